"""A prepared folder, memory-mapped: the token stream and its document boundaries, read page by page.

Opening costs the manifest and one memmap per shard, whatever the corpus size; a batch reads only the
pages of its sequences. Sequence i is tokens [i*seq_len, (i+1)*seq_len) of the stream (the remainder is
dropped), returned as int32 like the in-memory stream was; its document ids come from the document ends by
binary search, for the batch only.

May import: config, data.readers, data.prepare.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ablate.config.errors import SpecError
from ablate.data.prepare import MANIFEST, read_manifest
from ablate.data.readers import HASH_BLOCK


class PreparedCorpus:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        manifest = read_manifest(self.folder)  # DamagedPrepared naming it when it is not a manifest
        if manifest is None:
            raise SpecError(
                "not a prepared corpus (no manifest): run `ablate prepare` again",
                file=str(self.folder / MANIFEST),
            )
        self.manifest = manifest
        dtype = np.dtype(manifest["dtype"])
        sizes = [(s["file"], s["n_tokens"] * dtype.itemsize) for s in manifest["shards"]]
        for name, expected in [*sizes, (manifest["doc_ends"]["file"], manifest["n_documents"] * 8)]:
            size = (self.folder / name).stat().st_size if (self.folder / name).is_file() else -1
            if size != expected:
                raise SpecError(
                    f"prepared file has {size} bytes, the manifest says {expected}; "
                    f"re-prepare with `ablate prepare` (it replaces the folder)",
                    file=str(self.folder / name),
                )
        self.shards = [np.memmap(self.folder / s["file"], dtype=dtype, mode="r") for s in manifest["shards"]]
        self.starts = np.cumsum([0] + [s["n_tokens"] for s in manifest["shards"]])
        self.doc_ends = np.memmap(self.folder / "doc_ends.bin", dtype=np.int64, mode="r")
        self.n_tokens, self.n_documents = int(manifest["n_tokens"]), int(manifest["n_documents"])

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream as int32, across shard boundaries."""
        out = np.empty(stop - start, dtype=np.int32)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        pos = start
        for i in range(first, len(self.shards)):
            if pos >= stop:
                break
            lo, hi = pos - self.starts[i], min(stop, self.starts[i + 1]) - self.starts[i]
            out[pos - start : pos - start + hi - lo] = self.shards[i][lo:hi]
            pos += hi - lo
        return out

    def doc_ids(self, start: int, stop: int) -> np.ndarray:
        return np.searchsorted(self.doc_ends, np.arange(start, stop), side="right").astype(np.int32)

    def packed(self, seq_len: int) -> tuple["PackedView", "PackedView"]:
        """(sequences, doc ids): each indexable by an array of sequence indices -> (n, seq_len) int32."""
        n = self.n_tokens // seq_len
        if n == 0:
            raise SpecError(
                f"corpus has {self.n_tokens} tokens, fewer than one sequence of {seq_len}",
                key="data.seq_len",
                value=seq_len,
            )
        return PackedView(self.tokens, n, seq_len), PackedView(self.doc_ids, n, seq_len)

    def verify(self) -> list[str]:
        """Files whose sha256 differs from the manifest's (reads everything)."""
        files = [(s["file"], s["sha256"]) for s in self.manifest["shards"]]
        files.append((self.manifest["doc_ends"]["file"], self.manifest["doc_ends"]["sha256"]))
        bad = []
        for name, expected in files:
            h = hashlib.sha256()
            with open(self.folder / name, "rb") as f:
                while block := f.read(HASH_BLOCK):
                    h.update(block)
            if h.hexdigest() != expected:
                bad.append(str(self.folder / name))
        return bad


class PackedView:
    """Sequences of a stream-reading function: view[idx] -> (len(idx), seq_len) int32, like a 2-D array."""

    def __init__(self, read, n: int, seq_len: int):
        self._read, self.n, self.seq_len = read, n, seq_len
        self.shape = (n, seq_len)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx) -> np.ndarray:
        rows = np.atleast_1d(np.arange(self.n)[idx] if isinstance(idx, slice) else np.asarray(idx))
        if ((rows < 0) | (rows >= self.n)).any():
            raise IndexError(f"sequence index out of range 0..{self.n - 1}")
        out = np.stack([self._read(int(r) * self.seq_len, (int(r) + 1) * self.seq_len) for r in rows])
        return out if np.ndim(idx) or isinstance(idx, slice) else out[0]

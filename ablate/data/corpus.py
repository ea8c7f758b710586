"""What a run needs of its corpus: the packed sequences (memory-mapped from the prepared folder, preparing it
first when there is none), the held-out documents for probes, and the order sequences are read in.

Every document is tokenized with the tokenizer's special tokens ([CLS] doc [SEP] for BERT-style
tokenizers), the documents are concatenated, and the stream is cut into sequences of seq_len tokens (the
remainder is dropped), as run_mlm.py's group_texts does. Each token carries the index of its document so
CLM labels can stop at document boundaries.

A run never re-reads its corpus to check it: the prepared manifest's source sizes and mtimes are compared
(the bytes are re-hashed only when they differ), and a corpus that changed is refused with the command
that re-prepares it.

May import: config, data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ablate.config.errors import SpecError
from ablate.config.spec import DataSpec
from ablate.data.prepare import changed_sources, prepare, prepared_folder, read_manifest, tokenizer_fingerprint
from ablate.data.prepared import PackedView, PreparedCorpus
from ablate.data.readers import Source, iter_documents, resolve_sources

__all__ = [
    "SequenceOrder",
    "TokenStream",
    "estimated_tokens",
    "find_prepared",
    "load_packed",
    "open_prepared",
    "ensure_prepared",
    "prepared_tokens",
    "read_documents",
    "tokenize_documents",
    "tokenizer_fingerprint",
]

# UTF-8 bytes a token, roughly, for biomedical text: measured 4.4 (English clinical cases, BERT WordPiece) and
# 3.2 (French clinical cases); only for the dry run's estimate of a corpus that is not prepared
BYTES_PER_TOKEN = 4.0
UNCOMPRESSED = ("text", "jsonl")


def open_prepared(spec: DataSpec, tokenizer, which: str = "corpus") -> PreparedCorpus:
    """The memory-mapped prepared corpus, read only: it never tokenizes. A corpus with no complete prepared
    folder, or one that changed since it was prepared, is a SpecError naming `ablate prepare`."""
    folder, manifest, sources = find_prepared(spec, tokenizer, which)
    if manifest is None:
        raise SpecError(
            f"the corpus is not prepared (no complete folder {folder}); prepare it: ablate prepare <this run spec "
            "or grid> (a run prepares its own corpora before it reads them: ensure_prepared)",
            key=f"data.{which}",
            value=getattr(spec, which),
        )
    _refuse_changed(spec, which, folder, manifest, sources)
    return PreparedCorpus(folder)


def ensure_prepared(
    spec: DataSpec, tokenizer, which: str = "corpus", workers: int | None = None
) -> PreparedCorpus:
    """The prepared corpus, tokenized first (under its lock) when no complete folder exists: besides `ablate
    prepare`, the one call that tokenizes, made by a run's setup before it opens its streams (which only read).
    A corpus that changed since it was prepared is a SpecError naming the command that re-prepares it."""
    folder, manifest, sources = find_prepared(spec, tokenizer, which)
    if manifest is None:
        return PreparedCorpus(prepare(spec, tokenizer, which, workers=workers))
    _refuse_changed(spec, which, folder, manifest, sources)
    return PreparedCorpus(folder)


def _refuse_changed(spec: DataSpec, which: str, folder: Path, manifest: dict, sources: list) -> None:
    changed = changed_sources(manifest, sources, spec)
    if changed:
        raise SpecError(
            f"the corpus changed since it was prepared in {folder} ({', '.join(changed)}); "
            f"re-prepare it: ablate prepare <this run spec or grid>",
            key=f"data.{which}",
            value=getattr(spec, which),
        )


def find_prepared(spec: DataSpec, tokenizer, which: str = "corpus") -> tuple[Path, dict | None, list]:
    """(the prepared folder of this corpus reading and tokenizer, its manifest or None when not prepared, the
    sources), reading no document."""
    sources = resolve_sources(spec, which)
    folder = prepared_folder(spec, sources, tokenizer_fingerprint(tokenizer))
    return folder, read_manifest(folder), sources


def prepared_tokens(spec: DataSpec, tokenizer) -> int | None:
    """The corpus's token count from its prepared manifest, reading no document; None when it is not prepared
    (or changed since it was: preparing it again is what counts it)."""
    _, manifest, sources = find_prepared(spec, tokenizer)
    if manifest is None or changed_sources(manifest, sources, spec):
        return None
    return int(manifest["n_tokens"])


def estimated_tokens(spec: DataSpec, sources: list[Source]) -> int | None:
    """About how many tokens uncompressed text or jsonl sources hold, from their bytes alone; None when the
    bytes say little (compressed files, parquet, datasets, or `max_documents` keeping only some documents)."""
    plain = all(s.fmt in UNCOMPRESSED and not s.path.name.lower().endswith((".gz", ".zst")) for s in sources)
    if spec.max_documents is not None or not plain:
        return None
    return round(sum(s.stat()["size"] for s in sources) / BYTES_PER_TOKEN)


def load_packed(spec: DataSpec, tokenizer) -> tuple[PackedView, PackedView]:
    """(sequences, doc ids) of the corpus (prepared first if need be), both indexable by sequence indices."""
    return ensure_prepared(spec, tokenizer).packed(spec.seq_len)


def read_documents(spec: DataSpec, which: str = "corpus") -> list[str]:
    """The documents of a (small) corpus in memory, in file order: the held-out texts of layer probes."""
    docs = list(iter_documents(resolve_sources(spec, which), spec))
    if not docs:
        raise SpecError("corpus is empty", key=f"data.{which}", value=getattr(spec, which))
    return docs


@dataclass(frozen=True)
class TokenStream:
    """The whole stream in memory: the reference the prepared path is tested against."""

    tokens: np.ndarray  # (n_tokens,) int32
    doc_index: np.ndarray  # (n_tokens,) int32, document of each token
    n_documents: int


def tokenize_documents(docs: list[str], tokenizer, batch: int = 1000) -> TokenStream:
    pieces, owners = [], []
    for start in range(0, len(docs), batch):
        encoded = tokenizer(
            docs[start : start + batch],
            add_special_tokens=True,
            truncation=False,
            return_attention_mask=False,
            verbose=False,
        )["input_ids"]
        for i, ids in enumerate(encoded):
            pieces.append(np.asarray(ids, dtype=np.int32))
            owners.append(np.full(len(ids), start + i, dtype=np.int32))
    return TokenStream(np.concatenate(pieces), np.concatenate(owners), len(docs))


class SequenceOrder:
    """Which packed sequence comes at each position of the run: a fresh permutation per epoch, drawn from
    the data seed alone. Two runs with the same data seed read the same sequences in the same order."""

    def __init__(self, n_sequences: int, data_seed: int):
        self.n, self.seed = n_sequences, data_seed
        self._epochs: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            self._epochs = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.n)}
        return self._epochs[epoch]

    def take(self, position: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int64)
        for i in range(count):
            epoch, offset = divmod(position + i, self.n)
            out[i] = self._perm(epoch)[offset]
        return out

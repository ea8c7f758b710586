"""Tokenize a corpus once, in parallel worker processes, into a prepared folder of flat token shards.

    <prepared root>/<key>/tokens-00000.bin ...   the token stream, uint16 when the vocabulary fits, else uint32
                         /doc_ends.bin           int64: where each document's tokens end in the stream
                         /manifest.json          written last: format version, tokenizer fingerprint, sources
                                                 (path, size, mtime, sha256), counts, per-file sha256

The key hashes the source paths, the reading options and the tokenizer fingerprint, so every arm of a sweep
finds the same folder. One process prepares a key at a time (a FileLock next to the folder; others wait on
it); the folder is built under <key>.partial and renamed into place with its manifest, so a half-written
folder is never used, and a preparer killed mid-way leaves only a .partial the next one starts over.

The stream is exactly what the in-memory path gave: each document tokenized with add_special_tokens=True and
no truncation, concatenated in file order.

May import: config, store, data.readers, data.encode.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Iterator

import numpy as np

from ablate.config.errors import SpecError
from ablate.config.faults import die_after_shards
from ablate.config.paths import prepared_root
from ablate.config.spec import DataSpec
from ablate.data.encode import make_encoder
from ablate.data.readers import Source, hub_identity, iter_documents, resolve_sources
from ablate.store.atomic import publish_dir, write_json
from ablate.store.lock import FileLock

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARD_TOKENS = 1 << 28  # 512 MB of uint16 per shard
CHUNK_DOCS = 512  # documents per task handed to a worker


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of what decides token ids: the tokenizer's class and its serialized vocabulary/rules."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is not None:
        # truncation/padding are call-time settings the tokenizer object records on itself: not identity
        rules = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("truncation", "padding")}
        h.update(json.dumps(rules, sort_keys=True).encode())
    else:
        h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    return h.hexdigest()


def default_workers() -> int:
    """The cores this process may use (under Slurm: the job's CPUs)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _reading(spec: DataSpec) -> dict:
    return {
        "format": spec.format,
        "text_field": spec.text_field,
        "max_documents": spec.max_documents,
        "errors": spec.errors,
    }


def prepared_folder(spec: DataSpec, sources: list[Source], fingerprint: str) -> Path:
    blob = json.dumps([FORMAT_VERSION, [str(s.path) for s in sources], _reading(spec), fingerprint])
    return prepared_root(spec.prepared_root) / hashlib.sha256(blob.encode()).hexdigest()[:24]


class DamagedPrepared(SpecError):
    """A prepared folder whose manifest.json is there but is not what `prepare` writes: exit 2 naming it;
    `ablate prepare` prepares the corpus again over it."""


def _is_digest(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _is_count(value) -> bool:
    return type(value) is int and value >= 0


def _is_file(entry, *fields: str) -> bool:
    """A {file, sha256, *fields} entry naming a file of the folder itself."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("file"), str)
        and "/" not in entry["file"]
        and entry["file"] not in ("", ".", "..")
        and _is_digest(entry.get("sha256"))
        and all(_is_count(entry.get(f)) for f in fields)
    )


def manifest_problem(manifest) -> str | None:
    """What is wrong with a prepared folder's manifest (its version, fields and their types, the shards' token
    counts against the total), or None."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not a manifest"
    if manifest.get("format_version") != FORMAT_VERSION:
        return f"format_version {manifest.get('format_version')!r}, this ablate reads {FORMAT_VERSION}"
    shards, sources = manifest.get("shards"), manifest.get("sources")
    if not isinstance(shards, list) or not all(_is_file(s, "n_tokens") for s in shards):
        return "shards is not a list of {file, n_tokens, sha256}"
    if not _is_file(manifest.get("doc_ends")):
        return "doc_ends is not a {file, sha256}"
    if not isinstance(sources, list) or not all(
        isinstance(s, dict) and isinstance(s.get("path"), str) for s in sources
    ):
        return "sources is not a list of {path, ...}"
    for field in ("n_tokens", "n_documents", "vocab_size"):
        if not _is_count(manifest.get(field)):
            return f"{field} is {manifest.get(field)!r}, not a count"
    if manifest.get("dtype") not in ("uint16", "uint32"):
        return f"dtype {manifest.get('dtype')!r} is none of uint16, uint32"
    if sum(s["n_tokens"] for s in shards) != manifest["n_tokens"]:
        return f"its shards hold {sum(s['n_tokens'] for s in shards)} tokens, n_tokens says {manifest['n_tokens']}"
    return None


def read_manifest(folder: Path) -> dict | None:
    """The prepared folder's manifest; None when it has none (not prepared); DamagedPrepared naming the file
    when it cannot be read or is not what `prepare` writes (manifest_problem)."""
    path = Path(folder) / MANIFEST
    fix = "prepare it again: `ablate prepare <the run spec or grid>` replaces the folder"
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DamagedPrepared(f"not JSON ({exc}); {fix}", file=str(path)) from None
    problem = manifest_problem(manifest)
    if problem:
        raise DamagedPrepared(f"{problem}; {fix}", file=str(path))
    return manifest


def changed_sources(manifest: dict, sources: list[Source], spec: DataSpec) -> list[str]:
    """Sources whose size or mtime differ from the manifest's and whose bytes then hash differently."""
    changed = []
    recorded = {s["path"]: s for s in manifest["sources"]}
    if sorted(recorded) != sorted(str(s.path) for s in sources):
        return sorted(set(recorded) ^ {str(s.path) for s in sources})
    for source in sources:
        was = recorded[str(source.path)]
        if source.fmt == "hub":
            if hub_identity(source, spec) != {k: was[k] for k in ("path", "fingerprint")}:
                changed.append(str(source.path))
            continue
        now = source.stat()
        if (now["size"], now["mtime_ns"]) != (was["size"], was["mtime_ns"]) and source.content_hash() != was[
            "sha256"
        ]:
            changed.append(str(source.path))
    return changed


def _identity(source: Source, spec: DataSpec) -> dict:
    if source.fmt == "hub":
        return hub_identity(source, spec)
    return {**source.stat(), "sha256": source.content_hash()}


# ---------------------------------------------------------------- workers

_ENCODE = None
_DTYPE = np.dtype(np.int64)


def _init_worker(backend_json: str | None, hf_tokenizer, single: bool, dtype: str) -> None:
    global _ENCODE, _DTYPE
    _DTYPE = np.dtype(dtype)  # the shards' own: a worker sends 2 bytes a token, not 8
    if single:  # one tokenizer per core: the Rust thread pool would only oversubscribe
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if backend_json is not None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(backend_json)
        backend.no_truncation()
        backend.no_padding()
        _ENCODE = make_encoder(backend)
    else:
        _ENCODE = lambda docs: hf_tokenizer(  # noqa: E731
            docs,
            add_special_tokens=True,
            truncation=False,
            return_attention_mask=False,
            verbose=False,
        )["input_ids"]


def _encode(docs: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """(the chunk's tokens, each document's token count, its characters for the progress bar)."""
    ids = _ENCODE(docs)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=_DTYPE, count=int(lengths.sum()))
    return flat, lengths, sum(map(len, docs)) + len(docs)


def _chunks(docs: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(itertools.islice(docs, size)):
        yield chunk


# ---------------------------------------------------------------- writing


class ShardWriter:
    """Appends token arrays to fixed-size shards and document ends to doc_ends.bin, hashing as it writes."""

    def __init__(self, folder: Path, dtype: np.dtype, shard_tokens: int):
        self.folder, self.dtype, self.shard_tokens = folder, dtype, shard_tokens
        self.shards: list[dict] = []
        self.n_tokens = self.n_documents = 0
        self._file = self._hash = None
        self._in_shard = 0
        self._ends = open(folder / "doc_ends.bin", "wb")
        self._ends_hash = hashlib.sha256()
        self._die_after = die_after_shards() or 0  # ablate.config.faults: the tests kill it mid-way

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        ends = (self.n_tokens + np.cumsum(lengths)).astype(np.int64)
        self._ends.write(ends.tobytes())
        self._ends_hash.update(ends.tobytes())
        self.n_documents += len(lengths)
        data = np.asarray(tokens, dtype=self.dtype)
        while len(data):
            if self._file is None:
                name = f"tokens-{len(self.shards):05d}.bin"
                self._file, self._hash, self._in_shard = open(self.folder / name, "wb"), hashlib.sha256(), 0
                self.shards.append({"file": name})
            take = data[: self.shard_tokens - self._in_shard]
            self._file.write(take.tobytes())
            self._hash.update(take.tobytes())
            self._in_shard += len(take)
            self.n_tokens += len(take)
            data = data[len(take) :]
            if self._in_shard == self.shard_tokens:
                self._close_shard()

    def _close_shard(self) -> None:
        self._file.close()
        self.shards[-1].update(n_tokens=self._in_shard, sha256=self._hash.hexdigest())
        self._file = None
        if self._die_after and sum("sha256" in s for s in self.shards) >= self._die_after:
            os.kill(os.getpid(), signal.SIGKILL)

    def close(self) -> dict:
        if self._file is not None:
            self._close_shard()
        self._ends.close()
        return {
            "doc_ends": {"file": "doc_ends.bin", "sha256": self._ends_hash.hexdigest()},
            "shards": self.shards,
            "n_tokens": self.n_tokens,
            "n_documents": self.n_documents,
        }


def _progress_bar(sources: list[Source], show: bool):
    from tqdm import tqdm

    total = sum(s.path.stat().st_size for s in sources if s.path.is_file()) or None
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="preparing",
        disable=not show,
        file=sys.stderr,
        mininterval=0.5 if sys.stderr.isatty() else 10.0,
    )


def _bounded_map(pool, chunks: Iterator[list[str]], window: int) -> Iterator[tuple]:
    """pool.imap in order, with at most `window` chunks in flight (imap would read the whole corpus ahead)."""
    pending: deque = deque()
    for chunk in chunks:
        pending.append(pool.apply_async(_encode, (chunk,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _tokenize_into(
    tmp: Path, sources: list[Source], spec: DataSpec, tokenizer, workers: int, shard_tokens: int, show: bool
) -> dict:
    dtype = np.dtype(np.uint16) if len(tokenizer) <= 1 << 16 else np.dtype(np.uint32)
    writer = ShardWriter(tmp, dtype, shard_tokens)
    bar = _progress_bar(sources, show)
    chunks = _chunks(iter_documents(sources, spec), CHUNK_DOCS)
    first = list(itertools.islice(chunks, 2))
    chunks = itertools.chain(first, chunks)
    if len(first) < 2:
        workers = 1  # one chunk of documents: starting a pool would cost more than tokenizing it
    backend = getattr(tokenizer, "backend_tokenizer", None)
    initargs = (
        backend.to_str() if backend is not None else None,
        None if backend else tokenizer,
        workers > 1,
        dtype.name,
    )

    def consume(results) -> None:
        for tokens, lengths, chars in results:
            writer.add(tokens, lengths)
            bar.update(chars)
            bar.set_postfix(docs=f"{writer.n_documents:,}", tokens=f"{writer.n_tokens:,}", refresh=False)

    if workers <= 1:
        _init_worker(*initargs[:2], False, dtype.name)
        consume(map(_encode, chunks))
    else:
        ctx = multiprocessing.get_context("spawn")  # the caller may hold torch threads: no fork
        with ctx.Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
            consume(_bounded_map(pool, chunks, 4 * workers))
    bar.close()
    if writer.n_documents == 0:
        writer.close()
        raise SpecError(
            "corpus is empty (no non-empty document)",
            key="data.corpus",
            value=", ".join(str(s.path) for s in sources),
        )
    if spec.max_documents is not None and writer.n_documents < spec.max_documents:
        print(
            f"warning: data.max_documents {spec.max_documents:,} is more than the corpus's {writer.n_documents:,} "
            f"documents ({', '.join(str(s.path) for s in sources)}): all {writer.n_documents:,} are used",
            file=sys.stderr,
        )
    return {**writer.close(), "dtype": dtype.name, "vocab_size": len(tokenizer)}


def prepare(
    spec: DataSpec,
    tokenizer,
    which: str = "corpus",
    workers: int | None = None,
    show: bool = True,
    shard_tokens: int = SHARD_TOKENS,
) -> Path:
    """The prepared folder of this corpus and tokenizer, tokenizing it first unless a complete one exists whose
    sources did not change (a changed source is re-tokenized: this is the re-prepare command)."""
    sources = resolve_sources(spec, which)
    fingerprint = tokenizer_fingerprint(tokenizer)
    folder = prepared_folder(spec, sources, fingerprint)
    lock = FileLock(folder.with_name(folder.name + ".lock"))
    if lock.held_elsewhere() and show:
        print(f"waiting for another process preparing {folder} ({lock.holder()})", file=sys.stderr)
    lock.acquire(wait_s=None)
    try:
        try:
            manifest = read_manifest(folder)
        except DamagedPrepared as exc:  # prepared again over it, said
            print(f"note: {exc}: preparing it again", file=sys.stderr)
            manifest = None
        if manifest is not None and not changed_sources(manifest, sources, spec):
            return folder
        tmp = folder.with_name(folder.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a preparer that died: we hold the lock
        tmp.mkdir(parents=True)
        if show:
            print(f"tokenizing {len(sources)} source file(s) into {folder}", file=sys.stderr)
        identities = [_identity(s, spec) for s in sources]
        counts = _tokenize_into(tmp, sources, spec, tokenizer, workers or default_workers(), shard_tokens, show)
        write_json(
            tmp / MANIFEST,
            {
                "format_version": FORMAT_VERSION,
                "tokenizer_fingerprint": fingerprint,
                "reading": _reading(spec),
                "sources": identities,
                **counts,
            },
        )
        publish_dir(tmp, folder)
        return folder
    finally:
        lock.release()

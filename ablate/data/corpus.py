"""Corpus -> one token stream, tokenized once and cached, packed into fixed-length sequences.

Every document is tokenized with the tokenizer's special tokens ([CLS] doc [SEP] for BERT-style
tokenizers), the documents are concatenated, and the stream is cut into sequences of seq_len tokens (the
remainder is dropped), as run_mlm.py's group_texts does. The separator between documents is the
tokenizer's own [SEP]/[CLS] pair. Each token carries the index of its document so CLM labels can stop
at document boundaries.

The cache key is the hash of the corpus bytes, the reading options and the tokenizer's files, so an edited
corpus or another tokenizer never reads a stale cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ablate.config.errors import SpecError
from ablate.config.paths import cache_dir, resolve_data_path
from ablate.config.spec import DataSpec


@dataclass(frozen=True)
class TokenStream:
    tokens: np.ndarray      # (n_tokens,) int32
    doc_index: np.ndarray   # (n_tokens,) int32, document of each token
    n_documents: int

    def packed(self, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(sequences, doc ids): both (n_sequences, seq_len) views of the stream."""
        n = len(self.tokens) // seq_len
        if n == 0:
            raise SpecError(f"corpus has {len(self.tokens)} tokens, fewer than one sequence of {seq_len}",
                            key="data.seq_len", value=seq_len)
        return (self.tokens[: n * seq_len].reshape(n, seq_len),
                self.doc_index[: n * seq_len].reshape(n, seq_len))


def _detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    if path.is_dir():
        return "hf"
    return {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}.get(suffix, "text")


def read_documents(spec: DataSpec, which: str = "corpus") -> list[str]:
    """The documents of the corpus (or of the validation corpus), in file order, empty ones dropped."""
    ref = getattr(spec, which)
    key = f"data.{which}"
    if ref.startswith("hf:"):
        return _read_hf(ref.removeprefix("hf:"), spec, key)
    path = resolve_data_path(ref, spec.data_root)
    if not path.exists():
        raise SpecError("corpus not found (relative paths are under the data root: ABLATE_DATA_ROOT or "
                        "data.data_root)", key=key, value=str(path))
    fmt = _detect_format(path, spec.format)
    if fmt == "text":
        with path.open(encoding="utf-8") as f:
            docs = [line.strip() for line in f]
    elif fmt == "jsonl":
        docs = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    docs.append(str(json.loads(line)[spec.text_field]).strip())
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise SpecError(f"line {lineno} is not a JSON object with field {spec.text_field!r}",
                                    file=str(path), key="data.text_field") from None
    elif fmt == "parquet":
        import pandas as pd

        frame = pd.read_parquet(path)
        if spec.text_field not in frame.columns:
            raise SpecError("text field not in the parquet file", file=str(path), key="data.text_field",
                            value=spec.text_field, allowed=", ".join(map(str, frame.columns)))
        docs = [str(x).strip() for x in frame[spec.text_field]]
    else:
        return _read_hf(str(path), spec, key)
    docs = [d for d in docs if d]
    if spec.max_documents is not None:
        docs = docs[: spec.max_documents]
    if not docs:
        raise SpecError("corpus is empty", key=key, value=str(path))
    return docs


def _read_hf(name: str, spec: DataSpec, key: str) -> list[str]:
    import datasets

    try:
        ds = datasets.load_from_disk(name) if Path(name).is_dir() else datasets.load_dataset(name, split="train")
    except Exception as exc:  # datasets raises many types for a missing dataset
        raise SpecError(f"cannot load the dataset: {exc}", key=key, value=name) from None
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"]
    if spec.text_field not in ds.column_names:
        raise SpecError("text field not in the dataset", key="data.text_field", value=spec.text_field,
                        allowed=", ".join(ds.column_names))
    docs = [str(x).strip() for x in ds[spec.text_field] if str(x).strip()]
    return docs[: spec.max_documents] if spec.max_documents else docs


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


def _corpus_fingerprint(spec: DataSpec, which: str, docs: list[str]) -> str:
    h = hashlib.sha256(json.dumps([which, spec.format, spec.text_field, spec.max_documents]).encode())
    for d in docs:
        h.update(d.encode())
        h.update(b"\n")
    return h.hexdigest()


def tokenize_documents(docs: list[str], tokenizer, batch: int = 1000) -> TokenStream:
    pieces, owners = [], []
    for start in range(0, len(docs), batch):
        encoded = tokenizer(docs[start:start + batch], add_special_tokens=True, truncation=False,
                            return_attention_mask=False, verbose=False)["input_ids"]
        for i, ids in enumerate(encoded):
            pieces.append(np.asarray(ids, dtype=np.int32))
            owners.append(np.full(len(ids), start + i, dtype=np.int32))
    return TokenStream(np.concatenate(pieces), np.concatenate(owners), len(docs))


def load_token_stream(spec: DataSpec, tokenizer, which: str = "corpus") -> TokenStream:
    """Tokenize once; later calls (other runs, other arms) read the cached arrays."""
    docs = read_documents(spec, which)
    key = hashlib.sha256((_corpus_fingerprint(spec, which, docs) + tokenizer_fingerprint(tokenizer)).encode())
    path = cache_dir() / "tokens" / f"{key.hexdigest()[:24]}.npz"
    if path.is_file():
        with np.load(path) as z:
            return TokenStream(z["tokens"], z["doc_index"], int(z["n_documents"]))
    stream = tokenize_documents(docs, tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        np.savez(f, tokens=stream.tokens, doc_index=stream.doc_index, n_documents=stream.n_documents)
    os.replace(tmp, path)
    return stream


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

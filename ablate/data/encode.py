"""A preparation worker's encoder: documents -> token id lists, exactly as the tokenizer's own batch encoding
(add_special_tokens=True, no truncation) gives them.

Most of a worker's time is the Rust tokenizer. A WordPiece tokenizer behind BERT's normalizer and a
whitespace-splitting pre-tokenizer tokenizes each whitespace-separated chunk of a document on its own: the
normalizer works character by character (cleaning, lowercasing, accents, spaces around CJK), the pre-tokenizer
never joins across whitespace, and WordPiece sees one word at a time. For those (BERT, DistilBERT, ELECTRA,
MiniLM) a document is the special-token prefix, the ids of its chunks and the suffix, and a chunk seen before
is not tokenized again: corpora repeat their words, so most chunks are cache hits (the Rust BPE models keep a
word cache for the same reason). Any other tokenizer encodes whole documents. tests/test_data_prepare.py
checks both against the plain encoding on the shipped corpora and on edge cases.

May import: nothing of ablate.
"""

from __future__ import annotations

import json
import re
from typing import Callable

# Where the tokenizer splits: Rust's char::is_whitespace (Unicode White_Space) less the control characters
# BERT's normalizer (clean_text) deletes instead (U+000B, U+000C, U+0085), which join what is around them.
# Python's str.split() splits on these and on U+001C-U+001F too (also deleted), so documents holding any of
# them are split by the regex.
_WHITESPACE = re.compile("[\t\n\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
_PY_ONLY_SPACE = frozenset("\x0b\x0c\x1c\x1d\x1e\x1f\x85")
_WORD_LOCAL_PRE = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
CACHE_WORDS = 1 << 21  # cleared when it grows past this many chunks (memory stays bounded)


def word_local(backend) -> bool:
    """Whether this tokenizers.Tokenizer tokenizes whitespace-separated chunks independently."""
    rules = json.loads(backend.to_str())
    pre, norm, model = rules.get("pre_tokenizer"), rules.get("normalizer"), rules.get("model") or {}
    added = [t["content"] for t in rules.get("added_tokens") or []]
    return (
        pre is not None
        and pre.get("type") in _WORD_LOCAL_PRE
        and norm is not None
        and norm.get("type") == "BertNormalizer"
        and norm.get("clean_text")
        and model.get("type") == "WordPiece"
        and not any(_WHITESPACE.search(t) for t in added)
    )


def _chunks(doc: str) -> list[str]:
    if _PY_ONLY_SPACE.isdisjoint(doc):
        return doc.split()
    return [c for c in _WHITESPACE.split(doc) if c]


def make_encoder(backend) -> Callable[[list[str]], list[list[int]]]:
    """docs -> their ids with special tokens, for a tokenizers.Tokenizer set to no truncation and no padding."""
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    if not word_local(backend):
        return lambda docs: [e.ids for e in encode(docs, add_special_tokens=True)]

    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    at = next(i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain)
    prefix, suffix = full[:at], full[at + len(plain) :]
    cache: dict[str, list[int]] = {}

    def encode_docs(docs: list[str]) -> list[list[int]]:
        chunked = [_chunks(d) for d in docs]
        missing = list({c for chunks in chunked for c in chunks if c not in cache})
        if len(cache) + len(missing) > CACHE_WORDS:
            cache.clear()
            missing = list({c for chunks in chunked for c in chunks})
        cache.update(zip(missing, (e.ids for e in encode(missing, add_special_tokens=False))))
        out = []
        for chunks in chunked:
            ids = list(prefix)
            for c in chunks:
                ids += cache[c]
            out.append(ids + suffix)
        return out

    return encode_docs

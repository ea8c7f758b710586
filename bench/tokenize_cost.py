"""Where a preparation worker's time goes: the Rust tokenizer against what surrounds it.

    PYTHONPATH=$PWD python bench/tokenize_cost.py [--docs 6000] [--rounds 3]

On the first --docs documents of the 20 MB corpus of bench/data_scale.py (built if missing), one thread, in
chunks of ablate.data.prepare.CHUNK_DOCS, each round times: the raw tokenizer (`encode_batch_fast`, what a
worker runs), turning its encodings into id lists (the rest of a worker's own work), and the transformers call
the datasets.map recipe makes per batch (`tokenizer(batch)["input_ids"]`), and what a worker now runs
(ablate.data.encode.make_encoder: the word cache, new each round, checked equal). Prints one JSON line per round.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as in a worker of a multi-worker preparation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--size-mb", type=int, default=20, help="the corpus of bench/data_scale.py to read (default 20)"
    )
    args = ap.parse_args()

    from tokenizers import Tokenizer

    from ablate.data.encode import make_encoder
    from ablate.data.prepare import CHUNK_DOCS
    from ablate.models.loading import DEFAULT_MODEL, load_tokenizer
    from data_scale import build_corpus

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    with build_corpus(args.size_mb).open() as f:
        docs = [line.strip() for line in f if line.strip()][: args.docs]
    chunks = [docs[i : i + CHUNK_DOCS] for i in range(0, len(docs), CHUNK_DOCS)]
    for round_ in range(args.rounds):
        t0 = time.perf_counter()
        encodings = [backend.encode_batch_fast(c, add_special_tokens=True) for c in chunks]
        t1 = time.perf_counter()
        ids = [[e.ids for e in batch] for batch in encodings]
        t2 = time.perf_counter()
        recipe = [
            tokenizer(c, add_special_tokens=True, truncation=False, return_attention_mask=False, verbose=False)[
                "input_ids"
            ]
            for c in chunks
        ]
        t3 = time.perf_counter()
        encode = make_encoder(backend)
        cached = [encode(c) for c in chunks]
        t4 = time.perf_counter()
        assert [i for b in ids for i in b] == [i for b in recipe for i in b] == [i for b in cached for i in b]
        print(
            json.dumps(
                {
                    "round": round_,
                    "documents": len(docs),
                    "encode_s": round(t1 - t0, 3),
                    "to_lists_s": round(t2 - t1, 3),
                    "transformers_call_s": round(t3 - t2, 3),
                    "word_cache_s": round(t4 - t3, 3),
                }
            )
        )


if __name__ == "__main__":
    main()

"""One ModernBERT-base-shaped CLM and MLM training step at 8192 tokens on CPU: today's dense masks against the
banded path (ablate.models.attention), in one script.

    python bench/attention_8192.py                            # 3 layers (global, local, local), 8192 tokens
    python bench/attention_8192.py --layers 22                # ModernBERT-base's full depth (8 global, 14 local)
    python bench/attention_8192.py --seq-len 1024 --steps 1   # a quick check

The model: hidden 768, 12 heads, intermediate 1152, global_attn_every_n_layers 3, local_attention 128,
vocabulary 50,368 (ModernBERT-base), random weights, float32, micro-batch 1. A step is what the training loop
does (ablate.train.loop.train_step): the objective's inputs and labels (CLM: next token; MLM: 30% masked;
`--objectives prefix-lm`: a bidirectional prefix of half the sequence, the suffix's next tokens),
the encoder under ablate.train.attention_masks.attention_for, the head transform at labelled positions, the fused
vocabulary loss (ablate.train.vocab_loss), backward, AdamW.

Variants (mask kinds of attention_for on the same model):
  masks   today: CLM (and prefix-LM) a (1, 1, L, L) additive mask per layer type; MLM transformers' own
          masks (the local layers' (1, 1, L, L) sliding-window bool mask)
  banded  the default now: global layers SDPA with the causal flag (MLM: no mask), local layers only the
          keys inside their window; no L x L mask
  banded+docs  the same with document masking (documents of --doc-len tokens)

Each (objective, variant) runs in its own subprocess, so its peak memory is its own: `peak` is the worker's
whole-process RSS high-water mark (model, optimizer state, steps), `step peak` the high-water mark during
the steps minus the RSS before them. Step time: the best of --steps steps (the first pays for allocation;
give --steps 2 or more on a quiet machine). The output check, in this process once the workers have ended,
builds one model and compares the encoder's last hidden state of `banded` and `masks`, in float32 at --seq-len
and float64 at min(--seq-len, 1024), and counts tensors with two dimensions of L made during a banded forward +
backward (0 expected).

Prints one line per measurement, then one JSON object (last line).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from pretrain_step import peak_rss_mb, reset_peak_rss, vm_hwm_mb, vm_rss_mb  # noqa: E402

VARIANTS = {"masks": ("per-layer-type", False), "banded": ("banded", False), "banded+docs": ("banded", True)}


def build(layers: int, seq_len: int, dtype):
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM
    from transformers.initialization import no_init_weights

    config = ModernBertConfig(
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=1152,
        num_hidden_layers=layers,
        global_attn_every_n_layers=3,
        local_attention=128,
        vocab_size=50368,
        max_position_embeddings=max(seq_len, 8192),
        pad_token_id=50283,
        bos_token_id=50281,
        eos_token_id=50282,
        cls_token_id=50281,
        sep_token_id=50282,
        attn_implementation="sdpa",
    )
    with no_init_weights():
        model = ModernBertForMaskedLM(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=generator)
    return model.to(dtype)


def batch(seq_len: int, doc_len: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, vocab - 100, (1, seq_len), generator=g)
    docs = (torch.arange(seq_len) // doc_len)[None]
    return ids, docs


def step(model, family, objective: str, ids, docs, kind: str, documents: bool, opt) -> float:
    import torch

    from ablate.train.attention_masks import attention_for, clm_labels, mlm_inputs
    from ablate.train.vocab_loss import LOSSES

    prefix = None
    if objective == "mlm":
        special = torch.tensor([50281, 50282, 50283, 50284])
        inputs, labels = mlm_inputs(
            ids, 0.3, special, 50284, model.config.vocab_size, torch.Generator().manual_seed(2)
        )
    elif objective == "prefix-lm":  # the prefix at mid-sequence: the suffix predicted causally
        from ablate.config.objectives.prefix_lm import prefix_labels

        prefix = torch.tensor([ids.shape[1] // 2])
        inputs, labels = ids, prefix_labels(ids, docs, prefix)
    else:
        inputs, labels = ids, clm_labels(ids, docs)
    n_labels = int((labels != -100).sum())
    with attention_for(
        model,
        family,
        objective,
        ids.shape[1],
        torch.float32,
        "cpu",
        docs if documents else None,
        kind=kind,
        prefix=prefix,
    ) as attn:
        hidden = family.encoder(model)(input_ids=inputs, attention_mask=attn).last_hidden_state
        where = labels != -100
        features = family.transform(model, hidden[where])
        loss = LOSSES["fused"](features, *family.decoder(model), labels[where]) / n_labels
    del features, hidden
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss)


def worker(args) -> dict:
    import torch

    from ablate.models.families import family_of

    torch.set_num_threads(args.threads)
    kind, documents = VARIANTS[args.variant]
    model = build(args.layers, args.seq_len, torch.float32).train()
    family = family_of(model.config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, docs = batch(args.seq_len, args.doc_len, model.config.vocab_size)
    times, losses, step_peaks = [], [], []
    for _ in range(args.steps):
        before = vm_rss_mb()
        reset_peak_rss()
        start = time.perf_counter()
        losses.append(step(model, family, args.objective, ids, docs, kind, documents, opt))
        times.append(time.perf_counter() - start)
        peak = vm_hwm_mb()
        step_peaks.append(None if peak is None or before is None else peak - before)
    return {
        "objective": args.objective,
        "variant": args.variant,
        "step_s": times,
        "loss": losses,
        "step_peak_mb": step_peaks,
        "peak_mb": peak_rss_mb(),
    }


def square_tensors(model, family, objective: str, ids, length: int) -> int:
    """Tensors with two dimensions of `length` made during a banded forward + backward."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from ablate.train.attention_masks import attention_for

    class Shapes(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and list(t.shape).count(length) >= 2:
                    Shapes.count += 1
            return out

    with Shapes(), attention_for(model, family, objective, length, torch.float32, "cpu", kind="banded") as attn:
        family.encoder(model)(input_ids=ids, attention_mask=attn).last_hidden_state.sum().backward()
    model.zero_grad(set_to_none=True)
    return Shapes.count


def output_check(args) -> dict:
    import torch

    from ablate.models.families import family_of
    from ablate.train.attention_masks import attention_for

    torch.set_num_threads(args.threads)
    out = {}
    for dtype, length in ((torch.float32, args.seq_len), (torch.float64, min(args.seq_len, 1024))):
        model = build(args.layers, length, dtype).eval()
        family = family_of(model.config)
        ids, _ = batch(length, args.doc_len, model.config.vocab_size)
        for objective in ("clm", "mlm"):
            hidden = {}
            for kind in ("per-layer-type", "banded"):
                with (
                    torch.no_grad(),
                    attention_for(model, family, objective, length, dtype, "cpu", kind=kind) as attn,
                ):
                    hidden[kind] = family.encoder(model)(input_ids=ids, attention_mask=attn).last_hidden_state
            diff = float((hidden["banded"] - hidden["per-layer-type"]).abs().max())
            out[f"{objective}_{str(dtype).removeprefix('torch.')}_L{length}_max_abs_diff"] = diff
        if dtype == torch.float32:
            out["square_tensors_banded"] = sum(
                square_tensors(model.train(), family, o, ids, length) for o in ("clm", "mlm")
            )
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=3, help="3: global, local, local (default); 22: ModernBERT-base")
    ap.add_argument("--steps", type=int, default=2, help="steps per variant; the best is reported (default 2)")
    ap.add_argument("--objectives", default="clm,mlm")
    ap.add_argument("--variants", default="masks,banded,banded+docs")
    ap.add_argument("--doc-len", type=int, default=1000, help="tokens per document for banded+docs (default 1000)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-check", action="store_true", help="skip the output check")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--objective", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return {}

    common = [
        sys.executable,
        __file__,
        "--seq-len",
        str(args.seq_len),
        "--layers",
        str(args.layers),
        "--steps",
        str(args.steps),
        "--doc-len",
        str(args.doc_len),
        "--threads",
        str(args.threads),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    results = []
    for objective in args.objectives.split(","):
        for variant in args.variants.split(","):
            run = subprocess.run(
                [*common, "--worker", "--objective", objective, "--variant", variant],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            r = json.loads(run.stdout.strip().splitlines()[-1])
            results.append(r)
            every = ", ".join(f"{t:.2f}" for t in r["step_s"])
            step_peak = max(p or 0 for p in r["step_peak_mb"]) / 1024
            print(
                f"{objective} {variant:12s} step {min(r['step_s']):7.2f} s  (all {every})  peak "
                f"{r['peak_mb'] / 1024:5.2f} GiB  step peak {step_peak:5.2f} GiB  loss {r['loss'][0]:.6f}",
                flush=True,
            )
    summary: dict = {"seq_len": args.seq_len, "layers": args.layers, "threads": args.threads, "results": results}
    for objective in args.objectives.split(","):
        by = {r["variant"]: r for r in results if r["objective"] == objective}
        if "masks" in by and "banded" in by:
            speed = min(by["masks"]["step_s"]) / min(by["banded"]["step_s"])
            memory = by["banded"]["peak_mb"] / by["masks"]["peak_mb"]
            summary[f"{objective}_speedup"] = speed
            summary[f"{objective}_peak_ratio"] = memory
            print(f"{objective}: banded is {speed:.2f}x faster than masks, peak {memory:.2f}x theirs", flush=True)
    if not args.no_check:  # here: every measured worker has ended
        summary["check"] = output_check(args)
        for key, value in summary["check"].items():
            print(f"check {key}: {value:.3g}" if isinstance(value, float) else f"check {key}: {value}", flush=True)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()

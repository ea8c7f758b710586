"""GPU training step: ablate's MLM and CLM steps against the standard transformers Trainer recipe, one GPU.
The one GPU check of the repository: it runs on a bare GPU node (bench/GPU_NODE.md).

    python bench/gpu_step.py --compile                         # the check: under 6 minutes on one H100/H200
    python bench/gpu_step.py                                   # ModernBERT-base sized random init, 8192 + 1024, bf16
    python bench/gpu_step.py --seq-lens 8192 --objectives mlm  # the headline rows only (a minute or two)
    python bench/gpu_step.py --model /path/to/ModernBERT-base  # a local checkpoint folder (weights + tokenizer)
    python bench/gpu_step.py --compile                         # torch.compile (ablate: the encoder; Trainer: the model)
    python bench/gpu_step.py --deterministic                   # deterministic algorithms: their cost
    python bench/gpu_step.py --attn ablate_sdpa                # ablate.models.attention in both recipes
    python bench/gpu_step.py --allow-cpu --tiny                # CPU smoke check of the code path (seconds)

One prepared script for a GPU session: each row has --row-budget-s (default 40 s: a row stops timing steps
once it has spent it) and a row starts only when it fits in what is left of --budget-s (default 260 s), the
headline row first: rows that do not fit are reported as skipped, so the whole script stays under 6 minutes,
compile included. Every row's error (a SpecError, an out-of-memory, a kernel a backend lacks) is caught and
reported as the row's status, and the JSON is written after each row. It needs this repository, the node's
own packages and the wheels bench/GPU_NODE.md names (pydantic), and reads its tokenizer from
bench/tokenizer/ (the MiniLM WordPiece vocabulary, 0.5 MB, Apache-2.0), not from the 88 MB model package.

For each sequence length and objective (mlm, clm) it times `--steps` optimizer steps after `--warmup`
untimed ones, of two recipes on the same model config, batch and random token data (documents of 512 tokens):
  ablate   ablate.train.loop.train_step, as a run with `precision: bf16` computes: bf16 autocast, sparse
           prediction (the vocabulary projection only at labelled positions), fused AdamW, pinned host memory
           + non-blocking copies, the family's attention path for the implementation (the `mask` column:
           for ModernBERT under sdpa, ablate.models.attention's banded local layers where the family maps it
           so), torch.compile of the encoder with --compile; CLM = causal attention (ModernBERT's local layers
           stay windowed) and next-token labels within documents. MLM masks --mask-rate (default 0.3, as the
           grids do). With --documents on (a row each for off and on by default) the run's
           `document_masking: true`: attention stays inside each packed document.
  trainer  transformers Trainer + DataCollatorForLanguageModeling, bf16=True, same batch, same optimizer
           settings (AdamW, lr, weight decay, clip 1.0): mlm = the collator's masking (--mask-rate), loss from
           the model's full-vocabulary logits; clm = the collator with mlm=False: loss at every position of
           the MaskedLM head with bidirectional attention (the standard recipe has no causal ModernBERT), so it
           has the compute of a dense next-token loss, not its semantics.
Reported per row: tokens/s (timed tokens / timed wall seconds, CUDA-synchronised), the ratio to the recipe's
reference throughput (--reference-tokens-per-s, default 300,000 tokens/s per H100: the figure issue 25
quotes for ModernBERT-base training at 8192 in bf16), MFU and peak memory (torch.cuda.max_memory_allocated
over the recipe's steps, after a reset). A recipe that runs out of memory is reported as "oom", one that
fails otherwise as "error: <type>: ..." (e.g. an op without a deterministic kernel under --deterministic, or
flash_attention_2 where the flash-attn package is missing).

MFU = model FLOPs per second / peak. Model FLOPs per token for a training step (forward + backward):
6 * N + 12 * sum over layers of (context of the layer) * hidden, with N the parameters used by a token's
matmuls (all parameters minus the input embedding table; the tied decoder counts once) and the context
of a global layer = sequence length, of a local layer = min(sequence length, window + 1). Causal masking and
documents are not discounted, and the same nominal FLOPs are used for both recipes (sparse prediction's
saving therefore shows as a higher MFU). Peak: --peak-tflops, default 989 (H100/H200 SXM dense bf16).

--deterministic switches on what a run's `deterministic: true` does (ablate.train.precision.set_determinism:
torch.use_deterministic_algorithms, cuDNN deterministic, a fixed cuBLAS workspace) for both recipes; compare
with a run without it for the cost.

The last line printed is one JSON object; --json PATH writes it too. Exit 2 without a CUDA GPU, unless
--allow-cpu (then the same code on the CPU, bf16 autocast included: only a check that it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from gpu_recipes import Row, peak_gb, reset_memory, run_ablate, run_trainer, status_row  # noqa: E402

DEFAULT_TOKENIZER = str(REPO / "bench" / "tokenizer")  # the MiniLM vocabulary alone (no weights)
RECIPE_TOKENS_PER_S = 300_000  # the recipe's ModernBERT-base throughput per H100 at 8192, bf16 (issue 25)
HEADLINE = ("ablate", "mlm", 8192, False)  # recipe, objective, seq len, documents
MAX_STEPS = 100  # timed + warm-up steps per row: the script is sized for one short session
ATTN = ["sdpa", "eager", "flash_attention_2", "ablate_sdpa"]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default=None,
        help="a local ModernBERT folder, or config:NAME (default: config:modernbert-base, random init; "
        "config:tiny-modernbert with --tiny)",
    )
    ap.add_argument("--tokenizer", default=None, help="default: the model folder's, else bench/tokenizer")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=None, help="default 8192 1024 (64 128 with --tiny)")
    ap.add_argument(
        "--tokens-per-step",
        type=int,
        default=None,
        help="global batch in tokens; batch = this / seq len (default 32768; 256 with --tiny)",
    )
    ap.add_argument("--objectives", nargs="+", default=["mlm", "clm"], choices=["mlm", "clm"])
    ap.add_argument("--recipes", nargs="+", default=["ablate", "trainer"], choices=["ablate", "trainer"])
    ap.add_argument(
        "--documents",
        nargs="+",
        default=["off", "on"],
        choices=["off", "on"],
        help="ablate rows without and with document masking (the Trainer recipe has none)",
    )
    ap.add_argument("--mask-rate", type=float, default=0.3, help="MLM masking rate of both recipes (the grids')")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 2 with --tiny)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; 1 with --tiny)")
    ap.add_argument(
        "--attn",
        default="sdpa",
        choices=ATTN,
        help="attention implementation: flash_attention_2 only for MLM (CLM needs a mask); ablate_sdpa "
        "= ablate.models.attention (ablate: sdpa where the family runs it under sdpa; trainer: "
        "the model switched to it)",
    )
    ap.add_argument(
        "--precision", default="bf16", choices=["bf16", "fp32"], help="bf16 autocast (default) or fp32"
    )
    ap.add_argument(
        "--compile", action="store_true", help="torch.compile (ablate: the encoder; Trainer: the model)"
    )
    ap.add_argument(
        "--deterministic", action="store_true", help="deterministic algorithms, as `deterministic: true`"
    )
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="accelerator peak, bf16 dense")
    ap.add_argument(
        "--reference-tokens-per-s",
        type=float,
        default=RECIPE_TOKENS_PER_S,
        help="the recipe's tokens/s per GPU the rows are compared with (default 300000, per H100)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start a row only while it fits (its "
        "--row-budget-s) in what is left of this (default 260; 3600 with --tiny)",
    )
    ap.add_argument(
        "--row-budget-s",
        type=float,
        default=None,
        help="seconds one row may take: it stops timing steps past it (default 40; 600 with --tiny)",
    )
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--json", default=None, help="also write the result object to this file")
    ap.add_argument(
        "--predict-memory",
        action="store_true",
        help="each ablate row also gets the peak "
        "ablate.launch.gpu_memory predicts on the meta device (predicted_mem_gb; a minute per row "
        "at 8192 tokens on a few cores, outside the row budgets)",
    )
    ap.add_argument("--tiny", action="store_true", help="tiny model and sizes (smoke check)")
    ap.add_argument("--allow-cpu", action="store_true", help="run on CPU (only with --tiny makes sense)")
    args = ap.parse_args(argv)
    args.model = args.model or ("config:tiny-modernbert" if args.tiny else "config:modernbert-base")
    args.seq_lens = args.seq_lens or ([64, 128] if args.tiny else [8192, 1024])
    args.tokens_per_step = args.tokens_per_step or (256 if args.tiny else 32768)
    args.steps = args.steps if args.steps is not None else (2 if args.tiny else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    args.budget_s = args.budget_s if args.budget_s is not None else (3600.0 if args.tiny else 260.0)
    args.row_budget_s = args.row_budget_s if args.row_budget_s is not None else (600.0 if args.tiny else 40.0)
    if not 0 < args.mask_rate < 1:
        ap.error("--mask-rate must be in (0, 1)")
    if args.steps < 1 or args.warmup < 0 or args.steps + args.warmup > MAX_STEPS:
        ap.error(f"--steps (at least 1) and --warmup add up to at most {MAX_STEPS}")
    return args


# ---------------------------------------------------------------- the rows


def plan_rows(args) -> list[Row]:
    """The rows in the order they run: per sequence length and objective, ablate without documents (the
    headline first), the Trainer recipe, then ablate with documents."""
    rows = []
    for seq_len in args.seq_lens:
        for objective in args.objectives:
            for recipe in args.recipes:
                for docs in [d == "on" for d in args.documents] if recipe == "ablate" else [None]:
                    rows.append(Row(recipe, objective, seq_len, docs))
    order = {(False, "ablate"): 0, (None, "trainer"): 1, (True, "ablate"): 2}
    return sorted(
        rows,
        key=lambda r: (
            args.seq_lens.index(r.seq_len),
            args.objectives.index(r.objective),
            order[(r.documents, r.recipe)],
        ),
    )


def _line(row: dict) -> str:
    docs = {True: "docs", False: "    ", None: "    "}[row["documents"]]
    head = f"{row['recipe']:8s} {row['objective']} {docs} L={row['seq_len']:<5d} B={row['batch']:<3d} "
    if row["status"] != "ok":
        return head + row["status"]
    return head + (
        f"{row['tokens_per_s']:>12,.0f} tok/s ({row['vs_reference']:.2f}x the reference)  "
        f"MFU {row['mfu']:.1%}  peak {row['peak_mem_gb']} GB"
        + (f" (predicted {row['predicted_mem_gb']} GB)" if "predicted_mem_gb" in row else "")
        + (f"  mask {row['mask']}" if "mask" in row else "")
    )


def _headline(rows: list[dict], args, device_name: str) -> str:
    """The row the script exists for: ablate's MLM step at 8192 against the recipe's tokens/s."""
    found = [r for r in rows if (r["recipe"], r["objective"], r["seq_len"], r["documents"]) == HEADLINE]
    what = f"ablate mlm at 8192, {args.precision}, {args.model} on {device_name}"
    if not found:
        return (
            f"headline ({what}): not run (give --seq-lens 8192 --objectives mlm --recipes ablate --documents off)"
        )
    row = found[0]
    if row["status"] != "ok":
        return f"headline ({what}): {row['status']}"
    return (
        f"headline ({what}): {row['tokens_per_s']:,.0f} tokens/s = {row['vs_reference']:.2f}x the recipe's "
        f"{args.reference_tokens_per_s:,.0f} tokens/s per H100; MFU {row['mfu']:.1%} of {args.peak_tflops:g} "
        "TFLOP/s"
    )


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "bench/gpu_step.py needs a CUDA GPU (none is visible here); for a CPU smoke check of the code "
            "path: python bench/gpu_step.py --allow-cpu --tiny",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    result = {
        "device": device_name,
        "model": args.model,
        "attn": args.attn,
        "precision": args.precision,
        "compile": args.compile,
        "deterministic": args.deterministic,
        "mask_rate": args.mask_rate,
        "peak_tflops": args.peak_tflops,
        "reference_tokens_per_s": args.reference_tokens_per_s,
        "steps": args.steps,
        "warmup": args.warmup,
        "budget_s": args.budget_s,
        "row_budget_s": args.row_budget_s,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "rows": [],
        "headline": None,
    }
    try:
        tokenizer = _prepare(args)
    except Exception as err:  # a bad --tokenizer or --model: said in the JSON, as a row's error is
        result["error"] = _error(err)
        tokenizer = None
    for row in plan_rows(args):
        batch = max(1, args.tokens_per_step // row.seq_len)
        if tokenizer is None:
            result["rows"].append(status_row(row, batch, "skipped: " + result["error"]))
        else:
            result["rows"].append(_one_row(args, row, batch, tokenizer, device, started))
        print(_line(result["rows"][-1]), flush=True)
        _write(result, args, started)  # after each row: a crash later still leaves the rows done
    result["headline"] = _headline(result["rows"], args, device_name)
    print(result["headline"], flush=True)
    _write(result, args, started)
    print(json.dumps(result))
    return 0


def _prepare(args):
    """Determinism, the attention registration and the tokenizer, before the first row."""
    from ablate.models.sources import load_tokenizer, resolve_source
    from ablate.train.precision import set_determinism

    set_determinism(args.deterministic)  # before anything touches the GPU (cuBLAS reads its workspace)
    if args.attn == "ablate_sdpa":
        from ablate.models import attention  # noqa: F401  (registers the implementation with transformers)
    if args.tokenizer is None:
        kind, loc = resolve_source(args.model)
        args.tokenizer = (
            args.model if kind == "dir" and (Path(loc) / "tokenizer_config.json").is_file() else DEFAULT_TOKENIZER
        )
    return load_tokenizer(args.tokenizer)


def _write(result: dict, args, started: float) -> None:
    result["wall_s"] = round(time.monotonic() - started, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def _error(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"error: {type(err).__name__}: {text[0][:300] if text else ''}"


def _one_row(args, row: Row, batch: int, tokenizer, device, started: float) -> dict:
    import torch

    elapsed = time.monotonic() - started
    if elapsed + args.row_budget_s > args.budget_s:
        return status_row(
            row,
            batch,
            f"skipped: a row's {args.row_budget_s:g} s do not fit in what is left of "
            f"--budget-s {args.budget_s:g} ({elapsed:.0f} s spent)",
        )
    if row.objective == "clm" and args.attn == "flash_attention_2":
        return status_row(row, batch, "skipped: flash_attention_2 takes no causal 4D mask")
    run = run_ablate if row.recipe == "ablate" else run_trainer
    try:
        out = run(args, row, batch, tokenizer, device)
    except torch.cuda.OutOfMemoryError:
        out = status_row(row, batch, "oom", peak_mem_gb=peak_gb(device))
    except Exception as err:  # SpecError, a kernel without a deterministic version, ...: the next rows still run
        out = status_row(row, batch, _error(err))
    out["row_s"] = round(time.monotonic() - started - elapsed, 1)
    reset_memory(device)
    return out


if __name__ == "__main__":
    sys.exit(main())

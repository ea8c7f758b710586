"""The GPU check: ablate's pretraining step on one GPU, what it runs and how fast, in one prepared process.

    python bench/gpu_check.py --json $OUT/gpu_check.json   # on a GPU node (bench/GPU_NODE.md): at most 8 minutes
    python bench/gpu_check.py --allow-cpu --tiny            # the CPU smoke check the suite runs (tiny model)

ModernBERT-base sized (ablate/models/configs/modernbert-base.json, random init), bf16, random tokens in
documents of 512, or of the lengths of a corpus's documents (--documents-corpus, default corpus_en_e3c: drawn,
seeded, from bench/document_lengths.json and packed into rows as a prepared corpus is). Rows, in order of
value; a row starts only if its --row-budget-s fits in what is left of --budget-s (else it is reported
skipped), and the JSON is rewritten after each row. A row runs under a hard limit (its budget and 20 s,
SIGALRM): a compile that would not end is stopped there and the row reported "stopped"; a compiled row is
skipped when the last compiled row's compile and steps, scaled to its tokens, do not fit in what is left:

 0 environment  versions; SDPA's priority order (torch's own, and a step's: ablate.models.attention's
                sdpa_priority); the kernel CUDA picks for each attention shape of a step; the rate of an
                8192^3 bf16 matmul (the measured peak the MFUs are also given against)
 1 baseline     the step as it ran before this check's changes (bench/gpu_recipes.py todays_step: eager, the
                CPU's attention paths on CUDA, a 512-position head, per-parameter norms), MLM 8192 x 4:
                timed, then profiled by kernel class (attention, matmul, pointwise, head, optimizer, idle)
 2 kernels      one ModernBERT-base layer's attention (8192 tokens, 12 heads of 64), forward + backward, per
                kernel (flash varlen windowed / per document of 512 or of the corpus's lengths, cuDNN, flash,
                today's blocked path) against a float32 reference: the largest error of the output and of
                each gradient, and the time (the kernels timed in rounds, each once a round, the order
                reversed from one round to the next)
 3 step         the step as a run takes it (blocks compiled, flash varlen, cuDNN first, the GPU head, norms in
                one pass): MLM, CLM, MLM with documents of 512 and MLM with the corpus's documents at 8192 x 4
 4 batch        MLM 8192 x 8 and x 16
 5 short        MLM and CLM 1024 x 32
 6 trainer      the transformers Trainer recipe (its collator, the model's own loss, eager): MLM 1024 x 32 and
                8192 x 4
 7 cache        the compile cache saved (ablate.train.compiled.save_cache), what the node's next run loads

Each step row runs a pool of --warmup micro-batches once each, untimed, then --steps timed steps cycling over
the same pool (bench/gpu_recipes.py: no timed step meets a shape first; `steps_order` lists them), each row
with a reset compiler (its graphs its own). It reports: tokens/s (median, min and max over the timed steps,
--steps unless its budget ran out); compile_s, apart (the warm-up's seconds beyond its steps at the steady
step time: compiling, kernel plans, allocator growth) with the block graphs compiled and any eager fallback;
executed and nominal TFLOP/s (ablate.plan.flops over the row's own documents: executed counts what the step
computes, the Trainer's head at every position and its masked attention at every pair; nominal the
convention MFU figures quote); MFU against the device's peak (`peak`: the datasheet's dense bf16 for the
device's name, else row 0's measured matmul rate, or --peak-tflops; the JSON names which) and against row 0's
rate; peak memory (max_memory_allocated over the timed steps) beside the memory plan's prediction
(ablate.predict.gpu_memory, the eager step traced on the meta device in worker processes while the GPU runs;
`memory_compared` says whether the measured run was compiled or eager), and the first step's loss (seed 0).
At the end, `goals` compares the rows with the issue's goals (>= 360k tokens/s with the corpus's documents,
>= 1.2x the ModernBERT recipe's executed TFLOP/s without, CLM >= MLM, memory within 2% of the prediction:
judged on eager runs only, the eager trace being an upper bound of a compiled run's).

It needs this repository, the node's torch and transformers and the wheels bench/GPU_NODE.md names. Exit 2
without a CUDA GPU unless --allow-cpu (then the same code on the CPU: only a check that it runs).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import platform
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import gpu_recipes  # noqa: E402

DEFAULT_TOKENIZER = str(REPO / "bench" / "tokenizer")  # the MiniLM vocabulary alone (no weights)
# Dense bf16 tensor TFLOP/s per device, by the name torch.cuda.get_device_name gives: the vendor datasheets
# quote them with 2:4 sparsity, dense is half. H100 SXM: 1,979 sparse (NVIDIA H100 Tensor Core GPU datasheet;
# 989.4 = 132 SMs x 4 tensor cores x 1024 bf16 FLOP/clock x 1.83 GHz, glennklockwood.com/garden/processors/h100);
# H100 PCIe: 1,513 sparse (same datasheet); H200 (SXM): 1,979 sparse, H100 SXM's compute (NVIDIA H200
# datasheet, 2023); A100 40 and 80 GB, SXM and PCIe: 312 dense, 624 sparse (NVIDIA A100 datasheet,
# nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf); L40S: 362.05 dense, 733 sparse (NVIDIA L40S datasheet).
# A name not matched here (H100 NVL, H200 NVL, GH200, ...) takes row 0's measured rate.
DATASHEET_PEAKS = (
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 756.0),
    (r"\bH100\b(?!.*\b(NVL|PCIe)\b)", "H100 SXM", 989.4),
    (r"\bH200\b(?!.*\bNVL\b)", "H200", 989.4),
    (r"\bA100\b", "A100", 312.0),
    (r"\bL40S\b", "L40S", 362.05),
)
GRACE_S = 20.0  # a row's hard limit past its budget (its own checks end it at the budget between steps)
# ModernBERT's report (Warner et al. 2024): ~300k tokens/s per H100 for ModernBERT-base, which at the step's
# own FLOPs (ablate.plan.flops, 8192 tokens, attention across documents) executes about 255 TFLOP/s
RECIPE_TOKENS_PER_S = 300_000
RECIPE_EXECUTED_TFLOPS = 255.0
GOALS = {"documents_tokens_per_s": 360_000, "executed_vs_recipe": 1.2, "memory_error": 0.02}
GiB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default config:modernbert-base (config:tiny-modernbert --tiny)")
    ap.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    ap.add_argument("--rows", type=int, nargs="+", default=list(range(8)), help="which rows (0-7) to run")
    ap.add_argument("--steps", type=int, default=None, help="timed steps a row (default 8; 2 with --tiny)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; 1 with --tiny)")
    ap.add_argument("--budget-s", type=float, default=None, help="the whole check (default 420; 3600 --tiny)")
    ap.add_argument("--row-budget-s", type=float, default=None, help="one row at most (default 60; 600 --tiny)")
    ap.add_argument("--no-compile", action="store_true", help="row 3-5 eager (default: compiled on CUDA)")
    ap.add_argument("--deterministic", action="store_true", help="deterministic algorithms in every ablate row")
    ap.add_argument("--peak-tflops", type=float, default=None, help="default: the device's datasheet, else row 0")
    ap.add_argument("--documents-corpus", default="corpus_en_e3c", help="row 3's corpus (document_lengths.json)")
    ap.add_argument("--cache-dir", default=None, help="compile cache folder (default: beside --json)")
    ap.add_argument("--json", default=None, help="write the result object here after each row")
    ap.add_argument("--tiny", action="store_true", help="tiny model and sizes (a smoke check)")
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU (with --tiny)")
    args = ap.parse_args(argv)
    args.model = args.model or ("config:tiny-modernbert" if args.tiny else "config:modernbert-base")
    args.steps = args.steps if args.steps is not None else (2 if args.tiny else 8)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    args.budget_s = args.budget_s if args.budget_s is not None else (3600.0 if args.tiny else 420.0)
    args.row_budget_s = args.row_budget_s if args.row_budget_s is not None else (600.0 if args.tiny else 60.0)
    args.long, args.short = (64, 32) if args.tiny else (8192, 1024)
    args.short_batch = 8 if args.tiny else 32  # the tiny run: the same code, a quarter of its CPU seconds
    if args.warmup < 1:
        ap.error(f"--warmup {args.warmup}: at least 1 (the pool of micro-batches every timed step was warmed on)")
    try:
        gpu_recipes.corpus_percentiles(args.documents_corpus)
    except ValueError as error:
        ap.error(f"--documents-corpus: {error}")
    return args


def device_peak(name: str, args, measured_tflops: float | None) -> dict:
    """The peak the MFUs are given against: --peak-tflops, else the datasheet's for the device's name, else
    row 0's measured bf16 matmul rate (None when row 0 did not run)."""
    if args.peak_tflops is not None:
        return {"tflops": args.peak_tflops, "source": "given: --peak-tflops"}
    for pattern, device, tflops in DATASHEET_PEAKS:
        if re.search(pattern, name, re.IGNORECASE):
            return {"tflops": tflops, "source": f"datasheet: {device}, dense bf16"}
    if measured_tflops:
        return {"tflops": measured_tflops, "source": f"measured: row 0's matmul ({name!r} has no datasheet entry)"}
    return {"tflops": None, "source": f"none: {name!r} has no datasheet entry and row 0 did not run"}


# ---------------------------------------------------------------- the plan of rows


def step_rows(args) -> list[dict]:
    """(row, name, recipe, objective, seq_len, micro_batch, documents) of every timed row, in order."""
    long, short, many = args.long, args.short, args.short_batch
    rows = [dict(row=1, name="baseline", recipe="today", objective="mlm", seq_len=long, micro_batch=4)]
    fixed, corpus = f"fixed {gpu_recipes.doc_tokens(long)}", args.documents_corpus
    rows += [
        dict(row=3, name="step", recipe="ablate", objective=o, seq_len=long, micro_batch=4, documents=d)
        for o, d in (("mlm", None), ("clm", None), ("mlm", fixed), ("mlm", corpus))
    ]
    rows += [
        dict(row=4, name="batch", recipe="ablate", objective="mlm", seq_len=long, micro_batch=b) for b in (8, 16)
    ]
    rows += [
        dict(row=5, name="short", recipe="ablate", objective=o, seq_len=short, micro_batch=many)
        for o in ("mlm", "clm")
    ]
    rows += [
        dict(row=6, name="trainer", recipe="trainer", objective="mlm", seq_len=n, micro_batch=b)
        for n, b in ((short, many), (long, 4))
    ]
    for row in rows:  # documents: None (attention across the row), "fixed N" or the corpus of their lengths
        row.setdefault("documents", None)
    return [r for r in rows if r["row"] in args.rows]


def spec_of(args, row: dict, device):
    today = row["recipe"] == "today"
    return gpu_recipes.ablate_spec(
        args.model,
        args.tokenizer,
        row["objective"],
        row["seq_len"],
        row["micro_batch"],
        args.warmup + args.steps,
        device=device.type,
        precision="bf16",
        compile=False if today or args.no_compile else "auto",
        deterministic=args.deterministic,
        document_masking=row["documents"] is not None,
    )


def predicted_bytes(spec) -> int:
    """The memory plan's traced peak of the step (allocated bytes, as max_memory_allocated counts them)."""
    from ablate.predict import gpu_memory

    return gpu_memory.phase_memory(spec, spec.batch_size)[0].traced


# ---------------------------------------------------------------- rows 0, 1 (profile), 2 and 7


def environment(device) -> dict:
    import torch
    import transformers

    from ablate.models import attention, varlen

    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "varlen_available": varlen.AVAILABLE,  # flash variable length with windows
        "sdpa_priority_default": _priority_names(),
    }
    with attention.sdpa_priority():
        out["sdpa_priority_step"] = _priority_names()
        out["kernels"] = {name: _chosen(device, *shape) for name, shape in _attention_shapes(device).items()}
    with attention.sdpa_priority(deterministic=True):
        out["sdpa_priority_deterministic"] = _priority_names()
    out["matmul_tflops"] = _matmul_rate(device, 512 if device.type == "cpu" else 8192)
    return out


def _priority_names() -> list[str]:
    import torch

    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
    return [names.get(int(b), str(b)) for b in torch._C._get_sdp_priority_order()]


def _attention_shapes(device) -> dict:
    """A step's global-layer SDPA calls (local layers and documents take flash varlen: not SDPA)."""
    length = 8192 if device.type == "cuda" else 64
    return {"global mlm": (length, False), "global clm": (length, True)}


def _chosen(device, length: int, causal: bool) -> str:
    import torch

    if device.type != "cuda":
        return "cpu"
    q = torch.empty(1, 12, length, 64, device=device, dtype=torch.bfloat16)
    backend = torch._fused_sdp_choice(q, q, q, None, 0.0, causal)
    return {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}.get(int(backend), str(backend))


def _matmul_rate(device, n: int) -> float:
    import torch

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in "ab")
    times = []
    for _ in range(12):
        gpu_recipes.sync(device)
        t0 = time.perf_counter()
        a @ b
        gpu_recipes.sync(device)
        times.append(time.perf_counter() - t0)
    return round(2 * n**3 / statistics.median(times[2:]) / 1e12, 2)


CLASSES = ("attention", "matmul", "pointwise", "head", "optimizer")


def kernel_classes(prof, steps: int) -> dict:
    """Device seconds a step spends per kernel class, from the CPU ops that launched the kernels (on the CPU:
    the leaf ops' CPU seconds): attention
    (SDPA, flash, FlexAttention kernels), head (inside the fused vocabulary loss), optimizer (AdamW, norms,
    clipping), matmul (mm, addmm, bmm), pointwise (the rest); idle: the step's wall time the device was not
    busy."""
    seconds = dict.fromkeys(CLASSES, 0.0)
    device_time = any(getattr(e, "self_device_time_total", 0) for e in prof.events())
    for event in prof.events():
        # on the CPU (the smoke check) the ops' own CPU time stands in for their kernels'
        own = event.self_device_time_total if device_time else event.self_cpu_time_total
        if own and (device_time or not event.cpu_children):
            seconds[_class_of(event)] += own / 1e6
    return {k: round(v / steps, 5) for k, v in seconds.items()}


def _class_of(event) -> str:
    names = []
    while event is not None:
        names.append(event.name.lower())
        event = event.cpu_parent
    joined = " ".join(names)
    if "_fusedcrossentropy" in joined or "softmax_tail" in joined:
        return "head"
    if any(k in joined for k in ("optimizer", "adam", "foreach", "vector_norm", "clip_grad")):
        return "optimizer"
    if any(k in names[0] for k in ("attention", "flash", "varlen", "flex", "cudnn_attn")):
        return "attention"
    if any(k in names[0] for k in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")):
        return "matmul"
    return "pointwise"


def kernel_rows(args, device) -> list[dict]:
    """One layer's attention, forward + backward, per kernel, against a float32 reference."""
    import torch

    from ablate.models import attention, varlen

    length, heads, dim, window = (args.long, 12, 64, 64) if not args.tiny else (args.long, 2, 16, 8)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, dim, device=device, generator=generator) for _ in "qkv")
    grad = torch.randn(1, length, heads, dim, device=device, generator=generator)
    size = gpu_recipes.doc_tokens(length)
    spans = tuple((s, min(s + size, length)) for s in range(0, length, size))
    docs = varlen.segments(varlen.offsets((spans,), length), length, device)
    packed = gpu_recipes.packed_documents(1, length, args.documents_corpus, seed=1)
    corpus = varlen.segments(varlen.offsets(attention.document_spans(packed), length), length, device)
    rows_ = varlen.row_segments(1, length, device)
    scale = dim**-0.5
    sdpa = torch.nn.functional.scaled_dot_product_attention
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cases = {
        "varlen local mlm (64, 64)": (lambda a, b, c: varlen.attend(a, b, c, rows_, window, False, scale), rows_, (window, window)),
        "varlen local clm (64, 0)": (lambda a, b, c: varlen.attend(a, b, c, rows_, window, True, scale), rows_, (window, 0)),
        "varlen documents mlm": (lambda a, b, c: varlen.attend(a, b, c, docs, None, False, scale), docs, (-1, -1)),
        "varlen documents clm": (lambda a, b, c: varlen.attend(a, b, c, docs, None, True, scale), docs, (-1, 0)),
        f"varlen {args.documents_corpus} documents mlm": (lambda a, b, c: varlen.attend(a, b, c, corpus, None, False, scale), corpus, (-1, -1)),
        "banded local mlm (today)": (
            lambda a, b, c: attention.banded(a, b, c, window, False, None, None, 0.0, scale).transpose(1, 2),
            rows_, (window, window),
        ),
    }  # fmt: skip
    for backend, label in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
        for causal in (False, True):
            name = f"sdpa {label} global {'clm' if causal else 'mlm'}"

            def run(a, b, c, backend=backend, causal=causal):
                with sdpa_kernel([backend]):
                    return sdpa(a, b, c, is_causal=causal, scale=scale).transpose(1, 2)

            cases[name] = (run, rows_, (-1, 0) if causal else (-1, -1))
    out, checked = [], {}
    for name, (compute, parts, sides) in cases.items():
        if device.type != "cuda" and name.startswith(("varlen", "sdpa")):
            out.append({"row": 2, "name": "kernels", "kernel": name, "status": "skipped: CUDA kernels"})
            continue
        try:  # the errors, from the kernel's first (untimed) call
            row = {
                "row": 2,
                "name": "kernels",
                "kernel": name,
                **_kernel_errors(compute, (q, k, v), grad, parts, sides, scale, dtype),
            }
            checked[name] = compute
        except Exception as error:  # a backend this GPU or torch lacks: said in the row
            row = {"row": 2, "name": "kernels", "kernel": name, "status": _error(error)}
        out.append(row)
    times = _interleaved_times(checked, (q, k, v), grad, dtype, device)
    for row in out:
        if row["kernel"] in times:
            row["fwd_bwd_ms"] = round(1000 * statistics.median(times[row["kernel"]]), 3)
    return out


def _forward_backward(fn, tensors, grad, cast):
    leaves = [t.detach().to(cast).requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(grad.to(cast))
    return out.detach().float(), [t.grad.float() for t in leaves]


def _kernel_errors(compute, inputs, grad, parts, sides, scale, dtype) -> dict:
    """The kernel's largest relative error against varlen.reference in float32, of the output and of each
    gradient."""
    import torch

    from ablate.models import varlen

    def reference(a, b, c):
        flat = [t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (a, b, c)]
        out, _lse = varlen.reference(*flat, parts.cu_seqlens, sides, scale)
        return out.view(a.shape[0], a.shape[2], a.shape[1], a.shape[3])

    want, want_grads = _forward_backward(reference, inputs, grad, torch.float32)
    got, got_grads = _forward_backward(compute, inputs, grad, dtype)

    def error(a, b):
        return round(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)), 5)

    return {
        "max_rel_error_out": error(got, want),
        "max_rel_error_grads": [error(g, w) for g, w in zip(got_grads, want_grads)],
        "status": "ok",
    }


def _interleaved_times(kernels: dict, inputs, grad, dtype, device, rounds: int = 5) -> dict:
    """Each kernel's forward + backward seconds over `rounds` rounds, every kernel once a round, the order
    of a round reversed from the last (each was warmed by its error check); one that fails is left out."""
    times = {name: [] for name in kernels}
    for n in range(rounds):
        for name in [k for k in kernels if k in times][:: -1 if n % 2 else 1]:
            gpu_recipes.sync(device)
            t0 = time.perf_counter()
            try:
                _forward_backward(kernels[name], inputs, grad, dtype)
            except Exception:  # a kernel that failed once timed: left untimed
                del times[name]
                continue
            gpu_recipes.sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------- timed rows


def timed_row(args, row: dict, tokenizer, device, budget_s: float) -> dict:
    from ablate.plan import flops

    started = time.monotonic()
    if row["recipe"] == "trainer":
        measured = gpu_recipes.run_trainer(
            args.model, tokenizer, row["objective"], row["seq_len"], row["micro_batch"], device,
            args.warmup, args.steps, budget_s,
        )  # fmt: skip
    else:
        spec = spec_of(args, row, device)
        corpus = row["documents"] if row["documents"] not in (None, _fixed(row)) else None
        measured = gpu_recipes.run_ablate(
            spec, tokenizer, device, args.warmup, args.steps, budget_s, today=row["recipe"] == "today",
            corpus=corpus,
        )  # fmt: skip
    compiled = {
        "graphs_compiled": measured.graphs,
        "compile_fallbacks": measured.fallbacks,
        "warmup_s": [round(t, 4) for t in measured.warmup_s],
        "steps_order": [list(step) for step in measured.order],
        "row_s": round(time.monotonic() - started, 1),
    }
    if measured.stopped or not measured.step_s:
        return {**row, **compiled, "status": f"skipped: {measured.stopped or 'no step was timed'}"}
    from ablate.models.loading import load_config

    config = nominal_config = load_config(args.model)
    if row["recipe"] == "trainer":  # SDPA with the sliding-window mask scores every pair in every layer
        config = copy.deepcopy(config)
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    batches = measured.documents or [None]
    counted = [
        flops.step_flops(
            config, row["seq_len"], row["micro_batch"], row["objective"] == "clm", measured.labelled, docs
        )
        for docs in batches
    ]
    timed = [index for phase, index in measured.order if phase == "timed"]
    executed = statistics.fmean(counted[i % len(counted)].executed for i in timed)
    nominal = flops.step_flops(
        nominal_config, row["seq_len"], row["micro_batch"], False, 0
    ).nominal  # the convention
    tokens = row["seq_len"] * row["micro_batch"]
    rates = [tokens / s for s in measured.step_s]
    median = statistics.median(rates)
    step_s = tokens / median
    out = {
        **row,
        "device": str(device),
        "timed_steps": len(rates),
        "tokens_per_s": round(median, 1),
        "tokens_per_s_min": round(min(rates), 1),
        "tokens_per_s_max": round(max(rates), 1),
        "step_s": round(step_s, 5),
        "compile_s": gpu_recipes.first_time_s(measured.warmup_s, measured.step_s),
        **compiled,
        "tflops_executed": round(executed / step_s / 1e12, 2),
        "tflops_nominal": round(nominal / step_s / 1e12, 2),
        "executed_flops_per_token": round(executed / tokens),
        "nominal_flops_per_token": round(nominal / tokens),
        "peak_memory_gb": None if measured.peak_bytes is None else round(measured.peak_bytes / GiB, 3),
        "first_loss": round(measured.first_loss, 4),
        "status": "ok",
    }
    if measured.documents:
        counts = [len(lengths) for batch in measured.documents for lengths in batch]
        out["documents_per_row"] = {"min": min(counts), "median": statistics.median(counts), "max": max(counts)}
    if measured.compile_log:
        out["compile_log"] = measured.compile_log
    return out


def _fixed(row: dict) -> str:
    return f"fixed {gpu_recipes.doc_tokens(row['seq_len'])}"


def memory_compared(row: dict, args, device) -> str | None:
    """Which two things a row's memory columns set side by side."""
    if row["recipe"] != "ablate":
        return None
    run = (
        "compiled run (blocks compiled: the trace should bound it)"
        if _compiles(args, row, device)
        else "eager run"
    )
    return f"eager step traced on the meta device (ablate.predict.gpu_memory) vs this {run}"


def with_rates(row: dict, peak: dict, measured_tflops: float | None) -> dict:
    """The row's MFU against the device's peak (`peak`: its value and where it comes from) and the measured
    matmul rate."""
    if row.get("status") != "ok" or "tflops_nominal" not in row:
        return row
    if peak["tflops"]:
        row["peak_tflops"], row["peak_source"] = peak["tflops"], peak["source"]
        row["mfu_peak"] = round(row["tflops_nominal"] / peak["tflops"], 4)
        row["executed_vs_peak"] = round(row["tflops_executed"] / peak["tflops"], 4)
    if measured_tflops:
        row["mfu_measured"] = round(row["tflops_nominal"] / measured_tflops, 4)
        row["executed_vs_measured"] = round(row["tflops_executed"] / measured_tflops, 4)
    return row


def goals(rows: list[dict], args) -> dict:
    """The issue's goals, read off the rows (None where a row did not run)."""

    def find(**want):
        found = [r for r in rows if r.get("status") == "ok" and all(r.get(k) == v for k, v in want.items())]
        return found[0] if found else None

    docs = find(row=3, objective="mlm", documents=args.documents_corpus)
    fixed = find(row=3, objective="mlm", documents=f"fixed {gpu_recipes.doc_tokens(args.long)}")
    mlm, clm = find(row=3, objective="mlm", documents=None), find(row=3, objective="clm", documents=None)
    memory = [
        (abs(r["peak_memory_gb"] - r["predicted_memory_gb"]) / r["peak_memory_gb"], r["memory_compared"])
        for r in rows
        if r.get("status") == "ok" and r.get("peak_memory_gb") and r.get("predicted_memory_gb")
    ]
    eager = [error for error, compared in memory if "eager run" in compared]
    bounded = [
        r["predicted_memory_gb"] >= r["peak_memory_gb"]
        for r in rows
        if r.get("status") == "ok" and r.get("peak_memory_gb") and r.get("predicted_memory_gb")
        and "compiled run" in r["memory_compared"]
    ]  # fmt: skip
    return {
        "documents_tokens_per_s": docs and docs["tokens_per_s"],
        "documents_row": args.documents_corpus,
        "documents_goal_met": docs and docs["tokens_per_s"] >= GOALS["documents_tokens_per_s"],
        "fixed_documents_tokens_per_s": fixed and fixed["tokens_per_s"],
        "executed_vs_recipe": mlm and round(mlm["tflops_executed"] / RECIPE_EXECUTED_TFLOPS, 3),
        "executed_goal_met": mlm
        and mlm["tflops_executed"] >= GOALS["executed_vs_recipe"] * RECIPE_EXECUTED_TFLOPS,
        "clm_over_mlm": mlm and clm and round(clm["tokens_per_s"] / mlm["tokens_per_s"], 3),
        "clm_goal_met": mlm and clm and clm["tokens_per_s"] >= mlm["tokens_per_s"],
        "memory_error_max": round(max(e for e, _ in memory), 4) if memory else None,
        "memory_compared": sorted({c for _, c in memory}),
        # the goal compares like with like: the eager trace against eager runs (--no-compile)
        "memory_goal_met": max(eager) <= GOALS["memory_error"] if eager else None,
        "memory_trace_bounds_compiled": all(bounded) if bounded else None,  # the eager trace >= each compiled peak
    }


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("bench/gpu_check.py needs a CUDA GPU; for a CPU smoke check: --allow-cpu --tiny", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from ablate.models.loading import load_tokenizer
    from ablate.train.precision import set_determinism

    set_determinism(args.deterministic)
    tokenizer = load_tokenizer(args.tokenizer)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    result = {"device": name, "model": args.model, "budget_s": args.budget_s, "rows": [], "goals": None}

    def left() -> float:
        return args.budget_s - (time.monotonic() - started)

    def add(row: dict) -> None:
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        _write(result, args, started)

    def limited(row: int, work, name: str, errors: bool = True):
        """work() under the row's hard limit; a row that passes it is reported stopped, one that fails (with
        `errors`) failed: the next rows run."""
        t0 = time.monotonic()
        try:
            with gpu_recipes.time_limit(min(args.row_budget_s, left()) + GRACE_S):
                return work()
        except gpu_recipes.RowTimeout as stop:
            torch._dynamo.reset()  # a compile cut short leaves nothing the next rows reuse
            status = f"stopped: {stop}"
        except Exception as error:
            if not errors:
                raise
            status = "oom" if isinstance(error, torch.cuda.OutOfMemoryError) else _error(error)
        return [{"row": row, "name": name, "status": status, "row_s": round(time.monotonic() - t0, 1)}]

    def kernels_once() -> None:
        if 2 in args.rows and not any(r["row"] == 2 for r in result["rows"]):
            fits = left() >= args.row_budget_s
            done = (
                limited(2, lambda: kernel_rows(args, device), "kernels") if fits else [_skipped(2, left(), args)]
            )
            for kernel in done:
                add(kernel)

    timed = step_rows(args)
    predictions, pool = _predict(args, timed, device)  # on the meta device, in worker processes, meanwhile
    measured_tflops = None
    if 0 in args.rows:
        env = limited(
            0, lambda: [{"row": 0, "name": "environment", **environment(device), "status": "ok"}], "environment"
        )[0]
        measured_tflops = env.get("matmul_tflops")
        add(env)
    result["peak"] = peak = device_peak(name, args, measured_tflops)
    last_compiled = None  # the last compiled row that ran: its compile_s, step_s and tokens
    for row in timed:
        if row["row"] > 2:
            kernels_once()
        budget = min(args.row_budget_s, left())
        predicted = _predicted_s(args, row, last_compiled, device)
        if left() < args.row_budget_s:
            add({**row, **_skipped(row["row"], left(), args)})
            continue
        if predicted is not None and predicted > budget:
            add(
                {
                    **row,
                    "status": f"skipped: the last compiled row's compile and steps predict {predicted:.0f} s "
                    f"for this one, more than the {budget:.0f} s left for it",
                    "predicted_s": round(predicted, 1),
                }
            )
            continue  # fmt: skip
        try:
            out = limited(
                row["row"], lambda: [timed_row(args, row, tokenizer, device, budget)], row["name"], False
            )[0]
            out = {**row, **out}
        except torch.cuda.OutOfMemoryError:
            out = {**row, "status": "oom", "peak_memory_gb": _peak_gb(device)}
        except Exception as error:  # one row's failure (a kernel this GPU lacks, ...): the next rows run
            out = {**row, "status": _error(error)}
        if _compiles(args, row, device) and out["status"] == "ok" and out.get("compile_s") is not None:
            last_compiled = {"compile_s": out["compile_s"], "step_s": out["step_s"], "tokens": _tokens(row)}
        elif _compiles(args, row, device) and out["status"].startswith("stopped"):  # its compile: at least that
            last_compiled = {"compile_s": out["row_s"], "step_s": 0.0, "tokens": _tokens(row)}
        out.setdefault("predicted_memory_gb", None)  # the plan predicts ablate's step only
        out["memory_compared"] = memory_compared(row, args, device)
        future = predictions.get(_key(row)) if out["status"] in ("ok", "oom") else None
        if future is not None:
            try:
                out["predicted_memory_gb"] = round(future.result(timeout=max(min(left(), 30), 1)) / GiB, 3)
            except Exception as error:
                out["predicted_memory_gb"] = None
                out["prediction_error"] = _error(error)
        add(with_rates(out, peak, measured_tflops))
        if row["row"] == 1 and out["status"] == "ok" and left() >= args.row_budget_s:
            add(limited(1, lambda: [_profiled(args, row, tokenizer, device)], "baseline profile")[0])
        gpu_recipes.reset_memory(device)
    kernels_once()
    if 7 in args.rows:
        add(_cache_row(args))
    result["goals"] = goals(result["rows"], args)
    print(json.dumps({"goals": result["goals"]}), flush=True)
    _write(result, args, started)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)  # predictions of rows that did not run: not waited for
    return 0


def _compiles(args, row: dict, device) -> bool:
    return row["recipe"] == "ablate" and not args.no_compile and device.type == "cuda"


def _tokens(row: dict) -> int:
    return row["seq_len"] * row["micro_batch"]


def _predicted_s(args, row: dict, last: dict | None, device) -> float | None:
    """A compiled row's seconds from the last compiled row's: its compile, and its steps scaled to this row's
    tokens (None: no compiled row ran yet, or this row does not compile)."""
    if last is None or not _compiles(args, row, device):
        return None
    steps = (args.warmup + args.steps) * last["step_s"] * _tokens(row) / last["tokens"]
    return last["compile_s"] + steps


def _skipped(row: int, left: float, args) -> dict:
    return {"row": row, "status": f"skipped: {args.row_budget_s:g} s do not fit in the {max(left, 0):.0f} s left"}


def _key(row: dict) -> tuple:
    return row["row"], row["objective"], row["seq_len"], row["micro_batch"], row["documents"]


def _predict(args, rows: list[dict], device) -> tuple[dict, ProcessPoolExecutor | None]:
    """The memory plan's prediction of each ablate row, computed by worker processes on the meta device while
    the GPU runs (on the CPU, in this process when a row asks for it: a skipped row costs nothing)."""
    jobs = {_key(r): spec_of(args, r, device) for r in rows if r["recipe"] == "ablate"}
    if device.type != "cuda":
        return {key: _Deferred(functools.partial(predicted_bytes, spec)) for key, spec in jobs.items()}, None
    import multiprocessing

    pool = ProcessPoolExecutor(
        max_workers=min(4, os.cpu_count() or 1), mp_context=multiprocessing.get_context("spawn")
    )
    return {key: pool.submit(predicted_bytes, spec) for key, spec in jobs.items()}, pool


class _Deferred:
    """A future's result() computed when first asked for, in this process."""

    def __init__(self, compute):
        self.compute = compute

    def result(self, timeout=None):
        return self.compute()


def _profiled(args, row: dict, tokenizer, device) -> dict:
    prof, measured = gpu_recipes.profile_ablate(spec_of(args, row, device), tokenizer, device, steps=2, today=True)
    classes = kernel_classes(prof, 2)
    step = statistics.median(measured.step_s)
    classes["idle"] = round(max(step - sum(classes.values()), 0.0), 5)
    return {
        **row,
        "name": "baseline profile",
        "step_s": round(step, 5),
        "seconds_per_step": classes,
        "status": "ok",
    }


def _cache_row(args) -> dict:
    from ablate.train import compiled

    folder = Path(args.cache_dir or (Path(args.json).parent if args.json else "."), "compile-cache")
    try:
        path = compiled.save_cache(folder)
    except Exception as error:
        return {"row": 7, "name": "cache", "status": _error(error)}
    if path is None:
        return {"row": 7, "name": "cache", "status": "ok", "saved": None}
    return {"row": 7, "name": "cache", "status": "ok", "saved": str(path), "bytes": path.stat().st_size}


def _peak_gb(device):
    bytes_ = gpu_recipes.peak_bytes(device)
    return None if bytes_ is None else round(bytes_ / GiB, 3)


def _write(result: dict, args, started: float) -> None:
    result["wall_s"] = round(time.monotonic() - started, 1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))


def _error(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"error: {type(err).__name__}: {text[0][:300] if text else ''}"


if __name__ == "__main__":
    sys.exit(main())

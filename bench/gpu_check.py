"""The GPU check: ablate's pretraining step on one GPU, what it runs and how fast, in one prepared process.

    python bench/gpu_check.py --json $OUT/gpu_check.json   # on a GPU node (bench/GPU_NODE.md): at most 8 minutes
    python bench/gpu_check.py --allow-cpu --tiny            # the CPU smoke check the suite runs (tiny model)

ModernBERT-base sized (ablate/models/configs/modernbert-base.json, random init), bf16, random tokens in
documents of 512. Rows, in order of value; a row starts only if its --row-budget-s fits in what is left of
--budget-s (else it is reported skipped), and the JSON is rewritten after each row:

 0 environment  versions; SDPA's priority order (torch's own, and a step's: ablate.models.attention's
                sdpa_priority); the kernel CUDA picks for each attention shape of a step; the rate of an
                8192^3 bf16 matmul (the measured peak the MFUs are also given against)
 1 baseline     the step as it ran before this check's changes (bench/gpu_recipes.py todays_step: eager, the
                CPU's attention paths on CUDA, a 512-position head, per-parameter norms), MLM 8192 x 4:
                timed, then profiled by kernel class (attention, matmul, pointwise, head, optimizer, idle)
 2 kernels      one ModernBERT-base layer's attention (8192 tokens, 12 heads of 64), forward + backward, per
                kernel (flash varlen windowed / per document, cuDNN, flash, today's blocked path) against a
                float32 reference: the largest error of the output and of each gradient, and the time
 3 step         the step as a run takes it (blocks compiled, flash varlen, cuDNN first, the GPU head, norms in
                one pass): MLM, CLM and MLM with documents at 8192 x 4
 4 batch        MLM 8192 x 8 and x 16
 5 short        MLM and CLM 1024 x 32
 6 trainer      the transformers Trainer recipe (its collator, the model's own loss, eager): MLM 1024 x 32 and
                8192 x 4
 7 cache        the compile cache saved (ablate.train.compiled.save_cache), what the node's next run loads

Each step row: tokens/s (median, min and max over the timed steps, at least --steps unless its budget ran
out), executed and nominal TFLOP/s (ablate.plan.flops: executed counts what the step computes, nominal the
convention MFU figures quote), MFU against --peak-tflops (the datasheet's dense bf16) and against row 0's
measured rate, peak memory (max_memory_allocated) beside the memory plan's prediction (ablate.predict.gpu_memory,
traced on the meta device in worker processes while the GPU runs), and the first step's loss (seed 0).
At the end, `goals` compares the rows with the issue's goals (>= 360k tokens/s with documents, >= 1.2x the
ModernBERT recipe's executed TFLOP/s without, CLM >= MLM, memory within 2% of the prediction).

It needs this repository, the node's torch and transformers and the wheels bench/GPU_NODE.md names. Exit 2
without a CUDA GPU unless --allow-cpu (then the same code on the CPU: only a check that it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import gpu_recipes  # noqa: E402

DEFAULT_TOKENIZER = str(REPO / "bench" / "tokenizer")  # the MiniLM vocabulary alone (no weights)
DATASHEET_TFLOPS = 989.0  # H100 / H200 SXM, dense bf16
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
    ap.add_argument("--peak-tflops", type=float, default=DATASHEET_TFLOPS)
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
    return args


# ---------------------------------------------------------------- the plan of rows


def step_rows(args) -> list[dict]:
    """(row, name, recipe, objective, seq_len, micro_batch, documents) of every timed row, in order."""
    long, short = args.long, args.short
    rows = [dict(row=1, name="baseline", recipe="today", objective="mlm", seq_len=long, micro_batch=4)]
    rows += [
        dict(row=3, name="step", recipe="ablate", objective=o, seq_len=long, micro_batch=4, documents=d)
        for o, d in (("mlm", False), ("clm", False), ("mlm", True))
    ]
    rows += [
        dict(row=4, name="batch", recipe="ablate", objective="mlm", seq_len=long, micro_batch=b) for b in (8, 16)
    ]
    rows += [
        dict(row=5, name="short", recipe="ablate", objective=o, seq_len=short, micro_batch=32)
        for o in ("mlm", "clm")
    ]
    rows += [
        dict(row=6, name="trainer", recipe="trainer", objective="mlm", seq_len=n, micro_batch=b)
        for n, b in ((short, 32), (long, 4))
    ]
    for row in rows:
        row.setdefault("documents", False)
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
        document_masking=row["documents"],
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
        "varlen_available": varlen.AVAILABLE,
        "varlen_window_size": varlen.HAS_WINDOW,
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
    rows_ = varlen.row_segments(1, length, device)
    scale = dim**-0.5
    sdpa = torch.nn.functional.scaled_dot_product_attention
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cases = {
        "varlen local mlm (64, 64)": (lambda a, b, c: varlen.attend(a, b, c, rows_, window, False, scale), rows_, (window, window)),
        "varlen local clm (64, 0)": (lambda a, b, c: varlen.attend(a, b, c, rows_, window, True, scale), rows_, (window, 0)),
        "varlen documents mlm": (lambda a, b, c: varlen.attend(a, b, c, docs, None, False, scale), docs, (-1, -1)),
        "varlen documents clm": (lambda a, b, c: varlen.attend(a, b, c, docs, None, True, scale), docs, (-1, 0)),
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
    out = []
    for name, (compute, parts, sides) in cases.items():
        if device.type != "cuda" and name.startswith(("varlen", "sdpa")):
            out.append({"row": 2, "name": "kernels", "kernel": name, "status": "skipped: CUDA kernels"})
            continue
        try:
            out.append(
                {
                    "row": 2,
                    "name": "kernels",
                    "kernel": name,
                    **_kernel_check(compute, (q, k, v), grad, parts, sides, scale, dtype, device),
                }
            )
        except Exception as error:  # a backend this GPU or torch lacks: said in the row
            out.append({"row": 2, "name": "kernels", "kernel": name, "status": _error(error)})
    return out


def _kernel_check(compute, inputs, grad, parts, sides, scale, dtype, device) -> dict:
    import torch

    from ablate.models import varlen

    def forward_backward(fn, tensors, cast):
        leaves = [t.detach().to(cast).requires_grad_() for t in tensors]
        out = fn(*leaves)
        out.backward(grad.to(cast))
        return out.detach().float(), [t.grad.float() for t in leaves]

    def reference(a, b, c):
        flat = [t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (a, b, c)]
        out, _lse = varlen.reference(*flat, parts.cu_seqlens, sides, scale)
        return out.view(a.shape[0], a.shape[2], a.shape[1], a.shape[3])

    want, want_grads = forward_backward(reference, inputs, torch.float32)
    got, got_grads = forward_backward(compute, inputs, dtype)
    times = []
    for _ in range(5):
        gpu_recipes.sync(device)
        t0 = time.perf_counter()
        forward_backward(compute, inputs, dtype)
        gpu_recipes.sync(device)
        times.append(time.perf_counter() - t0)

    def error(a, b):
        return round(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)), 5)

    return {
        "max_rel_error_out": error(got, want),
        "max_rel_error_grads": [error(g, w) for g, w in zip(got_grads, want_grads)],
        "fwd_bwd_ms": round(1000 * statistics.median(times[1:]), 3),
        "status": "ok",
    }


# ---------------------------------------------------------------- timed rows


def timed_row(args, row: dict, tokenizer, device, budget_s: float) -> dict:
    from ablate.plan import flops

    if row["recipe"] == "trainer":
        measured = gpu_recipes.run_trainer(
            args.model, tokenizer, row["objective"], row["seq_len"], row["micro_batch"], device,
            args.warmup, args.steps, budget_s,
        )  # fmt: skip
    else:
        spec = spec_of(args, row, device)
        measured = gpu_recipes.run_ablate(
            spec, tokenizer, device, args.warmup, args.steps, budget_s, today=row["recipe"] == "today"
        )
    from ablate.models.loading import load_config

    config = load_config(args.model)
    docs = [gpu_recipes.document_lengths(row["seq_len"])] * row["micro_batch"] if row["documents"] else None
    counted = flops.step_flops(
        config, row["seq_len"], row["micro_batch"], row["objective"] == "clm", measured.labelled, docs
    )
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
        "tflops_executed": round(counted.executed / step_s / 1e12, 2),
        "tflops_nominal": round(counted.nominal / step_s / 1e12, 2),
        "executed_flops_per_token": round(counted.executed / tokens),
        "nominal_flops_per_token": round(counted.nominal / tokens),
        "peak_memory_gb": None if measured.peak_bytes is None else round(measured.peak_bytes / GiB, 3),
        "first_loss": round(measured.first_loss, 4),
        "status": "ok",
    }
    if measured.compile_log:
        out["compile_log"] = measured.compile_log
    return out


def with_rates(row: dict, args, measured_tflops: float | None) -> dict:
    """The row's MFU against the datasheet and the measured matmul rate."""
    if row.get("status") != "ok" or "tflops_nominal" not in row:
        return row
    row["mfu_datasheet"] = round(row["tflops_nominal"] / args.peak_tflops, 4)
    row["executed_vs_datasheet"] = round(row["tflops_executed"] / args.peak_tflops, 4)
    if measured_tflops:
        row["mfu_measured"] = round(row["tflops_nominal"] / measured_tflops, 4)
        row["executed_vs_measured"] = round(row["tflops_executed"] / measured_tflops, 4)
    return row


def goals(rows: list[dict]) -> dict:
    """The issue's goals, read off the rows (None where a row did not run)."""

    def find(**want):
        found = [r for r in rows if r.get("status") == "ok" and all(r.get(k) == v for k, v in want.items())]
        return found[0] if found else None

    docs = find(row=3, objective="mlm", documents=True)
    mlm, clm = find(row=3, objective="mlm", documents=False), find(row=3, objective="clm", documents=False)
    memory = [
        abs(r["peak_memory_gb"] - r["predicted_memory_gb"]) / r["peak_memory_gb"]
        for r in rows
        if r.get("status") == "ok" and r.get("peak_memory_gb") and r.get("predicted_memory_gb")
    ]
    return {
        "documents_tokens_per_s": docs and docs["tokens_per_s"],
        "documents_goal_met": docs and docs["tokens_per_s"] >= GOALS["documents_tokens_per_s"],
        "executed_vs_recipe": mlm and round(mlm["tflops_executed"] / RECIPE_EXECUTED_TFLOPS, 3),
        "executed_goal_met": mlm
        and mlm["tflops_executed"] >= GOALS["executed_vs_recipe"] * RECIPE_EXECUTED_TFLOPS,
        "clm_over_mlm": mlm and clm and round(clm["tokens_per_s"] / mlm["tokens_per_s"], 3),
        "clm_goal_met": mlm and clm and clm["tokens_per_s"] >= mlm["tokens_per_s"],
        "memory_error_max": round(max(memory), 4) if memory else None,
        "memory_goal_met": bool(memory) and max(memory) <= GOALS["memory_error"],
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

    timed = step_rows(args)
    predictions = _predict(args, timed, device)  # on the meta device, in worker processes, meanwhile
    measured_tflops = None
    if 0 in args.rows:
        env = {"row": 0, "name": "environment", **environment(device), "status": "ok"}
        measured_tflops = env["matmul_tflops"]
        add(env)
    for row in timed:
        if row["row"] > 2 and 2 in args.rows and not any(r["row"] == 2 for r in result["rows"]):
            for kernel in (
                kernel_rows(args, device) if left() >= args.row_budget_s else [_skipped(2, left(), args)]
            ):
                add(kernel)
        if left() < args.row_budget_s:
            add({**row, **_skipped(row["row"], left(), args)})
            continue
        try:
            out = timed_row(args, row, tokenizer, device, min(args.row_budget_s, left()))
        except torch.cuda.OutOfMemoryError:
            out = {**row, "status": "oom", "peak_memory_gb": _peak_gb(device)}
        except Exception as error:  # one row's failure (a kernel this GPU lacks, ...): the next rows run
            out = {**row, "status": _error(error)}
        future = predictions.get(_key(row))
        out.setdefault("predicted_memory_gb", None)  # the plan predicts ablate's step only
        if future is not None:
            try:
                out["predicted_memory_gb"] = round(future.result() / GiB, 3)
            except Exception as error:
                out["predicted_memory_gb"] = None
                out["prediction_error"] = _error(error)
        add(with_rates(out, args, measured_tflops))
        if row["row"] == 1 and out["status"] == "ok" and left() >= args.row_budget_s:
            add(_profiled(args, row, tokenizer, device))
        gpu_recipes.reset_memory(device)
    if 7 in args.rows:
        add(_cache_row(args))
    result["goals"] = goals(result["rows"])
    print(json.dumps({"goals": result["goals"]}), flush=True)
    _write(result, args, started)
    return 0


def _skipped(row: int, left: float, args) -> dict:
    return {"row": row, "status": f"skipped: {args.row_budget_s:g} s do not fit in the {max(left, 0):.0f} s left"}


def _key(row: dict) -> tuple:
    return row["row"], row["objective"], row["seq_len"], row["micro_batch"], row["documents"]


def _predict(args, rows: list[dict], device) -> dict:
    """The memory plan's prediction of each ablate row, computed by worker processes on the meta device while
    the GPU runs (on the CPU, in this process: the futures are done at once)."""
    from concurrent.futures import Future

    jobs = {_key(r): spec_of(args, r, device) for r in rows if r["recipe"] == "ablate"}
    if device.type != "cuda":
        done = {}
        for key, spec in jobs.items():
            future: Future = Future()
            try:
                future.set_result(predicted_bytes(spec))
            except Exception as error:
                future.set_exception(error)
            done[key] = future
        return done
    import multiprocessing

    pool = ProcessPoolExecutor(
        max_workers=min(4, os.cpu_count() or 1), mp_context=multiprocessing.get_context("spawn")
    )
    return {key: pool.submit(predicted_bytes, spec) for key, spec in jobs.items()}


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

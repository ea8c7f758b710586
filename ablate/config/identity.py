"""One source of run identity: which RunSpec fields enter which identity, declared once.

- RUN: the run id (the run folder: the same spec trains the same run, whatever the labels or trackers);
- ARM: the training identity, what the runs of two arms or two seeds at one grid point share (the run id
  without the phases and the seed: pairs, layer transplants);
- STEP: branching's computation key, what reaches a training step's numbers bitwise (the phases are compared
  one by one through their objective entries, ablate.plan.branching).

Fields that compute the same function by another route (device, compile, deterministic algorithms, the fused
or dense vocabulary loss: equal up to float rounding) and the probe (its measures land in the checkpoint) are
STEP only. Where tokens are kept (`data.prepared_root`) and the epoch guard (`data.max_epochs`) enter none:
the prepared shards are a pure function of the corpus and the tokenizer, so two runs that differ only there
train the same tokens and are one run, one arm, one computation (before, the training identity kept
prepared_root and so refused to pair such runs).

Fields added after runs existed are dropped at the value that computes what those runs computed
(LATER_DEFAULTS, PHASE_LATER_DEFAULTS), so the ids of older runs stay as they were.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

RUN, ARM, STEP = "run", "arm", "step"
ALL = frozenset({RUN, ARM, STEP})
HOW = frozenset({STEP})
NONE: frozenset = frozenset()

FIELDS: dict[str, frozenset] = {
    "model": ALL,
    "tokenizer": ALL,
    "attn_implementation": ALL,
    "document_masking": ALL,
    "data": ALL,
    "data.prepared_root": NONE,
    "data.max_epochs": NONE,
    "batch_size": ALL,
    "micro_batch_size": ALL,
    "optim": ALL,
    "precision": ALL,
    "seed": frozenset({RUN, STEP}),
    "budget_tokens": frozenset({RUN, ARM}),  # STEP reads the phases' resolved lengths instead
    "phases": frozenset({RUN}),  # STEP: phase by phase (plan.branching)
    "device": HOW,
    "compile": HOW,
    "deterministic": HOW,
    "vocab_loss": HOW,
    "probe": HOW,
    "checkpoint_every": NONE,
    "log_every": NONE,
    "eval": NONE,
    "tracking": NONE,
    "labels": NONE,
    "branching": NONE,
}
LATER_DEFAULTS: dict[str, Any] = {
    "precision": "auto",
    "document_masking": False,
    "data.errors": "strict",
    "data.mixture": None,
    "probe.texts": None,
}
PHASE_LATER_DEFAULTS = ("mask_rate_end", "corruption", "span_length", "mixture", "granularity", "data")  # at None
PHASE_DATA_LATER_DEFAULTS = ("rope_theta", "local_rope_theta")  # keys of a phase's data, at None


def content(dumped: dict, scope: str) -> dict:
    """The part of a RunSpec's JSON dump that enters `scope`, later fields at their old values dropped."""
    out = {}
    for key, value in dumped.items():
        if scope not in FIELDS[key]:
            continue
        if isinstance(value, dict) and key != "labels":
            value = {k: v for k, v in value.items() if scope in FIELDS.get(f"{key}.{k}", ALL)}
        out[key] = value
    for path, default in LATER_DEFAULTS.items():
        head, _, tail = path.partition(".")
        holder, key = (out.get(head), tail) if tail else (out, head)
        if isinstance(holder, dict) and key in holder and holder[key] == default:
            holder.pop(key)
    for phase in out.get("phases", ()):
        _drop_phase_defaults(phase)
    return out


def _drop_phase_defaults(phase: dict) -> None:
    for key in PHASE_LATER_DEFAULTS:
        if key in phase and phase[key] is None:
            phase.pop(key)
    data = phase.get("data")
    for key in PHASE_DATA_LATER_DEFAULTS if isinstance(data, dict) else ():
        if key in data and data[key] is None:
            data.pop(key)
    for member in phase.get("mixture") or ():
        _drop_phase_defaults(member)


def digest(obj: Any, length: int) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:length]

"""Fine-tuning protocols: named profiles of fine-tuning settings, the one place their numbers are written.

`paper` is the paper's recipe (Touchent & de la Clergerie 2026, arXiv:2605.12438, appendix: fine-tuning):
English tasks lr 5e-5, weight decay 0.01, batch 16, 10 epochs (20 for NER), 512 tokens; French
classification lr 2e-5, batch 4, 15 epochs at long lengths (here: the model's whole context), multi-label
with a BCE weighted by label frequencies; the model kept is the one of the best dev epoch (no early stop).
French NER (QUAERO) is the span model's recipe (span_ner: 4000 steps, a dev evaluation every 500, batch
16, encoder lr 5e-5, head lr 1e-3, warmup 10%, gradient clip 10, weight decay 0.01, 1024 tokens); a
token_classification task gets the NER rule in any language. A language the paper does not
cover gets the English rules. `smoke` is a fast CPU profile (the smoke grid's budget): 2 epochs on the
first 1000 training examples, 300 dev/test examples, 128 tokens.

Settings resolve in this order, each layer overriding the one before:
    FinetuneSettings defaults < the task file (`max_length`, `finetune:`) < the chosen profile
    (`ablate evaluate --protocol`, or a grid's `eval.protocol`) < the grid's `eval.finetune` < `--set`
With no profile chosen the task file rules; the shipped task files state the `paper` profile
(tests/test_tasks.py checks every task file in the registry against it).

A task type's row is its entry's protocol kind (ablate.evaluate.task_types).

May import: config, evaluate (task_types: a type's protocol kind).
"""

from __future__ import annotations

from typing import Any

from ablate.config.errors import SpecError
from ablate.evaluate.task_types import task_type

# The largest max_length a profile asks for: the model's context caps it (finetune.context_length).
WHOLE_CONTEXT = 8192

_PAPER_COMMON = {
    "lr": 5.0e-5,
    "weight_decay": 0.01,
    "batch_size": 16,
    "epochs": 10,
    "patience": None,
    "max_length": 512,
    "pooling": "cls",
    "multi_label_pos_weight": True,
}
_PAPER_RULES: dict[tuple[str, str], dict[str, Any]] = {  # (language or "*", a protocol kind)
    ("*", "ner"): {"epochs": 20},
    ("*", "classification"): {},
    ("fr", "classification"): {"lr": 2.0e-5, "batch_size": 4, "epochs": 15, "max_length": WHOLE_CONTEXT},
    ("*", "span_ner"): {
        "max_steps": 4000,
        "eval_every": 500,
        "head_lr": 1.0e-3,
        "warmup_ratio": 0.1,
        "grad_clip": 10.0,
        "max_length": 1024,
        "head_dropout": 0.4,
        "max_span_length": 40,
        "lstm_hidden_size": 400,
        "lstm_layers": 3,
        "biaffine_hidden_size": 64,
    },
}
_SMOKE = {
    "epochs": 2,
    "lr": 1.0e-4,
    "batch_size": 16,
    "patience": None,
    "max_length": 128,
    "max_train_examples": 1000,
    "max_eval_examples": 300,
}

# Tasks the paper runs with settings of their own: the needle in a haystack is probed (encoder frozen, an MLP
# on CLS: ablate.evaluate.task_types.probe) for 3 epochs at lr 2e-5, batch 4, at long lengths.
_NEEDLE = {"lr": 2.0e-5, "batch_size": 4, "epochs": 3, "max_length": WHOLE_CONTEXT, "probe": "mlp"}
# The paper's own tasks read their documents at lengths of their own (its fine-tuning harness: multi-label
# documents at 4096 tokens, DiaMED at 2048; the clinical English tasks of long notes at 8192).
_PAPER_LENGTHS = {
    "diamed": 2048,
    "meddialog_fr": 4096,
    "fracco_30": 4096,
    "fracco_100": 4096,
    "cantemist": 4096,
    "distemist": 4096,
    "phenotyping": 8192,
    "deid": 8192,
}
_PAPER_TASKS: dict[str, dict[str, Any]] = {
    "needle_fr": _NEEDLE,
    "needle_fr_cpu": _NEEDLE,
    "needle_en": _NEEDLE,
    **{t: {"max_length": n} for t, n in _PAPER_LENGTHS.items()},
}

PROFILES = ("paper", "smoke")


def task_kind(type_name: str) -> str:
    """The protocol row of a task type: "ner", "classification" or "span_ner" (its entry's protocol_kind)."""
    return task_type(type_name).protocol_kind


def paper_settings(language: str, task_type: str, task: str | None = None) -> dict[str, Any]:
    """The paper's fine-tuning settings for a task of this language and type (max_length included), or of
    that task where the paper gives it its own."""
    kind = task_kind(task_type)
    rule = _PAPER_RULES.get((language, kind), _PAPER_RULES[("*", kind)])
    return {**_PAPER_COMMON, **rule, **_PAPER_TASKS.get(task or "", {})}


def check_protocol(name: str | None, key: str = "--protocol", file: str | None = None) -> str | None:
    """`name` if it is a profile (or None: the task files' own settings); else a SpecError listing them."""
    if name is not None and name not in PROFILES:
        raise SpecError(
            "unknown fine-tuning protocol",
            file=file,
            key=key,
            value=name,
            allowed=", ".join(PROFILES) + " (or none: the task files' own settings)",
        )
    return name


def profile_settings(name: str | None, language: str, task_type: str, task: str | None = None) -> dict[str, Any]:
    """What profile `name` sets for a task of this language and type ({} for no profile)."""
    if check_protocol(name) is None:
        return {}
    return paper_settings(language, task_type, task) if name == "paper" else dict(_SMOKE)

"""Fine-tuning protocols: named profiles of fine-tuning settings, the one place their numbers are written, each
rule with where its numbers come from (SOURCES: the protocol tables of docs/differences.md and
grids/tasks/README.md are generated from them, `python -m ablate.cli.protocol_table`).

`paper` is the paper's recipe (Touchent & de la Clergerie 2026, arXiv:2605.12438, appendix: fine-tuning; its
text and task table are public in the first author's thesis, chapter 5, "Fine-tuning Protocol" and Table
"Evaluation tasks": github Rian-T/thesis at 0c3a71a, sources/part_2/chapter5/article.tex): English tasks lr
5e-5, weight decay 0.01, batch 16, 10 epochs (20 for NER), 512 tokens (8192 for Phenotyping and
De-identification); French classification lr 2e-5, batch 4, 15 epochs, 2048 tokens single-label (DiaMED) and
4096 multi-label (MedDialog-FR, FRACCO, CANTEMIST, DisTEMIST), multi-label with a BCE weighted by label
frequencies; the model kept is the one of the best dev epoch (no early stop). French NER (QUAERO) is the span
model's recipe (span_ner: 4000 steps, a dev evaluation every 500, batch 16, encoder lr 5e-5, head lr 1e-3,
warmup 10%, gradient clip 10, weight decay 0.01, 1024 tokens; the paper's harness's config, github
Rian-T/tabib configs/base/ner_span_bert.yaml). Not the paper's: a French classification task it does not run
(MORFITT, FrenchMedMCQA) at the model's whole context; a token_classification task gets the NER rule in any
language (the paper scores French NER with the span model only); a language the paper does not cover gets
the English rules. `smoke` is a fast CPU profile (the smoke grid's budget): 2 epochs on the first 1000
training examples, 300 dev/test examples, 128 tokens.

Settings resolve in this order, each layer overriding the one before:
    FinetuneSettings defaults < the task file (`max_length`, `finetune:`) < the chosen profile
    (`ablate evaluate --protocol`, or a grid's `eval.protocol`) < the grid's `eval.finetune` < `--set`
With no profile chosen the task file rules; the shipped task files state the `paper` profile
(tests/test_tasks.py checks every task file in the registry against it).

A task type's row is its entry's protocol kind (ablate.evaluate.task_types).

May import: config, evaluate (task_types).
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
PAPER_LANGUAGES = ("en", "fr")

# Where each rule's numbers come from: the paper's text and task table, or its harness's configs (tabib),
# or ablate's own choice where the paper says nothing. `(language or "*", protocol kind)` as _PAPER_RULES;
# ("fr", "ner") is the English rule applied where the paper uses another model.
_RULE_SOURCES: dict[tuple[str, str], str] = {
    ("*", "classification"): "the paper's English recipe (BioClinical-ModernBERT's protocol); the length: its "
    "task table",
    ("*", "ner"): "the paper's English recipe (more epochs for NER); the length: its task table",
    ("fr", "classification"): "the paper's French recipe (tabib configs/base/cls_bert.yaml); the length is not "
    "the paper's: its task table gives lengths for its own tasks only, these take the model's whole context",
    ("fr", "ner"): "not the paper's: it scores French NER (QUAERO) with the span model only (the span_ner "
    "row); a token_classification task takes the English NER rule",
    ("*", "span_ner"): "the paper's QUAERO recipe (steps, learning rates, batch, length); warmup, clip, "
    "dropout, dev evaluations and the head's sizes: tabib configs/base/ner_span_bert.yaml",
}
_FR_LENGTH = "the paper's French recipe; the length: its task table ({what}; tabib configs/base/{config})"
_TASK_SOURCES: dict[str, str] = {
    **{
        t: "the paper's needle probe (the encoder frozen, an MLP on the [CLS] state); the length: its longest "
        "haystack"
        for t in ("needle_fr", "needle_fr_cpu", "needle_en")
    },
    "diamed": _FR_LENGTH.format(what="single-label", config="cls_bert.yaml"),
    **{
        t: _FR_LENGTH.format(what="multi-label", config="multilabel_bert_4096.yaml")
        for t in ("meddialog_fr", "fracco_30", "fracco_100", "cantemist", "distemist")
    },
    **{t: "the paper's English recipe; the length: its task table" for t in ("phenotyping", "deid")},
}


def task_kind(type_name: str) -> str:
    """The protocol row of a task type: "ner", "classification" or "span_ner" (its entry's protocol_kind)."""
    return task_type(type_name).protocol_kind


def paper_settings(language: str, task_type: str, task: str | None = None) -> dict[str, Any]:
    """The paper's fine-tuning settings for a task of this language and type (max_length included), or of
    that task where the paper gives it its own."""
    kind = task_kind(task_type)
    rule = _PAPER_RULES.get((language, kind), _PAPER_RULES[("*", kind)])
    return {**_PAPER_COMMON, **rule, **_PAPER_TASKS.get(task or "", {})}


def paper_source(language: str, task_type: str, task: str | None = None) -> str:
    """Where paper_settings' numbers for this task come from, in words (the paper, its harness's configs, or
    ablate's choice: "not the paper's")."""
    if task in _TASK_SOURCES:
        return _TASK_SOURCES[task]
    kind = task_kind(task_type)
    source = _RULE_SOURCES.get((language, kind), _RULE_SOURCES[("*", kind)])
    if language not in PAPER_LANGUAGES:
        return f"a language the paper does not cover, the English rule: {source}"
    return source


def smoke_settings() -> dict[str, Any]:
    """What the `smoke` profile sets, whatever the task."""
    return dict(_SMOKE)


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
    return paper_settings(language, task_type, task) if name == "paper" else smoke_settings()

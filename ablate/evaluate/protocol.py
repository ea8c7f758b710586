"""Fine-tuning protocols: named profiles of fine-tuning settings, the one place their numbers are written, each
rule with where its numbers come from (SOURCES: the protocol tables of docs/differences.md and
grids/tasks/README.md are generated from them, `python -m ablate.cli.protocol_table`).

`paper` is the paper's recipe (Touchent & de la Clergerie 2026, arXiv:2605.12438, appendix: fine-tuning; its text
and task table are public in the first author's thesis, chapter 5, "Fine-tuning Protocol" and Table "Evaluation
tasks": github Rian-T/thesis at 0c3a71a, sources/part_2/chapter5/article.tex): English tasks lr 5e-5, weight decay
0.01, batch 16, 10 epochs (20 for NER), the rest as BioClinical-ModernBERT's harness runs it, rule by rule with its
file and line (_HARNESS_RULES: no warm-up, fp32, the head transformers builds, plain BCE, shuffled batches, data
order and dropout seeded 42); French classification lr 2e-5, batch 4, 15 epochs, multi-label with a BCE weighted by
label frequencies; the model kept is the one of the best dev epoch (no early stop). Lengths are the task files'
(`max_length`, one place for each number): 2048 tokens for DiaMED, 4096 for the French multi-label tasks, 1024 for
QUAERO's span model, the model's context (8192) for the English tasks as the harness truncates. French NER (QUAERO)
is the span model's recipe (span_ner: 4000 steps, a dev evaluation every 500, batch 16, encoder lr 5e-5, head lr
1e-3, warmup 10%, gradient clip 10, weight decay 0.01, 1024 tokens; the paper's harness's config, github
Rian-T/tabib configs/base/ner_span_bert.yaml). Not the paper's: a French classification task it does not run
(MORFITT, FrenchMedMCQA) at the model's whole context; a token_classification task gets the NER rule in any
language (the paper scores French NER with the span model only); a language the paper does not cover gets the
English rules. `smoke` is a fast CPU profile (the smoke grid's budget): 2 epochs on the first 1000 training
examples, 300 dev/test examples, 128 tokens.

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
from ablate.evaluate.task_types import TYPE_SETTINGS, task_type

# The paper's English recipe is BioClinical-ModernBERT's harness (github lindvalllab/BioClinical-ModernBERT at
# fb40fb6; its environment.yaml:595 pins transformers 4.52.4, :519 evaluate 0.4.3, :583 seqeval 1.2.2): the
# numbers its text states, and what its code leaves to the Hugging Face Trainer's defaults. Each setting with
# the file and line it comes from (HARNESS files; TRAINER: transformers 4.52.4).
HARNESS = "BioClinical-ModernBERT fb40fb6"
TRAINER = "transformers 4.52.4"
_HARNESS_RULES: dict[str, tuple[Any, str]] = {
    "lr": (5.0e-5, "the paper's text; the harness takes it as --lr (main.py:35)"),
    "weight_decay": (0.01, "the paper's text; main.py:37 (--wd), no decay on biases and norms (trainer.py:1197)"),
    "batch_size": (16, "the paper's text; main.py:38 (per_device_train_batch_size)"),
    "epochs": (10, "the paper's text (10, 20 for NER); main.py:36 (num_train_epochs)"),
    "patience": (
        None,
        "no early stop: every epoch evaluated, the best restored (src/tasks/sequence_classification.py:53-59, "
        "src/tasks/token_classification.py:81-87)",
    ),
    "warmup_ratio": (
        0.0,
        f"no warm-up: {TRAINER} training_args.py:918 (warmup_ratio 0.0), linear decay to 0 "
        "(:907, lr_scheduler_type linear)",
    ),
    "grad_clip": (1.0, f"{TRAINER} training_args.py:899 (max_grad_norm 1.0)"),
    "precision": (
        "fp32",
        f"no bf16/fp16 flag (main.py:34-41; {TRAINER} training_args.py:1056); TF32 matmuls on "
        "GPU (main.py:7 set_float32_matmul_precision('high'))",
    ),
    "pooling": (
        "model",
        "AutoModelForSequenceClassification as transformers builds it "
        "(src/tasks/sequence_classification.py:21-25; ModernBERT: the config's classifier_pooling)",
    ),
    "multi_label_pos_weight": (
        False,
        "plain BCEWithLogitsLoss (problem_type multi_label_classification, "
        "src/tasks/sequence_classification.py:24), a label predicted when its logit > 0 (src/metrics/metrics.py:16)",
    ),
    "group_by_length": (False, f"shuffled batches: {TRAINER} trainer.py:1002 (RandomSampler)"),
    "data_seed": (
        42,
        f"the Trainer reseeds with its default seed 42 ({TRAINER} trainer.py:465, "
        "training_args.py:1042) after main.py:26 set_seed(seed) built the model: seeds 42-46 "
        "(scripts/run_parallel.sh:16) differ in the head's initialisation only",
    ),
}
_HARNESS = {k: v for k, (v, _) in _HARNESS_RULES.items()}
# the French classification recipe (tabib) and ablate's own choices where the paper and tabib say nothing
_FRENCH = {
    "warmup_ratio": 0.1,
    "grad_clip": 1.0,
    "precision": "auto",
    "pooling": "cls",
    "multi_label_pos_weight": True,
    "group_by_length": True,
    "data_seed": None,
}
_PAPER_RULES: dict[tuple[str, str], dict[str, Any]] = {  # (language or "*", a protocol kind)
    ("*", "ner"): {**_HARNESS, "epochs": 20},
    ("*", "classification"): _HARNESS,
    ("fr", "classification"): {**_HARNESS, **_FRENCH, "lr": 2.0e-5, "batch_size": 4, "epochs": 15},
    ("*", "span_ner"): {
        **_HARNESS,
        **_FRENCH,
        "max_steps": 4000,
        "eval_every": 500,
        "head_lr": 1.0e-3,
        "grad_clip": 10.0,
        "group_by_length": False,
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
    # the smoke grid's numbers as they were before the English profile became the harness's
    "warmup_ratio": 0.1,
    "group_by_length": True,
    "data_seed": None,
}

# Tasks the paper runs with settings of their own: the needle in a haystack is probed (encoder frozen, an MLP
# on CLS: ablate.evaluate.task_types.probe) for 3 epochs at lr 2e-5, batch 4.
_NEEDLE = {**_FRENCH, "lr": 2.0e-5, "batch_size": 4, "epochs": 3, "probe": "mlp"}
_PAPER_TASKS: dict[str, dict[str, Any]] = {"needle_fr": _NEEDLE, "needle_fr_cpu": _NEEDLE, "needle_en": _NEEDLE}

PROFILES = ("paper", "smoke")
PAPER_LANGUAGES = ("en", "fr")

# Lengths are no profile's: each task file's `max_length` is the paper's length for it (one place), and its
# comment says where it comes from (HARNESS_LENGTH for the English tasks).
HARNESS_LENGTH = (
    "the tokenizer's model_max_length when under 10,000, else 512 (src/tasks/sequence_classification.py:28, "
    "src/tasks/token_classification.py:28): 8192 for ModernBERT's tokenizer, on every task; the paper's task table "
    "gives 512 for most English tasks (docs/differences.md)"
)
# The tasks the harness itself reads (src/dataloader/dataloader.py:11-23: Phenotype, ChemProt, DEID, COS,
# SocialHistory); the paper's other English tasks (BigBIO's) get its conventions.
HARNESS_TASKS = frozenset({"phenotyping", "chemprot_blue", "deid", "cos", "social_history"})
# The metric that keeps the best dev epoch (the task file's first) and where the paper's harness takes it from.
HARNESS_SELECTION = {
    "classification": "weighted_f1: metric_for_best_model (src/tasks/sequence_classification.py:58), "
    "sklearn's weighted F1 (src/metrics/metrics.py:18, :38)",
    "ner": "seqeval_f1: metric_for_best_model f1 (src/tasks/token_classification.py:86), evaluate's seqeval in "
    "its default mode over the first sub-token of each kept word (src/metrics/metrics.py:54-73, "
    "src/tasks/token_classification.py:56-70)",
}

# Where each rule's numbers come from: the paper's text and task table, or its harness's code and configs
# (BioClinical-ModernBERT for English, tabib for French), or ablate's own choice where the paper says nothing.
# `(language or "*", protocol kind)` as _PAPER_RULES; ("fr", "ner") is the English rule applied where the paper
# uses another model.
_RULE_SOURCES: dict[tuple[str, str], str] = {
    ("*", "classification"): "the paper's English recipe",  # and, setting by setting, harness_rules
    ("*", "ner"): "the paper's English recipe (more epochs for NER)",
    ("fr", "classification"): "the paper's French recipe (tabib configs/base/cls_bert.yaml, "
    "multilabel_bert_4096.yaml): warmup 10%, CLS pooling, weighted BCE; the length: the task file's (the "
    "paper's task table for its own tasks: 2048 single-label, 4096 multi-label; for the others, not the paper's: "
    "the model's whole context)",
    ("fr", "ner"): "not the paper's: it scores French NER (QUAERO) with the span model only (the span_ner "
    "row); a token_classification task takes the English NER rule",
    ("*", "span_ner"): "the paper's QUAERO recipe (steps, learning rates, batch, length); warmup, clip, "
    "dropout, dev evaluations and the head's sizes: tabib configs/base/ner_span_bert.yaml",
}
_TASK_SOURCES: dict[str, str] = {
    t: "the paper's needle probe (the encoder frozen, an MLP on the [CLS] state); the length: its longest haystack"
    for t in ("needle_fr", "needle_fr_cpu", "needle_en")
}


def task_kind(type_name: str) -> str:
    """The protocol row of a task type: "ner", "classification" or "span_ner" (its entry's protocol_kind)."""
    return task_type(type_name).protocol_kind


def paper_settings(language: str, type_name: str, task: str | None = None) -> dict[str, Any]:
    """The paper's fine-tuning settings for a task of this language and type, or of that task where the paper
    gives it its own (never a length: the task file's max_length is the paper's)."""
    kind = task_kind(type_name)
    rule = _PAPER_RULES.get((language, kind), _PAPER_RULES[("*", kind)])
    unread = set(TYPE_SETTINGS) - task_type(type_name).reads  # a rule states what a task of this type reads
    return {k: v for k, v in {**rule, **_PAPER_TASKS.get(task or "", {})}.items() if k not in unread}


def paper_source(language: str, task_type: str, task: str | None = None) -> str:
    """Where paper_settings' numbers for this task come from, in words (the paper, its harness's configs, or
    ablate's choice: "not the paper's")."""
    if task in _TASK_SOURCES:
        return _TASK_SOURCES[task]
    kind = task_kind(task_type)
    source = _RULE_SOURCES.get((language, kind), _RULE_SOURCES[("*", kind)])
    rules = harness_rules(language, task_type)
    if rules:
        skip = ("lr", "weight_decay", "batch_size")  # the table's own columns, sourced in harness_rules
        source += f", {HARNESS}'s harness: " + "; ".join(f"{k} {v}: {src}" for k, v, src in rules if k not in skip)
        source += "; kept by " + HARNESS_SELECTION[kind]
    if language not in PAPER_LANGUAGES:
        return f"a language the paper does not cover, the English rule: {source}"
    return source


def harness_rules(language: str, task_type: str) -> list[tuple[str, Any, str]]:
    """(setting, value, where it comes from) for each setting the English rule of this task's kind sets, its
    harness source named; [] where the paper's rule is not BioClinical-ModernBERT's (French, span_ner)."""
    kind = task_kind(task_type)
    if (language, kind) in _PAPER_RULES or kind not in HARNESS_SELECTION:
        return []
    rule = paper_settings(language, task_type)
    return [(k, rule[k], src) for k, (_, src) in _HARNESS_RULES.items() if k in rule]


def protocol_lines(tasks: list[tuple[str, str, str, int, str]], profile: str | None) -> list[str]:
    """The dry run's account of the English protocol: for each kind of task (tasks: name, language, type,
    max_length, first metric), every setting the paper's English rule sets with the harness file and line it
    comes from, the length and the metric that keeps the model. Other languages: one line each, the rule's
    source."""
    groups: dict[tuple[str, str], list[tuple[str, str, str, int, str]]] = {}
    for t in tasks:
        groups.setdefault((t[1], t[2]), []).append(t)
    if profile == "smoke":
        return [f"fine-tuning protocol: the `smoke` profile (not the paper's: a CPU budget): {_SMOKE}"]
    where = f"the `{profile}` profile" if profile else "the task files (they state the `paper` profile)"
    lines = [f"fine-tuning protocol ({where}; docs/differences.md):"]
    for (language, type_name), members in groups.items():
        names, kind = ", ".join(m[0] for m in members), task_kind(type_name)
        rules = harness_rules(language, type_name)
        if not rules:
            lines.append(f"  {language} {type_name} ({names}): {paper_source(language, type_name)}")
            continue
        lines.append(f"  {language} {type_name} ({names}): {HARNESS}'s harness, rule by rule")
        lines += [f"    {k} = {v}: {src}" for k, v, src in rules]
        lengths = ", ".join(sorted({str(m[3]) for m in members}))
        lines.append(f"    max_length = {lengths} (the task files): {HARNESS_LENGTH}")
        outside = [m[0] for m in members if m[0] not in HARNESS_TASKS]
        if outside:
            lines.append(
                f"    {', '.join(outside)}: not in the harness (src/dataloader/dataloader.py:11-23 reads its 5 "
                "clinical tasks only): its conventions applied, as the paper fine-tunes all English tasks alike"
            )
        firsts = ", ".join(sorted({m[4] for m in members}))
        lines.append(f"    model kept by {firsts} (the task files' first metric): {HARNESS_SELECTION[kind]}")
    return lines


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

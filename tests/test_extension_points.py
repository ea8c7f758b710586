"""Every extension point is one entry: no module compares a registered name (a family or model type, a task
type, an objective) outside its entry, and a new family or a new task type is one entry that every consumer
then serves (pretraining, pooling, the model fit, fine-tuning, the card, the memory plan)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transformers import MPNetConfig

from ablate.config import objectives
from ablate.config.spec import parse_run_spec
from ablate.evaluate import finetune as ft
from ablate.evaluate.tasks import load_task, load_task_data, resolve_settings
from ablate.evaluate.task_types import TASK_TYPES
from ablate.models import families
from ablate.models.families import FAMILIES, Family, _linear, _roberta_transform, check_layout, family_of
from ablate.models.loading import load_masked_lm
from ablate.plan.model_fit import usable_positions
from ablate.train.loop import pretrain
from builders import corpus_slice, run_spec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ablate"
# (module, name): where a registered name is a string of another vocabulary, and why
NOT_A_REGISTERED_NAME = {
    ("cli/protocol_table.py", "span_ner"): "a protocol kind (evaluate.protocol), which shares the type's name",
    ("data/mixture.py", "mixture"): "a data block's `mixture:` key, not the objective",
    ("evaluate/task_types/probe.py", "regression"): "transformers' problem_type values",
    ("evaluate/task_types/probe.py", "multi_label_classification"): "transformers' problem_type values",
}
SMALL = {"max_train_examples": 16, "max_eval_examples": 8, "epochs": 1, "max_length": 32, "batch_size": 8}


def _registered_names() -> dict[str, str]:
    names = {n: "objective" for n in objectives.names()}
    names |= {t: "task type" for t in TASK_TYPES}
    names |= {n: "family" for f in FAMILIES.values() for n in (f.name, *f.model_types)}
    return names


def _entry_modules() -> set[str]:
    """Where the entries themselves live (their names are theirs to spell)."""
    return {
        "models/families.py",
        *(f"config/objectives/{p.name}" for p in (PACKAGE / "config" / "objectives").glob("*.py")),
        *(f"evaluate/task_types/{p.name}" for p in (PACKAGE / "evaluate" / "task_types").glob("*.py")),
    }


def _compared_strings(tree: ast.AST):
    """(line, string) of every string constant compared (==, !=, in, not in, alone or in a literal collection)
    or used as a dict literal's key."""
    for node in ast.walk(tree):
        parts = []
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                parts += side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        elif isinstance(node, ast.Dict):
            parts = [k for k in node.keys if k is not None]
        for part in parts:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                yield node.lineno, part.value


def test_no_module_outside_an_entry_compares_a_registered_name():
    names, entries, found = _registered_names(), _entry_modules(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE))
        if module in entries:
            continue
        for line, value in _compared_strings(ast.parse(path.read_text())):
            if value in names and (module, value) not in NOT_A_REGISTERED_NAME:
                found.append(f"ablate/{module}:{line}: the {names[value]} {value!r}")
    assert not found, "ask the entry instead of comparing its name:\n" + "\n".join(found)


# ---------------------------------------------------------------- a new family is one entry

MPNET = Family(
    "mpnet",
    ("mpnet",),
    "mpnet",
    ("embeddings.",),
    families._BERT_LAYERS,
    _roberta_transform,  # lm_head: dense, gelu, layer_norm, then its decoder
    _linear("lm_head.decoder"),
    {"eager": "additive"},
    ("q", "k", "v"),
    "tiny-mpnet",
    shared=("encoder.relative_attention_bias.",),
    components=families._BERT_PARTS,
    first_token_reader="classifier",
    position_offset=True,
)


def test_a_new_family_is_one_entry_every_consumer_serves(tmp_path, data_root, monkeypatch):
    """MPNet, which ablate does not ship, added as one FAMILIES entry: its layout is found, it pretrains CLM then
    MLM through the causal preflight and the fused head, its positions are counted as its family says, and its
    classification model pools by mean as the entry's first-token reader allows."""
    monkeypatch.setitem(FAMILIES, "mpnet", MPNET)
    config = MPNetConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=130, pad_token_id=0,
    )  # fmt: skip
    (tmp_path / "config.json").write_text(config.to_json_string())
    model = load_masked_lm(f"config:{tmp_path / 'config.json'}", "eager", seed=0)
    assert family_of(model.config) is MPNET
    check_layout(model, MPNET)
    assert usable_positions(model.config) == 129  # 130 less pad_token_id + 1, as RoBERTa's

    phases = [{"name": "clm", "objective": "clm", "steps": 1}, {"name": "mlm", "objective": "mlm", "steps": 1}]
    spec = run_spec(
        model=f"config:{tmp_path / 'config.json'}", attn_implementation="eager", device="cpu",
        data=corpus_slice(max_documents=60), phases=phases,
    )  # fmt: skip
    state = pretrain(parse_run_spec(spec), tmp_path / "run", log=lambda _m: None)
    assert state.done and len(state.curves) == 2

    task = load_task("chemprot")
    settings = resolve_settings(task, {**SMALL, "pooling": "mean"})
    rows = ft.finetune(str(tmp_path / "run" / "model"), task, 0, settings)
    assert {r["metric"] for r in rows} == {"micro_f1", "macro_f1", "accuracy"}
    classifier = ft._load_model(str(tmp_path / "run" / "model"), task, load_task_data(task).labels, settings)
    assert classifier.classifier._forward_pre_hooks  # the mean written where the head reads position 0


# ---------------------------------------------------------------- a new task type is one entry

NEW_TYPE = textwrap.dedent(
    """
    import dataclasses, json, sys
    from ablate.evaluate import task_types
    base = task_types.TASK_TYPES["sequence_classification"]
    task_types.register(dataclasses.replace(base, name="topic", description="a topic per text",
                                            hub_pipeline="zero-shot-classification"))
    from ablate.evaluate import finetune as ft
    from ablate.evaluate.tasks import load_task, resolve_settings
    from ablate.predict import finetune_memory
    from ablate.release import card
    task = load_task(sys.argv[1])
    settings = resolve_settings(task, json.loads(sys.argv[2]))
    rows = ft.finetune(sys.argv[3], task, 0, settings)
    print(json.dumps({"type": task.type, "metrics": sorted({r["metric"] for r in rows}),
                      "pipeline": card._task_type(sys.argv[1]),
                      "host_reads": task.entry.host_reads}))
    """
)


@pytest.mark.slow
def test_a_new_task_type_is_one_entry_every_consumer_serves(tmp_path, data_root, tiny_bert):
    """A type registered as one entry (chemprot's data read as "topic"): a task file names it, fine-tuning,
    the metrics, the card's pipeline and the memory plan's traceability all come from the entry."""
    chemprot = (ROOT / "grids" / "tasks" / "chemprot.yaml").read_text()
    task_file = tmp_path / "chemprot.yaml"  # a task's name is its file's
    task_file.write_text(chemprot.replace("type: sequence_classification", "type: topic"))
    assert "type: topic" in task_file.read_text()

    done = subprocess.run(
        [sys.executable, "-c", NEW_TYPE, str(task_file), json.dumps(SMALL), tiny_bert],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["type"] == "topic" and out["metrics"] == ["accuracy", "macro_f1", "micro_f1"]
    assert out["host_reads"] is None and out["pipeline"] == "zero-shot-classification"

"""Every extension point is one entry: no module compares a registered name (a family or model type, a task
type, an objective) outside its entry, and a new family or a new task type is one entry that every consumer
then serves (pretraining, pooling, the model fit, fine-tuning, the card, the memory plan)."""

from __future__ import annotations

import ast
import dataclasses
import re
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


def test_the_page_and_the_report_command_ask_the_figure_entry_not_its_name():
    """What the sweep page and `ablate report` need to know of a figure (drawn per measure, only for a tune
    study, followed by the score summary) is a field of its entry, never a comparison with its name."""
    from ablate.report.registry import FIGURES

    axis = {("cli/commands.py", "freeze")}  # the grid's freeze axis in the branching tree's labels
    found = [
        f"ablate/{module}:{line}: {value!r}"
        for module in ("report/html.py", "cli/commands.py")
        for line, value in _compared_strings(ast.parse((PACKAGE / module).read_text()))
        if value in FIGURES and (module, value) not in axis
    ]
    assert found == []


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


@pytest.fixture
def registries():
    """The registries of every extension point, as they are now; each put back as it was after the test."""
    from ablate.config.objectives.base import OBJECTIVES
    from ablate.data.converters import CONVERTERS
    from ablate.launch.executors import EXECUTORS
    from ablate.report.registry import FIGURES

    every = {"family": FAMILIES, "objective": OBJECTIVES, "task type": TASK_TYPES, "figure": FIGURES,
             "converter": CONVERTERS, "executor": EXECUTORS}  # fmt: skip
    saved = {kind: dict(registry) for kind, registry in every.items()}
    yield every
    for kind, registry in every.items():
        dict.clear(registry)
        dict.update(registry, saved[kind])


@pytest.mark.slow
def test_a_new_task_type_is_one_entry_every_consumer_serves(tmp_path, data_root, tiny_bert, registries):
    """A type registered as one entry (chemprot's data read as "topic"), after the task files' module was
    imported: a task file names it, fine-tuning, the metrics, the card's pipeline and the memory plan's
    traceability all come from the entry."""
    from ablate.release import card

    base = TASK_TYPES["sequence_classification"]
    registries["task type"].register(
        dataclasses.replace(
            base, name="topic", description="a topic per text", hub_pipeline="zero-shot-classification"
        )
    )
    chemprot = (ROOT / "grids" / "tasks" / "chemprot.yaml").read_text()
    task_file = tmp_path / "chemprot.yaml"  # a task's name is its file's
    task_file.write_text(chemprot.replace("type: sequence_classification", "type: topic"))
    assert "type: topic" in task_file.read_text()

    task = load_task(str(task_file))
    rows = ft.finetune(tiny_bert, task, 0, resolve_settings(task, SMALL))
    assert task.type == "topic" and sorted({r["metric"] for r in rows}) == ["accuracy", "macro_f1", "micro_f1"]
    assert task.entry.host_reads is None and card._task_type(str(task_file)) == "zero-shot-classification"


# ---------------------------------------------------------------- one of each, from a folder outside ablate/

EXTENSIONS = textwrap.dedent(
    """
    import dataclasses

    import pandas as pd
    import submitit

    from ablate.config import objectives
    from ablate.config.objectives.mlm import MaskedLM
    from ablate.data.converters import CONVERTERS, Converter
    from ablate.evaluate.task_types import TASK_TYPES
    from ablate.launch.executors import EXECUTORS, Executor
    from ablate.models.families import FAMILIES
    from ablate.report.registry import FIGURES, Figure
    from ablate.report.style import new_figure


    class WholeWordMLM(MaskedLM):
        name = "mlm-copy"


    def runs_figure(sweep, *, scale: float = 1.0):
        data = pd.DataFrame({"runs": [len(sweep.runs) * scale]})
        fig = new_figure(2.0, 2.0)
        fig.gca().bar([0], data["runs"])
        return fig, data


    def upper(inputs, out, entry):
        (out / "text.txt").write_text(inputs["text"].read_text().upper())


    objectives.register(WholeWordMLM())
    FAMILIES.register(dataclasses.replace(FAMILIES["bert"], name="bert-copy", model_types=("bert_copy",)))
    TASK_TYPES.register(dataclasses.replace(TASK_TYPES["regression"], name="score", description="a score"))
    FIGURES.register(Figure("runs", "how many runs", runs_figure))
    CONVERTERS.register(Converter("upper", upper))
    EXECUTORS.register(Executor("inline", "in this process", lambda launcher, folder, name: submitit.DebugExecutor(folder)))
    """
)


def test_one_of_each_extension_point_registered_from_a_module_outside_ablate(tmp_path, monkeypatch, registries):
    """A module in a temporary folder adds a family, an objective, a task type, a figure, a converter and an
    executor, each by its registry's `register`, after every consumer was imported: each is then served by
    name where the shipped ones are, and a broken entry is refused as it is registered."""
    from transformers import BertConfig

    from ablate.config.launcher import Launcher
    from ablate.launch.executors import make_executor, require_executor
    from ablate.report.registry import check_figure
    from ablate.report.sweep import Sweep
    from in_process import ablate

    (tmp_path / "my_extensions.py").write_text(EXTENSIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_extensions", raising=False)
    __import__("my_extensions")

    assert family_of(BertConfig(model_type="bert")).name == "bert"
    assert family_of(type("C", (), {"model_type": "bert_copy"})()).name == "bert-copy"
    phases = [{"name": "a", "objective": "mlm-copy", "steps": 1}]
    assert parse_run_spec(run_spec(phases=phases)).phases[0].objective == "mlm-copy"
    # a task file names the new type: biosses read as "score"
    biosses = (ROOT / "grids" / "tasks" / "biosses.yaml").read_text().replace("type: regression", "type: score")
    (tmp_path / "biosses.yaml").write_text(biosses)
    assert load_task(str(tmp_path / "biosses.yaml")).entry is TASK_TYPES["score"]

    assert check_figure("runs", {"scale": "2"}) == {"scale": 2.0}
    import pandas as pd

    _, data = registries["figure"]["runs"](
        Sweep(path=tmp_path, runs=pd.DataFrame({"run_id": ["a", "b"]})), scale=2
    )
    assert data["runs"].tolist() == [4.0]
    listed = ablate(["report", "--figure"], cwd=tmp_path)
    assert listed.returncode == 0 and "runs" in listed.stdout.split("figures: ")[1].split(";")[0].split(", ")

    (tmp_path / "source.txt").write_text("text")
    (tmp_path / "out").mkdir()
    registries["converter"]["upper"]({"text": tmp_path / "source.txt"}, tmp_path / "out", None)
    assert (tmp_path / "out" / "text.txt").read_text() == "TEXT"

    assert require_executor("inline") == "inline"
    assert type(make_executor("inline", Launcher(), tmp_path / "jobs", "x")).__name__ == "DebugExecutor"

    with pytest.raises(ValueError, match="registered twice"):
        registries["figure"].register(dataclasses.replace(registries["figure"]["runs"], description="again"))
    with pytest.raises(TypeError, match="options by keyword only"):
        from ablate.report.registry import Figure

        registries["figure"].register(Figure("bad", "positional options", lambda sweep, scale: None))
    with pytest.raises(ValueError, match="mask kinds"):
        FAMILIES.register(dataclasses.replace(FAMILIES["bert"], name="b", model_types=("b",), causal={"x": "y"}))


# ---------------------------------------------------------------- the lists that name the entries


def test_the_parser_help_and_the_docs_name_every_figure_executor_and_task_type():
    """Where a list of an extension point's names is written out for a reader, it is the registry's."""
    import typing

    from ablate.cli.parser import build_parser
    from ablate.config.launcher import Launcher
    from ablate.launch.executors import EXECUTORS
    from ablate.report.registry import FIGURES

    report = build_parser()._subparsers._group_actions[0].choices["report"]
    figure_help = next(a.help for a in report._actions if "--figure" in a.option_strings)
    assert figure_help.split(" (")[0].split(", ") == list(FIGURES)
    results = (ROOT / "docs" / "results.md").read_text()
    assert re.findall(r"^- `([\w-]+)`: ", results.split("The figures (")[1], re.M) == list(FIGURES)
    assert typing.get_args(Launcher.model_fields["executor"].annotation) == tuple(EXECUTORS)
    tasks = (ROOT / "docs" / "tasks.md").read_text()
    listed = re.search(r"one entry of `ablate/evaluate/task_types/` \(([^)]*)\)", tasks).group(1)
    assert sorted(listed.replace("\n", " ").split(", ")) == sorted(TASK_TYPES)


def test_the_guide_has_one_section_per_extension_point_naming_files_that_exist():
    guide = (ROOT / "docs" / "extending.md").read_text()
    sections = re.findall(r"^## (.+)$", guide, re.M)
    assert sections == [
        "A model family", "An objective", "A task type", "A task of a known type", "A figure", "A converter",
        "An executor",
    ]  # fmt: skip
    named = re.findall(r"`((?:ablate|tests|docs)/[\w/.-]+\.(?:py|md|yaml|tsv))`", guide)
    assert named and [p for p in named if not (ROOT / p).exists()] == []


def test_every_catalogued_converter_is_a_registered_one():
    from ablate.data.catalog import catalog
    from ablate.data.converters import CONVERTERS

    named = {ds.converter for ds in catalog().values() if ds.converter is not None}
    assert named and named - set(CONVERTERS) == set()

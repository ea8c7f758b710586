"""Compute parity as a checked property of a grid: a schedule's fractions add up to 1, and the arms a sweep
compares (schedule x freeze mask x seed at one point of the other axes) train the same tokens, prelude
included, unless the grid says `allow_unequal_compute: true`."""

from __future__ import annotations

from tests.test_grid import BASE, dry_run, grid_dict, write

SHORT_CLM = {
    "clm_detour": [
        {"name": "clm", "objective": "clm", "steps": 2},
        {"name": "mlm_decay", "objective": "mlm", "steps": 2},
    ]
}


def _unequal(**extra) -> dict:
    grid = grid_dict(axes={"schedule": ["mlm", "clm_detour"]}, **extra)
    grid["schedules"].update(SHORT_CLM)  # the detour trains 4 steps, the baseline 5
    return grid


def test_arms_of_unequal_compute_exit_2_naming_the_arms_their_tokens_and_the_setting(tmp_path, capsys):
    rc, out, err = dry_run(write(tmp_path, _unequal()), tmp_path, capsys)
    assert rc == 2 and out == ""
    assert "allow_unequal_compute" in err
    assert "mlm (" in err and "640 tokens" in err  # 5 steps x 4 x 32
    assert "clm_detour (" in err and "512 tokens" in err  # 4 steps


def test_the_prelude_counts_and_the_setting_allows_unequal_arms_with_the_check_printed(tmp_path, capsys):
    prelude = [{"name": "warm", "objective": "mlm", "steps": 1}]
    rc, out, err = dry_run(
        write(tmp_path, _unequal(prelude=prelude, allow_unequal_compute=True)), tmp_path, capsys
    )
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("compute parity"))
    assert "unequal, allowed by allow_unequal_compute: true" in line
    assert "768 tokens" in line and "640 tokens" in line  # 6 and 5 steps with the prelude's one


def test_equal_arms_print_ok_per_comparison_group(tmp_path, capsys):
    grid = grid_dict(axes={"schedule": ["mlm", "clm_detour"], "optim.lr": [1.0e-4, 2.0e-4]})
    rc, out, err = dry_run(write(tmp_path, grid), tmp_path, capsys)
    assert rc == 0, err
    lines = [x for x in out.splitlines() if x.startswith("compute parity")]
    assert lines == [
        f"compute parity (optim.lr={lr}): ok, 2 arm(s) train 640 tokens each (prelude included)"
        for lr in (1.0e-4, 2.0e-4)
    ]


def test_arms_at_different_points_of_another_axis_are_not_compared(tmp_path, capsys):
    grid = grid_dict(axes={"schedule": ["mlm"], "batch_size": [4, 8]})
    rc, out, err = dry_run(write(tmp_path, grid), tmp_path, capsys)
    assert rc == 0, err


def test_fractions_of_a_schedule_must_add_up_to_1(tmp_path, capsys):
    schedules = {
        "mlm": [
            {"name": "mlm", "objective": "mlm", "fraction": 0.8},
            {"name": "mlm_decay", "objective": "mlm", "fraction": 0.1},
        ]
    }
    grid = grid_dict(base={**BASE, "budget_tokens": 12800}, schedules=schedules)
    rc, out, err = dry_run(write(tmp_path, grid), tmp_path, capsys)
    assert rc == 2 and "add up to 0.9, not 1" in err and "0.8 + 0.1" in err


def test_any_split_of_the_budget_trains_the_same_steps():
    from ablate.config.spec import parse_run_spec

    def steps(first: float) -> list[int]:
        spec = parse_run_spec(
            {
                **BASE,
                "budget_tokens": 11_000,
                "phases": [
                    {"name": "a", "objective": "clm", "fraction": first},
                    {"name": "b", "objective": "mlm", "fraction": round(1 - first, 12)},
                ],
            }
        )
        return spec.phase_steps()

    totals = {sum(steps(f)) for f in (0.05, 0.1, 0.3, 0.6, 0.7, 0.95)}
    assert totals == {86}  # ceil(11,000 / 128): one rounding, not one per phase
    assert steps(0.7) == [61, 25]


def test_the_shipped_mechanism_grid_forms_its_twin_and_seed_noise_pairs_at_equal_compute(tmp_path, capsys):
    from tests.test_grid import REPO

    rc, out, err = dry_run(REPO / "grids" / "mechanism.yaml", tmp_path, capsys)
    assert rc == 0, err
    assert "compute parity (the whole grid): ok, 2 arm(s) train 92,160 tokens each" in out
    assert "pairs (ablate collect --pairs): 1 twin, 3 seed-noise" in out

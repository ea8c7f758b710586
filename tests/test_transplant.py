"""Layer transplants on the real tiny decay sweep (conftest.decay_sweep, whose grid keeps the decay grid's
`transplants:` block): the hybrids the sweep built from the grid and those `ablate transplant` builds,
checked tensor by tensor against their sources, fine-tuned and in the tables; a re-run of the sweep skips
them; a failed one is recorded and shown; bad input exits 2 before anything is built or submitted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file

from ablate.cli import main
from ablate.config.errors import SpecError
from builders import tiny_grid, write_transplant_grid


def _weights(sweep: Path, run_id: str) -> dict[str, torch.Tensor]:
    return load_file(sweep / "runs" / run_id / "model" / "model.safetensors")


def _derived(sweep: Path) -> pd.DataFrame:
    runs = pd.read_parquet(sweep / "runs.parquet")
    return runs[runs["run_id"].str.startswith("tx-")]


def test_the_sweep_builds_the_grids_transplants_per_seed_and_scores_them(decay_sweep):
    _, sweep = decay_sweep
    runs = pd.read_parquet(sweep / "runs.parquet").set_index("run_id")
    hybrids = _derived(sweep)
    grid_made = hybrids[hybrids["schedule"].isin(["mlm_d10_clm_d10[0-1]", "clm_d10_mlm_d10[0-1]"])]
    assert len(grid_made) == 4 and (grid_made["status"] == "done").all()
    assert set(zip(grid_made["schedule"], grid_made["seed"])) == {
        (s, seed) for s in ("mlm_d10_clm_d10[0-1]", "clm_d10_mlm_d10[0-1]") for seed in (17, 18)
    }
    for row in grid_made.itertuples(index=False):
        source, target = runs.loc[row.derived_from], runs.loc[row.derived_into]
        assert source["seed"] == target["seed"] == row.seed
        assert f"{target['schedule']}_{source['schedule']}[0-1]" == row.schedule
        a, b, h = _weights(sweep, row.derived_from), _weights(sweep, row.derived_into), _weights(sweep, row.run_id)
        low = [k for k in h if k.startswith(("bert.encoder.layer.0.", "bert.encoder.layer.1."))]
        rest = [k for k in h if k not in low]
        assert low and any(k.startswith("bert.encoder.layer.3.") for k in rest) and any("cls." in k for k in rest)
        assert any(k.startswith("bert.embeddings.") for k in rest)  # the paper's transplants leave the embeddings
        assert all(torch.equal(h[k], a[k]) for k in low) and all(torch.equal(h[k], b[k]) for k in rest)
        assert not all(torch.equal(a[k], b[k]) for k in low)  # the arms differ, so the test can fail
    scores = pd.read_parquet(sweep / "scores.parquet")
    f1 = scores[scores["run_id"].isin(grid_made["run_id"]) & (scores["metric"] == "entity_f1")]
    assert set(f1["run_id"]) == set(grid_made["run_id"]) and f1["value"].between(0, 1).all()
    assert set(f1["task"]) == {"ncbi_disease"}


@pytest.mark.slow
def test_a_rerun_of_the_sweep_skips_the_transplants_done(decay_sweep, capsys):
    results, sweep = decay_sweep
    derived = _derived(sweep)
    ids = derived.loc[derived["schedule"].isin(["mlm_d10_clm_d10[0-1]", "clm_d10_mlm_d10[0-1]"]), "run_id"]
    assert len(ids) == 4
    files = [p for rid in ids for p in (sweep / "runs" / rid).rglob("*") if p.is_file()]
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    rc = main(["sweep", str(results.parent / "decay.yaml"), "--results", str(results), "--poll", "0.1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "transplants: 4 derived runs, built once the runs each needs are done; to run 0; already done 4" in out
    assert "nothing to submit" in out
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files} == before


def test_a_transplant_of_everything_equals_its_source_bit_for_bit(decay_sweep, capsys):
    results, sweep = decay_sweep
    rc = main(
        [
            "transplant",
            "decay",
            "--results",
            str(results),
            "--from",
            "clm_d40",
            "--into",
            "mlm_d40",
            "--layers",
            "encoder,head",
        ]
    )
    assert rc == 0, capsys.readouterr()
    runs = pd.read_parquet(sweep / "runs.parquet").set_index("run_id")
    hybrids = _derived(sweep)
    hybrids = hybrids[hybrids["schedule"] == "mlm_d40_clm_d40[emb,0-3,head]"]
    assert len(hybrids) == 2 and set(hybrids["seed"]) == {17, 18} and (hybrids["status"] == "done").all()
    for row in hybrids.itertuples(index=False):
        source, hybrid = _weights(sweep, row.derived_from), _weights(sweep, row.run_id)
        assert runs.loc[row.derived_from, "schedule"] == "clm_d40"
        assert runs.loc[row.derived_into, "schedule"] == "mlm_d40"
        assert source.keys() == hybrid.keys()
        assert all(torch.equal(source[k], hybrid[k]) and source[k].dtype == hybrid[k].dtype for k in source)


@pytest.mark.slow
def test_a_failed_transplant_is_recorded_as_failed_and_shown_in_status(decay_sweep, tmp_path, capsys):
    """A grid entry whose seed-17 source run lost its model: that hybrid's job (a process of the local
    executor) fails, recorded in its folder and shown by `ablate status` (exit 1); the seed-18 one is built
    all the same and the transplants done before are left alone."""
    results, sweep = decay_sweep
    runs = pd.read_parquet(sweep / "runs.parquet")
    arm = {(r.schedule, r.seed): r.run_id for r in runs.itertuples()}
    lost = arm[("clm_d40", 17)]
    needed = {arm[("mlm_d40", 17)], arm[("mlm_d40", 18)], arm[("clm_d40", 18)]}  # the models a hybrid reads
    copy = tmp_path / "r" / "decay"
    shutil.copytree(
        sweep / "runs",
        copy / "runs",
        ignore=lambda folder, names: [
            n for n in names if n == "checkpoints" or (n == "model" and Path(folder).name not in needed)
        ],
    )
    grid = yaml.safe_load((results.parent / "decay.yaml").read_text())
    grid["transplants"].append({"from": "clm_d40", "into": "mlm_d40", "layers": "high", "tasks": []})
    grid["launcher"] = {"executor": "local", "local": {"parallel": 2}}
    path = tmp_path / "decay.yaml"
    path.write_text(yaml.safe_dump(grid))
    rc = main(["sweep", str(path), "--results", str(tmp_path / "r"), "--poll", "0.1"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "transplants: 6 derived runs, built once the runs each needs are done; to run 2; already done 4" in out
    assert main(["status", "decay", "--results", str(tmp_path / "r")]) == 1
    status = [line for line in capsys.readouterr().out.splitlines() if "mlm_d40_clm_d40[3]" in line]
    assert len(status) == 2 and sum(" failed " in line for line in status) == 1
    assert sum(" done " in line for line in status) == 1
    failed = next(line.split()[0] for line in status if " failed " in line)
    spec = yaml.safe_load((copy / "runs" / failed / "spec.json").read_text())
    assert spec["labels"]["derived"]["from"] == lost and spec["seed"] == 17
    assert "model" in (copy / "runs" / failed / "log.txt").read_text()


ARMS = "allowed: mlm, clm_detour, clm_detour/low_clm"


@pytest.mark.parametrize(
    "entry, key, message",
    [
        (
            {"from": "clm_detur", "into": "mlm", "layers": "low"},
            "transplants[0].from",
            f"not an arm this grid expands to; got 'clm_detur'; {ARMS}",
        ),
        (
            {"from": "clm_detour", "into": "mlm/low_clm", "layers": "low"},
            "transplants[0].into",  # excluded
            f"not an arm this grid expands to; got 'mlm/low_clm'; {ARMS}",
        ),
        (
            {"from": "clm_detour", "into": "mlm", "layers": "bottom"},
            "transplants[0].layers",
            "not a layer split; got 'bottom'; allowed: none, embeddings",
        ),
        (
            {"from": "clm_detour", "into": "mlm", "layers": [0, "2-4"]},
            "transplants[0].layers",
            "layer range goes past the model's depth (4 layers: 0-3); got '2-4'",
        ),
        (
            {"from": "clm_detour", "into": "mlm", "layers": "low", "seeds": [1]},
            "transplants[0].seeds",
            "unknown key; allowed: from, into, layers, components, embeddings, tasks, eval",
        ),
        ({"from": "clm_detour", "into": "mlm"}, "transplants[0].layers", "missing required key"),
        ({"from": "mlm", "into": "mlm", "layers": "low"}, "transplants[0].into", "the same arm"),
        (
            {"from": "clm_detour", "into": "mlm", "layers": "low", "tasks": ["nope"]},
            "transplants[0].tasks",
            "unknown task",
        ),
    ],
)
def test_a_bad_transplants_block_exits_2_before_anything_is_submitted(tmp_path, capsys, entry, key, message):
    results = tmp_path / "results"
    rc = main(["sweep", str(write_transplant_grid(tmp_path, [entry])), "--results", str(results)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and not results.exists()
    assert err.startswith(f"error: {tmp_path / 'grid.yaml'}: {key}: ") and message in err, err


def test_the_dry_run_plans_a_hybrid_per_shared_seed_and_warns_about_the_others(tmp_path, capsys):
    tiny = tiny_grid()
    axes = {**tiny["axes"], "seed": [17, 18]}
    exclude = [*tiny["exclude"], {"schedule": "clm_detour", "seed": 18}]
    path = write_transplant_grid(
        tmp_path,
        [
            {"from": "clm_detour", "into": "mlm", "layers": "low"},
            {"from": "mlm", "into": "clm_detour/low_clm", "layers": ["mid", 3]},
        ],
        axes=axes,
        exclude=exclude,
    )
    rc = main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith("tx-") and " transplants[" in line]
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("transplants[0]", "mlm_clm_detour[0-1]", "17"),
        ("transplants[1]", "clm_detour/low_clm_mlm[2-3]", "17"),
    ]
    assert out.splitlines()[-1].startswith("4 runs, 2 transplants; executor debug;")
    warned = [line for line in err.splitlines() if line.startswith("warning: transplants[")]
    assert len(warned) == 2 and all("seed 18" in line and "no hybrid" in line for line in warned)
    assert not (tmp_path / "results").exists()


def test_the_dry_run_counts_a_transplants_fine_tuning_in_the_per_task_rows(tmp_path, capsys):
    path = write_transplant_grid(
        tmp_path, [{"from": "clm_detour", "into": "mlm", "layers": "low", "tasks": ["ncbi_disease"]}]
    )
    rc = main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    at = lines.index("evaluation (fine-tuning per task; hours measured by `ablate calibrate`, else estimated):")
    row = next(line.split() for line in lines[at:] if line.startswith("ncbi_disease"))
    assert row[1:5] == ["-", "1", "1", "1"], lines[at : at + 5]  # the derived run alone fine-tunes: seed 0, once


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from", "clm_d40", "--into", "mlm_d40", "--layers", "0-4"], "past the model's depth"),
        (["--from", "clm_d40", "--into", "mlm_d40", "--layers", "bottom"], "not a layer split"),
        (["--from", "clm_d99", "--into", "mlm_d40", "--layers", "low"], "no finished run of this arm"),
    ],
)
def test_bad_transplants_exit_2(decay_sweep, capsys, args, message):
    results, sweep = decay_sweep
    before = sorted(p.name for p in (sweep / "runs").iterdir())
    rc = main(["transplant", "decay", "--results", str(results), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err
    assert sorted(p.name for p in (sweep / "runs").iterdir()) == before


def test_transplant_between_different_architectures_is_refused():
    from ablate.evaluate.transplant import hybrid_state
    from ablate.models.loading import load_masked_lm

    with pytest.raises(SpecError, match="different architectures or depths"):
        hybrid_state(load_masked_lm("config:tiny-modernbert"), load_masked_lm("config:tiny-bert"), ("low",))

"""Shared fixtures: the data root ($ABLATE_DATA_ROOT, else the checkout's ./data; a run whose data root lacks
what the tests read stops before collecting anything and names the command that fetches it), tiny models, the
local Slurm cluster (tests that need it skip without it, and the summary says so in a block of its own)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ablate.config.paths import DATA_ROOT_ENV, absolute_env_paths

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault(DATA_ROOT_ENV, str(REPO / "data"))  # the default data root, seen from the checkout
absolute_env_paths()  # subprocesses of the tests start in their own tmp folders
# Threads per test process, and per process a test starts (OMP_NUM_THREADS, inherited): the cores shared among the
# xdist workers, at most 2. Two workers of two threads each on two cores spent a quarter more CPU time in
# OpenMP threads waiting on each other than one thread each (README, "Contributing").
TEST_THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
os.environ["OMP_NUM_THREADS"] = str(TEST_THREADS)
torch.set_num_threads(TEST_THREADS)
TESTS_SET = "tests"  # the datasets the tests read (ablate/data/sets.yaml)


def missing_test_data(root: Path) -> list[str]:
    """The datasets of the tests' set with a file missing under root (presence only: `ablate data verify tests`
    checks the contents)."""
    from ablate.data.catalog import dataset, dataset_sets

    return [
        name
        for name in dataset_sets()[TESTS_SET]
        if not all((root / name / expected.file).is_file() for expected in dataset(name).files)
    ]


# Fixtures that train a sweep (tens of seconds each): every test that reads one is in the slow tier, so the fast
# tier (`pytest -m "not slow"`, the inner loop) never waits for one.
TRAINED_SWEEPS = {"decay_sweep", "local_sweep", "finished", "tiny_run", "sqlite_study", "scratch", "family_run"}


# Under pytest-xdist (`-n 2`, as .ci/run runs the suite) each module's tests stay on one worker, so its module
# fixtures are computed once; the tests that use the one Slurm cluster and its MariaDB share a group of their own,
# so two of them never queue behind each other's jobs; and the modules that read a trained session fixture share
# one, so that sweep is trained once, not once per worker.
CLUSTER = {"slurm_env", "mariadb_url"}
SHARED_SWEEPS = {"decay_sweep"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the xdist_group marks into work units
def pytest_collection_modifyitems(config, items):
    module_group = {}  # a module that reads a shared sweep -> that sweep's group
    for item in items:
        for name in SHARED_SWEEPS & set(getattr(item, "fixturenames", ())):
            module_group[item.module.__name__] = name
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if TRAINED_SWEEPS & fixtures:
            item.add_marker(pytest.mark.slow)
        on_cluster = CLUSTER & fixtures or item.get_closest_marker("slurm") is not None
        module = item.module.__name__
        item.add_marker(pytest.mark.xdist_group("cluster" if on_cluster else module_group.get(module, module)))


def _xdist_drops_groups(config) -> bool:
    """pytest 9.2's structured node ids drop the "@group" ids through which pytest-xdist (3.8 and before) keeps a
    group on one worker (pytest-xdist issue 1386): each module's fixtures would then be set up on both workers."""
    from importlib.metadata import version

    from packaging.version import Version

    if config.getoption("dist", None) != "loadgroup":
        return False
    return Version(pytest.__version__) >= Version("9.2") and Version(version("pytest-xdist")) <= Version("3.8.0")


def pytest_configure(config):
    """Without the data the tests read, one line naming the command that fetches it (pytest's usage error, exit
    4), not a failure per test; the same for a pytest whose xdist groups are lost."""
    if _xdist_drops_groups(config):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with this pytest-xdist ignores --dist loadgroup (pytest-xdist issue "
            "1386): install the dev extra's pytest (below 9.2), or run without -n"
        )
    root = Path(os.environ[DATA_ROOT_ENV])
    missing = missing_test_data(root)
    if missing:
        raise pytest.UsageError(
            f"the data root {root} lacks datasets the tests read ({', '.join(missing)}); fetch "
            f"them from their public sources with `.venv/bin/ablate data fetch {TESTS_SET}` "
            f"(into ./data), or set {DATA_ROOT_ENV} to a folder that holds them"
        )


@pytest.fixture(scope="session")
def data_root() -> Path:
    return Path(os.environ[DATA_ROOT_ENV])


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    os.environ["ABLATE_CACHE"] = str(tmp_path_factory.mktemp("ablate-cache"))


@pytest.fixture(scope="session")
def minilm_tokenizer():
    from ablate.models.loading import DEFAULT_MODEL, load_tokenizer

    return load_tokenizer(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, minilm_tokenizer) -> str:
    """A random-init 2-layer BERT (hidden 32) saved as a *ForMaskedLM folder with MiniLM's tokenizer, like a
    run's final model: what fine-tuning tests start from."""
    from transformers import BertConfig, BertForMaskedLM

    d = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    BertForMaskedLM(
        BertConfig(
            vocab_size=minilm_tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(d)
    minilm_tokenizer.save_pretrained(d)
    return str(d)


# ---------------------------------------------------------------- the local Slurm cluster

DEFAULT_CONF = Path(os.environ.get("ABLATE_SLURM_DIR", "/tmp/ablate-slurm")) / "etc" / "slurm.conf"


def _cluster_env() -> dict | None:
    env = dict(os.environ)
    if "SLURM_CONF" not in env and DEFAULT_CONF.is_file():
        env["SLURM_CONF"] = str(DEFAULT_CONF)
    # sinfo retries a missing slurm.conf for a minute before it fails: no file, no cluster
    if shutil.which("sinfo") is None or not Path(env.get("SLURM_CONF", "")).is_file():
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (
        env
        if out.returncode == 0 and ("idle" in out.stdout or "mix" in out.stdout or "alloc" in out.stdout)
        else None
    )


@pytest.fixture(scope="module")
def slurm_env():
    env = _cluster_env()
    if env is None:
        if os.environ.get("ABLATE_REQUIRE_SLURM") == "1":
            pytest.fail("no Slurm cluster answers (scripts/slurm-local.sh start)")
        pytest.skip("no Slurm cluster here (scripts/slurm-local.sh start)")
    return env


# ---------------------------------------------------------------- a real tiny decay-length sweep

DECAY_FINETUNE = {
    "epochs": 1,
    "max_train_examples": 48,
    "max_eval_examples": 32,
    "max_length": 64,
    "batch_size": 8,
}


@pytest.fixture(scope="session")
def decay_sweep(tmp_path_factory, data_root):
    """The CPU twin of grids/decay.yaml: its schedules for the 10% decay length and a 40% one made from them
    (the grid's lengths are 2.5-50%; 40% keeps a 4-step decay here) (a main phase of 10 steps of 4 x 32
    tokens, decays of 1 and 4 steps), MLM and CLM detour at each, seeds 17 and 18, on tiny BERT,
    branched as the grid is (each 10% run starts from its 40% twin's checkpoint at the main phase's end), and
    its transplants (low layers of clm_d10 into mlm_d10 and the reverse, fine-tuned on ncbi_disease), run with
    the debug executor and collected with --pairs. Returns (results root, sweep folder); the grid is
    <results root>/../decay.yaml."""
    import copy

    import yaml
    from in_process import ablate

    root = tmp_path_factory.mktemp("decay")
    grid = yaml.safe_load((REPO / "grids" / "decay.yaml").read_text())
    tiny = yaml.safe_load((REPO / "tests" / "grids" / "tiny.yaml").read_text())["base"]
    grid["base"] = {**tiny, "eval": {"tasks": [], "seeds": [0], "finetune": DECAY_FINETUNE}}
    step_tokens = 4 * 32
    for objective in ("mlm", "clm"):
        longer = copy.deepcopy(grid["schedules"][f"{objective}_d10"])
        longer[1]["tokens"] = round(0.4 * longer[0]["tokens"])
        grid["schedules"][f"{objective}_d40"] = longer
    grid["baseline"] = [*grid["baseline"], "mlm_d40"]
    for phases in grid["schedules"].values():
        main, decay = phases
        share = decay["tokens"] / main["tokens"]
        main.update(tokens=10 * step_tokens, lr={"warmup_steps": 1})
        decay["tokens"] = round(share * 10 * step_tokens)
    grid["axes"] = {"schedule": ["mlm_d10", "clm_d10", "mlm_d40", "clm_d40"], "seed": [17, 18]}
    for entry in grid["transplants"]:
        entry["tasks"] = ["ncbi_disease"]
    grid["launcher"] = {"executor": "debug"}
    path = root / "decay.yaml"
    path.write_text(yaml.safe_dump(grid))
    results = root / "results"
    for args in (
        ["sweep", str(path), "--results", str(results), "--poll", "0.1"],
        ["collect", "decay", "--results", str(results), "--pairs"],
    ):
        done = ablate(args, root)  # in this process: the debug executor runs every job here
        assert done.returncode == 0, done.stdout + done.stderr
    return results, results / "decay"


def pytest_terminal_summary(terminalreporter):
    """Slurm tests skipped for want of a cluster are said out loud, not folded into the count of skips."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "slurm" in r.keywords]
    if not skipped:
        return
    n = len(skipped)
    terminalreporter.write_sep(
        "!", f"{n} Slurm test{'s' if n != 1 else ''} SKIPPED: no cluster answered", red=True, bold=True
    )
    terminalreporter.write_line(f"start it: bash scripts/slurm-local.sh start; export SLURM_CONF={DEFAULT_CONF}")
    terminalreporter.write_line("ABLATE_REQUIRE_SLURM=1 turns these skips into failures (CI sets it)")
    for report in skipped:
        terminalreporter.write_line(f"  {report.nodeid}")
    terminalreporter.write_sep("!", red=True, bold=True)

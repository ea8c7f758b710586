"""The README and the pages under docs/ as a reader meets them: the README opens with the two commands CI and
users run, every relative link, anchor and image resolves, every page under docs/ is listed in the README, every
repository path they name exists, and a YAML example said to come from a shipped grid is made of that grid's
own lines (so a grid that changes fails here until its example follows)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from ablate.config.base import parse_yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FIRST_COMMANDS = [
    # the main job on a fresh machine: the smoke grid's data fetched into the default root first
    "bash scripts/setup.sh && .venv/bin/ablate data fetch grids/smoke.yaml && .venv/bin/ablate sweep grids/smoke.yaml",
    # the whole test suite (Slurm, MariaDB and Chromium installed as root), after fetching what the tests read
    "bash scripts/setup.sh --with-slurm && export SLURM_CONF=${ABLATE_SLURM_DIR:-/tmp/ablate-slurm}/etc/slurm.conf \\\n"
    "  && .venv/bin/ablate data fetch tests"
    " && ABLATE_REQUIRE_SLURM=1 ABLATE_REQUIRE_CHROMIUM=1 .venv/bin/python -m pytest -q -n 2 --dist loadgroup",
    # the same without root: the Slurm and Chromium tests skip
    "bash scripts/setup.sh && .venv/bin/ablate data fetch tests && .venv/bin/python -m pytest -q -n 2 --dist loadgroup",
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# a path of this repository in backticks (under ablate/ only modules and folders: an exported model's
# `ablate/spec.json` is a folder of the export, not of the repository)
REPO_PATH = re.compile(
    r"`(ablate/[\w/]*(?:\.py)?|(?:grids|bench|scripts|tests|docs|analysis_notebooks)/[\w./-]*)`"
)
GRID_FILE = re.compile(r"(?:tests/)?grids/[\w/-]+\.yaml")


def _prose(text: str) -> str:
    """The text a reader sees outside code blocks and HTML comments."""
    return FENCE.sub("", COMMENT.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in _prose(page.read_text()).splitlines() if line.startswith("#")}


def test_the_readme_opens_with_the_main_job_and_the_tests():
    blocks = [body.rstrip("\n") for lang, body in FENCE.findall((ROOT / "README.md").read_text())[:3]]
    assert blocks == FIRST_COMMANDS


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_anchor_and_image_resolves(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {resolved.name}")
    assert not broken, f"{page.name}: {broken}"


def test_every_page_under_docs_is_listed_in_the_readme():
    listed = {
        Path(t).name for t in LINK.findall(_prose((ROOT / "README.md").read_text())) if t.startswith("docs/")
    }
    assert {p.name for p in PAGES[1:]} <= listed


def test_the_readme_says_first_what_ablate_is():
    title, first = _prose((ROOT / "README.md").read_text()).split("\n\n")[:2]
    assert title == "# ablate"
    assert first.startswith("ablate is a ") and first.endswith(".") and ". " not in first  # one sentence


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_the_architecture_page_draws_one_tree_and_it_is_the_folders():
    """docs/architecture.md's one tree: the package's stages indented under `ablate/` (the floors, in the order
    tests/test_architecture.py reads), then the repository's other folders."""
    trees = [body for _, body in FENCE.findall(ARCHITECTURE.read_text()) if body.split()[0].endswith("/")]
    assert len(trees) == 1, "docs/architecture.md should draw the folders once"
    entries = [(line.startswith(" "), line.split()[0]) for line in trees[0].splitlines() if line.strip()]
    stages = {name.rstrip("/") for nested, name in entries if nested}
    assert stages == {p.parent.name for p in (ROOT / "ablate").glob("*/__init__.py")}
    top = {name.rstrip("/") for nested, name in entries if not nested}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {line.split("/")[0] for line in tracked.splitlines() if "/" in line and not line.startswith(".")}
    assert top == folders


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_named_exists(page):
    named = REPO_PATH.findall(COMMENT.sub("", page.read_text()))
    assert named, f"{page.name} names no repository path: the pattern no longer matches its style"
    assert [p for p in named if not (ROOT / p).exists()] == []


def _grid_examples() -> list[tuple[str, str, str]]:
    """(page, grid, YAML block) for each yaml block whose paragraph right before it names exactly one grid."""
    found = []
    for page in PAGES:
        text = COMMENT.sub("", page.read_text())
        for match in FENCE.finditer(text):
            if match.group(1) != "yaml":
                continue
            paragraph = text[: match.start()].rstrip().rsplit("\n\n", 1)[-1]
            grids = set(GRID_FILE.findall(paragraph))
            if len(grids) == 1:
                found.append((page.name, grids.pop(), match.group(2)))
    return found


EXAMPLES = _grid_examples()


def test_the_concepts_take_their_examples_from_the_grids():
    assert len([e for e in EXAMPLES if e[0] == "concepts.md"]) == 6  # run, phase, objective, ...


@pytest.mark.parametrize(
    "page, grid, block", EXAMPLES, ids=[f"{p}-{g}-{i}" for i, (p, g, _) in enumerate(EXAMPLES)]
)
def test_a_grid_example_is_made_of_that_grids_lines(page, grid, block):
    parse_yaml(block, file=page)
    lines = {line.strip() for line in (ROOT / grid).read_text().splitlines()}
    assert [line for line in block.splitlines() if line.strip() and line.strip() not in lines] == []


# ---------------------------------------------------------------- docs/your-study.md, run as a reader runs it

GUIDE = ROOT / "docs" / "your-study.md"
FILE_MARK = re.compile(r"<!-- file: (\S+) -->\s*$")
SKIP_MARK = re.compile(r"<!-- not run by the tests: .+ -->\s*$")


def _guide_steps() -> list[tuple[str, str, str]]:
    """The guide's blocks in order, as (kind, target, body): ("file", path, text) for a block marked
    `<!-- file: PATH -->`, ("run", "", commands) for every bash block not marked `<!-- not run by the tests: why
    -->`, ("yaml", "", text) for the other YAML examples."""
    text, steps = GUIDE.read_text(), []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        lang, body = match.group(1), match.group(2)
        if FILE_MARK.match(before):
            steps.append(("file", FILE_MARK.match(before).group(1), body))
        elif lang == "bash" and not SKIP_MARK.match(before):
            steps.append(("run", "", body))
        elif lang == "yaml":
            steps.append(("yaml", "", body))
    return steps


def test_the_guide_marks_its_files_and_commands():
    kinds = [(kind, target) for kind, target, _ in _guide_steps()]
    assert ("file", "my_study.yaml") in kinds and ("file", "tasks/my_task.yaml") in kinds
    assert sum(kind == "run" for kind, _ in kinds) >= 5
    for kind, _, body in _guide_steps():
        if kind != "run":
            parse_yaml(body, file=GUIDE.name)


def _guide_inputs(folder: Path, data_root: Path, tokenizer) -> None:
    """What the guide assumes a researcher has, made tiny: a model folder, a corpus of shards, held-out texts,
    a two-label task, from slices of the real data."""
    import json

    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = folder / "models" / "my-encoder"
    BertForMaskedLM(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(model)
    tokenizer.save_pretrained(model)
    texts = [t for t in (data_root / "corpus_en_e3c" / "train.txt").read_text().splitlines() if t.strip()][:300]
    (folder / "data" / "my_corpus").mkdir(parents=True)
    for i in range(3):
        lines = [json.dumps({"text": t}) for t in texts[i * 80 : (i + 1) * 80]]
        (folder / "data" / "my_corpus" / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "data" / "my_held_out.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[240:])
    )
    (folder / "data" / "my_task").mkdir()
    for split, n in (("train", 48), ("dev", 16), ("test", 16)):
        rows = [json.loads(line) for line in (data_root / "chemprot" / f"{split}.jsonl").read_text().splitlines()]
        kept = [r for r in rows if r["label"] in ("INHIBITOR", "SUBSTRATE")][:n]
        (folder / "data" / "my_task" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in kept)
        )


@pytest.mark.slow
def test_the_guide_runs_from_a_grid_to_the_tables(tmp_path, data_root, minilm_tokenizer, monkeypatch):
    """Line by line, as a reader types it: `ablate ...` in this process (tests/in_process.py), anything else in
    bash; the reader has set neither variable below."""
    import shlex
    import subprocess

    from in_process import ablate

    _guide_inputs(tmp_path, data_root, minilm_tokenizer)
    (tmp_path / "grids").symlink_to(ROOT / "grids")
    monkeypatch.delenv("ABLATE_DATA_ROOT", raising=False)
    monkeypatch.delenv("ABLATE_RESULTS", raising=False)
    for kind, target, body in _guide_steps():
        if kind == "file":
            (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / target).write_text(body)
        elif kind == "run":
            for line in (
                ln for ln in body.replace("\\\n", " ").splitlines() if ln.strip() and not ln.startswith("#")
            ):
                words = shlex.split(line)
                if words[0] == "ablate":
                    done = ablate(words[1:], cwd=tmp_path)
                else:
                    done = subprocess.run(
                        ["bash", "-c", "set -euo pipefail\n" + line], cwd=tmp_path, capture_output=True, text=True
                    )
                assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    sweep = tmp_path / "results" / "my_study"
    assert len(list((sweep / "runs").iterdir())) == 3
    assert (sweep / "tables" / "scores.md").is_file() and (sweep / "figures" / "layers.png").is_file()

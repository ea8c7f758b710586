"""Which data is pinned and which is not, said wherever a score is read: the catalogue tells each dataset's
pinning (a commit, a Zenodo record's md5, a pinned sha256, or nothing: unverified), `ablate data verify`
says UNVERIFIED for a dataset whose download nothing pins, the score summary and the report page mark the
scores computed on such data (a language's average too), and the README's data sentence names them all."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

from ablate.cli import main
from ablate.data.catalog import catalog, pinning, unverified_reason, write_fetched

sys.path.insert(0, str(Path(__file__).parent))
from test_report import rewrite, write_sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
UNVERIFIED = {
    "diamed": "DiaMED",
    "chemprot_blue": "ChemProt-BLUE",
    "cos": "COS",
    "social_history": "Social History",
}


def test_the_catalogue_says_how_each_dataset_is_pinned():
    by = {name: pinning(ds) for name, ds in catalog().items()}
    assert {n for n, p in by.items() if p == "unverified"} == set(UNVERIFIED)
    assert {n for n, p in by.items() if p == "record md5"} == {"fracco_30", "fracco_100", "cantemist", "distemist"}
    assert by["ncbi_disease"] == by["needle_fr"] == "commit"
    assert "Dr-BERT/DiaMED at revision main (not a commit sha)" in unverified_reason(catalog()["diamed"])
    assert unverified_reason(catalog()["fracco_30"]) is None


def test_the_readme_names_what_is_pinned_and_what_is_not():
    text = " ".join((ROOT / "README.md").read_text().split())
    sentence = next(s for s in text.split(". ") if "unverified" in s and "md5" in s)
    for name in [*UNVERIFIED.values(), "FRACCO", "CANTEMIST", "DisTEMIST"]:
        assert name in sentence, name


def _fetched(root: Path, name: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text('{"text": "x", "label": "a"}\n')
    write_fetched(folder, [folder / "train.jsonl"])


def test_data_verify_says_unverified_for_a_download_nothing_pins(tmp_path, capsys):
    root = tmp_path / "root"
    for name in ("diamed", "fracco_30"):
        _fetched(root, name)
    assert main(["data", "verify", "diamed", "fracco_30", "--data-root", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "diamed: ok, UNVERIFIED source: Hugging Face dataset Dr-BERT/DiaMED at revision main" in out[0]
    assert out[1] == "fracco_30: ok"
    assert out[2].startswith("1 datasets come from unverified downloads (diamed)")


def _sweep_on(tmp_path: Path, tasks: dict[str, str]) -> Path:
    """The synthetic sweep with its tasks renamed (old -> a registry task) and their languages set."""
    sweep = write_sweep(tmp_path / "s", languages={"ner_a": "en", "cls_b": "fr", "sts_c": "en"})
    scores = pd.read_parquet(sweep / "scores.parquet")
    scores["task"] = scores["task"].replace(tasks)
    rewrite(sweep, "scores", scores)
    return sweep


def test_the_summary_and_the_page_mark_the_scores_on_unverified_data(tmp_path):
    from ablate.report.html import scores_section
    from ablate.report.scores import score_summary
    from ablate.report.sweep import load_sweep

    sweep = load_sweep(_sweep_on(tmp_path, {"cls_b": "diamed", "ner_a": "ncbi_disease", "sts_c": "biosses"}))
    summary = score_summary(sweep)
    marks = dict(zip(summary["task"], summary["data"]))
    assert marks["diamed"] == "unverified" and marks["ncbi_disease"] == marks["biosses"] == ""
    assert marks["average (fr)"] == marks["average"] == "unverified: includes diamed"
    assert marks["average (en)"] == ""

    section = scores_section(sweep)
    assert re.search(r"<li><b>diamed</b>: diamed: Hugging Face dataset Dr-BERT/DiaMED at revision main", section)
    shown = section.split("<details>", 1)[0].split('class="wide"', 1)[1]
    assert "<th>data</th>" in shown
    rows = re.findall(r"<tr><td>[^<]*</td><td>([^<]*)</td><td>[^<]*</td><td>([^<]*)</td>", shown)
    assert {task: mark for task, mark in rows if task in ("diamed", "ncbi_disease")} == {
        "diamed": "unverified",
        "ncbi_disease": "",
    }


def test_a_sweep_on_pinned_data_has_no_mark(tmp_path):
    from ablate.report.html import scores_section
    from ablate.report.sweep import load_sweep

    sweep = load_sweep(_sweep_on(tmp_path, {"cls_b": "fracco_30", "ner_a": "ncbi_disease", "sts_c": "biosses"}))
    section = scores_section(sweep)
    assert "unverified" not in section and "<th>data</th>" not in section.split("<details>", 1)[0]

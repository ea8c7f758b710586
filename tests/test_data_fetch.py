"""`ablate data fetch / verify` and the sweep's check of the data root, offline: a loopback HTTP server serves a
mirror laid out like the public URLs (<owner>/<repo>/<commit>/<path>, <owner>/<repo>/tar.gz/<commit>). A
copied dataset's mirror is the shipped data itself, so what is fetched must equal the manifest byte for byte;
each derived dataset's converter turns a small real sample of its upstream files (tests/data/fetch_samples)
into exactly the lines the shipped files have for those documents."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import shutil
import socket
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from ablate.cli import main
from ablate.data.catalog import FETCHED, catalog, dataset, with_requirements
from ablate.data.converters.blurb import (
    biosses_records,
    gad_records,
    hoc_abstracts,
    hoc_sentences,
    jnlpba_lines,
    tsv_rows,
)
from ablate.data.converters.articles import convert_craft, journal_and_notice
from ablate.data.converters.brat import MANTRA_FOLDERS, convert_quaero, mantra_group, mantra_spans, tagged_tokens
from ablate.data.converters.common import write_jsonl
from ablate.data.converters.ddi import convert_ddi
from ablate.data.converters.e3c_corpus import (
    EN_LICENCES,
    FR_LICENCES,
    LEAFLET_LICENCE,
    archive_members,
    corpus_lines,
    e3c_documents,
    up_to_chars,
)
from ablate.data.converters.leaflets import TEST_SETS, novel_leaflets, overlapping, sentence_grams_of
from ablate.data.converters.medquad import kept_documents, medquad_documents
from ablate.data.converters.others import conll_sentences, convert_e3c_fr_ner, convert_pubmedqa, morfitt_records
from ablate.launch.data_needs import target_datasets

SAMPLES = Path(__file__).parent / "data" / "fetch_samples"
SMOKE = Path(__file__).resolve().parents[1] / "grids" / "smoke.yaml"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Truncating(_Quiet):
    """Announces each file's whole length, sends half of it and closes the connection."""

    def do_GET(self):
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            return self.send_error(404)
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.close_connection = True


@contextlib.contextmanager
def serving(folder: Path, handler=_Quiet):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def mirror_of_shipped(mirror: Path, name: str, data_root: Path) -> Path:
    """A copied dataset's upstream files, taken from the shipped ones, where the public URLs have them."""
    ds = dataset(name)
    for shipped, upstream in ds.sources:
        dest = mirror / ds.repo / ds.commit / upstream
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data_root / name / shipped, dest)
    return mirror


def leftovers(root: Path) -> list[str]:
    """Anything half-done a failed fetch could leave: temporary folders, partial downloads."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if ".part-" in p.name or p.name.startswith(".fetch-") and p.name != ".fetch-cache"
    )


def fetch(root: Path, url: str, *targets: str) -> int:
    return main(["data", "fetch", *targets, "--data-root", str(root), "--mirror", url])


# ---------------------------------------------------------------------------------------- fetch end to end


def test_a_copied_dataset_is_fetched_byte_for_byte_then_skipped_offline(tmp_path, data_root, capsys):
    root = tmp_path / "root"
    with serving(mirror_of_shipped(tmp_path / "mirror", "ncbi_disease", data_root)) as url:
        assert fetch(root, url, "ncbi_disease") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "ncbi_disease: licence repository CC BY 4.0" in out and "3 files in" in out
    for f in ("train.tsv", "dev.tsv", "test.tsv"):
        assert (root / "ncbi_disease" / f).read_bytes() == (data_root / "ncbi_disease" / f).read_bytes()
    assert sorted(p.name for p in root.iterdir()) == ["ncbi_disease"]  # the download cache is gone
    assert main(["data", "verify", "ncbi_disease", "--data-root", str(root)]) == 0
    # the server is gone: a second fetch has nothing to download
    assert fetch(root, url, "ncbi_disease") == 0
    assert "ncbi_disease: in place, every file matches the manifest" in capsys.readouterr().out


@pytest.mark.parametrize("handler, reason", [(_Quiet, "HTTP 404"), (_Truncating, "truncated download: ")])
def test_a_missing_or_truncated_source_places_nothing_and_says_how_to_supply_it(
    tmp_path, capsys, handler, reason, data_root
):
    root, mirror = tmp_path / "root", tmp_path / "mirror"
    mirror.mkdir()
    if handler is _Truncating:
        mirror_of_shipped(mirror, "ncbi_disease", data_root)
    with serving(mirror, handler) as url:
        assert fetch(root, url, "ncbi_disease") == 2
    err = capsys.readouterr().err
    ds = dataset("ncbi_disease")
    assert f"{url}/{ds.repo}/{ds.commit}/data/NCBI-disease-IOB/train.tsv" in err
    assert reason in err and "dataset ncbi_disease" in err and "(offline, or the source moved)" in err
    assert f"into {root / 'ncbi_disease'}/" in err and "save_to_disk" in err and "hub dataset" in err
    assert not (root / "ncbi_disease").exists() and leftovers(root) == []


def test_offline_names_the_url_and_exits_2(tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert fetch(tmp_path / "root", url, "bc5cdr") == 2
    err = capsys.readouterr().err
    assert "cannot download" in err and f"{url}/cambridgeltl/MTL-Bioinformatics-2016/" in err


def test_a_checksum_mismatch_places_nothing_and_drops_the_bad_download(tmp_path, data_root, capsys):
    root, mirror = tmp_path / "root", mirror_of_shipped(tmp_path / "mirror", "ncbi_disease", data_root)
    ds = dataset("ncbi_disease")
    dev = mirror / ds.repo / ds.commit / "data/NCBI-disease-IOB/devel.tsv"
    dev.write_bytes(dev.read_bytes().replace(b"B-Disease", b"I-Disease", 1))
    (root / "ncbi_disease").mkdir(parents=True)
    shutil.copyfile(data_root / "ncbi_disease" / "train.tsv", root / "ncbi_disease" / "train.tsv")
    with serving(mirror) as url:
        assert fetch(root, url, "ncbi_disease") == 2
    err = capsys.readouterr().err
    assert "the derived files do not match the manifest (dev.tsv: sha256" in err and "nothing was placed" in err
    assert sorted(p.name for p in (root / "ncbi_disease").iterdir()) == ["train.tsv"]
    assert not (root / ".fetch-cache" / ds.repo / ds.commit / "data/NCBI-disease-IOB/devel.tsv").exists()
    assert leftovers(root) == []


def test_an_archive_source_is_downloaded_and_converted_and_a_sample_is_refused(tmp_path, capsys):
    ds = dataset("corpus_en_e3c")
    archive = tmp_path / "mirror" / ds.repo / "tar.gz" / ds.commit
    archive.parent.mkdir(parents=True)
    shutil.copyfile(SAMPLES / "corpus_en_e3c" / "archive.tar.gz", archive)
    with serving(tmp_path / "mirror") as url:
        assert fetch(tmp_path / "root", url, "corpus_en_e3c") == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[1].startswith("corpus_en_e3c: NON-COMMERCIAL licence")  # said before the fetch
    assert "do not match the manifest (doc_ids.tsv: size" in err and "train.txt: size" in err
    assert not (tmp_path / "root" / "corpus_en_e3c").exists() and leftovers(tmp_path / "root") == []


def _cut_short(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _bad_gzip_crc(data: bytes) -> bytes:
    """The gzip trailer's CRC-32 (its last 8 bytes: CRC-32, length) changed; every deflate block intact."""
    return data[:-8] + bytes([data[-8] ^ 0xFF]) + data[-7:]


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_cut_short, "EOFError: Compressed file ended before the end-of-stream marker was reached"),  # tar.gz
        (_bad_gzip_crc, "BadGzipFile: CRC check failed"),  # gzip: tarfile alone never reads the trailer
    ],
)
def test_an_unreadable_archive_is_exit_2_leaves_no_cached_copy_and_a_good_one_fetches(
    tmp_path, monkeypatch, capsys, damage, reason
):
    """A repository's tar.gz, served whole (its length as announced) but unreadable: exit 2 naming the dataset,
    the download and its URL; the cached file gone, nothing placed; the next fetch downloads it again. (The
    dataset: E3C's converter on its sample archive, checked as derived, so that the good archive is a success.)"""
    ds = replace(dataset("corpus_en_e3c"), name="e3c_sample", files=(), derived=True)
    monkeypatch.setitem(catalog(), ds.name, ds)
    good = (SAMPLES / "corpus_en_e3c" / "archive.tar.gz").read_bytes()
    served = tmp_path / "mirror" / ds.repo / "tar.gz" / ds.commit
    served.parent.mkdir(parents=True)
    served.write_bytes(damage(good))
    root, cached = tmp_path / "root", tmp_path / "root" / ".fetch-cache" / ds.repo / "tar.gz" / ds.commit
    with serving(tmp_path / "mirror") as url:
        assert fetch(root, url, ds.name) == 2
        err = capsys.readouterr().err
        assert (
            f"dataset e3c_sample: cannot read the download archive from {url}/{ds.repo}/tar.gz/{ds.commit}" in err
        )
        assert reason in err and "the next fetch downloads it again" in err and "nothing was placed" in err
        assert not cached.exists() and not (root / ds.name).exists() and leftovers(root) == []
        served.write_bytes(good)
        assert fetch(root, url, ds.name) == 0, capsys.readouterr().err
    assert len(_lines(root / ds.name / "train.txt")) == 3 and (root / ds.name / FETCHED).is_file()  # EN112374, ..


def test_targets_name_datasets_tasks_suites_and_grids():
    assert [d.name for d in target_datasets(str(SMOKE))] == ["corpus_en_e3c", "ncbi_disease"]
    assert [d.name for d in target_datasets("bc5cdr_chemical")] == ["bc5cdr"]
    assert {d.name for d in target_datasets("suite:fr_smoke")} == {
        "quaero_emea",
        "quaero_medline",
        "mantragsc_fr_emea",
        "mantragsc_fr_medline",
        "mantragsc_fr_patents",
        "morfitt",
        "e3c_fr_ner",
        "frenchmedmcqa",
    }
    with pytest.raises(Exception, match="unknown fetch target.*datasets: anatem, bc2gm"):
        target_datasets("no_such_thing")


# ------------------------------------------------------------------------------------------------- verify


def test_verify_names_missing_and_changed_files(tmp_path, data_root, capsys):
    shutil.copytree(data_root / "gad", tmp_path / "gad")
    assert main(["data", "verify", "--data-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gad: ok" in out and "ncbi_disease: not fetched" in out
    with open(tmp_path / "gad" / "dev.jsonl", "ab") as f:
        f.write(b"\n")
    (tmp_path / "gad" / "test.jsonl").unlink()
    assert main(["data", "verify", "--data-root", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "gad: MISMATCH: dev.jsonl: size 113,318 B, the manifest has 113,317 B; test.jsonl: missing" in out


def test_verify_over_nothing_is_an_error_never_a_match(tmp_path, capsys):
    """A data root that is not there, a file, or a folder with no dataset fetched: exit 2 saying so."""
    for root in (tmp_path / "no-such-root", tmp_path / "a-file"):
        assert main(["data", "verify", "--data-root", str(root)]) == 2
        assert f"the data root {root} is not a folder" in capsys.readouterr().err
        (tmp_path / "a-file").write_text("")
    (tmp_path / "empty").mkdir()
    assert main(["data", "verify", "--data-root", str(tmp_path / "empty")]) == 2
    out, err = capsys.readouterr()
    assert "ncbi_disease: not fetched" in out and "matches" not in out and "nothing was checked" in err


@pytest.mark.parametrize(
    "row, problem",
    [
        ("train.tsv\tabc\t" + "0" * 64, "line 2: size 'abc' is not a number of bytes"),
        ("train.tsv\t12\tnot-a-digest", "line 2: sha256 'not-a-digest' is not 64 hexadecimal digits"),
        ("../../secret\t12\t" + "0" * 64, "line 2: file '../../secret' is not a file name inside"),
        ("train.tsv\t12", "line 2: 2 fields where 3 belong"),
    ],
)
def test_a_damaged_fetched_tsv_is_exit_2_naming_it_and_what_to_do(tmp_path, capsys, row, problem):
    folder = tmp_path / "cos"
    folder.mkdir()
    (folder / FETCHED).write_text(f"file\tsize\tsha256\n{row}\n")
    assert main(["data", "verify", "cos", "--data-root", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert f"cos: MISMATCH: {folder / FETCHED}: {problem}" in out
    assert "`ablate data fetch cos` fetches the dataset again" in out


def test_an_archive_member_that_is_not_utf8_is_an_unreadable_download(tmp_path, capsys):
    """A .ann in Latin-1 inside the zip a `url` dataset downloads (put in the fetch cache, as by hand): exit 2
    naming the download, removed from the cache so that the next fetch downloads it again; nothing placed."""
    root = tmp_path / "root"
    cached = root / ".fetch-cache" / "url" / "cos" / "corpus"
    cached.parent.mkdir(parents=True)
    with zipfile.ZipFile(cached, "w") as archive:
        archive.writestr("events-COS-corpus/data/a.txt", "Opacité stable.\n".encode("latin-1"))
        archive.writestr("events-COS-corpus/data/a.ann", "T1\tCos 8 14\tstable\n#é\n".encode("latin-1"))
    assert main(["data", "fetch", "cos", "--data-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "dataset cos: cannot read the download corpus from https://" in err
    assert "a member that is not UTF-8 text (UnicodeDecodeError" in err and "Traceback" not in err
    assert not cached.exists() and not (root / "cos").exists() and leftovers(root) == []


# --------------------------------------------------------------------------------------- the sweep's check


def test_the_smoke_grids_dry_run_on_an_empty_data_root_names_what_to_fetch(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ABLATE_DATA_ROOT", str(tmp_path / "empty"))
    assert main(["sweep", str(SMOKE), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "lacks corpus_en_e3c (corpus_en_e3c/train.txt, corpus_en_e3c/valid.txt); fetch them" in err
    assert f"`ablate data fetch {SMOKE}`" in err


@pytest.mark.slow
def test_the_freeze_grids_dry_run_on_a_root_without_the_french_tasks_names_its_fetch(
    tmp_path, data_root, monkeypatch, capsys
):
    root = tmp_path / "english"  # what `ablate data fetch grids/smoke.yaml` leaves: no French task
    for name in ("corpus_en_e3c", "ncbi_disease"):
        shutil.copytree(data_root / name, root / name)
    monkeypatch.setenv("ABLATE_DATA_ROOT", str(root))
    monkeypatch.chdir(SMOKE.parents[1])
    # the French tasks come through suite:fr_paper: the dry run passes, names each one skipped and its fetch
    assert main(["sweep", "grids/freeze.yaml", "--dry-run", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "suite:fr_paper: 8 task(s) skipped, the data root lacks them" in out
    assert (
        "  diamed: `ablate data fetch diamed`" in out
        and "  quaero_emea_spans: `ablate data fetch quaero_brat`" in out
    )


# ------------------------------------------------------------------------ converters on real upstream samples


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _jsonl_lines(tmp_path: Path, records) -> list[str]:
    write_jsonl(tmp_path / "out.jsonl", records)
    return _lines(tmp_path / "out.jsonl")


def test_jnlpba_sample_gives_the_shipped_lines(data_root):
    converted = jnlpba_lines((SAMPLES / "jnlpba" / "train.tsv").read_text(encoding="utf-8"))
    shipped = (data_root / "jnlpba" / "train.tsv").read_text(encoding="utf-8")
    assert converted.count("\n\n") >= 2 and shipped.startswith(converted)


@pytest.mark.parametrize(
    "name, records",
    [("gad", lambda rows: gad_records(rows, "train")), ("biosses", biosses_records), ("morfitt", morfitt_records)],
)
def test_tsv_samples_give_the_shipped_lines(tmp_path, data_root, name, records):
    converted = _jsonl_lines(tmp_path, records(tsv_rows(SAMPLES / name / "train.tsv")))
    assert len(converted) >= 2 and converted == _lines(data_root / name / "train.jsonl")[: len(converted)]


def test_hoc_sample_gives_the_shipped_sentence_and_abstract_lines(tmp_path, data_root):
    sentences = hoc_sentences(tsv_rows(SAMPLES / "hoc" / "train.tsv"))
    converted = _jsonl_lines(tmp_path, sentences)
    assert converted == _lines(data_root / "hoc" / "train_sentences.jsonl")[: len(converted)]
    abstracts = _jsonl_lines(tmp_path, hoc_abstracts(sentences))
    assert len(abstracts) == 2 and abstracts == _lines(data_root / "hoc" / "train.jsonl")[:2]


def test_pubmedqa_sample_gives_the_shipped_records(tmp_path, data_root):
    """The test split is the official PMIDs in file order; train/dev come from a seeded shuffle of all 500
    others, which a sample cannot reproduce: each of its records must be the shipped line all the same."""
    inputs = {
        "labelled": SAMPLES / "pubmedqa_pqal" / "ori_pqal.json",
        "test_ground_truth": SAMPLES / "pubmedqa_pqal" / "test_ground_truth.json",
    }
    convert_pubmedqa(inputs, tmp_path, dataset("pubmedqa_pqal"))
    shipped_test = _lines(data_root / "pubmedqa_pqal" / "test.jsonl")
    assert _lines(tmp_path / "test.jsonl") == shipped_test[:2]
    shipped = {
        line for split in ("train", "dev") for line in _lines(data_root / "pubmedqa_pqal" / f"{split}.jsonl")
    }
    others = _lines(tmp_path / "train.jsonl") + _lines(tmp_path / "dev.jsonl")
    assert len(others) == 3 and all(line in shipped for line in others)


def test_e3c_fr_ner_sample_gives_the_shipped_dev_and_the_ends_of_train_and_test(tmp_path, data_root):
    inputs = {"train": SAMPLES / "e3c_fr_ner" / "train.txt", "test": SAMPLES / "e3c_fr_ner" / "test.txt"}
    convert_e3c_fr_ner(inputs, tmp_path, dataset("e3c_fr_ner"))
    assert (tmp_path / "dev.txt").read_bytes() == (data_root / "e3c_fr_ner" / "dev.txt").read_bytes()
    shipped_train = conll_sentences((data_root / "e3c_fr_ner" / "train.txt").read_text(encoding="utf-8"))
    assert conll_sentences((tmp_path / "train.txt").read_text(encoding="utf-8")) == shipped_train[-2:]
    shipped_test = conll_sentences((data_root / "e3c_fr_ner" / "test.txt").read_text(encoding="utf-8"))
    assert conll_sentences((tmp_path / "test.txt").read_text(encoding="utf-8")) == shipped_test[:3]


def _shipped_lines(data_root: Path, name: str) -> dict[str, str]:
    """Document id -> its line in the shipped corpus files (doc_ids.tsv says which file and line)."""
    files = {"extra": "extra_leaflets_cc-by-nc.txt"}
    rows = [line.split("\t") for line in _lines(data_root / name / "doc_ids.tsv")[1:]]
    lines = {}
    for split in dict.fromkeys(r[0] for r in rows):
        texts = _lines(data_root / name / files.get(split, f"{split}.txt"))
        lines.update(zip([r[1] for r in rows if r[0] == split], texts, strict=True))
    return lines


@pytest.mark.parametrize(
    "name, licences, kept_ids",
    [
        (
            "corpus_en_e3c",
            EN_LICENCES,
            ["EN112374", "EN114836", "EN117429"],
        ),  # a CC BY-NC one, a short one dropped
        ("corpus_fr_e3c", FR_LICENCES, ["EN101041", "EN101261", "EN101292"]),  # FR101041 repeats EN101041's text
        ("corpus_fr_e3c", (LEAFLET_LICENCE,), ["EN103644"]),
    ],
)  # the extra leaflets
def test_e3c_corpus_samples_give_the_shipped_lines(data_root, name, licences, kept_ids):
    """Kept documents give exactly their shipped line. (Which split a document lands in depends on the whole
    corpus's shuffle, which a sample cannot reproduce.)"""
    ds = dataset(name)
    kept = corpus_lines(e3c_documents(SAMPLES / name / "archive.tar.gz", ds.archive), licences)
    assert sorted(d["id"] for d, _ in kept) == kept_ids
    shipped = _shipped_lines(data_root, name)
    assert all(shipped[doc["id"]] == line for doc, line in kept)


def test_leaflets_are_taken_up_to_a_character_budget():
    kept = [({"id": str(i)}, "x" * 9) for i in range(5)]  # 10 characters a line with its newline
    assert [d["id"] for d, _ in up_to_chars(kept, 25)] == ["0", "1", "2"]
    assert [d["id"] for d, _ in up_to_chars(kept, 20)] == ["0", "1"]


def test_ddi_sample_gives_the_shipped_pairs_of_its_documents(tmp_path, data_root):
    """Dextroamphetamine holds the one true pair without a type (dropped), Abciximab overlapping mentions
    (@DRUG-DRUG$), MedLine.d119 is one of BLURB's dev documents; one test document."""
    inputs = {"corpus": SAMPLES / "ddi" / "DDICorpus-2013.zip", "blurb_dev": SAMPLES / "ddi" / "dev.tsv"}
    convert_ddi(inputs, tmp_path, dataset("ddi"))
    assert _lines(tmp_path / "dev_doc_ids.txt") == ["DDI-MedLine.d119"]
    documents = {
        "train": ("DDI-DrugBank.d236.", "DDI-DrugBank.d532."),
        "dev": ("DDI-MedLine.d119.",),
        "test": ("DDI-MedLine.d",),
    }
    for split, prefixes in documents.items():
        converted = _lines(tmp_path / f"{split}.jsonl")
        ids = {json.loads(line)["id"].rsplit(".s", 1)[0] + "." for line in converted}
        shipped = [
            line
            for line in _lines(data_root / "ddi" / f"{split}.jsonl")
            if json.loads(line)["id"].rsplit(".s", 1)[0] + "." in ids
        ]
        assert converted and converted == shipped and all(i.startswith(prefixes) for i in ids)
    assert any("@DRUG-DRUG$" in line for line in _lines(tmp_path / "train.jsonl"))


def _sentences(path: Path) -> list[str]:
    return [s for s in path.read_text(encoding="utf-8").split("\n\n") if s.strip()]


@pytest.mark.parametrize("name, n_sentences", [("quaero_emea", 40), ("quaero_medline", 2)])
def test_quaero_sample_gives_the_first_shipped_sentences(tmp_path, data_root, name, n_sentences):
    """The sample is the first training document(s) of each corpus: EMEA 318 (split into sentences),
    MEDLINE 10051979 and 1006003 (a title each)."""
    convert_quaero({"archive": SAMPLES / "quaero" / "archive.tar.gz"}, tmp_path, dataset(name))
    converted = _sentences(tmp_path / "train.tsv")
    assert len(converted) >= n_sentences
    assert converted == _sentences(data_root / name / "train.tsv")[: len(converted)]


def test_mantra_sample_gives_the_shipped_sentence_of_each_unit(data_root):
    """One unit per file; the groups come from the notes (`"OBJC|CHEM"`: OBJC; a type name last: the code
    quoted before it). Which split a unit lands in depends on all the units."""
    shipped = {}
    for name in MANTRA_FOLDERS:
        for split in ("train", "dev", "test"):
            ids = _lines(data_root / name / f"{split}_ids.txt")
            shipped.update(zip(ids, _sentences(data_root / name / f"{split}.tsv"), strict=True))
    with zipfile.ZipFile(SAMPLES / "mantragsc_fr" / "Mantra-GSC-brat.zip") as archive:
        texts = sorted(n for n in archive.namelist() if n.endswith(".txt"))
        assert len(texts) == 5
        for name in texts:
            text, ann = archive.read(name).decode("utf-8"), archive.read(name[:-4] + ".ann").decode("utf-8")
            tokens = tagged_tokens(text, mantra_spans(ann))
            unit = name.rsplit("/", 1)[1][:-4]
            assert "\n".join(f"{w}\t{t}" for w, t, _, _ in tokens) == shipped[unit]
    assert mantra_group('"C0034036", "Publications", "OBJC" ,"Manufactured Object"') == "OBJC"
    assert mantra_group('"C0037570", "Sodium, Dietary", "Food|Inorganic Chemical" ,"OBJC|CHEM"') == "OBJC"


def test_craft_sample_gives_the_shipped_line_and_doc_ids_rows(tmp_path, data_root):
    """One article through the converter; the journal and notice of four .copyright files (a PLoS CC BY, a
    BMC open-access notice cut at 300 characters, an Oxford one without a licence: empty)."""
    sample = SAMPLES / "corpus_en_craft"
    convert_craft(
        {p.name: p for p in sample.iterdir() if p.name.startswith("15018652")},
        tmp_path,
        dataset("corpus_en_craft"),
    )
    assert _lines(tmp_path / "train.txt") == [_shipped_lines(data_root, "corpus_en_craft")["15018652"]]
    rows = {line.split("\t")[1]: line for line in _lines(data_root / "corpus_en_craft" / "doc_ids.tsv")}
    assert _lines(tmp_path / "doc_ids.tsv")[1] == rows["15018652"]
    for path in sample.glob("*.copyright"):
        journal, notice = journal_and_notice(path.read_text(encoding="utf-8"))
        assert f"train\t{path.stem}\t{journal}\t{notice}" == rows[path.stem]


def test_medquad_sample_gives_the_shipped_lines(data_root):
    """GHR 0000005 repeats an answer of GHR 0000003 (dropped from the second); CDC 0000397 has no document
    id (its id: 9_CDC_QA/0000397)."""
    ds = dataset("corpus_en_medquad")
    files = dict(archive_members(SAMPLES / "corpus_en_medquad" / "archive.tar.gz", ds.archive))
    documents = medquad_documents(files, ds.archive)
    kept = kept_documents(documents)
    assert [(d["collection"], d["id"]) for d, _ in kept] == [
        ("3_GHR_QA", "0000003"),
        ("3_GHR_QA", "0000005"),
        ("9_CDC_QA", "9_CDC_QA/0000397"),
    ]
    rows = [line.split("\t") for line in _lines(data_root / "corpus_en_medquad" / "doc_ids.tsv")[1:]]
    shipped = {}
    for split in ("train", "valid"):
        keys = [(r[2], r[1]) for r in rows if r[0] == split]
        shipped.update(zip(keys, _lines(data_root / "corpus_en_medquad" / f"{split}.txt"), strict=True))
    assert all(shipped[(d["collection"], d["id"])] == line for d, line in kept)
    alone = medquad_documents({k: v for k, v in files.items() if "0000005" in k}, ds.archive)
    assert len(alone[0]["text"]) > len(kept[1][1])  # with 0000003 before it, a repeated answer went


def test_a_derived_dataset_is_fetched_converted_and_checked_end_to_end(tmp_path, data_root, capsys):
    """BIOSSES is small enough to keep its whole upstream files (tests/data/fetch_samples/biosses)."""
    ds = dataset("biosses")
    for split, path in ds.sources:
        dest = tmp_path / "mirror" / ds.repo / ds.commit / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SAMPLES / "biosses" / f"{split}.tsv", dest)
    with serving(tmp_path / "mirror") as url:
        assert fetch(tmp_path / "root", url, "biosses") == 0, capsys.readouterr().err
    for split in ("train", "dev", "test"):
        assert (tmp_path / "root" / "biosses" / f"{split}.jsonl").read_bytes() == (
            data_root / "biosses" / f"{split}.jsonl"
        ).read_bytes()


def test_fetch_without_a_target_is_bad_input(tmp_path, capsys):
    assert main(["data", "fetch", "--data-root", str(tmp_path)]) == 2
    assert "name what to fetch" in capsys.readouterr().err


def test_leaflets_sample_gives_the_shipped_lines_shares_and_removal(data_root):
    """EN111634, EN106103, EN112845 are the first three leaflets the near-duplicate filter reads (their shares
    depend only on each other); EN108642 shares a distinctive 8-gram with a QUAERO-EMEA / Mantra test sentence."""
    ds = dataset("corpus_fr_leaflets_e3c")
    docs = {d["id"]: d for d in e3c_documents(SAMPLES / ds.name / "archive.tar.gz", ds.archive)}
    first = [(docs[i], " ".join(docs[i]["text"].split())) for i in ("EN111634", "EN106103", "EN112845")]
    kept = novel_leaflets(first)
    rows = {r[1]: r for r in (line.split("\t") for line in _lines(data_root / ds.name / "doc_ids.tsv")[1:])}
    assert (
        [f"{share:.2f}" for _, _, share in kept]
        == [rows[d["id"]][4] for d, _ in first]
        == ["0.98", "0.94", "0.92"]
    )
    shipped = _shipped_lines(data_root, ds.name)
    assert all(shipped[d["id"]] == line for d, line, _ in kept)
    removed = dict(line.split("\t") for line in _lines(data_root / ds.name / "removed_for_test_overlap.tsv")[1:])
    grams = sentence_grams_of([data_root / name / "test.tsv" for name in TEST_SETS])
    suspect = [(docs["EN108642"], " ".join(docs["EN108642"]["text"].split()), 1.0)]
    assert overlapping(suspect, grams) == {"EN108642"} and "EN108642" in removed

    # EN111634 shares boilerplate with the test sentences: in 20 leaflets it is not distinctive (in the whole
    # corpus it is in far more), in 19 it is
    def copies(n):
        return [({**d, "id": f"{d['id']}-{k}"}, line, share) for k in range(n) for d, line, share in kept]

    assert overlapping(copies(20) + suspect, grams) == {"EN108642"}
    assert "EN111634-0" in overlapping(copies(19) + suspect, grams)


def test_a_dataset_that_requires_others_comes_after_them():
    order = with_requirements([dataset("corpus_fr_leaflets_e3c"), dataset("quaero_emea")])
    assert [d.name for d in order] == ["quaero_emea", "mantragsc_fr_emea", "corpus_fr_leaflets_e3c"]

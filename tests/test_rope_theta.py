"""RoPE theta per phase (context extension): a phase's data sets the model's theta from its start on, on the
random-init tiny ModernBERT and a slice of the shipped corpus: applied, resumed to the same bits from a
checkpoint inside that phase, carried by the final config and the run's record, refused (exit 2) where the
family has none, and leaving the run ids of specs without it unchanged."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoConfig

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.sources import phase_rope_thetas, rope_thetas_at
from ablate.config.spec import parse_run_spec
from ablate.models.families import FAMILIES
from ablate.plan.model_fit import check_model_fit
from ablate.train.loop import pretrain

sys.path.insert(0, str(Path(__file__).parent))
from test_data_mixture import _killed_and_resumed as killed_and_resumed  # noqa: E402
from builders import detour_spec  # noqa: E402

LONG = {"seq_len": 64, "rope_theta": 640000.0, "local_rope_theta": 40000.0}
SPEC = detour_spec(
    "tiny-modernbert",
    phases=[
        {"name": "mlm", "objective": "mlm", "steps": 3},
        {"name": "long", "objective": "mlm", "steps": 3, "data": LONG},
        {"name": "after", "objective": "mlm", "steps": 1},
    ],
)


def spec_with(**phase_data) -> dict:
    out = copy.deepcopy(SPEC)
    out["phases"][1]["data"] = phase_data or None
    return out


def _quiet(_msg: str) -> None:
    pass


def _losses(state) -> list[float]:
    return [row["loss"] for row in state.curves]


def test_the_thetas_in_effect_hold_until_a_later_phase_sets_others():
    spec = parse_run_spec(SPEC)
    assert rope_thetas_at(spec.phases, 0) == {}
    assert (
        rope_thetas_at(spec.phases, 1)
        == rope_thetas_at(spec.phases, 2)
        == {"rope_theta": 640000.0, "local_rope_theta": 40000.0}
    )
    assert list(phase_rope_thetas(spec.phases)) == ["mlm", "long", "after"]
    assert phase_rope_thetas(parse_run_spec(spec_with(seq_len=64)).phases) == {}


def test_a_theta_enters_the_phase_identity_only_when_set():
    plain = parse_run_spec(spec_with(seq_len=64))
    assert parse_run_spec(SPEC).run_id != plain.run_id
    # a spec written without the keys keeps the id it had: the dump of its phase data has no theta
    dumped = plain.model_dump(mode="json")["phases"][1]["data"]
    assert dumped["rope_theta"] is None
    from ablate.config import identity

    assert "rope_theta" not in identity.content(plain.model_dump(mode="json"), identity.RUN)["phases"][1]["data"]


@pytest.mark.slow
def test_a_longer_phase_with_a_larger_theta_trains_resumes_to_the_same_bits_and_saves_the_theta(
    tmp_path, data_root
):
    spec = parse_run_spec(SPEC)
    whole = pretrain(spec, tmp_path / "whole", log=_quiet)
    plain = pretrain(parse_run_spec(spec_with(seq_len=64)), tmp_path / "plain", log=_quiet)
    assert _losses(whole)[:3] == _losses(plain)[:3]

    pretrain(spec, tmp_path / "resumed", log=_quiet, stop_after_steps=5)  # stops at step 5, in `long`
    resumed = pretrain(spec, tmp_path / "resumed", log=_quiet)
    assert resumed.done and _losses(resumed) == _losses(whole)
    a, b = (load_file(tmp_path / d / "model" / "model.safetensors") for d in ("whole", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = load_file(tmp_path / "plain" / "model" / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a), "the theta changed nothing: it was not applied"

    config = AutoConfig.from_pretrained(tmp_path / "whole" / "model")
    assert config.rope_parameters["full_attention"]["rope_theta"] == 640000.0
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 40000.0
    plain_config = json.loads((tmp_path / "plain" / "model" / "config.json").read_text())
    assert plain_config["rope_parameters"]["full_attention"]["rope_theta"] == 160000.0


def test_the_rotary_frequencies_follow_the_theta_as_transformers_computes_them():
    from transformers import AutoModelForMaskedLM

    from ablate.models.loading import load_config
    from ablate.train.rope import set_rope_thetas

    config = load_config("config:tiny-modernbert")
    model = AutoModelForMaskedLM.from_config(copy.deepcopy(config))
    set_rope_thetas(model, FAMILIES["modernbert"], {"rope_theta": 640000.0})
    config.rope_parameters["full_attention"]["rope_theta"] = 640000.0
    fresh = AutoModelForMaskedLM.from_config(config)
    for name in ("full_attention_inv_freq", "full_attention_original_inv_freq", "sliding_attention_inv_freq"):
        assert torch.equal(getattr(model.model.rotary_emb, name), getattr(fresh.model.rotary_emb, name)), name


def test_a_family_without_a_theta_is_refused_naming_the_key():
    raw = spec_with(seq_len=64, rope_theta=640000.0)
    raw["model"] = "config:tiny-bert"
    with pytest.raises(SpecError) as info:
        check_model_fit([parse_run_spec(raw)], file="run.yaml")
    err = info.value
    assert (err.file, err.key, err.value) == ("run.yaml", "phases[1].data.rope_theta", 640000.0)
    assert "bert" in err.message and "modernbert" in err.allowed
    check_model_fit([parse_run_spec(SPEC)], file="run.yaml")  # ModernBERT declares both


@pytest.mark.slow
def test_the_run_record_says_the_thetas_of_each_phase(tmp_path, data_root, capsys):
    spec_file = tmp_path / "run.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC))
    assert main(["run", str(spec_file), "--out", str(tmp_path / "out")]) == 0
    record = json.loads((tmp_path / "out" / "records" / "run.json").read_text())
    both = {"rope_theta": 640000.0, "local_rope_theta": 40000.0}
    assert json.loads(record["rope_thetas"]) == {"mlm": {}, "long": both, "after": both}


@pytest.mark.slow
def test_kill_9_at_a_checkpoint_inside_the_theta_phase_resumes_to_the_same_bits(tmp_path, data_root):
    spec_file = tmp_path / "run.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC))
    pretrain(parse_run_spec(SPEC), tmp_path / "straight", log=_quiet)
    killed_and_resumed(spec_file, tmp_path / "killed", 4, tmp_path)  # step 4: one step into `long`
    a, b = (load_file(tmp_path / d / "model" / "model.safetensors") for d in ("straight", "killed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    config = json.loads((tmp_path / "killed" / "model" / "config.json").read_text())
    assert config["rope_parameters"]["full_attention"]["rope_theta"] == 640000.0

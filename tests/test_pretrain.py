"""The pretraining engine on tiny random-init models and real text: freezing, identical data across arms,
kill-and-resume, the saved model, schedules and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM

from ablate.config.errors import SpecError
from ablate.models.families import layer_of
from ablate.plan.phases import plan_phases
from ablate.train.freezing import apply_freeze
from ablate.train.loop import Optimizer, pretrain, setup
from ablate.train.schedule import lr_at
from ablate.config.spec import LRSchedule, parse_run_spec
from in_process import ablate
from builders import detour_spec

REPO = Path(__file__).resolve().parents[1]


def _quiet(_msg: str) -> None:
    pass


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["tiny-bert", "tiny-modernbert"])
def test_frozen_layers_are_bitwise_unchanged_and_left_out_of_the_optimizer(arch, tmp_path, data_root):
    spec = parse_run_spec(
        detour_spec(
            arch, phases=[{"name": "clm", "objective": "clm", "steps": 3, "freeze": ["low", "embeddings"]}]
        )
    )
    ctx, _, plans = setup(spec)
    model, family = ctx.model, ctx.family
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = Optimizer(model, spec, fused=False)
    apply_freeze(model, family, plans[0].frozen)
    opt.set_trainable()
    in_optimizer = {id(p) for g in opt.torch.param_groups for p in g["params"]}
    frozen_names = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen_names, "the mask froze nothing"
    assert all(layer_of(n, family) in ("emb", "0", "1") for n in frozen_names)
    assert not any(id(dict(model.named_parameters())[n]) in in_optimizer for n in frozen_names)

    state = pretrain(spec, tmp_path / "run", log=_quiet)
    after = dict(AutoModelForMaskedLM.from_pretrained(tmp_path / "run" / "model").named_parameters())
    for name in frozen_names:
        assert torch.equal(after[name], before[name]), f"{name} moved while frozen"
    moved = [n for n in before if layer_of(n, family) == "2" and not torch.equal(after[n], before[n])]
    assert moved, "unfrozen layers did not train"
    assert state.done


def test_a_layer_frozen_in_one_phase_keeps_its_adamw_moments_and_trains_on_from_them(
    tmp_path, data_root, monkeypatch
):
    from ablate.train import loop

    moments: dict[int, dict[str, dict[str, torch.Tensor]]] = {}  # global step -> the optimizer's, by name
    save = loop.save_checkpoint

    def saving_and_recording(root, model, opt, state, **kw):
        moments[state.global_step] = {
            n: {k: v.clone() for k, v in m.items()} for n, m in opt.state_by_name().items()
        }
        return save(root, model, opt, state, **kw)

    monkeypatch.setattr(loop, "save_checkpoint", saving_and_recording)  # checkpoint_every 2: end of each phase
    spec = parse_run_spec(
        detour_spec(
            phases=[
                {"name": "a", "objective": "mlm", "steps": 2},
                {"name": "b", "objective": "clm", "steps": 2, "freeze": "0-1"},
                {"name": "c", "objective": "mlm", "steps": 2},
            ]
        )
    )
    state = pretrain(spec, tmp_path / "run", log=_quiet)
    assert sorted(moments) == [2, 4, 6]
    frozen = [n for n in moments[2] if n.startswith(("bert.encoder.layer.0.", "bert.encoder.layer.1."))]
    trained = "bert.encoder.layer.2.attention.self.query.weight"
    assert len(frozen) > 10 and trained not in frozen
    for name in frozen:
        before, during, after = moments[2][name], moments[4][name], moments[6][name]
        assert during.keys() == before.keys() == after.keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        for key in before:  # phase b left them exactly as phase a did
            assert torch.equal(during[key], before[key]), f"{name} {key} changed while frozen"
        assert float(after["step"]) == 4, f"{name}: moments reset when it trained again"  # 2 in a + 2 in c
        assert not torch.equal(after["exp_avg"], during["exp_avg"]), f"{name} did not train in phase c"
    assert float(moments[4][trained]["step"]) == 4 and not torch.equal(
        moments[4][trained]["exp_avg"], moments[2][trained]["exp_avg"]
    )
    saved = torch.load(tmp_path / "run" / "checkpoints" / "step-000000006-p3" / "optimizer.pt", weights_only=True)[
        "moments"
    ]
    assert all(torch.equal(saved[n]["exp_avg_sq"], moments[6][n]["exp_avg_sq"]) for n in frozen)
    by = {(r["phase"], r["layer"]): r["value"] for r in state.layer_rows if r["measure"] == "weight_rel_change"}
    assert by[("b", 0)] == by[("a", 0)] and by[("c", 0)] != by[("b", 0)]


@pytest.mark.slow
def test_arms_with_the_same_data_seed_see_the_same_tokens(tmp_path, data_root):
    clm = parse_run_spec(detour_spec())
    mlm = parse_run_spec(
        detour_spec(
            phases=[
                {"name": "mlm", "objective": "mlm", "steps": 4, "mask_rate": 0.3},
                {"name": "mlm_decay", "objective": "mlm", "steps": 3},
            ]
        )
    )
    other_seed = parse_run_spec(detour_spec(data={**detour_spec()["data"], "data_seed": 7}))
    a = pretrain(clm, tmp_path / "clm", log=_quiet)
    b = pretrain(mlm, tmp_path / "mlm", log=_quiet)
    c = pretrain(other_seed, tmp_path / "other", log=_quiet)
    assert a.token_hash == b.token_hash and a.tokens_seen == b.tokens_seen == 7 * 4 * 32
    assert a.phase_token_hashes["mlm_decay"] == b.phase_token_hashes["mlm_decay"]
    assert c.token_hash != a.token_hash


def _run_cli(spec_file: Path, out: Path, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ablate.cli", "run", str(spec_file), "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        **kw,
    )


DETOUR = [
    {"name": "clm", "objective": "clm", "steps": 8, "freeze": "low"},
    {"name": "mlm_decay", "objective": "mlm", "steps": 6, "lr": {"decay": "1-sqrt", "final_fraction": 0.1}},
]
# a mixture by sequence (causal and masked rows in one micro-batch), then a masking-rate schedule
MIXED = [
    {
        "name": "mix",
        "objective": "mixture",
        "granularity": "sequence",
        "steps": 8,
        "mixture": [
            {"objective": "clm", "weight": 1},
            {"objective": "mntp", "weight": 1, "mask_rate": 0.3},
            {"objective": "prefix-lm", "weight": 1},
        ],
    },
    {
        "name": "mlm_decay",
        "objective": "mlm",
        "mask_rate": 0.3,
        "mask_rate_end": 0.05,
        "steps": 6,
        "lr": {"decay": "linear"},
    },
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch, extra, phases",
    [
        ("tiny-modernbert", {}, DETOUR),
        ("tiny-bert", {"micro_batch_size": 2}, MIXED),  # dropout 0.1, micro-batches, a mixture, then a decay
    ],
)
def test_sigkill_then_resume_ends_with_the_same_weights_and_curve(arch, extra, phases, tmp_path, data_root):
    spec = detour_spec(arch, **extra, phases=phases)
    spec_file = tmp_path / "run.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    straight = tmp_path / "straight"
    assert _run_cli(spec_file, straight, env).wait(timeout=300) == 0

    killed = tmp_path / "killed"
    proc = _run_cli(spec_file, killed, env)
    deadline = time.time() + 240
    while time.time() < deadline:  # wait for a checkpoint in the middle of the CLM phase, then kill -9
        latest = killed / "checkpoints" / "LATEST"
        if latest.is_file() and int(latest.read_text().split("-")[1]) >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "model").exists(), "the run finished before it could be killed"
    status = json.loads((killed / "status.json").read_text())
    assert status["state"] == "running"  # what a killed process leaves; the lock tells it is not
    assert _run_cli(spec_file, killed, env).wait(timeout=300) == 0
    assert "resumed from step-" in (killed / "log.txt").read_text()

    a = load_file(str(straight / "model" / "model.safetensors"))
    b = load_file(str(killed / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    curve_a = json.loads((straight / "records" / "curves.json").read_text())
    curve_b = json.loads((killed / "records" / "curves.json").read_text())
    assert curve_a == curve_b
    assert json.loads((killed / "status.json").read_text())["attempts"] == 2
    if phases is MIXED:  # each member's loss and the scheduled rate are in the curves
        assert {"loss/clm", "loss/mntp", "loss/prefix-lm", "mask_rate/mntp", "mask_rate"} <= set(curve_a)
        rates = [r for r in curve_a["mask_rate"] if r is not None]
        assert rates[0] == pytest.approx(0.3) and rates[-1] == pytest.approx(0.05)


def test_saved_model_loads_with_auto_model_for_masked_lm(tmp_path, data_root):
    spec = parse_run_spec(detour_spec("tiny-modernbert", phases=[{"name": "mlm", "objective": "mlm", "steps": 2}]))
    pretrain(spec, tmp_path / "run", log=_quiet)
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "run" / "model")
    assert type(model).__name__ == "ModernBertForMaskedLM"
    assert model.decoder.weight.data_ptr() == model.model.embeddings.tok_embeddings.weight.data_ptr()


@pytest.mark.slow
def test_gradient_accumulation_matches_the_full_batch(tmp_path, data_root):
    # tiny ModernBERT has no dropout, so the two differ only in how the batch is split
    phases = [{"name": "mlm", "objective": "mlm", "steps": 3}]
    full = pretrain(parse_run_spec(detour_spec("tiny-modernbert", phases=phases)), tmp_path / "full", log=_quiet)
    accum = pretrain(
        parse_run_spec(detour_spec("tiny-modernbert", phases=phases, micro_batch_size=2)),
        tmp_path / "acc",
        log=_quiet,
    )
    assert full.token_hash == accum.token_hash
    np.testing.assert_allclose([c["loss"] for c in full.curves], [c["loss"] for c in accum.curves], rtol=1e-5)


def test_lr_schedules():
    peak = 1.0
    warm = LRSchedule(warmup_steps=4)
    assert [lr_at(warm, peak, s, 10) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    sqrt = LRSchedule(decay="1-sqrt", final_fraction=0.1)
    values = [lr_at(sqrt, peak, s, 5) for s in range(5)]
    assert values[0] == 1.0 and values[-1] == pytest.approx(0.1)
    assert values[2] == pytest.approx(1 - 0.9 * (0.5**0.5))
    lin = LRSchedule(decay="linear", final_fraction=0.0, warmup_fraction=0.5)
    assert [lr_at(lin, peak, s, 6) for s in range(6)] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0, 0.5, 0.0])


@pytest.mark.parametrize(
    "change, key, words",
    [
        ({"phases": []}, "phases", "at least one phase"),
        ({"phasez": []}, "phasez", "unknown key"),
        ({"phases": [{"name": "m", "objective": "mlm", "steps": 2, "mask_rate": 1.5}]}, "phases", "(0, 1)"),
        (
            {"phases": [{"name": "m", "objective": "mlm", "steps": 2, "freeze": "lowest"}]},
            "phases[0].freeze",
            "allowed",
        ),
        ({"phases": [{"name": "m", "objective": "rtd", "steps": 2}]}, "phases[0].objective", "mlm"),
        ({"phases": [{"name": "m", "objective": "mlm"}]}, "phases[0]", "exactly one length"),
        ({"batch_size": 6, "micro_batch_size": 4}, "micro_batch_size", "multiple"),
    ],
)
def test_bad_specs_name_the_key(change, key, words):
    with pytest.raises(SpecError) as err:
        parse_run_spec({**detour_spec(), **change}, file="run.yaml")
    assert err.value.file == "run.yaml"
    assert err.value.key.startswith(key) and words in str(err.value)


def test_freeze_range_past_the_depth_is_an_error_before_training():
    spec = parse_run_spec(detour_spec(phases=[{"name": "m", "objective": "mlm", "steps": 2, "freeze": "2-9"}]))
    with pytest.raises(SpecError, match="past the model's depth") as err:
        plan_phases(spec, 4)
    assert err.value.key == "phases[0].freeze"


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"phases": [{"name": "m", "objective": "mlm", "steps": 1, "freeze": "0-12"}]}, "phases[0].freeze"),
        ({"data": {"corpus": "no/such/corpus.txt"}}, "data.corpus"),
        ({"model": "config:tiny-gpt"}, "model"),
    ],
)
def test_cli_rejects_bad_input_with_exit_code_2(change, expected, tmp_path, data_root):
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(yaml.safe_dump({**detour_spec(), **change}))
    result = ablate(["run", spec_file, "--out", tmp_path / "out"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "error:" in result.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_empty_corpus_is_an_error(tmp_path, data_root):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(yaml.safe_dump({**detour_spec(), "data": {"corpus": str(empty)}}))
    result = ablate(["run", spec_file, "--out", tmp_path / "out"], tmp_path)
    assert result.returncode == 2 and "corpus is empty" in result.stderr


def test_yaml_tags_that_build_objects_are_refused(tmp_path):
    spec_file = tmp_path / "evil.yaml"
    spec_file.write_text("model: !!python/object/apply:os.system ['echo pwned']\n")
    result = ablate(["run", spec_file], tmp_path)
    assert result.returncode == 2 and "not valid YAML" in result.stderr


@pytest.mark.slow
def test_tokenization_is_prepared_once_per_tokenizer_and_content(
    tmp_path, data_root, minilm_tokenizer, monkeypatch
):
    from ablate.data import corpus, prepare
    from ablate.config.spec import DataSpec

    monkeypatch.setenv("ABLATE_PREPARED", str(tmp_path / "prepared"))
    calls = []
    original = prepare._tokenize_into
    monkeypatch.setattr(prepare, "_tokenize_into", lambda *a: calls.append(1) or original(*a))
    spec = DataSpec(corpus="corpus_en_e3c/train.txt", max_documents=50)
    with pytest.raises(SpecError, match="not prepared.*ablate prepare"):  # reading never tokenizes
        corpus.open_prepared(spec, minilm_tokenizer)
    assert calls == []
    first = corpus.ensure_prepared(spec, minilm_tokenizer)
    again = corpus.ensure_prepared(spec, minilm_tokenizer)
    assert calls == [1] and np.array_equal(first.tokens(0, first.n_tokens), again.tokens(0, again.n_tokens))
    corpus.ensure_prepared(DataSpec(corpus="corpus_en_e3c/train.txt", max_documents=51), minilm_tokenizer)
    assert calls == [1, 1]  # other content: prepared again, in its own folder
    assert len([p for p in (tmp_path / "prepared").iterdir() if p.is_dir()]) == 2
    seqs, docs = first.packed(64)
    all_rows = np.arange(len(seqs))
    assert seqs.shape[1] == 64 and seqs[all_rows][0, 0] == minilm_tokenizer.cls_token_id
    assert (np.diff(docs[all_rows].ravel()) >= 0).all()


def test_a_mask_that_freezes_everything_is_an_error_before_training(tmp_path, data_root):
    spec = parse_run_spec(
        detour_spec(
            phases=[
                {"name": "ok", "objective": "mlm", "steps": 2},
                {"name": "all", "objective": "mlm", "steps": 2, "freeze": ["encoder", "head"]},
            ]
        )
    )
    with pytest.raises(SpecError, match="nothing to train") as err:
        pretrain(spec, tmp_path / "run", log=_quiet)
    assert err.value.key == "phases[1].freeze"
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_jsonl_parquet_and_datasets_corpora_give_the_same_stream_as_text(
    fmt, tmp_path, data_root, minilm_tokenizer
):
    import pandas as pd

    from ablate.data.corpus import ensure_prepared
    from ablate.config.spec import DataSpec

    docs = [line.strip() for line in (data_root / "corpus_en_e3c" / "valid.txt").open()][:30]
    path = tmp_path / f"corpus.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    elif fmt == "hf":  # a `datasets` dataset saved to disk
        import datasets

        datasets.Dataset.from_dict({"body": docs}).save_to_disk(str(path))
    else:
        pd.DataFrame({"body": docs}).to_parquet(path)
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(docs) + "\n")
    a = ensure_prepared(DataSpec(corpus=str(path), text_field="body"), minilm_tokenizer)
    b = ensure_prepared(DataSpec(corpus=str(text)), minilm_tokenizer)
    assert np.array_equal(a.tokens(0, a.n_tokens), b.tokens(0, b.n_tokens)) and a.n_documents == 30

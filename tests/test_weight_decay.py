"""Weight decay with the recipe's meaning (Composer's DecoupledAdamW): each step multiplies a decayed weight by
1 - (lr_t / peak) x weight_decay; biases, norms and frozen parameters are never decayed."""

from __future__ import annotations

import pytest
import torch

from ablate.config.spec import parse_run_spec
from ablate.models.loading import load_masked_lm
from ablate.train.optimizer import Optimizer, _no_decay
from builders import detour_spec
from tests.test_pretrain import _quiet

PEAK, WD = 2e-4, 1e-5  # the paper's values


def _optimizer(form: str, fused: bool, weight_decay: float = WD):
    spec = parse_run_spec(detour_spec(optim={"lr": PEAK, "weight_decay": weight_decay, "weight_decay_form": form}))
    model = load_masked_lm(spec.model, spec.attn_implementation, seed=spec.seed)
    return model, Optimizer(model, spec, fused=fused)


def _zero_grad_steps(model, opt: Optimizer, lr: float, steps: int) -> None:
    """Adam's update is exactly 0 for a zero gradient: what is left of a step is the decay."""
    for _ in range(steps):
        for p in opt.trainable():
            p.grad = torch.zeros_like(p)
        for group in opt.torch.param_groups:
            group["lr"] = lr
        opt.torch.step()


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("lr", [PEAK, PEAK / 4])
def test_decayed_weights_shrink_by_the_recipes_factor_per_step_and_frozen_ones_do_not(fused, lr):
    model, opt = _optimizer("composer", fused)
    frozen = "bert.encoder.layer.0.attention.self.query.weight"
    model.get_parameter(frozen).requires_grad_(False)
    opt.set_trainable()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    steps = 50
    _zero_grad_steps(model, opt, lr, steps)

    per_step = torch.tensor(1 - lr / PEAK * WD, dtype=torch.float32)  # 1e-5 a step at peak
    decayed = [n for n in before if not _no_decay(n) and n != frozen]
    for name, p in model.named_parameters():
        if name in decayed:
            expected = before[name].clone()
            for _ in range(steps):
                expected = expected * per_step
            assert torch.equal(p.detach(), expected), name
        else:  # biases, norms, the frozen weight
            assert torch.equal(p.detach(), before[name]), f"{name} decayed"
    word = "bert.embeddings.word_embeddings.weight"
    shrink = 1 - float(model.get_parameter(word).detach().double().norm() / before[word].double().norm())
    assert shrink == pytest.approx(1 - (1 - lr / PEAK * WD) ** steps, rel=1e-2)  # float32 rounding


def test_torch_form_at_the_recipes_values_leaves_float32_weights_bitwise_unchanged():
    """What ablate ran before: torch's 1 - lr x wd = 1 - 2e-9 rounds to 1.0 in float32."""
    model, opt = _optimizer("torch", fused=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _zero_grad_steps(model, opt, PEAK, 20)
    assert all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


def test_runs_with_and_without_weight_decay_end_with_different_weights(tmp_path, data_root):
    from ablate.train.loop import pretrain

    phases = [{"name": "mlm", "objective": "mlm", "steps": 3}]
    weights = {}
    for wd in (0.0, WD):
        spec = parse_run_spec(detour_spec(phases=phases, optim={"lr": PEAK, "weight_decay": wd}))
        pretrain(spec, tmp_path / str(wd), log=_quiet)
        model = load_masked_lm(str(tmp_path / str(wd) / "model"), "sdpa", seed=0)
        weights[wd] = dict(model.named_parameters())
    name = "bert.encoder.layer.2.attention.self.query.weight"
    assert not torch.equal(weights[0.0][name], weights[WD][name])
    assert (
        parse_run_spec(detour_spec(optim={"weight_decay_form": "torch"})).run_id
        != parse_run_spec(detour_spec()).run_id
    )

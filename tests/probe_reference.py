"""Per-layer weight change and gradient norms computed the slow, obvious way, one parameter at a time: the
references the tests hold the loop's fused measures to (ablate.analysis.probe.weight_rel_change over whole
models, ablate.train.grad_norms.step_norms)."""

from __future__ import annotations

import torch

from ablate.analysis.probe import layer_params, weight_rel_change


def weight_relative_change(model_after, model_base) -> dict[int, float]:
    """weight_rel_change between two models of the same architecture (MLM wrappers or bare encoders)."""
    encoder_after = getattr(model_after, "base_model", model_after)
    encoder_base = getattr(model_base, "base_model", model_base)
    groups = layer_params(encoder_after)
    if groups != layer_params(encoder_base):
        raise ValueError("the two models have different layers")
    return weight_rel_change(dict(encoder_after.named_parameters()), dict(encoder_base.named_parameters()), groups)


def layer_grad_norms(model) -> dict[int, float]:
    """layer -> L2 norm of its current gradients: each tensor's norm in its own dtype, combined in float64;
    layers without gradients (frozen, or not reached) left out."""
    params, norms = dict(model.named_parameters()), {}
    for layer, names in layer_params(model).items():
        grads = [params[n].grad for n in names if params[n].grad is not None]
        if grads:
            norms[layer] = float(
                torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g).double() for g in grads]))
            )
    return norms

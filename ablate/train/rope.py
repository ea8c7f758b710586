"""A phase's RoPE thetas set on the model at the phase's start (context extension).

The family entry says which layer type each theta key sets (ablate.models.families: `rope_thetas`); the theta
goes into the config's rope_parameters (what the saved model's config.json carries) and every rotary
embedding's inverse frequencies are computed again from it, as transformers computes them when it builds the
model (both the live buffer and the original one that dynamic RoPE types scale from). The thetas in effect at
a phase are the last ones set up to it (config.sources.rope_thetas_at), so a run resumed inside a phase, or
branched from another run's checkpoint, sets the same ones on its freshly loaded model. A phase's start
(freezing, then these thetas) is ablate.train.freezing.start_phase.

May import: models.
"""

from __future__ import annotations

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ablate.models.families import Family


@torch.no_grad()
def set_rope_thetas(model: torch.nn.Module, family: Family, thetas: dict[str, float]) -> None:
    """Set `thetas` (phase data key -> theta) in the model's config and rotary embeddings."""
    if not thetas:
        return
    types = family.rope_layer_types(thetas)
    for key, layer_type in types.items():
        model.config.rope_parameters[layer_type]["rope_theta"] = float(thetas[key])
    for module in model.modules():
        inits = getattr(module, "rope_type", None)
        if not isinstance(inits, dict) or not hasattr(module, "compute_default_rope_parameters"):
            continue
        for layer_type in set(types.values()) & set(inits):
            module.config.rope_parameters[layer_type]["rope_theta"] = model.config.rope_parameters[layer_type][
                "rope_theta"
            ]
            init = (
                module.compute_default_rope_parameters
                if inits[layer_type] == "default"
                else ROPE_INIT_FUNCTIONS[inits[layer_type]]
            )
            live = getattr(module, f"{layer_type}_inv_freq")
            inv_freq, _ = init(module.config, live.device, layer_type=layer_type)
            live.copy_(inv_freq)
            getattr(module, f"{layer_type}_original_inv_freq").copy_(inv_freq)

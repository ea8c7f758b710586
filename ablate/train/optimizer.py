"""AdamW over a model whose trainable set changes per phase, with moments kept by parameter name.

Weight decay has the recipe's meaning by default (Composer's DecoupledAdamW, which the paper trained with):
each step multiplies a decayed weight by 1 - (lr_t / peak) x weight_decay, peak being `optim.lr`. That is
torch's AdamW with its decay coefficient divided by the peak: torch multiplies by 1 - lr_t x coefficient,
before the Adam update, as Composer does. `weight_decay_form: torch` keeps torch's own meaning.

May import: config.
"""

from __future__ import annotations

import torch

from ablate.config.spec import OptimSpec, RunSpec


def _no_decay(name: str) -> bool:
    return name.endswith("bias") or "norm" in name.lower()


class Optimizer:
    """AdamW over every parameter, with the phase's frozen ones removed from its groups.

    Moments are kept per parameter name across phases (a layer frozen in one phase keeps what it learned
    before and resumes with it), and saved by name, so a checkpoint taken while a layer is frozen still
    holds that layer's moments."""

    def __init__(self, model: torch.nn.Module, spec: RunSpec, fused: bool):
        self.named = dict(model.named_parameters())
        o = spec.optim
        self.decay_names = [n for n in self.named if not _no_decay(n)]
        self.plain_names = [n for n in self.named if _no_decay(n)]
        self.torch = torch.optim.AdamW(
            [
                {"params": [self.named[n] for n in self.decay_names], "weight_decay": torch_decay(o)},
                {"params": [self.named[n] for n in self.plain_names], "weight_decay": 0.0},
            ],
            lr=o.lr,
            betas=o.betas,
            eps=o.eps,
            **({"fused": True} if fused else {}),
        )

    def set_trainable(self) -> None:
        self.torch.param_groups[0]["params"] = [
            self.named[n] for n in self.decay_names if self.named[n].requires_grad
        ]
        self.torch.param_groups[1]["params"] = [
            self.named[n] for n in self.plain_names if self.named[n].requires_grad
        ]

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for g in self.torch.param_groups for p in g["params"]]

    def state_by_name(self) -> dict[str, dict[str, torch.Tensor]]:
        by_param = self.torch.state
        return {n: {k: v for k, v in by_param[p].items()} for n, p in self.named.items() if p in by_param}

    def load_state_by_name(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Moments saved by name (read to CPU) onto each parameter's device, `step` where torch keeps it."""
        step_with_param = self.keeps_step_on_param_device()
        for n, moments in state.items():
            p = self.named[n]
            self.torch.state[p] = {k: _placed(k, v, p, step_with_param) for k, v in moments.items()}

    def keeps_step_on_param_device(self) -> bool:
        """torch's fused and capturable AdamW need `step` on the parameter's device (float32); the other
        paths keep it as a CPU scalar tensor (torch's own Optimizer.load_state_dict places it the same)."""
        return bool(self.torch.defaults.get("fused") or self.torch.defaults.get("capturable"))


def _placed(key: str, value: torch.Tensor, param: torch.Tensor, step_with_param: bool) -> torch.Tensor:
    """One saved optimizer tensor where the resumed step needs it."""
    if key != "step":
        return value.to(param.device)
    return value.to(param.device, torch.float32) if step_with_param else value.cpu()


def torch_decay(optim: OptimSpec) -> float:
    """The coefficient torch.optim.AdamW needs to decay as `optim.weight_decay_form` says."""
    if optim.weight_decay_form == "composer":
        return optim.weight_decay / optim.lr
    return optim.weight_decay


def fused_adamw(device: torch.device) -> bool:
    """torch has fused AdamW kernels for CPU and CUDA (transformers' Trainer uses them by default too)."""
    return device.type in ("cpu", "cuda")

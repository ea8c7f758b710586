"""The estimate of fine-tuning time where none was measured: the fine-tuning's executed FLOPs at the executed FLOP
rate that the pretraining throughput (a calibration's tokens/s, or --tokens-per-s) implies for the model.

    a fine-tuning example of n tokens, per the conventions of ablate.plan.flops:
      forward  = 2 N n + 4 x hidden x allowed pairs, summed over layers         (dev and test evaluations)
      training = 3 x the matmuls + 3.5 x the attention of the forward            (method full)
                 2 x the matmuls + 3.5 x the attention                          (LoRA: no weight gradients)
                 the forward                                                    (a probe: the encoder frozen)

N: the encoder blocks' matmul weights (ablate.plan.flops.matmul_parameters); attention is bidirectional over the
example's own tokens, windowed on local layers. Not counted: padding (the flash path runs the real tokens only),
the task heads (a classifier, the span model's BiLSTM), the optimizer. The rate of a model is the executed FLOPs
of its pretraining phases in the grid over their seconds at the throughput, with attention counted over whole
rows (the documents are not known before the corpus is read: with document masking, pretraining computes less,
so the rate is high and the fine-tuning estimate low). The estimate is a lower bound: `ablate calibrate` measures.

May import: config, plan.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ablate.config import objectives
from ablate.config.objectives.base import CAUSAL, MaskingObjective, mask_rate_at
from ablate.config.spec import PhaseSpec, RunSpec
from ablate.plan.cost import Throughput, phase_combo
from ablate.plan.flops import ATTENTION_PASSES, FORWARD_AND_BACKWARD, allowed_pairs, layer_windows, step_flops
from ablate.plan.flops import matmul_parameters


@functools.lru_cache(maxsize=65536)
def _pairs(length: int, window: int | None) -> int:
    return allowed_pairs([length], False, window)


class ExampleFlops:
    """Executed FLOPs of one fine-tuning example of a model (a config): forward, and a training step of it."""

    def __init__(self, config) -> None:
        self.blocks = matmul_parameters(config)[0]
        self.hidden = config.hidden_size
        self.windows = layer_windows(config)

    def _parts(self, length: int) -> tuple[float, float]:
        """(the blocks' matmuls, attention) of a forward over `length` tokens."""
        pairs = sum(_pairs(length, window) for window in self.windows)
        return 2.0 * self.blocks * length, 4.0 * self.hidden * pairs

    def forward(self, length: int) -> float:
        return sum(self._parts(length))

    def training(self, length: int, method: str, probe: str) -> float:
        matmuls, attention = self._parts(length)
        if probe != "none":
            return matmuls + attention
        passes = FORWARD_AND_BACKWARD if method != "lora" else FORWARD_AND_BACKWARD - 1
        return passes * matmuls + ATTENTION_PASSES * attention


def mean_flops(
    config, lengths: dict[str, Sequence[int]], method: str, probe: str
) -> tuple[float, float, float] | None:
    """Mean FLOPs of one example: a training step on train, a forward on dev and on test; None when a split has
    no lengths."""
    if not all(lengths.get(split) for split in ("train", "dev", "test")):
        return None
    per = ExampleFlops(config)

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values)

    return (
        mean(per.training(n, method, probe) for n in lengths["train"]),
        mean(per.forward(n) for n in lengths["dev"]),
        mean(per.forward(n) for n in lengths["test"]),
    )


def _labelled_share(entry, params) -> float:
    """The share of a pretraining row's positions with a loss: a masking objective's mean rate over the phase,
    otherwise every position (next-token prediction; prefix-LM predicts fewer)."""
    if isinstance(entry, MaskingObjective):
        return (mask_rate_at(params, 0, 2) + mask_rate_at(params, 1, 2)) / 2
    return 1.0


def pretraining_flops_per_token(config, seq_len: int, phase: PhaseSpec) -> float:
    """Executed FLOPs per token of a pretraining step of `phase` at `seq_len` (a mixture's members by their
    weights), attention over whole rows, causal for a causal member."""
    total = weights = 0.0
    for entry, params, weight in objectives.leaves(phase):
        labelled = round(_labelled_share(entry, params) * seq_len)
        total += weight * step_flops(config, seq_len, 1, entry.pattern == CAUSAL, labelled).executed
        weights += weight
    return total / weights / seq_len


def executed_flop_rates(specs: list[RunSpec], throughput: Throughput, configs: dict) -> dict[str, float]:
    """Model -> the executed FLOP/s of one process over its runs' pretraining phases at `throughput` (models
    without a config in `configs`, or phases without a throughput, left out)."""
    flops: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for spec in specs:
        config = configs.get(spec.model)
        if config is None:
            continue
        for index, (phase, steps, per_step) in enumerate(
            zip(spec.phases, spec.phase_steps(), spec.phase_tokens_per_step())
        ):
            rate = throughput.tokens_per_s(phase_combo(spec, index, phase.objective))
            if rate is None:
                continue
            tokens = steps * per_step
            per_token = pretraining_flops_per_token(config, spec.phase_seq_len(index), phase)
            flops[spec.model] = flops.get(spec.model, 0.0) + tokens * per_token
            seconds[spec.model] = seconds.get(spec.model, 0.0) + tokens / rate
    return {model: flops[model] / seconds[model] for model in flops if seconds[model] > 0}

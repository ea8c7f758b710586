"""What the estimate of fine-tuning time (ablate.plan.finetune_flops) needs from files, where `ablate calibrate`
has measured no fine-tuning throughput: each model's config (for its FLOPs), each task's examples in tokens
(counted by the run's tokenizer when it is here, else estimated from characters), cut at the task's max_length
and the model's context, and the lines that say how the estimate was made.

May import: config, models, plan.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.plan.cost import DEFAULT_FLOOR_FIXED_S, DEFAULT_FLOOR_PER_LAYER_S, Throughput, default_step_floor
from ablate.plan.finetune_flops import executed_flop_rates, mean_flops

# Characters per token where the tokenizer is not here (a hub id not in the local cache): about what a subword
# tokenizer of 30-50k pieces makes of English or French prose; technical text has fewer per token.
CHARS_PER_TOKEN = 4
TOO_LARGE = 10**9  # a tokenizer's model_max_length that says nothing (transformers' VERY_LARGE_INTEGER)


def _text_chars(example) -> int:
    """Characters of an example's input: its text (a token-classification example's words joined by spaces) and
    its text pair."""
    text = example.text if isinstance(example.text, str) else " ".join(example.text)
    return len(text) + (len(example.text_pair) + 1 if example.text_pair is not None else 0)


def token_lengths(examples: list, tokenizer, max_length: int) -> list[int]:
    """Tokens per example, special tokens included, cut at `max_length`: by `tokenizer`, or with None, its
    characters / CHARS_PER_TOKEN plus a start and an end token."""
    if not examples:
        return []
    if tokenizer is None:
        return [min(max_length, math.ceil(_text_chars(ex) / CHARS_PER_TOKEN) + 2) for ex in examples]
    words = not isinstance(examples[0].text, str)
    texts = [list(ex.text) if words else ex.text for ex in examples]
    pairs = [ex.text_pair for ex in examples] if examples[0].text_pair is not None else None
    encoded = tokenizer(texts, pairs, truncation=True, max_length=max_length, is_split_into_words=words)
    return [len(ids) for ids in encoded["input_ids"]]


class TokenCounter:
    """Each model's config and each tokenizer, loaded once (None where not here: the model's fine-tuning is
    then not estimated; the examples' characters stand in for the tokenizer); `how` says how each tokenizer
    source was counted."""

    def __init__(self) -> None:
        self._configs: dict[str, object] = {}
        self._tokenizers: dict[str, object] = {}
        self.how: dict[str, str] = {}  # tokenizer source -> how its tokens were counted

    def config(self, model: str):
        if model not in self._configs:
            from ablate.models.loading import load_config

            try:
                self._configs[model] = load_config(model)
            except SpecError:  # a hub id neither cached nor shipped, with the hub unreachable
                self._configs[model] = None
        return self._configs[model]

    def tokenizer(self, source: str):
        if source not in self._tokenizers:
            from ablate.models.loading import load_tokenizer

            try:
                self._tokenizers[source] = load_tokenizer(source, local_only=True)
            except SpecError:
                self._tokenizers[source] = None
            self.how[source] = (
                "its tokenizer"
                if self._tokenizers[source] is not None
                else f"characters / {CHARS_PER_TOKEN} (the tokenizer is not in the local cache)"
            )
        return self._tokenizers[source]

    def example_flops(
        self, spec: RunSpec, settings, examples: dict[str, list], max_length: int
    ) -> tuple[float, float, float] | None:
        """Mean executed FLOPs of one example of each split (ablate.plan.finetune_flops.mean_flops) when the
        spec's model fine-tunes on `examples` under `settings`; None without the model's config."""
        config = self.config(spec.model)
        if config is None:
            return None
        tokenizer = self.tokenizer(spec.tokenizer or spec.model)
        limit = max_length
        for bound in (
            getattr(config, "max_position_embeddings", None),
            getattr(tokenizer, "model_max_length", None),
        ):
            if isinstance(bound, int) and bound < TOO_LARGE:
                limit = min(limit, bound)
        lengths = {split: token_lengths(items, tokenizer, limit) for split, items in examples.items()}
        return mean_flops(config, lengths, settings.method, settings.probe)


def with_estimates(
    throughput: Throughput,
    specs: list[RunSpec],
    counter: TokenCounter,
    measured_floors: dict[str, tuple[float, str]] | None = None,
) -> Throughput:
    """`throughput` with the executed FLOP rate of each model the counter has a config of (over the specs'
    pretraining at it), the floor of one of its fine-tuning steps (`measured_floors`: model -> (seconds, where),
    from `ablate calibrate`; else the default of its layer count, ablate.plan.cost.default_step_floor), and
    the lines that say how fine-tuning is estimated from them."""
    configs = {spec.model: counter.config(spec.model) for spec in specs}
    rates = executed_flop_rates(specs, throughput, {m: c for m, c in configs.items() if c is not None})
    if not rates:
        return throughput
    measured_floors = measured_floors or {}
    floors, said = {}, []
    for model in rates:
        if model in measured_floors:
            floors[model], where = measured_floors[model]
            said.append(f"{model} {floors[model] * 1000:.3g} ms (measured by `ablate calibrate` on {where})")
        else:
            layers = configs[model].num_hidden_layers
            floors[model] = default_step_floor(layers)
            said.append(
                f"{model} {floors[model] * 1000:.3g} ms (default, not measured: {DEFAULT_FLOOR_FIXED_S * 1000:g} ms "
                f"+ {DEFAULT_FLOOR_PER_LAYER_S * 1000:g} ms x {layers} layers)"
            )
    basis = (
        "fine-tuning h (estimated): no fine-tuning throughput was measured; each fine-tuning is the longer of",
        "  its executed FLOPs (6 x the encoder's matmul weights x tokens + attention, over steps x batch for a "
        "max_steps task; no padding, no task heads) at the executed FLOP rate of its model's pretraining at this "
        "throughput (attention over whole rows), and its optimizer steps x the model's step floor (an "
        "evaluation batch a third of it): a step of a few short sequences is bound by kernel launches, not FLOPs",
        "  FLOP rate per process: "
        + "; ".join(f"{model} {rate / 1e12:.3g} TFLOP/s" for model, rate in rates.items()),
        "  step floor: " + "; ".join(said),
        "  tokens per example from the task data, cut at max_length: "
        + "; ".join(f"{source}: {how}" for source, how in counter.how.items()),
    )
    return replace(throughput, flop_rates=rates, step_floors=floors, estimate_basis=basis)

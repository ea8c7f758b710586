"""What every objective entry is, and what its batch returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ablate.config.base import Located
from ablate.config.registry import Registry

IGNORE = -100
BIDIRECTIONAL, CAUSAL, PREFIX = "bidirectional", "causal", "prefix"
PATTERNS = (BIDIRECTIONAL, CAUSAL, PREFIX)
DEFAULT_MASK_RATE = 0.15
BERT_SPLIT = (0.8, 0.1, 0.1)  # [MASK], a random token, kept: the corruption of a masked position
# every field an objective may read, on a phase or a mixture member: None is "not written"
OBJECTIVE_FIELDS = ("mask_rate", "mask_rate_end", "corruption", "span_length", "mixture", "granularity")


@dataclass(frozen=True)
class TokenInfo:
    """What a batch needs of the tokenizer and the model."""

    special_ids: torch.Tensor  # never masked
    mask_id: int
    vocab_size: int


@dataclass(frozen=True)
class Draws:
    """Where a batch's randomness and position come from: deterministic in (seed, step)."""

    masking: torch.Generator  # masking, spans, prefix splits, in the order the entries draw them
    choice: torch.Generator  # which mixture member trains which rows
    step: int  # within the phase (masking-rate schedules)
    steps: int  # the phase's length
    micro: int  # sequences per micro-batch (a mixture's micro-batch granularity)


@dataclass
class Batch:
    """inputs and labels (B, L), labels IGNORE where there is no loss; prefix (B,): how many leading positions
    of each row attend bidirectionally (L: bidirectional, 0: causal); member (B,): which mixture member
    (index into `labels_of`) each row trains; mask_rates: the rate each masking member used."""

    inputs: torch.Tensor
    labels: torch.Tensor
    prefix: torch.Tensor
    member: torch.Tensor
    labels_of: tuple[str, ...]
    mask_rates: dict[str, float]

    def pattern(self, rows: slice = slice(None)) -> str:
        return pattern_of_rows(self.prefix[rows], self.inputs.shape[1])


def pattern_of_rows(prefix: torch.Tensor, length: int) -> str:
    """The attention pattern of rows with these prefix lengths: bidirectional, causal, or prefix (per row)."""
    if bool((prefix == length).all()):
        return BIDIRECTIONAL
    return CAUSAL if bool((prefix == 0).all()) else PREFIX


def mask_rate_at(params, step: int, steps: int) -> float:
    """The masking rate at `step` of a phase of `steps`: mask_rate (default 0.15), or linear from it to
    mask_rate_end over the phase (first step at the start rate, last at the end rate)."""
    start = DEFAULT_MASK_RATE if params.mask_rate is None else params.mask_rate
    end = params.mask_rate_end
    if end is None or steps <= 1:
        return start
    return start + (end - start) * step / (steps - 1)


def corrupt(
    ids: torch.Tensor,
    masked: torch.Tensor,
    split: tuple[float, float, float] | None,
    tokens: TokenInfo,
    generator: torch.Generator,
) -> torch.Tensor:
    """The inputs with each masked position replaced by [MASK], a random token or kept, by `split`
    (default 80/10/10). The draws are the same whatever the split (a split changes no later draw)."""
    replace_share, _random_share, keep_share = split or BERT_SPLIT
    how = torch.rand(ids.shape, generator=generator)
    random_tokens = torch.randint(tokens.vocab_size, ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[masked & (how < replace_share)] = tokens.mask_id
    swap = masked & (how >= replace_share) & (how < 1 - keep_share)  # 1 - 0.1 is 0.9 exactly
    inputs[swap] = random_tokens[swap]
    return inputs


def maskable(ids: torch.Tensor, tokens: TokenInfo) -> torch.Tensor:
    return ~torch.isin(ids, tokens.special_ids)


class Objective:
    """One objective. Subclasses set the class attributes and `make` (and `check` for rules of their own)."""

    name: ClassVar[str]
    pattern: ClassVar[str]
    random_draws: ClassVar[tuple[str, ...]] = ()
    fields: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""

    def check(self, params) -> None:
        """ValueError for a field set that this objective does not read, or a value it cannot take."""
        for name in OBJECTIVE_FIELDS:
            if name not in self.fields and getattr(params, name, None) is not None:
                readers = ", ".join(_readers_of(name)) or "none"
                raise Located(
                    f"{name} does not apply to objective {self.name} (it applies to: {readers})",
                    name,
                    getattr(params, name),
                    f"the fields of {self.name}: {', '.join(self.fields) or 'none'}",
                )

    def identity(self, params) -> dict[str, Any]:
        """What makes this objective what it is on `params`, defaults resolved (0.15 and None are one rate)."""
        out: dict[str, Any] = {"objective": self.name}
        for name in self.fields:
            out[name] = self.effective(params, name)
        return out

    def effective(self, params, name: str) -> Any:
        value = getattr(params, name, None)
        if name == "mask_rate":
            return DEFAULT_MASK_RATE if value is None else value
        if name == "corruption":
            return tuple(value or BERT_SPLIT)
        return value

    def members(self, params) -> list[tuple["Objective", Any, float]]:
        """(entry, its params, weight) of what trains in a phase: itself, or a mixture's members."""
        return [(self, params, 1.0)]

    def make(
        self, ids: torch.Tensor, docs: torch.Tensor, draws: Draws, tokens: TokenInfo, params
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(inputs, labels, per-row prefix lengths or None for the entry's uniform pattern)."""
        raise NotImplementedError

    def batch(self, ids: torch.Tensor, docs: torch.Tensor, draws: Draws, tokens: TokenInfo, params) -> Batch:
        inputs, labels, prefix = self.make(ids, docs, draws, tokens, params)
        if prefix is None:
            prefix = torch.full(
                (len(ids),), ids.shape[1] if self.pattern == BIDIRECTIONAL else 0, dtype=torch.long
            )
        rates = {self.name: mask_rate_at(params, draws.step, draws.steps)} if "mask_rate" in self.fields else {}
        return Batch(inputs, labels, prefix, torch.zeros(len(ids), dtype=torch.long), (self.name,), rates)


class MaskingObjective(Objective):
    """An objective that masks tokens at a (scheduled) rate and corrupts them by the corruption rule: its
    subclasses say which tokens may be masked, how they are chosen and where each is predicted."""

    pattern = BIDIRECTIONAL
    fields = ("mask_rate", "mask_rate_end", "corruption")

    def candidates(self, ids: torch.Tensor, docs: torch.Tensor, tokens: TokenInfo) -> torch.Tensor:
        return maskable(ids, tokens)

    def choose(
        self, ids: torch.Tensor, candidates: torch.Tensor, rate: float, draws: Draws, params
    ) -> torch.Tensor:
        return candidates & (torch.rand(ids.shape, generator=draws.masking) < rate)

    def targets(self, ids: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """Labels: each masked token predicted in place."""
        return torch.where(masked, ids, torch.full_like(ids, IGNORE))

    def make(self, ids, docs, draws, tokens, params):
        rate = mask_rate_at(params, draws.step, draws.steps)
        masked = self.choose(ids, self.candidates(ids, docs, tokens), rate, draws, params)
        return corrupt(ids, masked, params.corruption, tokens, draws.masking), self.targets(ids, masked), None


def _check_objective(entry: Objective, _registry) -> None:
    if not isinstance(getattr(entry, "name", None), str) or not hasattr(entry, "pattern"):
        raise ValueError(f"objective {type(entry).__name__}: an entry sets `name` and `pattern`")
    unknown = set(entry.fields) - set(OBJECTIVE_FIELDS)
    if unknown:
        raise ValueError(f"objective {entry.name!r} reads fields OBJECTIVE_FIELDS lacks: {sorted(unknown)}")


# the registered objectives (ablate.config.objectives registers the shipped ones; `register` adds one)
OBJECTIVES: Registry[Objective] = Registry("objective", Objective, _check_objective)


def _readers_of(field: str) -> list[str]:
    return sorted(n for n, e in OBJECTIVES.items() if field in e.fields)

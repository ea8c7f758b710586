"""What a run reads, as written: a corpus with its weight in a mixture, and the data a phase names for itself.

A run's `data` reads one corpus, or a `mixture` of weighted corpora (replay: a share of general text beside
the domain corpus). A phase may name its own data (`data:` in the phase: a corpus, a mixture and/or a
sequence length); what it leaves out it takes from the run's `data`. A phase may also set the model's RoPE
theta from its start on (`rope_theta`, `local_rope_theta`: context extension). How the rows of each step are shared
out between the members, and where each corpus is read from, is ablate.data.mixture.

May import: config.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from ablate.config.base import Located, Strict

FORMATS = Literal["auto", "text", "jsonl", "parquet", "hf"]


class SourceSpec(Strict):
    """One member of a data mixture: its corpus, its weight, and how to read it (default: as the enclosing
    data's format and text field)."""

    corpus: str = Field(min_length=1, description="path under the data root (or absolute), or hf:NAME")
    weight: float = Field(gt=0, description="relative share of the sequences the run reads")
    format: FORMATS | None = Field(default=None, description="default: the enclosing data's")
    text_field: str | None = Field(default=None, description="default: the enclosing data's")


def check_members(mixture: tuple[SourceSpec, ...] | None) -> None:
    """A mixture has at least one member and names each corpus once (its tokens are counted by corpus)."""
    if mixture is None:
        return
    if not mixture:
        raise Located("a mixture needs at least one member", "mixture", [], "[{corpus: NAME, weight: W}, ...]")
    names = [m.corpus for m in mixture]
    for name in names:
        if names.count(name) > 1:
            raise Located("a mixture names each corpus once", "mixture", name, "distinct corpora")


class PhaseData(Strict):
    """The data of one phase, where it differs from the run's: its own corpus (with format and text field)
    or mixture, and its own sequence length. What is not written is the run's."""

    corpus: str | None = Field(default=None, min_length=1, description="this phase's corpus")
    format: FORMATS | None = Field(default=None, description="how this phase's corpus is read; default: the run's")
    text_field: str | None = Field(
        default=None, description="the text field of this phase's corpus; default: the run's"
    )
    mixture: tuple[SourceSpec, ...] | None = Field(default=None, description="this phase's weighted corpora")
    seq_len: int | None = Field(default=None, ge=8, description="tokens per sequence in this phase")
    rope_theta: float | None = Field(
        default=None,
        gt=0,
        description="RoPE theta of the global-attention layers "
        "from this phase on (context extension; families that declare one)",
    )
    local_rope_theta: float | None = Field(
        default=None, gt=0, description="RoPE theta of the local (sliding-window) layers from this phase on"
    )

    @model_validator(mode="after")
    def _one_source(self):
        if self.corpus is not None and self.mixture is not None:
            raise Located(
                "a phase reads a corpus or a mixture, not both", "mixture", "(and corpus)", "corpus, or mixture"
            )
        check_members(self.mixture)
        if self.model_dump(exclude_none=True) == {}:
            raise Located(
                "a phase's data names nothing",
                "data",
                {},
                "corpus, format, text_field, mixture, seq_len, rope_theta, local_rope_theta",
            )
        return self

    @property
    def reads(self) -> bool:
        """Whether it names what the phase reads (a source or a length), not only RoPE thetas."""
        return bool(self.model_dump(exclude_none=True, exclude=set(ROPE_KEYS)))


ROPE_KEYS = ("rope_theta", "local_rope_theta")


def rope_thetas_at(phases, index: int) -> dict[str, float]:
    """The RoPE thetas in effect in phase `index`: each the last one a phase up to it sets (a theta holds until
    a later phase sets another); none: the model's own."""
    out: dict[str, float] = {}
    for phase in phases[: index + 1]:
        for key in ROPE_KEYS:
            value = getattr(phase.data, key, None) if phase.data is not None else None
            if value is not None:
                out[key] = value
    return out


def phase_rope_thetas(phases) -> dict[str, dict[str, float]]:
    """{phase name: the RoPE thetas in effect there} when any phase sets one, else {} (the model's own)."""
    if not any(rope_thetas_at(phases, i) for i in range(len(phases))):
        return {}
    return {p.name: rope_thetas_at(phases, i) for i, p in enumerate(phases)}


def steps_by_length(phases, per_step: list[int], budget_tokens: int | None) -> list[int]:
    """Each phase's steps when phases differ in length: a fraction's cumulative boundary in tokens, reached from
    the tokens the fractions before it trained, in steps of its own length (RunSpec.phase_steps)."""
    out, trained, done = [], 0, 0.0
    for p, step in zip(phases, per_step):
        if p.steps is not None:
            out.append(p.steps)
        elif p.tokens is not None:
            out.append(max(1, math.ceil(p.tokens / step)))
        else:
            done += p.fraction
            out.append(max(1, math.ceil((done * budget_tokens - trained) / step - 1e-9)))
            trained += out[-1] * step
    return out

"""What a run reads, as written: a corpus with its weight in a mixture, and the data a phase names for itself.

A run's `data` reads one corpus, or a `mixture` of weighted corpora (replay: a share of general text beside
the domain corpus). A phase may name its own data (`data:` in the phase: a corpus, a mixture and/or a
sequence length); what it leaves out it takes from the run's `data`. How the rows of each step are shared
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
    text_field: str | None = Field(default=None, description="the text field of this phase's corpus; default: the "
                                                             "run's")
    mixture: tuple[SourceSpec, ...] | None = Field(default=None, description="this phase's weighted corpora")
    seq_len: int | None = Field(default=None, ge=8, description="tokens per sequence in this phase")

    @model_validator(mode="after")
    def _one_source(self):
        if self.corpus is not None and self.mixture is not None:
            raise Located("a phase reads a corpus or a mixture, not both", "mixture", "(and corpus)",
                          "corpus, or mixture")
        check_members(self.mixture)
        if self.model_dump(exclude_none=True) == {}:
            raise Located("a phase's data names nothing", "data", {}, "corpus, format, text_field, mixture, seq_len")
        return self


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

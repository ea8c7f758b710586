"""How many times a run reads its corpus, and the refusal of a run that would read it too often.

A run trains steps x batch_size sequences of seq_len tokens (every phase, a grid's prelude included); its
corpus packs corpus tokens // seq_len such sequences (the remainder is dropped). Epochs are the first over
the second. The data order (ablate.data.corpus.SequenceOrder) starts a fresh permutation at each pass, so
without this check a corpus too small for the budget would loop silently. The dry run prints the epochs;
a submission, and every run at its start, refuse more than `data.max_epochs` of them, and any global batch
that holds more sequences than the corpus has (it would hold some sequence twice in one step).

May import: config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec

GRID_KEY = "base.data.max_epochs"
OVER = " !"  # marks a dry run's epochs cell that a real submission refuses


@dataclass(frozen=True)
class CorpusSize:
    """What is known of a corpus's tokens before a run: counted (`exact`: its prepared manifest), estimated
    (from its bytes), or nothing (`tokens` None; `missing`: the corpus is not there)."""

    tokens: int | None
    exact: bool = False
    missing: bool = False


def planned_sequences(spec: RunSpec) -> int:
    return sum(spec.phase_steps()) * spec.batch_size


def planned_tokens(spec: RunSpec) -> int:
    """The tokens the run trains: the sum of its phase steps x batch_size x each phase's seq_len."""
    return spec.planned_tokens()


def packed_sequences(spec: RunSpec, corpus_tokens: int) -> int:
    return corpus_tokens // spec.data.seq_len


def corpus_epochs(spec: RunSpec, corpus_tokens: int) -> float:
    """How many times the run reads its corpus of `corpus_tokens` tokens (inf when it packs no sequence)."""
    sequences = packed_sequences(spec, corpus_tokens)
    return planned_sequences(spec) / sequences if sequences else math.inf


def over_max_epochs(spec: RunSpec, corpus_tokens: int) -> bool:
    """More sequences planned than max_epochs passes over the corpus hold (a hair of float slack, so that
    exactly max_epochs passes are allowed)."""
    return planned_sequences(spec) > spec.data.max_epochs * packed_sequences(spec, corpus_tokens) * (1 + 1e-12)


def batch_too_large(spec: RunSpec, corpus_tokens: int) -> bool:
    return spec.batch_size > packed_sequences(spec, corpus_tokens)


def format_epochs(epochs: float, estimate: bool = False) -> str:
    """Whole epochs from 100 on, else 3 significant digits; an estimate to its 2 significant digits."""
    if math.isinf(epochs):
        return "inf"
    if estimate:
        epochs = float(f"{epochs:.2g}")  # 18,951 -> 19,000: no false precision
    return f"{epochs:,.0f}" if epochs >= 100 else f"{epochs:.{2 if estimate else 3}g}"


def refused(spec: RunSpec, corpus_tokens: int) -> bool:
    return batch_too_large(spec, corpus_tokens) or over_max_epochs(spec, corpus_tokens)


def epochs_cell(spec: RunSpec, size: CorpusSize) -> str:
    """The dry run's epochs of one run: exact, `~` and `(estimate)` from the corpus's bytes, `unknown` or
    `missing`; `!` when a real submission would refuse it."""
    if size.missing:
        return "missing"
    if size.tokens is None:
        return "unknown"
    epochs = corpus_epochs(spec, size.tokens)
    text = format_epochs(epochs) if size.exact else f"~{format_epochs(epochs, estimate=True)} (estimate)"
    return text + (OVER if refused(spec, size.tokens) else "")


def _what(spec: RunSpec, corpus_tokens: int) -> str:
    steps, seq_len = sum(spec.phase_steps()), spec.data.seq_len
    return (
        f"corpus {spec.data.corpus} has {corpus_tokens:,} tokens: {packed_sequences(spec, corpus_tokens):,} "
        f"sequences of {seq_len}; run {spec.run_id} plans {planned_tokens(spec):,} tokens ({steps:,} steps of "
        f"{spec.batch_size} sequences), {format_epochs(corpus_epochs(spec, corpus_tokens))} epochs over it"
    )


def check_epochs(spec: RunSpec, corpus_tokens: int, file: str | None = None) -> None:
    """A SpecError when the run would hold a sequence twice in one global batch, or read its corpus of
    `corpus_tokens` tokens more than data.max_epochs times."""
    what = _what(spec, corpus_tokens)
    sequences = packed_sequences(spec, corpus_tokens)
    if batch_too_large(spec, corpus_tokens):
        raise SpecError(
            f"{what}: a global batch of {spec.batch_size} sequences is more than the corpus has, so "
            "every step would hold some sequences twice (data.max_epochs, which allows reading the "
            "corpus again across steps, does not allow this)",
            file=file,
            key="batch_size",
            value=spec.batch_size,
            allowed=f"at most {sequences:,} sequences, or a larger corpus",
        )
    if over_max_epochs(spec, corpus_tokens):
        enough = math.ceil(planned_sequences(spec) / spec.data.max_epochs) * spec.data.seq_len
        raise SpecError(
            f"{what}, more than data.max_epochs allows: supply a corpus of at least {enough:,} tokens, "
            f"shorten the run, or allow repetition with data.max_epochs (in a grid: {GRID_KEY})",
            file=file,
            key="data.max_epochs",
            value=spec.data.max_epochs,
            allowed=f"at least {corpus_epochs(spec, corpus_tokens):.4g} for this run and corpus",
        )

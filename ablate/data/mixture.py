"""Which corpus each row of a step reads: a phase's data resolved against the run's, and the rows shared out
between the members of a mixture.

A phase reads one or more *members*, each a corpus read at the phase's sequence length: a *stream* (the
same corpus at the same length is one stream, whichever phase reads it, so a later phase goes on where an
earlier one stopped). Row r of a phase (r = step in phase x batch_size + row in the batch) goes to the
member whose cumulative weight interval holds frac(offset + r x (sqrt(5) - 1) / 2), the offset drawn from the
data seed: a low-discrepancy sequence, so after R rows each member has read within a few rows of its weight
x R (the realised shares converge to the weights), and a pure function of (data seed, step): a resumed run
reads what the uninterrupted one reads, and twins read identical streams. A phase of one member puts every
row there, so a run without phase data reads its corpus exactly as a run always did (stream position =
sequences consumed before).

May import: config, data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ablate.config.spec import DataSpec, RunSpec

GOLDEN = (5**0.5 - 1) / 2
# what decides the prepared tokens of a corpus (seq_len, data_seed, valid_corpus do not)
READING_FIELDS = ("corpus", "format", "text_field", "max_documents", "errors", "data_root", "prepared_root")


@dataclass(frozen=True)
class Member:
    """One corpus a phase reads: its name (the corpus as written: the curves' tokens/<name>), its full data
    spec (one corpus, at the phase's seq_len), its weight and its stream."""

    label: str
    data: DataSpec
    weight: float

    @property
    def stream(self) -> str:
        return stream_key(self.data)


@dataclass(frozen=True)
class PhaseData:
    """A phase's data resolved: its sequence length, members, and where each member's stream starts."""

    seq_len: int
    members: tuple[Member, ...]
    starts: tuple[int, ...]  # each member's stream position (sequences read) at the phase's start

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(m.weight for m in self.members)

    def identity(self) -> list:
        """What the phase reads, for branching: the same streams with the same weights from the same positions."""
        return [self.seq_len, [(m.stream, m.weight, s) for m, s in zip(self.members, self.starts)]]


def stream_key(data: DataSpec) -> str:
    return json.dumps([[getattr(data, f) for f in READING_FIELDS], data.seq_len])


def reading_key(data: DataSpec) -> str:
    return json.dumps([getattr(data, f) for f in READING_FIELDS])


def readings(spec: RunSpec) -> list[DataSpec]:
    """Each distinct corpus reading of the run's phases (what its streams open), in first-read order."""
    found = {}
    for plan in phase_data(spec):
        for m in plan.members:
            found.setdefault(reading_key(m.data), m.data)
    return list(found.values())


def uses_own_data(spec: RunSpec) -> bool:
    """A mixture, or a phase with data of its own: the run reads by members (else as one corpus)."""
    return spec.data.mixture is not None or any(p.data is not None and p.data.reads for p in spec.phases)


def _members(spec: RunSpec, index: int) -> tuple[Member, ...]:
    own, base = spec.phases[index].data, spec.data
    seq_len = spec.phase_seq_len(index)
    fmt = own.format if own is not None and own.format is not None else base.format
    field = own.text_field if own is not None and own.text_field is not None else base.text_field
    if own is not None and own.corpus is not None:
        written = ((own.corpus, 1.0, None, None),)
    elif own is not None and own.mixture is not None:
        written = tuple((m.corpus, m.weight, m.format, m.text_field) for m in own.mixture)
    elif base.mixture is not None:
        written = tuple((m.corpus, m.weight, m.format, m.text_field) for m in base.mixture)
    else:
        written = ((base.corpus, 1.0, None, None),)
    return tuple(
        Member(
            corpus,
            base.model_copy(
                update={
                    "corpus": corpus,
                    "mixture": None,
                    "format": f or fmt,
                    "text_field": t or field,
                    "seq_len": seq_len,
                }
            ),
            weight,
        )
        for corpus, weight, f, t in written
    )


def phase_data(spec: RunSpec) -> list[PhaseData]:
    """Every phase's data resolved, in order, with its streams' starting positions."""
    out, read = [], {}
    for index, steps in enumerate(spec.phase_steps()):
        members = _members(spec, index)
        starts = tuple(read.get(m.stream, 0) for m in members)
        out.append(PhaseData(spec.phase_seq_len(index), members, starts))
        for m, count in zip(members, member_counts(out[-1].weights, spec.data.data_seed, steps * spec.batch_size)):
            read[m.stream] = read.get(m.stream, 0) + int(count)
    return out


def _offset(data_seed: int) -> float:
    return float(np.random.default_rng([data_seed, 38]).random())


def row_members(weights: tuple[float, ...], data_seed: int, first_row: int, count: int) -> np.ndarray:
    """The member index of rows first_row .. first_row + count - 1 of a phase."""
    if len(weights) == 1:
        return np.zeros(count, dtype=np.int64)
    bounds = np.cumsum(np.asarray(weights, dtype=np.float64)) / sum(weights)
    rows = np.arange(first_row, first_row + count, dtype=np.float64)
    u = np.mod(_offset(data_seed) + rows * GOLDEN, 1.0)
    return np.minimum(np.searchsorted(bounds, u, side="right"), len(weights) - 1)


def member_counts(weights: tuple[float, ...], data_seed: int, rows: int, first_row: int = 0) -> np.ndarray:
    """How many of the rows first_row .. first_row + rows - 1 each member reads."""
    counts = np.zeros(len(weights), dtype=np.int64)
    chunk = 1 << 20
    for start in range(first_row, first_row + rows, chunk):
        n = min(chunk, first_row + rows - start)
        counts += np.bincount(row_members(weights, data_seed, start, n), minlength=len(weights))
    return counts


def planned_member_sequences(spec: RunSpec) -> list[tuple[PhaseData, np.ndarray]]:
    """Each phase's data with the sequences each of its members is planned to read."""
    plans = phase_data(spec)
    return [
        (p, member_counts(p.weights, spec.data.data_seed, steps * spec.batch_size))
        for p, steps in zip(plans, spec.phase_steps())
    ]

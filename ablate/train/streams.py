"""The sequences of a step: each row from its member's stream (ablate.data.mixture), at that stream's position.

Every corpus a run reads is opened once (memory-mapped, read only: the run's setup prepared it), packed at each
sequence length a phase reads it at, and ordered by the data seed alone (data.corpus.SequenceOrder). The
rows of a step are a pure function of (spec, phase, step in phase), so a resumed run and a twin read exactly
what the uninterrupted run reads. A run is checked against its corpora's sizes here too (plan.epochs,
plan.data_plan): a job whose corpus was prepared after submission never loops silently.

May import: config, data, plan.
"""

from __future__ import annotations

import numpy as np

from ablate.config.spec import RunSpec
from ablate.data.corpus import SequenceOrder, open_prepared
from ablate.data.mixture import PhaseData, member_counts, phase_data, reading_key, row_members, uses_own_data
from ablate.plan.data_plan import check_source_epochs
from ablate.plan.epochs import check_epochs


class Streams:
    """Every stream of a run, opened; `read` gives a step's batch, doc ids and each row's member."""

    def __init__(self, spec: RunSpec, tokenizer):
        self.spec, self.plans = spec, phase_data(spec)
        self.by_members = uses_own_data(spec)
        corpora, self._views, self._orders = {}, {}, {}
        for plan in self.plans:
            for m in plan.members:
                reading = reading_key(m.data)
                if reading not in corpora:
                    corpora[reading] = open_prepared(m.data, tokenizer)
                if m.stream not in self._views:
                    view = corpora[reading].packed(plan.seq_len)
                    self._views[m.stream] = view
                    self._orders[m.stream] = SequenceOrder(len(view[0]), spec.data.data_seed)
        self.corpus_tokens = {
            plan.members[i].label: corpora[reading_key(plan.members[i].data)].n_tokens
            for plan in self.plans
            for i in range(len(plan.members))
        }
        self._counted: tuple[int, int, np.ndarray] | None = None  # (phase, rows, their member counts)

    def check(self) -> None:
        """The run against its corpora's sizes (max_epochs, a batch larger than a stream)."""
        if self.by_members:
            check_source_epochs(self.spec, self.corpus_tokens)
        else:
            check_epochs(self.spec, next(iter(self.corpus_tokens.values())))

    @property
    def first(self) -> tuple:
        """(sequences, doc ids) of the first phase's first member: what the causal preflight samples."""
        return self._views[self.plans[0].members[0].stream]

    def _before(self, phase: int, rows: int, weights: tuple[float, ...]) -> np.ndarray:
        """Each member's rows of the phase before row `rows` (counted on from the last call when it can)."""
        seed = self.spec.data.data_seed
        if self._counted is not None and self._counted[0] == phase and self._counted[1] <= rows:
            counts = self._counted[2] + member_counts(weights, seed, rows - self._counted[1], self._counted[1])
        else:
            counts = member_counts(weights, seed, rows)
        self._counted = (phase, rows, counts)
        return counts

    def read(self, phase: int, step_in_phase: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sequences, doc ids, member index of each row) of a step."""
        plan: PhaseData = self.plans[phase]
        size = self.spec.batch_size
        first_row = step_in_phase * size
        if len(plan.members) == 1:
            stream = plan.members[0].stream
            idx = self._orders[stream].take(plan.starts[0] + first_row, size)
            sequences, docs = self._views[stream]
            return sequences[idx], docs[idx], np.zeros(size, dtype=np.int64)
        members = row_members(plan.weights, self.spec.data.data_seed, first_row, size)
        before = self._before(phase, first_row, plan.weights)
        batch = docs_out = None
        for k, m in enumerate(plan.members):
            rows = np.flatnonzero(members == k)
            if not len(rows):
                continue
            idx = self._orders[m.stream].take(plan.starts[k] + int(before[k]), len(rows))
            sequences, docs = self._views[m.stream]
            got, got_docs = sequences[idx], docs[idx]
            if batch is None:
                batch = np.empty((size, plan.seq_len), dtype=np.int32)
                docs_out = np.empty((size, plan.seq_len), dtype=np.int64)
            batch[rows], docs_out[rows] = got, got_docs
        return batch, docs_out, members

    def labels(self, phase: int) -> tuple[str, ...]:
        return tuple(m.label for m in self.plans[phase].members)

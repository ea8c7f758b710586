"""Each step's loss and gradient norms read back in one go at the loop's boundaries (ablate.train.readback):
every step booked with the numbers it computed, in order, and a non-finite loss raised naming its step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ablate.train.checkpoint import TrainState
from ablate.train.readback import Unread


def _step(state: TrainState, unread: Unread, loss: float, norms: list[float]) -> None:
    state.advance("p", np.zeros((2, 4), dtype=np.int32))
    values = torch.tensor(norms, dtype=torch.float64)
    unread.add(state, "p", 1e-4, torch.tensor(loss, dtype=torch.float64), (tuple(range(len(norms))), values))


def test_settling_books_every_step_as_booking_it_at_once_would():
    state, unread, direct = TrainState(), Unread(), TrainState()
    for loss, norms in ((2.5, [0.1, 0.2]), (2.25, [0.3]), (2.0, [])):
        _step(state, unread, loss, norms)
        direct.advance("p", np.zeros((2, 4), dtype=np.int32))
        direct.book_step("p", direct.global_step, direct.tokens_seen, loss, 1e-4, dict(enumerate(norms)), None)
    assert state.curves == [] and state.grad_norms == []  # nothing read before the boundary
    unread.settle(state)
    assert state.__dict__ == direct.__dict__
    unread.settle(state)  # nothing left: a second read adds nothing
    assert state.__dict__ == direct.__dict__


def test_a_non_finite_loss_raises_at_the_boundary_naming_its_step():
    state, unread = TrainState(), Unread()
    for loss in (2.0, float("nan"), 1.0):
        _step(state, unread, loss, [0.5])
    with pytest.raises(FloatingPointError, match="loss is nan at step 2 \\(phase p\\)"):
        unread.settle(state)

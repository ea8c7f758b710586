"""Compute parity: the arms a sweep compares train the same number of tokens.

The tables compare arms (schedule x freeze mask) over the seeds they share, the pairs table pairs an arm with
its MLM twin, and a transplant mixes two arms of one seed: all of them compare runs that differ only in
schedule, freeze mask and seed. So runs that agree on every other axis of the grid (model, batch, LR, ...)
form one comparison group, and every run of a group must train the same tokens, prelude included. A grid
that means to compare unequal budgets says so with `allow_unequal_compute: true`.

May import: config, plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.config.errors import SpecError
from ablate.plan.grid import PlannedRun
from ablate.plan.epochs import planned_tokens

ARM_AXES = ("schedule", "freeze", "seed")
SETTING = "allow_unequal_compute"


@dataclass(frozen=True)
class ComparisonGroup:
    point: tuple[tuple[str, object], ...]  # the axes the group's runs share (model, LR, ...)
    tokens: dict[str, tuple[int, ...]]  # arm label -> the distinct token counts of its runs (seeds)
    runs: dict[str, list[str]]  # arm label -> its run ids

    @property
    def equal(self) -> bool:
        return len({t for counts in self.tokens.values() for t in counts}) == 1

    def where(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.point) or "the whole grid"

    def describe(self) -> str:
        return "; ".join(
            f"{arm} ({', '.join(self.runs[arm])}): " + " / ".join(f"{t:,}" for t in counts) + " tokens"
            for arm, counts in self.tokens.items()
        )


def _arm(run: PlannedRun) -> str:
    freeze = run.axes.get("freeze", "none")
    return str(run.axes.get("schedule")) + ("" if freeze == "none" else f", freeze {freeze}")


def comparison_groups(runs: list[PlannedRun]) -> list[ComparisonGroup]:
    """The runs grouped by every axis but schedule, freeze mask and seed, in grid order, with the tokens each
    trains (plan.epochs.planned_tokens: every phase, the prelude's included)."""
    grouped: dict[str, tuple[tuple, dict[str, set[int]], dict[str, list[str]]]] = {}
    for run in runs:
        point = tuple((k, v) for k, v in run.axes.items() if k not in ARM_AXES)
        _, tokens, ids = grouped.setdefault(repr(point), (point, {}, {}))  # repr: axis values may be lists
        tokens.setdefault(_arm(run), set()).add(planned_tokens(run.spec))
        ids.setdefault(_arm(run), []).append(run.run_id)
    return [
        ComparisonGroup(point, {arm: tuple(sorted(t)) for arm, t in tokens.items()}, ids)
        for point, tokens, ids in grouped.values()
    ]


def parity_lines(groups: list[ComparisonGroup], allowed: bool) -> list[str]:
    """What the dry run prints: one line per comparison group."""
    lines = []
    for g in groups:
        if g.equal:
            tokens = next(iter(g.tokens.values()))[0]
            lines.append(
                f"compute parity ({g.where()}): ok, {len(g.tokens)} arm(s) train {tokens:,} tokens each "
                "(prelude included)"
            )
        else:
            state = f"unequal, allowed by {SETTING}: true" if allowed else "VIOLATED"
            lines.append(f"compute parity ({g.where()}): {state}: {g.describe()}")
    return lines


def check_parity(groups: list[ComparisonGroup], allowed: bool, file: str | None = None) -> None:
    """SpecError naming the arms and their tokens when a group trains unequal budgets and the grid does not
    allow it."""
    if allowed:
        return
    for g in groups:
        if not g.equal:
            raise SpecError(
                f"arms compared with each other train different numbers of tokens ({g.where()}): "
                f"{g.describe()}; the tables, pairs and transplants would compare unequal compute",
                file=file,
                key=SETTING,
                value=False,
                allowed=f"phases that give every arm the same tokens, or {SETTING}: true in the grid",
            )

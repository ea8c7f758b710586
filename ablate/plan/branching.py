"""Shared prefixes: which runs of a sweep start from another run's checkpoint instead of training from step 0.

Two runs compute the same first N steps when everything that reaches a step's computation is equal: the spec
apart from its phases and the fields that change no number (`computation_key`), and phase by phase up to step
N the name (curves and token hashes are keyed by it), objective, mask rate, what it reads (its corpora and
their weights, from the same stream positions, at the same sequence length), resolved frozen layers, peak LR
and the LR of every step (`lr_at`, so a constant-LR main phase shares a prefix with a longer one and a decay
does not; a warmup_fraction depends on the phase's length, warmup_steps does not). Every random draw of a step
is seeded from (seed, global step) and the batch depends only on the data seed and the data position, so a
child that loads its parent's checkpoint at step N computes, from there, what it would have from scratch.

The runs form a tree (`plan_tree`): longest first, each run branches from the earlier run with which it
shares the most steps (any insertion order trains the union of the prefixes exactly once; longest first gives
short chains). A branch step must be a state the parent's checkpoint holds: a phase end for both, inside a
phase for both, or the end of the child's phase inside the parent's (the child then does the phase-end work
itself); a phase end of the parent inside the child's phase is one step earlier (the parent's checkpoint there
already holds its phase-end measures).

May import: config, data, plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ablate.config import identity, objectives
from ablate.config.sources import rope_thetas_at
from ablate.config.spec import LRSchedule, RunSpec
from ablate.data.mixture import phase_data
from ablate.plan.phases import PhasePlan

LrAt = Callable[[LRSchedule, float, int, int], float]  # ablate.train.schedule.lr_at, given by the caller


def computation_key(spec: RunSpec) -> str:
    """A digest of everything besides the phases that reaches a training step's numbers (model, tokenizer,
    data and its seed, batch and micro-batch, seed, optimizer, device, vocab loss, compile, probe): the STEP
    identity that ablate.config.identity declares."""
    return identity.digest(identity.content(spec.model_dump(mode="json"), identity.STEP), 16)


@dataclass(frozen=True)
class RunPlan:
    """What the finder reads of one run: its id, spec and phase plans (plan.phases)."""

    run_id: str
    spec: RunSpec
    plans: tuple[PhasePlan, ...]

    @property
    def steps(self) -> int:
        return sum(p.steps for p in self.plans)


@dataclass(frozen=True)
class Branch:
    parent: str
    step: int  # the global step of the parent's checkpoint the child starts from


@dataclass
class BranchTree:
    branches: dict[str, Branch] = field(default_factory=dict)  # child run id -> where it starts
    steps: dict[str, int] = field(default_factory=dict)  # run id -> its planned steps
    tokens_per_step: dict[str, int] = field(default_factory=dict)

    def keep_steps(self, parent: str) -> dict[int, list[str]]:
        """The parent's branch steps -> the children that start there."""
        out: dict[int, list[str]] = {}
        for child, b in self.branches.items():
            if b.parent == parent:
                out.setdefault(b.step, []).append(child)
        return dict(sorted(out.items()))

    def trained_steps(self, run_id: str) -> int:
        branch = self.branches.get(run_id)
        return self.steps[run_id] - (branch.step if branch else 0)

    def planned_tokens(self) -> int:
        return sum(self.steps[r] * self.tokens_per_step[r] for r in self.steps)

    def trained_tokens(self) -> int:
        return sum(self.trained_steps(r) * self.tokens_per_step[r] for r in self.steps)

    def depth_order(self) -> list[str]:
        """Run ids parents first (roots, then their children, ...), each level in planning order."""
        placed, out = set(), []
        while len(out) < len(self.steps):
            level = [
                r
                for r in self.steps
                if r not in placed and (r not in self.branches or self.branches[r].parent in placed)
            ]
            placed |= set(level)
            out += level
        return out


def _phase_key(plan: PhasePlan, spec: RunSpec, data: list) -> tuple:
    p = plan.spec
    what = json.dumps(objectives.get(p.objective).identity(p), sort_keys=True)  # its entry's identity fields
    return (
        p.name,
        what,
        plan.frozen,
        p.lr.peak_lr or spec.optim.lr,
        json.dumps(data[plan.index]),
        json.dumps(rope_thetas_at(spec.phases, plan.index), sort_keys=True),
    )


def _data_of(run: RunPlan, cache: dict) -> list:
    """What each phase of the run reads (data.mixture.PhaseData.identity): streams, weights, positions, length."""
    key = ("data", run.run_id)
    if key not in cache:
        cache[key] = [d.identity() for d in phase_data(run.spec)]
    return cache[key]


def _lrs(plan: PhasePlan, spec: RunSpec, lr_at: LrAt, cache: dict) -> list[float]:
    peak = plan.spec.lr.peak_lr or spec.optim.lr
    key = (plan.spec.lr, peak, plan.steps)
    if key not in cache:
        cache[key] = [lr_at(plan.spec.lr, peak, i, plan.steps) for i in range(plan.steps)]
    return cache[key]


def shared_prefix(a: RunPlan, b: RunPlan, lr_at: LrAt, cache: dict | None = None) -> tuple[int, bool, bool]:
    """(N, N is a phase boundary of a, N is one of b): the steps a and b compute identically from step 0."""
    cache = {} if cache is None else cache
    if computation_key(a.spec) != computation_key(b.spec):
        return 0, True, True
    offset, data_a, data_b = 0, _data_of(a, cache), _data_of(b, cache)
    for pa, pb in zip(a.plans, b.plans):
        if _phase_key(pa, a.spec, data_a) != _phase_key(pb, b.spec, data_b):
            break
        la, lb = _lrs(pa, a.spec, lr_at, cache), _lrs(pb, b.spec, lr_at, cache)
        same = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
        if same < len(la) or same < len(lb):
            return offset + same, same in (0, len(la)), same in (0, len(lb))
        offset += same
    return offset, True, True


def branch_step(child: RunPlan, parent: RunPlan, lr_at: LrAt, cache: dict | None = None) -> int:
    """The latest step of the parent's checkpoints the child can start from (0: none)."""
    steps, child_end, parent_end = shared_prefix(child, parent, lr_at, cache)
    if parent_end and not child_end:
        steps -= 1  # the parent's checkpoint there holds its phase-end work, inside the child's phase
    return max(steps, 0)


def plan_tree(runs: Sequence[RunPlan], lr_at: LrAt) -> BranchTree:
    """The sweep's tree: longest runs first, each run branching from the earlier run it shares the most steps
    with (ties: the earlier). A run with `branching: false` is neither parent nor child."""
    tree = BranchTree(
        steps={r.run_id: r.steps for r in runs}, tokens_per_step={r.run_id: r.spec.tokens_per_step for r in runs}
    )
    ordered = sorted(runs, key=lambda r: -r.steps)  # stable: grid order among equals
    cache: dict = {}
    keys = {r.run_id: computation_key(r.spec) for r in runs}
    for i, run in enumerate(ordered):
        if not run.spec.branching:
            continue
        best = Branch("", 0)
        for earlier in ordered[:i]:
            if not earlier.spec.branching or keys[earlier.run_id] != keys[run.run_id]:
                continue
            step = branch_step(run, earlier, lr_at, cache)
            if step > best.step:
                best = Branch(earlier.run_id, step)
        if best.step:
            tree.branches[run.run_id] = best
    return tree


def tree_lines(tree: BranchTree, labels: dict[str, str]) -> list[str]:
    """The dry run's lines: who branches from whom at which step, and the tokens trained against planned."""
    if not tree.branches:
        return ["branching: no run shares a prefix with another (every run trains from step 0)"]
    planned, trained = tree.planned_tokens(), tree.trained_tokens()
    lines = [
        f"branching: {len(tree.branches)} of {len(tree.steps)} runs start from another run's checkpoint; "
        f"trained {trained:,} of {planned:,} tokens ({trained / planned:.2f}x), {planned - trained:,} saved"
    ]

    def walk(run_id: str, indent: int) -> None:
        for step, children in tree.keep_steps(run_id).items():
            for child in children:
                lines.append(
                    f"{'  ' * indent}{child} {labels.get(child, '')}: branch of {run_id} @ step {step} "
                    f"(trains {tree.trained_steps(child)} of {tree.steps[child]} steps)"
                )
                walk(child, indent + 1)

    for root in [r for r in tree.steps if r not in tree.branches and tree.keep_steps(r)]:
        lines.append(f"  {root} {labels.get(root, '')}: trained from step 0 ({tree.steps[root]} steps)")
        walk(root, 2)
    return lines

"""What a run's lengths become once counted in whole optimizer steps, said out loud: a phase written in tokens
that is not a whole number of steps trains up to the next step (one line for all such phases); a phase whose
fraction of budget_tokens is under one step still trains one; budget_tokens that no phase reads; a warmup
longer than its phase, or a warmup fraction that rounds to no step. Pure: the token rounding is a note of the
dry run, the rest warnings (the dry run and the sweep print them on stderr), one per distinct case with the
runs it concerns counted.

May import: config.
"""

from __future__ import annotations

import math

from ablate.config.spec import RunSpec


def rounded_tokens(spec: RunSpec) -> list[tuple[str, int, int]]:
    """(phase, tokens written, steps trained) of each phase written in tokens that is not whole steps."""
    step = spec.tokens_per_step
    return [
        (p.name, p.tokens, steps)
        for p, steps in zip(spec.phases, spec.phase_steps())
        if p.tokens is not None and p.tokens % step
    ]


def spec_rounding(spec: RunSpec) -> list[str]:
    """The other rounding notes of one spec, without its run id (the same note of many runs reads once)."""
    step = spec.tokens_per_step
    notes = [
        f"phase {p.name}: fraction {p.fraction:g} of budget_tokens is {p.fraction * spec.budget_tokens:,.0f} "
        f"tokens, under one step of {step:,}: it trains 1 step"
        for p in spec.phases
        if p.fraction is not None and p.fraction * spec.budget_tokens < step
    ]
    for p, steps in zip(spec.phases, spec.phase_steps()):
        if p.lr.warmup_steps > steps:
            notes.append(
                f"phase {p.name}: lr.warmup_steps {p.lr.warmup_steps} is more than its {steps} steps: it "
                f"warms up over all {steps} and reaches the peak LR at its last step"
            )
        if p.lr.warmup_fraction and not round(p.lr.warmup_fraction * steps):
            notes.append(
                f"phase {p.name}: lr.warmup_fraction {p.lr.warmup_fraction:g} of its {steps} steps rounds "
                "to 0 steps: it has no warmup"
            )
    fractions = [p for p in spec.phases if p.fraction is not None]
    if spec.budget_tokens is not None and not fractions:
        notes.append(
            f"budget_tokens {spec.budget_tokens:,} is read by no phase (none gives its length as a "
            "fraction): the phases' own steps or tokens decide the length"
        )
    elif fractions and spec.budget_tokens % step:
        trained = math.ceil(spec.budget_tokens / step - 1e-9)
        notes.append(
            f"budget_tokens {spec.budget_tokens:,} is {spec.budget_tokens / step:.2f} steps of {step:,} "
            f"tokens: the fractions' phases train {trained:,} steps in all ({trained * step:,} tokens)"
        )
    return notes


def rounding_notes(specs: list[RunSpec]) -> tuple[list[str], list[str]]:
    """(notes, warnings): a note per step size for the phases written in tokens (under one step of difference:
    the dry run says it), then each other case once as a warning, saying how many of the runs it concerns."""
    by_step: dict[int, dict[tuple, None]] = {}
    counts: dict[str, int] = {}
    for spec in specs:
        for rounded in rounded_tokens(spec):
            by_step.setdefault(spec.tokens_per_step, {})[rounded] = None
        for note in spec_rounding(spec):
            counts[note] = counts.get(note, 0) + 1
    lines = [
        f"phase lengths in tokens round up to whole steps of {step:,} tokens (batch_size x data.seq_len): "
        + "; ".join(
            f"{name} {tokens:,} -> {steps:,} steps ({steps * step:,} tokens)" for name, tokens, steps in phases
        )
        for step, phases in by_step.items()
    ]
    return lines, [f"{note} ({n} of {len(specs)} runs)" if len(specs) > 1 else note for note, n in counts.items()]

"""A grid's data choices (`data_choices:`, picked by the `data` axis) merged into the phases they name.

A choice maps phase names to data blocks (a phase's `data:` keys). Its block goes over the phase's own data:
a block that names a source (corpus or mixture) replaces the phase's source whole, with its format and text
field; any other key (seq_len) replaces that key alone. An empty block leaves the phase as written, so a
choice `{}` is the schedules as written and their run ids.

May import: config.
"""

from __future__ import annotations

import copy
from typing import Any

from ablate.config.errors import SpecError
from ablate.config.grid import GridSpec

SOURCE_KEYS = ("corpus", "mixture", "format", "text_field")
WHOLE_SOURCE = SOURCE_KEYS[:2]  # a block naming either replaces the phase's whole source


def merged_data(own: Any, block: dict[str, Any]) -> dict[str, Any]:
    """A phase's data (as written; None: the run's) with a choice's block over it."""
    out = dict(own) if isinstance(own, dict) else {}
    if any(key in block for key in WHOLE_SOURCE):
        for key in SOURCE_KEYS:
            out.pop(key, None)
    out.update(copy.deepcopy(block))
    return out


def check_named_phases(what: str, section: str, name: str, block, schedule: str, phases: list[dict]) -> None:
    """A grid's named per-phase block (a freeze mask, a data choice) names only phases of the run's schedule;
    another asks for an exclude rule for that combination."""
    present = [p.get("name") for p in phases]
    for phase_name in block:
        if phase_name not in present:
            raise SpecError(
                f"{what} {name!r} names phase {phase_name!r}, which schedule {schedule!r} "
                "does not have; add an exclude rule for this combination",
                key=f"{section}.{name}.{phase_name}",
                value=phase_name,
                allowed=", ".join(str(n) for n in present),
            )


def apply_data_choice(grid: GridSpec, phases: list[dict], schedule: str, choice: str | None) -> dict[int, str]:
    """Merge choice `choice` into `phases` (the schedule's phases as written, changed in place); returns
    {phase position: data_choices.<choice>.<phase>} for each phase it changed. A choice naming a phase the
    schedule lacks asks for an exclude rule, as a freeze mask does."""
    if choice is None:
        return {}
    blocks = grid.data_choices[choice]
    check_named_phases("data choice", "data_choices", choice, blocks, schedule, phases)
    changed = {}
    for i, phase in enumerate(phases):
        block = blocks.get(phase.get("name"))
        if block:
            phase["data"] = merged_data(phase.get("data"), block)
            changed[i] = f"data_choices.{choice}.{phase['name']}"
    return changed

"""Layer transplants as a user writes them, in a grid's `transplants:` block or on the command line
(`ablate transplant --from ARM --into ARM --layers ...`): the entry's schema, the arm and layer-split
parsers, and the derived run's id.

    transplants:
      - {from: clm_detour, into: mlm, layers: low}             # ARM: SCHEDULE or SCHEDULE/FREEZE
      - {from: mlm, into: clm_detour/low_clm, layers: [0-3, head], tasks: [ncbi_disease]}

May import: config.
"""

from __future__ import annotations

import hashlib

from pydantic import Field

from ablate.config.base import Strict
from ablate.config.errors import SpecError
from ablate.config.spec import FREEZE_ALLOWED, FREEZE_WORDS, parse_layer_range

ARM_FORMS = "SCHEDULE or SCHEDULE/FREEZE (a schedule name, and a freeze mask name when it is not none)"


class TransplantSpec(Strict):
    """One entry of a grid's `transplants:` block: per pretraining seed, a hybrid of two arms' runs."""

    source: str = Field(alias="from", description=f"the arm that gives the embeddings and the chosen layers: "
                                                  f"{ARM_FORMS}")
    target: str = Field(alias="into", description="the arm that gives everything else")
    layers: str | int | tuple[str | int, ...] = Field(description="freeze-mask words: low, mid, high, 0-7, "
                                                                  "encoder, head; a list or comma-separated")
    tasks: tuple[str, ...] | None = Field(default=None, description="fine-tuning tasks (default: the runs' "
                                                                    "eval.tasks; [] builds only)")


def parse_layers(text: str | int | list | tuple, key: str = "--layers") -> tuple[str, ...]:
    """'0-7' / 'low,mid' / ['embeddings', 3] -> words a freeze mask takes ('none' is no transplant)."""
    items = text.split(",") if isinstance(text, str) else text if isinstance(text, (list, tuple)) else [text]
    words = tuple(str(w).strip() for w in items if str(w).strip())
    bad = [w for w in words if w == "none" or (w not in FREEZE_WORDS and parse_layer_range(w) is None)]
    if not words or bad:
        raise SpecError("not a layer split", key=key, value=bad[0] if bad else str(text), allowed=FREEZE_ALLOWED)
    return words


def parse_arm(text: str, key: str) -> tuple[str, str]:
    """'schedule' or 'schedule/freeze' -> (schedule, freeze); freeze defaults to "none"."""
    schedule, _, freeze = text.partition("/")
    if not schedule or "/" in freeze:
        raise SpecError("not an arm", key=key, value=text, allowed=ARM_FORMS)
    return schedule, freeze or "none"


def arm_name(arm: tuple[str, str]) -> str:
    """(schedule, freeze) as written: 'schedule', or 'schedule/freeze' when the mask is not none."""
    return arm[0] if arm[1] == "none" else "/".join(arm)


def derived_id(from_id: str, into_id: str, words: tuple[str, ...]) -> str:
    """The derived run's folder name: the same two runs and layer words always give the same one."""
    return "tx-" + hashlib.sha256(f"{from_id}|{into_id}|{','.join(words)}".encode()).hexdigest()[:10]

"""Layer and component transplants as a user writes them, in a grid's `transplants:` block or on the
command line (`ablate transplant --from ARM --into ARM --layers ... --components ...`): the entry's schema,
the arm, layer-split and component parsers, and the derived run's id.

    transplants:
      - {from: clm_detour, into: mlm, layers: low}             # ARM: SCHEDULE or SCHEDULE/FREEZE
      - {from: clm_detour, into: mlm, layers: low, embeddings: true}   # and the from run's embeddings
      - {from: mlm, into: clm_detour/low_clm, layers: [0-3, head], tasks: [ncbi_disease]}
      - {from: clm_detour, into: mlm, components: [mlp]}       # every block's MLP, nothing else
      - {from: clm_detour, into: mlm, layers: mid, components: [attention],
         eval: {tasks: [diamed], seeds: [0, 1, 2], finetune: {epochs: 5}}}

A layer split copies the chosen blocks (everything in them); components copy only those parts of each chosen
block (every block when `layers` is absent). The embeddings stay the into run's unless the entry asks for
them (`embeddings: true`, `--embeddings`) or its layers name them (`embeddings`, `encoder`): the paper's
transplants copy layer groups ("copying full parameter blocks", Low 0-7, Mid 8-14, Late 15-21; the first
author's thesis, chapter 5: github Rian-T/thesis at 0c3a71a, sources/part_2/chapter5/article.tex). Before
the option existed a layer split also copied the embeddings; those hybrids keep their ids (derived_id). Which
parameters a component is, per architecture: ablate.models.families (Family.components). COMPONENTS is the
vocabulary.

May import: config.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import Field

from ablate.config.base import Strict
from ablate.config.errors import SpecError
from ablate.config.spec import FREEZE_ALLOWED, FREEZE_WORDS, parse_layer_range

ARM_FORMS = "SCHEDULE or SCHEDULE/FREEZE (a schedule name, and a freeze mask name when it is not none)"
COMPONENTS = ("attention", "mlp")  # a block's parts a transplant can copy alone (each family names its own)
WITH_EMBEDDINGS = ("embeddings", "encoder")  # layer words that name the embeddings themselves


class TransplantEval(Strict):
    """A transplant's own evaluation: what it changes of the `into` run's eval (the rest is the run's)."""

    tasks: tuple[str, ...] | None = Field(
        default=None, description="fine-tuning tasks or suite:NAME ([] builds only)"
    )
    seeds: tuple[int, ...] | None = Field(default=None, description="fine-tuning seeds")
    finetune: dict[str, Any] = Field(
        default_factory=dict, description="fine-tuning settings over the run's eval.finetune (e.g. probe: linear)"
    )
    protocol: str | None = Field(
        default=None, description="a fine-tuning profile (paper, smoke) instead of the run's"
    )


class TransplantSpec(Strict):
    """One entry of a grid's `transplants:` block: per pretraining seed, a hybrid of two arms' runs."""

    source: str = Field(alias="from", description=f"the arm that gives the chosen layers: {ARM_FORMS}")
    target: str = Field(alias="into", description="the arm that gives everything else")
    layers: str | int | tuple[str | int, ...] | None = Field(
        default=None,
        description="freeze-mask words: low, mid, high, 0-7, encoder, head; a list or "
        "comma-separated (with components: the blocks they are taken from; default every block)",
    )
    components: tuple[str, ...] | None = Field(
        default=None, description=f"copy only these parts of each block: {', '.join(COMPONENTS)}"
    )
    embeddings: bool = Field(
        default=False,
        description="also copy the from run's embeddings; false (the paper's transplants): they stay the into "
        "run's, unless layers name them (embeddings, encoder)",
    )
    tasks: tuple[str, ...] | None = Field(
        default=None, description="fine-tuning tasks (default: the runs' eval.tasks; [] builds only)"
    )
    eval: TransplantEval | None = Field(
        default=None,
        description="the hybrid's evaluation over the into run's: tasks, seeds, finetune settings, protocol",
    )


def parse_layers(text: str | int | list | tuple, key: str = "--layers") -> tuple[str, ...]:
    """'0-7' / 'low,mid' / ['embeddings', 3] -> words a freeze mask takes ('none' is no transplant)."""
    items = text.split(",") if isinstance(text, str) else text if isinstance(text, (list, tuple)) else [text]
    words = tuple(str(w).strip() for w in items if str(w).strip())
    bad = [w for w in words if w == "none" or (w not in FREEZE_WORDS and parse_layer_range(w) is None)]
    if not words or bad:
        raise SpecError("not a layer split", key=key, value=bad[0] if bad else str(text), allowed=FREEZE_ALLOWED)
    return words


def parse_components(items: str | list | tuple | None, key: str = "--components") -> tuple[str, ...]:
    """'attention,mlp' / ['mlp'] -> the components in COMPONENTS order; None or empty -> () (whole layers)."""
    if items is None:
        return ()
    names = [str(c).strip() for c in (items.split(",") if isinstance(items, str) else items) if str(c).strip()]
    bad = [c for c in names if c not in COMPONENTS]
    if bad or not names:
        raise SpecError(
            "unknown component", key=key, value=bad[0] if bad else str(items), allowed=", ".join(COMPONENTS)
        )
    return tuple(c for c in COMPONENTS if c in names)


def entry_split(entry: TransplantSpec, key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(layer words, components) of a grid entry; layers are required unless components are given (then
    every block). SpecError at `key`.layers / .components / .tasks."""
    components = parse_components(entry.components, f"{key}.components")
    if entry.tasks is not None and entry.eval is not None and entry.eval.tasks is not None:
        raise SpecError("tasks given twice: as tasks and as eval.tasks", key=f"{key}.tasks", allowed="one of them")
    if entry.layers is None:
        if not components:
            raise SpecError("missing required key (layers, or components for every block)", key=f"{key}.layers")
        return ("encoder",), components
    words = parse_layers(entry.layers, f"{key}.layers")
    named = [w for w in words if w in WITH_EMBEDDINGS]
    if "embeddings" in entry.model_fields_set and not entry.embeddings and named and not components:
        raise SpecError(
            f"embeddings: false, but layers name them ({named[0]})",
            key=f"{key}.embeddings",
            value=False,
            allowed="true, or layers without embeddings / encoder (low, mid, high, 0-7, head)",
        )
    return words, components


def copies_embeddings(words: tuple[str, ...], components: tuple[str, ...], asked: bool) -> bool:
    """Whether a transplant copies the from run's embeddings: asked for, or named by a whole-layer split's
    words (a component transplant takes them only when asked)."""
    return asked or (not components and any(w in WITH_EMBEDDINGS for w in words))


def parse_arm(text: str, key: str) -> tuple[str, str]:
    """'schedule' or 'schedule/freeze' -> (schedule, freeze); freeze defaults to "none"."""
    schedule, _, freeze = text.partition("/")
    if not schedule or "/" in freeze:
        raise SpecError("not an arm", key=key, value=text, allowed=ARM_FORMS)
    return schedule, freeze or "none"


def arm_name(arm: tuple[str, str]) -> str:
    """(schedule, freeze) as written: 'schedule', or 'schedule/freeze' when the mask is not none."""
    return arm[0] if arm[1] == "none" else "/".join(arm)


def derived_id(
    from_id: str, into_id: str, words: tuple[str, ...], components: tuple[str, ...], embeddings: bool
) -> str:
    """The derived run's folder name: the same two runs, layer words, components and embeddings choice
    (copies_embeddings) always give the same one. A hybrid built as ablate built it before the choice
    existed (a whole-layer split with the embeddings, components without) keeps the id it had then (and a
    whole-layer one the id it had before components existed); the other choice adds a mark, so two different
    hybrids never share an id."""
    text = f"{from_id}|{into_id}|{','.join(words)}" + (f"|{'+'.join(components)}" if components else "")
    if embeddings != (not components):  # not what a transplant of these words and components copied before
        text += "|embeddings" if embeddings else "|no-embeddings"
    return "tx-" + hashlib.sha256(text.encode()).hexdigest()[:10]

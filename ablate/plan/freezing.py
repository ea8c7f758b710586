"""Freeze masks: names -> concrete layer sets -> parameters that do not train in a phase.

Layer groups are thirds of the depth, with the boundaries rounded up:
  low  = [0, ceil(n/3)),  mid = [ceil(n/3), ceil(2n/3)),  high = [ceil(2n/3), n)
For the 22 layers of ModernCamemBERT base, the paper's freezing study's model (ModernBERT's architecture), this
gives 0-7 / 8-14 / 15-21, its own split; for MiniLM-L6 0-1 / 2-3 / 4-5. `embeddings` is the embedding block
(and with it any output projection tied to it), `encoder` is the embeddings, every block and the family's
shared encoder parameters (final norm, DeBERTa's relative position embeddings): everything but the MLM head;
`head` is the MLM head (its output projection is tied to the word embeddings and so follows `embeddings`).
Applying a mask to a model's parameters is ablate.train.freezing's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ablate.config.errors import SpecError
from ablate.models.families import Family, layer_of
from ablate.config.spec import parse_layer_range


def layer_groups(n_layers: int) -> dict[str, range]:
    a, b = math.ceil(n_layers / 3), math.ceil(2 * n_layers / 3)
    return {"low": range(0, a), "mid": range(a, b), "high": range(b, n_layers)}


@dataclass(frozen=True)
class FrozenSet:
    """What a phase freezes, resolved against a model's depth."""

    layers: frozenset[int]
    embeddings: bool
    encoder_tail: bool
    head: bool = False

    @property
    def empty(self) -> bool:
        return not (self.layers or self.embeddings or self.encoder_tail or self.head)

    def describe(self) -> str:
        """'emb,0-1,4-5' style; '' when nothing is frozen."""
        parts = ["emb"] if self.embeddings else []
        parts += [f"{a}-{b}" if a != b else str(a) for a, b in consecutive_runs(sorted(self.layers))]
        parts += ["head"] if self.head else []
        return ",".join(parts)


def consecutive_runs(sorted_ints: list[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 5] -> [(0, 2), (5, 5)]: consecutive stretches of sorted layer indices."""
    out: list[tuple[int, int]] = []
    for i in sorted_ints:
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def resolve_freeze(words: tuple[str, ...], n_layers: int, key: str = "freeze") -> FrozenSet:
    groups = layer_groups(n_layers)
    layers: set[int] = set()
    embeddings = tail = head = False
    for word in words:
        if word == "none":
            continue
        if word == "head":
            head = True
        elif word == "embeddings":
            embeddings = True
        elif word == "encoder":
            embeddings = tail = True
            layers.update(range(n_layers))
        elif word in groups:
            layers.update(groups[word])
        else:
            lo, hi = parse_layer_range(word)
            if hi >= n_layers:
                raise SpecError(
                    f"layer range goes past the model's depth ({n_layers} layers: 0-{n_layers - 1})",
                    key=key,
                    value=word,
                )
            layers.update(range(lo, hi + 1))
    return FrozenSet(frozenset(layers), embeddings, tail, head)


def is_frozen(param_name: str, family: Family, frozen: FrozenSet) -> bool:
    where = layer_of(param_name, family)
    if where == "emb":
        return frozen.embeddings
    if where == "tail":
        return frozen.encoder_tail
    if where == "head":
        return frozen.head
    return int(where) in frozen.layers

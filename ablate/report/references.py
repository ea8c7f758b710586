"""The published numbers ablate's tables can be set beside: the shipped reference files (reference/*.yaml,
one per name: `paper`, every number of the CLM-detour paper), their schema, and loading them checked.

A file is validated strictly when loaded (an unknown key, a row whose scores do not fill the table's tasks,
a repeated row name: a SpecError naming the file), so a mistyped number cannot be silently half-read.
Numbers are percentages as the paper prints them (`units: percent`).

May import: config.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import model_validator

from ablate.config.base import Strict, read_yaml, unique_items, validate
from ablate.config.errors import SpecError

FOLDER = Path(__file__).resolve().parent / "reference"
REFERENCES = {"paper": FOLDER / "paper.yaml"}  # --reference NAME -> its file
Size = Literal["base", "large"]
Language = Literal["fr", "en"]


class Source(Strict):
    repo: str
    path: str
    commit: str

    def cite(self, table: str) -> str:
        return f"{self.repo} {self.path} at {self.commit}, {table}"


class MainRow(Strict):
    """One model's row of a main results table; `schedule`/`size`/`tokens` find a sweep's arm for it, `hub`
    a base model evaluated alone."""

    name: str
    group: str
    context: int
    scores: tuple[float, ...]
    average: float
    schedule: str | None = None
    size: Size | None = None
    tokens: float | None = None
    hub: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _arm_keys_together(self):
        if (self.schedule is None) != (self.size is None):
            raise ValueError(f"row {self.name!r}: schedule and size go together (they match a sweep's arm)")
        return self


class MainTable(Strict):
    table: str
    caption: str
    language: Language
    seeds: int
    tasks: tuple[str, ...]
    rows: tuple[MainRow, ...]

    @model_validator(mode="after")
    def _rows_fill_the_tasks(self):
        unique_items(self.tasks, "task")
        unique_items([r.name for r in self.rows], "row")
        for row in self.rows:
            if len(row.scores) != len(self.tasks):
                raise ValueError(f"row {row.name!r} has {len(row.scores)} scores for {len(self.tasks)} tasks")
        return self

    def score(self, row: MainRow) -> dict[str, float]:
        return dict(zip(self.tasks, row.scores))


class FreezeRow(Strict):
    name: str
    schedule: str
    freeze: str
    frozen: dict[str, str]  # phase -> encoder layers ("0-7"), as the paper describes the arm
    average: float
    delta_vs_mlm: float | None = None
    p_vs_mlm: float | None = None


class FreezeTable(Strict):
    table: str
    caption: str
    language: Language
    size: Size
    n_tasks: int
    seeds: int
    rows: tuple[FreezeRow, ...]


class DecayRow(Strict):
    size: Size
    phase1_tokens: float
    decay_tokens: float
    percent: float
    clm_decay: float
    mlm_decay: float


class DecayTable(Strict):
    table: str
    caption: str
    tasks: tuple[str, ...]
    seeds: int
    rows: tuple[DecayRow, ...]


class TransplantRow(Strict):
    table: str
    name: str
    layers: str | None = None
    modules: Literal["attention", "mlp"] | None = None
    score: float
    delta: float | None = None
    recovery: float


class Transplants(Strict):
    task: str
    seeds: int
    rows: tuple[TransplantRow, ...]


class DivergenceRow(Strict):
    model: str
    params: str
    direction: str
    divergence: float
    ci: float


class DivergenceTable(Strict):
    table: str
    rows: tuple[DivergenceRow, ...]


class Reference(Strict):
    source: Source
    units: Literal["percent"]
    sizes: dict[Size, int]  # size -> encoder layers
    model_languages: dict[str, Language]  # a model name containing the key -> its language
    main: tuple[MainTable, ...]
    freeze: FreezeTable
    decay: DecayTable
    transplants: Transplants
    divergence: DivergenceTable

    @model_validator(mode="after")
    def _one_table_per_language(self):
        unique_items([t.language for t in self.main], "main table language")
        return self

    def main_table(self, language: str) -> MainTable | None:
        return next((t for t in self.main if t.language == language), None)


def check_reference(name: str) -> Path:
    """The file of reference `name`; an unknown name is a SpecError listing the known ones."""
    if name not in REFERENCES:
        raise SpecError("unknown reference", key="--reference", value=name, allowed=", ".join(REFERENCES))
    return REFERENCES[name]


@cache
def load_reference(name: str) -> Reference:
    """Reference `name`, read and validated (cached: the files ship with the package and do not change)."""
    path = check_reference(name)
    return validate(Reference, read_yaml(path), file=str(path), what="reference file")

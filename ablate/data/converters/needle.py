"""The needle-in-a-haystack datasets (needle_fr, needle_fr_cpu, needle_en): generated, not downloaded, from the
valid split of the corpora the catalog entry `requires` (their folders in the data root; never a train
split), with the entry's `generate:` settings (language, seed, pairs, lengths). The corpora are pinned by the
manifest, so the generated files are too. ablate/data/needle/generate.py says how a record is built.

May import: config, data.
"""

from __future__ import annotations

from pathlib import Path

from ablate.config.errors import SpecError
from ablate.data.catalog import CATALOG, Dataset, dataset
from ablate.data.converters.common import SPLITS, write_jsonl
from ablate.data.needle.generate import Settings, generate

HELD_OUT = "valid.txt"


def needle_settings(name: str) -> Settings:
    """The catalog entry's `generate:` block (checked when the catalogue is read)."""
    return settings_of(dataset(name))


def settings_of(ds: Dataset) -> Settings:
    if ds.generate is None:
        raise SpecError(
            "a needle dataset's catalog entry needs a generate: block",
            file=str(CATALOG),
            key=f"{ds.name}.generate",
            allowed="generate: {language, seed, pairs, lengths}",
        )
    return ds.generate


def held_out_documents(folders: list[Path]) -> list[str]:
    """The documents (one a line) of each corpus's valid split, in the order the catalog lists the corpora."""
    return [
        line
        for folder in folders
        for line in (folder / HELD_OUT).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def write_needle(records: dict[str, list[dict]], out: Path) -> None:
    for split in SPLITS:
        write_jsonl(out / f"{split}.jsonl", records[split])


def convert_needle(inputs: dict[str, Path], out: Path, ds) -> None:
    documents = held_out_documents([inputs[name] for name in ds.requires])
    write_needle(generate(documents, settings_of(ds), ds.name), out)

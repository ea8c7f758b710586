"""What the converters share: the split names, JSON lines as the shipped files write them, copies.

May import: data.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SPLITS = ("train", "dev", "test")


def write_jsonl(path: Path, records, ensure_ascii: bool = False) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=ensure_ascii) + "\n")


def convert_copy(inputs: dict[str, Path], out: Path, ds) -> None:
    """Files shipped as the repository has them, under their shipped names (devel.tsv -> dev.tsv, ...)."""
    for name, _ in ds.sources:
        shutil.copyfile(inputs[name], out / name)

"""Write ablate/data/manifest.tsv (size + sha256 of every data file) from a data root that holds the files the
tables were computed on: `python scripts/make_data_manifest.py DATA_ROOT`. Commit the manifest, never
the data."""

from __future__ import annotations

import sys
from pathlib import Path

from ablate.data.catalog import MANIFEST, manifest_rows, write_manifest

if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python scripts/make_data_manifest.py DATA_ROOT")
    rows = manifest_rows(Path(sys.argv[1]))
    write_manifest(rows)
    print(f"{MANIFEST}: {len(rows)} files of {len({r[0] for r in rows})} datasets")

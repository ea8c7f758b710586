"""Shared fixtures: the data root (../shared/data unless ABLATE_DATA_ROOT says otherwise), tiny models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA_ROOT = REPO.parent / "shared" / "data"
os.environ.setdefault("ABLATE_DATA_ROOT", str(DEFAULT_DATA_ROOT))
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = Path(os.environ["ABLATE_DATA_ROOT"])
    if not (root / "corpus_en_e3c" / "train.txt").is_file():
        pytest.fail(f"real data not found under {root}: set ABLATE_DATA_ROOT")
    return root


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    os.environ["ABLATE_CACHE"] = str(tmp_path_factory.mktemp("ablate-cache"))


@pytest.fixture(scope="session")
def minilm_tokenizer():
    from ablate.models import DEFAULT_MODEL, load_tokenizer

    return load_tokenizer(DEFAULT_MODEL)

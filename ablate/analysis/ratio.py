"""The paper's ratio across runs of a sweep, per layer: (1 - CKA(arm, MLM seed a)) / (1 - CKA(MLM seed b,
MLM seed a)), how far an arm moved a layer in units of MLM seed-to-seed noise; undefined where that noise is
float rounding.

May import: config, store, analysis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ablate.analysis.probe import cka_vs_reference, held_out_texts, probe_texts, representations_for
from ablate.config.errors import SpecError
from ablate.config.grid import DEFAULT_BASELINE, declared_baseline

RATIO_MEASURE = "cka_ratio_vs_mlm"

# Seed noise (1 - CKA between MLM seeds) below this is float rounding, and a ratio over it is undefined (NaN).
# 1 - CKA is second order in a difference of representations: 1e-10 is what a relative difference of ~1e-5
# (about 100 float32 ulps) in every representation gives. Measured on MiniLM-L6, 64 held-out corpus_en_e3c
# texts: bitwise-identical float32 sets give |1 - CKA| <= 2.2e-16 (float64 rounding of the CKA itself), the
# float64 -> float32 rounding of saving <= 6.7e-16, a float32 recomputation with other kernels (eager vs SDPA
# attention) <= 1.2e-13; random 500 x 768 sets ~2 float32 ulps apart <= 8e-14. The floor is ~1000x above these.
NOISE_FLOOR = 1e-10


def noise_ratio(moved, noise, identical=None) -> np.ndarray:
    """The paper's ratio per layer, moved / noise (1 - CKA(arm, twin) over the MLM seed noise); NaN where the
    noise is below NOISE_FLOOR (or NaN) and where `identical` says all the runs' representations are the same."""
    moved, noise = np.asarray(moved, dtype=np.float64), np.asarray(noise, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = moved / noise
    undefined = ~(noise >= NOISE_FLOOR)
    if identical is not None:
        undefined |= np.asarray(identical, dtype=bool)
    return np.where(undefined, np.nan, ratio)


def _load_for_probe(model_dir: str, tokenizer=None):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(model_dir, dtype="float32")
    if tokenizer is None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError) as e:
            raise SpecError(
                "no tokenizer in the run's model folder; pass one", key="model_dir", value=model_dir
            ) from e
    return model, tokenizer


def cka_ratio(
    runs,
    texts: Sequence[str],
    *,
    baseline_schedule: str = DEFAULT_BASELINE,
    match: Sequence[str] = ("model",),
    reps: Mapping[str, Sequence[np.ndarray]] | None = None,
    tokenizer=None,
    max_length: int = 128,
    batch_size: int = 32,
):
    """Rows (run_id, phase="final", layer, measure="cka_ratio_vs_mlm", value) for every arm of a sweep.

    value = (1 - CKA(arm, MLM seed a)) / mean_b (1 - CKA(MLM seed b, MLM seed a)) per layer: how far the
    arm moved a layer relative to seed-to-seed noise of the MLM baseline; NaN where that noise is rounding
    (noise_ratio). The baseline runs are the done runs with schedule == `baseline_schedule` and freeze ==
    "none" that agree with the arm on the `match` columns; seed a is the baseline sharing the arm's seed (its
    twin on the same token stream) when there is one, else the lowest baseline seed; b ranges over the other
    baseline seeds. Arms without at least two such baseline seeds get no rows. Every other done run with a
    model folder is an arm.

    Representations come from `reps` (run_id -> per-layer arrays on `texts`) when given, else from the
    run's `model_dir` (its own tokenizer unless `tokenizer` is passed); each model is encoded once.
    """
    import pandas as pd

    columns = ["run_id", "phase", "layer", "measure", "value"]
    runs = runs[runs["status"] == "done"] if "status" in runs.columns else runs
    match = [c for c in match if c in runs.columns]
    is_base = (runs["schedule"] == baseline_schedule) & (runs["freeze"] == "none")
    cache: dict[str, list[np.ndarray]] = {k: list(v) for k, v in (reps or {}).items()}

    def reps_of(row) -> list[np.ndarray]:
        if row.run_id not in cache:
            model_dir = getattr(row, "model_dir", "") or ""
            if not model_dir or not Path(model_dir).exists():
                raise SpecError(
                    "run has no saved model folder for cross-run CKA",
                    key=f"runs.{row.run_id}",
                    value=model_dir or None,
                )
            model, tok = _load_for_probe(model_dir, tokenizer)
            cache[row.run_id] = representations_for(model, tok, texts, max_length, batch_size)
        return cache[row.run_id]

    pair_cka: dict[tuple[str, str], list[float]] = {}

    def cka_between(r1, r2) -> np.ndarray:
        key = tuple(sorted((r1.run_id, r2.run_id)))
        if key not in pair_cka:
            pair_cka[key] = cka_vs_reference(reps_of(r1), reps_of(r2))
        return np.asarray(pair_cka[key])

    rows = []
    for arm in runs[~is_base].itertuples(index=False):
        if not (getattr(arm, "model_dir", "") or arm.run_id in cache):
            continue
        same = is_base.copy()
        for c in match:
            same &= runs[c] == getattr(arm, c)
        bases = runs[same].sort_values("seed").drop_duplicates("seed")
        if len(bases) < 2:
            continue
        twins = bases[bases["seed"] == arm.seed]
        a = next((twins if len(twins) else bases).itertuples(index=False))
        others = [b for b in bases.itertuples(index=False) if b.run_id != a.run_id]
        noise = np.mean([1.0 - cka_between(b, a) for b in others], axis=0)
        moved = 1.0 - cka_between(arm, a)
        layers = zip(*map(reps_of, (arm, a, *others)))  # per layer: each run's representations
        same = [all(np.array_equal(layer[0], y) for y in layer[1:]) for layer in layers]
        ratio = noise_ratio(moved, noise, same)
        rows += [(arm.run_id, "final", layer - 1, RATIO_MEASURE, float(v)) for layer, v in enumerate(ratio)]
    return pd.DataFrame(rows, columns=columns)


def add_cka_ratio(sweep_dir: Path, tables: dict, n_texts: int) -> int:
    """The paper's ratio per layer, (1 - CKA(arm, MLM seed a)) / (1 - CKA(MLM seed b, MLM seed a)), on
    n_texts held-out texts of the sweep's validation corpus, put into `tables["layers"]` (phase "final",
    replacing earlier ratio rows). Returns the number of runs that got a ratio (0: fewer than two MLM-baseline
    seeds per model)."""
    import pandas as pd

    from ablate.store.rundir import read_spec

    runs = tables["runs"]
    done = runs[runs["status"] == "done"] if "status" in runs else runs
    if done.empty:
        raise SpecError("no finished runs to compare", key="--cka-ratio", file=str(sweep_dir))
    spec = read_spec(Path(sweep_dir) / "runs" / done["run_id"].iloc[0])
    texts = probe_texts(
        held_out_texts(spec, str(sweep_dir)),
        n_texts,
        spec.probe.seed,
        corpus=spec.data.valid_corpus,
        key="--cka-ratio",
    )
    ratio = cka_ratio(
        done, texts, max_length=spec.probe.max_length, baseline_schedule=declared_baseline(sweep_dir)
    )
    if ratio.empty:
        return 0
    layers = tables["layers"]
    layers = layers[layers["measure"] != RATIO_MEASURE] if "measure" in layers else layers
    tables["layers"] = pd.concat([layers, ratio], ignore_index=True)
    return int(ratio["run_id"].nunique())

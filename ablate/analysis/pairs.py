"""Divergence between runs: linear CKA per layer between two runs' saved phase-end representations, for
pairs of runs formed by one explicit rule, and its ratio to MLM seed-to-seed noise.

The pairing rule (also in docs and `ablate collect --pairs`):
- a run's *identity* is everything in its RunSpec that changes training except the phases and the seed
  (model, tokenizer, data and data seed, batch, optimizer, budget, ...); its *phase ends* are the global
  steps at which each phase ends;
- a *baseline* run is of the baseline arm (ablate.config.grid.is_baseline_arm: the grid's `baseline:` schedule,
  default mlm, with the freeze mask "none");
- twin: a run that is not a baseline and the baseline with the same identity, seed and phase ends (so
  the same token stream and the same phase lengths, a different schedule or freeze mask). Phase ends are
  matched by position: phase k of the arm with phase k of its twin (the CLM phase with the MLM phase that
  ends at the same step; phases of the same name after it, such as the decay, with each other);
- seed-noise: two baselines with the same identity and the same phases that differ only in seed.
Runs of different decay lengths have different phase ends and so are never paired. Derived runs (layer
transplants) have no phase ends and are not paired.

Rows: run_a, run_b, relation, position (1-based phase end), phase (run_a's phase), phase_b (run_b's),
layer (-1 = embeddings output, MODEL_LAYER = -2 = the whole model), measure, value. Measures: "cka" (both
relations), "divergence_model" (both relations, layer MODEL_LAYER: the paper's whole-model divergence, 1 - the
mean over the blocks of their CKA, as its data files compute it: see docs/divergence.md) and "cka_ratio" (twins:
(1 - CKA(arm, twin)) / mean over the twin's seed-noise partners of (1 - CKA(twin, partner)), the paper's
ratio; NaN where that seed noise is float rounding: below analysis.ratio.NOISE_FLOOR, or every one of the
runs' representations bitwise the same, as behind a frozen encoder). Column `tokens`: whether the two runs
read the same tokens in that phase ("same" / "differ"; records older than token_hash_format 2: by the whole
stream). Columns `step` (run_a's global step at that phase end) and `decay_tokens` (the tokens run_a trained
after the end of its first phase, at that phase end: 0 at the end of the detour, the decay's length at the
end of the decay).

May import: config, store, plan, analysis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.analysis.probe import REPS_DIR, cka_vs_reference, load_representations
from ablate.analysis.ratio import noise_ratio
from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec

# the rule's view of a run lives in the store, so that `ablate collect` checks twins' tokens by the same rule
from ablate.store.rundir import (
    SAME_TOKENS,
    RunInfo,
    TokenStream,
    baselines_by_group,
    compare_streams,
    differing_phases,
    read_json,
    read_spec,
    run_info,
    runs_dir,
    token_stream,
    twins_of,
)

MODEL_LAYER = -2  # the `layer` of whole-model rows (-1 is the embeddings output, 0.. the blocks)
MODEL_MEASURE = "divergence_model"
PAIR_COLUMNS = ("run_a", "run_b", "relation", "position", "phase", "phase_b", "layer", "measure", "value")
TWIN, NOISE = "twin", "seed-noise"
RULE = (
    "twin: an arm and the baseline arm (the grid's baseline schedule, freeze none) with the same model, "
    "data, data seed, seed, training settings and phase ends, phase ends matched by position; seed-noise: two "
    "baselines that differ only in seed"
)


def form_pairs(infos: Sequence[RunInfo]) -> list[tuple[RunInfo, RunInfo, str]]:
    """(run_a, run_b, relation) by the module's rule; SpecError naming the run whose twin or second seed
    is missing."""
    baselines = [i for i in infos if i.baseline]
    by_group = baselines_by_group(infos)
    out = []
    for arm in (i for i in infos if not i.baseline):
        twins = twins_of(arm, by_group)
        if not twins:
            raise SpecError(
                f"run {arm.run_id} (seed {arm.seed}, phases {' > '.join(arm.phases)}) has no finished "
                "MLM twin: no MLM-baseline run with the same model, data, seed and phase ends",
                key=f"runs.{arm.run_id}",
                allowed=RULE,
            )
        out += [(arm, b, TWIN) for b in twins]
    for i, a in enumerate(baselines):
        partners = [
            b
            for b in baselines
            if b is not a and (b.identity, b.schedule) == (a.identity, a.schedule) and b.seed != a.seed
        ]
        if not partners:
            raise SpecError(
                f"MLM baseline {a.run_id} (seed {a.seed}) has no finished run of another seed: the "
                "seed-noise pairs (and the ratio) need two MLM seeds",
                key=f"runs.{a.run_id}",
                allowed=RULE,
            )
        out += [(a, b, NOISE) for b in partners if b.seed > a.seed]
    return out


def model_divergence(cka_per_layer: Sequence[float]) -> float:
    """The whole model's divergence from per-layer CKA ([embeddings output, block 0, ...]): 1 - the mean CKA
    of the blocks, the embeddings output left out. The paper's data files (Rian-T/thesis @ 0c3a71a,
    plots/chapter5/data/trajectory_decay_heldout_float64.json) hold 22 per-layer CKAs for the 22 blocks of
    ModernBERT-base and a divergence that is exactly 1 - their mean."""
    blocks = np.asarray(cka_per_layer, dtype=np.float64)[1:]
    if blocks.size == 0:
        raise ValueError("model_divergence needs the CKA of at least one block")
    return float(1.0 - blocks.mean())


def layer_digests(reps: Sequence[np.ndarray]) -> list[bytes]:
    """A digest of each layer's representations (dtype, shape and bytes): equal digests, bitwise-equal arrays."""
    arrays = [np.ascontiguousarray(r) for r in reps]
    return [hashlib.sha256(f"{a.dtype}{a.shape}".encode() + a.tobytes()).digest() for a in arrays]


def identical_layers(digests: Sequence[Sequence[bytes]]) -> np.ndarray:
    """Per layer, whether every run's representations are bitwise the same (`digests`: layer_digests per run)."""
    return np.array([len(set(layer)) == 1 for layer in zip(*digests)], dtype=bool)


def pair_rows(
    pairs: Sequence[tuple[RunInfo, RunInfo, str]], reps_of: Callable[[str, int], Sequence[np.ndarray]]
) -> pd.DataFrame:
    """The pairs table for `pairs`; `reps_of(run_id, position)` gives a run's representations at the end
    of its phase `position` (1-based). Each pair's CKA is computed once."""
    cka: dict[tuple[str, str, int], np.ndarray] = {}
    digests: dict[tuple[str, int], list[bytes]] = {}  # (run, position) -> layer_digests, for the ratio

    def between(a: RunInfo, b: RunInfo, pos: int) -> np.ndarray:
        key = (*sorted((a.run_id, b.run_id)), pos)
        if key not in cka:
            reps_a, reps_b = reps_of(a.run_id, pos), reps_of(b.run_id, pos)
            for run_id, reps in ((a.run_id, reps_a), (b.run_id, reps_b)):
                if (run_id, pos) not in digests:
                    digests[(run_id, pos)] = layer_digests(reps)
            cka[key] = np.asarray(cka_vs_reference(reps_a, reps_b))
        return cka[key]

    noise_partners: dict[str, list[RunInfo]] = {}
    for a, b, rel in pairs:
        if rel == NOISE:
            noise_partners.setdefault(a.run_id, []).append(b)
            noise_partners.setdefault(b.run_id, []).append(a)
    rows = []
    for a, b, rel in pairs:
        for pos in range(1, len(a.ends) + 1):
            values = between(a, b, pos)
            head = (a.run_id, b.run_id, rel, pos, a.phases[pos - 1], b.phases[pos - 1])
            rows += [(*head, layer - 1, "cka", float(v)) for layer, v in enumerate(values)]
            rows.append((*head, MODEL_LAYER, MODEL_MEASURE, model_divergence(values)))
            if rel == TWIN:
                partners = noise_partners.get(b.run_id, [])
                noise = (
                    np.mean([1.0 - between(b, p, pos) for p in partners], axis=0)
                    if partners
                    else np.full(len(values), np.nan)
                )
                same = identical_layers([digests[(r.run_id, pos)] for r in (a, b, *partners)])
                ratio = noise_ratio(1.0 - values, noise, same)
                rows += [(*head, layer - 1, "cka_ratio", float(v)) for layer, v in enumerate(ratio)]
    return pd.DataFrame(rows, columns=list(PAIR_COLUMNS))


def pairs_table(sweep_dir: Path, runs: pd.DataFrame) -> pd.DataFrame:
    """The pairs table of a sweep's finished runs (`runs`: the collected runs table), from the run folders'
    spec.json and records/reps/<phase>.npz. SpecError when a pair cannot be formed or a run saved no
    representations (probe.n_texts: 0), or two runs probed different texts."""
    done = runs[runs["status"] == "done"] if "status" in runs.columns else runs
    infos, folders, specs = [], {}, {}
    for run_id in done["run_id"]:
        folder = runs_dir(sweep_dir) / str(run_id)
        if not (folder / "spec.json").is_file():
            continue  # the base model's reference scores: no run folder
        spec = read_spec(folder)
        if spec.labels.get("derived"):
            continue  # a layer transplant: no phases of its own
        infos.append(run_info(str(run_id), spec))
        folders[str(run_id)], specs[str(run_id)] = folder, spec
    if not infos:
        raise SpecError("no finished runs to pair", file=str(sweep_dir), key="runs")
    pairs = form_pairs(infos)
    by_id = {i.run_id: i for i in infos}
    keys: dict[str, str] = {}

    def reps_of(run_id: str, pos: int) -> list[np.ndarray]:
        phase = by_id[run_id].phases[pos - 1]
        path = folders[run_id].joinpath(*REPS_DIR, f"{phase}.npz")
        if not path.is_file():
            raise SpecError(
                f"run {run_id} saved no representations at the end of phase {phase!r}",
                file=str(path),
                key="probe.n_texts",
                allowed="a run with probe.n_texts > 0",
            )
        reps, key = load_representations(path)
        first = keys.setdefault("key", key)
        if key != first:
            raise SpecError(
                f"run {run_id} probed other texts than the rest of the sweep",
                file=str(path),
                key="probe",
                value=key,
                allowed=first,
            )
        return list(reps)

    rows = pair_rows(pairs, reps_of)
    ends = {run_id: phase_end_tokens(spec) for run_id, spec in specs.items()}
    rows["step"] = [by_id[a].ends[pos - 1] for a, pos in zip(rows["run_a"], rows["position"])]
    rows["decay_tokens"] = [ends[a][pos - 1] - ends[a][0] for a, pos in zip(rows["run_a"], rows["position"])]
    rows["objective"] = rows["run_a"].map({r: spec.phases[0].objective.upper() for r, spec in specs.items()})
    streams = {run_id: _token_stream(folders[run_id], by_id[run_id]) for run_id in folders}
    rows["tokens"] = [
        _phase_tokens(streams[a], streams[b], pos)
        for a, b, pos in zip(rows["run_a"], rows["run_b"], rows["position"])
    ]
    return rows


def phase_end_tokens(spec: RunSpec) -> list[int]:
    """The tokens a run has trained at the end of each of its phases (steps x that phase's tokens per step)."""
    return list(
        accumulate(steps * per_step for steps, per_step in zip(spec.phase_steps(), spec.phase_tokens_per_step()))
    )


def _token_stream(folder: Path, info: RunInfo) -> TokenStream:
    try:
        record = read_json(folder / "records" / "run.json")
    except (OSError, ValueError):
        record = {}
    return token_stream(record if isinstance(record, dict) else {}, info.phases)


def _phase_tokens(a: TokenStream, b: TokenStream, position: int) -> str:
    """Whether two runs read the same tokens in phase `position`: by the phase hashes where both records
    compare them, else by the whole streams ("same", "differ", or "unrecorded")."""
    verdict = compare_streams(a, b)
    if verdict in (SAME_TOKENS, "unrecorded"):
        return verdict
    positions = differing_phases(a, b)
    return SAME_TOKENS if positions and position not in positions else "differ"


# --- summaries -------------------------------------------------------------------------------------------


def region_of(layers: Sequence[int], n_layers: int) -> dict[int, str]:
    """Block index -> "low" / "mid" / "high" (freeze masks' thirds); the embeddings output (-1) is in none."""
    from ablate.plan.freezing import layer_groups

    return {layer: name for name, r in layer_groups(n_layers).items() for layer in r if layer in set(layers)}


def region_values(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per pair, phase end and measure: the mean over the blocks of each region, and over all blocks
    ("all"), of 1 - CKA (measure "1-cka") or of the ratio. Depth from the pair's largest layer index."""
    rows = []
    keys = ["run_a", "run_b", "relation", "position", "phase", "phase_b", "measure"]
    blocks = pairs[(pairs["layer"] >= 0) & (pairs["measure"] != MODEL_MEASURE)]
    for key, g in blocks.groupby(keys, sort=False):
        y = 1.0 - g["value"] if key[-1] == "cka" else g["value"]
        regions = g["layer"].map(region_of(g["layer"].tolist(), int(g["layer"].max()) + 1))
        measure = "1-cka" if key[-1] == "cka" else key[-1]
        for name in ("low", "mid", "high"):
            rows.append((*key[:-1], measure, name, float(y[regions == name].mean())))
        rows.append((*key[:-1], measure, "all", float(y.mean())))
    return pd.DataFrame(rows, columns=[*keys, "region", "value"])


def describe_pairs(specs: Sequence[tuple[str, RunSpec]]) -> str:
    """One line for a dry run: how many pairs of each relation the runs will give, or why none can form."""
    try:
        pairs = form_pairs([run_info(run_id, spec) for run_id, spec in specs])
    except SpecError as exc:
        return f"pairs (ablate collect --pairs): cannot be formed: {exc.message}; rule: {RULE}"
    counts = {rel: sum(r == rel for _, _, r in pairs) for rel in (TWIN, NOISE)}
    return f"pairs (ablate collect --pairs): {counts[TWIN]} twin, {counts[NOISE]} seed-noise; rule: {RULE}"

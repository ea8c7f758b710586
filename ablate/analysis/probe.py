"""Per-layer measures: how far continued pretraining moved each layer of an encoder.

- representations: mean-pooled (non-pad tokens) hidden states of the embeddings output and of each block,
  on a fixed set of held-out texts, in float64;
- linear CKA between two models' representations of the same texts, per layer;
- relative weight change and gradient norms per layer group;
- the paper's ratio (1 - CKA(arm, MLM seed a)) / (1 - CKA(MLM seed b, MLM seed a)) across runs of a sweep.

Layer indices follow the `layers` table: -1 is the embeddings output, 0..n-1 the blocks. Weight groups are
named "embeddings", "0", "1", ...; parameters outside them (MLM head, BERT pooler, ModernBERT final_norm)
belong to no group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ablate.config.errors import SpecError

# --- CKA -------------------------------------------------------------------------------------------------

def linear_cka(x, y) -> float:
    """Linear CKA (Kornblith et al. 2019) between two (n, d) feature matrices of the same n examples.

    Features are mean-centred and everything is computed in float64: in single precision the products
    underflow/lose digits on the near-identical representations of deep layers.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"linear_cka needs two (n, d) matrices with the same n, got {x.shape} and {y.shape}")
    x = x - x.mean(axis=0, keepdims=True)
    y = y - y.mean(axis=0, keepdims=True)
    n = x.shape[0]
    if n < max(x.shape[1], y.shape[1]):
        # Same quantity through the n x n Gram matrices: ||Y^T X||_F^2 = <XX^T, YY^T>_F; cheaper when d > n.
        kx, ky = x @ x.T, y @ y.T
        cross, nx, ny = np.vdot(kx, ky), np.linalg.norm(kx), np.linalg.norm(ky)
    else:
        cross = np.linalg.norm(y.T @ x) ** 2
        nx, ny = np.linalg.norm(x.T @ x), np.linalg.norm(y.T @ y)
    if nx == 0.0 or ny == 0.0:
        return float("nan")  # a constant representation has no similarity structure
    return float(cross / (nx * ny))


def cka_vs_reference(reps_a: Sequence[np.ndarray], reps_b: Sequence[np.ndarray]) -> list[float]:
    """Linear CKA per layer between two models' representations of the same texts."""
    if len(reps_a) != len(reps_b):
        raise ValueError(f"different numbers of layers: {len(reps_a)} vs {len(reps_b)}")
    return [linear_cka(a, b) for a, b in zip(reps_a, reps_b)]


# --- representations -------------------------------------------------------------------------------------

def probe_texts(valid_texts: Sequence[str], n: int, seed: int, *, corpus: str = "data.valid_corpus",
                key: str = "probe.n_texts", file: str | None = None) -> list[str]:
    """A fixed set of `n` held-out texts, chosen by `seed`, in corpus order. SpecError (naming the corpus, and
    `key` in `file`) when it has fewer usable (non-blank) texts: a probe never measures fewer than it says."""
    candidates = [t for t in valid_texts if t and t.strip()]
    if n > len(candidates):
        raise SpecError(f"the layer probe asks for {n} held-out texts, but the validation corpus {corpus} has "
                        f"{len(candidates)} usable (non-blank) texts", file=file or corpus, key=key, value=n,
                        allowed=f"at most {len(candidates)} (0: no probe), or a data.valid_corpus with at least "
                                f"{n} texts")
    if n == len(candidates):
        return candidates
    idx = np.sort(np.random.default_rng(seed).choice(len(candidates), size=n, replace=False))
    return [candidates[i] for i in idx]


def held_out_texts(spec, file: str | None = None) -> list[str]:
    """The documents of the run's data.valid_corpus; SpecError when it names none."""
    from ablate.data.corpus import read_documents

    if spec.data.valid_corpus is None:
        raise SpecError("layer probes need held-out texts", file=file, key="data.valid_corpus",
                        allowed="a corpus path, or probe.n_texts: 0")
    return read_documents(spec.data, "valid_corpus")


def check_probe_texts(specs: list, file: str | None) -> None:
    """Before anything is submitted: each distinct (data.valid_corpus, probe.n_texts) of the runs that probe
    has that many usable held-out texts (probe_texts' SpecError otherwise). Reads each corpus once and loads
    no model. A held-out file that does not exist is left to the corpus check (a dry run's warning, a
    submission's error). `specs`: RunSpecs; `file`: the grid or run file they come from."""
    from ablate.data.sources import CorpusNotFound

    reading = {"valid_corpus", "format", "text_field", "max_documents", "data_root", "errors"}
    texts: dict[str, list[str] | None] = {}
    for spec in (s for s in specs if s.probe.n_texts > 0):
        which = spec.data.model_dump_json(include=reading)
        if which not in texts:
            try:
                texts[which] = held_out_texts(spec, file)
            except CorpusNotFound:
                texts[which] = None
        if texts[which] is None:
            continue
        probe_texts(texts[which], spec.probe.n_texts, spec.probe.seed, corpus=spec.data.valid_corpus, file=file)


def _encoder(model):
    # *ForMaskedLM -> its bare encoder (bert / model); a bare encoder is its own base_model.
    return getattr(model, "base_model", model)


def layer_representations(model, input_ids_batches, attention_masks) -> list[np.ndarray]:
    """Mean-pooled hidden states over non-pad tokens: [embeddings output, block 0, ...], each (n, d) float64.

    Runs the bare encoder in eval mode without gradients (bidirectional attention, as the model ships).
    """
    import torch

    encoder = _encoder(model)
    was_training = encoder.training
    encoder.eval()
    device = next(encoder.parameters()).device
    pooled: list[list[np.ndarray]] | None = None
    try:
        with torch.no_grad():
            for ids, mask in zip(input_ids_batches, attention_masks, strict=True):
                ids, mask = torch.as_tensor(ids).to(device), torch.as_tensor(mask).to(device)
                out = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
                m = mask.to(torch.float64).unsqueeze(-1)
                count = m.sum(dim=1).clamp_min(1.0)
                per_layer = [((h.to(torch.float64) * m).sum(dim=1) / count).cpu().numpy()
                             for h in out.hidden_states]
                if pooled is None:
                    pooled = [[] for _ in per_layer]
                for acc, p in zip(pooled, per_layer):
                    acc.append(p)
    finally:
        encoder.train(was_training)
    if pooled is None:
        raise ValueError("layer_representations got no batches")
    return [np.concatenate(acc, axis=0) for acc in pooled]


def representations_for(model, tokenizer, texts: Sequence[str], max_length: int = 128,
                        batch_size: int = 32) -> list[np.ndarray]:
    """Tokenize `texts` (truncated to max_length) and return their per-layer mean-pooled representations."""
    if not texts:
        raise ValueError("representations_for needs at least one text")
    ids, masks = [], []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[start:start + batch_size]), padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt")
        ids.append(enc["input_ids"])
        masks.append(enc["attention_mask"])
    return layer_representations(model, ids, masks)


# --- weights and gradients -------------------------------------------------------------------------------

def layer_params(model) -> dict[int, list[str]]:
    """{layer index (-1 = embeddings): parameter names} for a *ForMaskedLM or a bare encoder."""
    from ablate.models.families import family_of, layer_index

    family = family_of(model.config)
    out: dict[int, list[str]] = {}
    for name, _ in model.named_parameters():
        idx = layer_index(name, family)
        if idx is not None:
            out.setdefault(idx, []).append(name)
    return dict(sorted(out.items()))


def weight_rel_change(params: Mapping, base: Mapping, groups: Mapping[int, list[str]]) -> dict[int, float]:
    """||W - W_base|| / ||W_base|| per layer, Frobenius norms (float64) over all the layer's parameters."""
    import torch

    out = {}
    with torch.no_grad():
        for layer, names in groups.items():
            diff_sq = base_sq = 0.0
            for name in names:
                w = params[name].detach().to("cpu", torch.float64)
                w_base = base[name].detach().to("cpu", torch.float64)
                diff_sq += float(((w - w_base) ** 2).sum())
                base_sq += float((w_base ** 2).sum())
            out[layer] = float(np.sqrt(diff_sq) / np.sqrt(base_sq)) if base_sq > 0 else float("nan")
    return out


def weight_relative_change(model_after, model_base) -> dict[int, float]:
    """weight_rel_change between two models of the same architecture (MLM wrappers or bare encoders)."""
    after, base = dict(_encoder(model_after).named_parameters()), dict(_encoder(model_base).named_parameters())
    groups = layer_params(_encoder(model_after))
    if groups != layer_params(_encoder(model_base)):
        raise ValueError("the two models have different layers")
    return weight_rel_change(after, base, groups)


def grad_norms(params: Mapping, groups: Mapping[int, list[str]]) -> dict[int, float]:
    """L2 norm of the current gradients per layer (each tensor's norm in its own dtype, combined in
    float64: no float64 copy of a large gradient); layers without gradients (frozen, or not reached) are
    left out."""
    import torch

    out = {}
    for layer, names in groups.items():
        grads = [params[n].grad for n in names if params[n].grad is not None]
        if grads:
            out[layer] = float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g).double() for g in grads])))
    return out


def layer_grad_norms(model) -> dict[int, float]:
    return grad_norms(dict(model.named_parameters()), layer_params(model))


# --- the paper's ratio across runs -----------------------------------------------------------------------

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
            raise SpecError("no tokenizer in the run's model folder; pass one", key="model_dir",
                            value=model_dir) from e
    return model, tokenizer


def cka_ratio(runs, texts: Sequence[str], *, baseline_schedule: str = "mlm", match: Sequence[str] = ("model",),
              reps: Mapping[str, Sequence[np.ndarray]] | None = None, tokenizer=None,
              max_length: int = 128, batch_size: int = 32):
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
                raise SpecError("run has no saved model folder for cross-run CKA", key=f"runs.{row.run_id}",
                                value=model_dir or None)
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
        layers = zip(*map(reps_of, (arm, a, *others)))    # per layer: each run's representations
        same = [all(np.array_equal(layer[0], y) for y in layer[1:]) for layer in layers]
        ratio = noise_ratio(moved, noise, same)
        rows += [(arm.run_id, "final", layer - 1, RATIO_MEASURE, float(v)) for layer, v in enumerate(ratio)]
    return pd.DataFrame(rows, columns=columns)


# --- during pretraining ----------------------------------------------------------------------------------

REPS_DIR = ("records", "reps")   # <run folder>/records/reps/<phase>.npz: the phase-end representations


def probe_key(texts: Sequence[str], max_length: int) -> str:
    """A digest of the probe texts and their truncation: two runs' saved representations are comparable
    exactly when their keys agree."""
    import hashlib

    h = hashlib.sha256(str(max_length).encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()[:16]


def save_representations(path: Path, reps: Sequence[np.ndarray], key: str) -> None:
    """One phase end's representations as one float32 array (layers incl. embeddings, n_texts, hidden) in an
    .npz with the probe key, written atomically. Cost: (n_layers + 1) x n_texts x hidden x 4 bytes (the
    paper's ModernBERT-base on 500 texts: 23 x 500 x 768 x 4 = 35 MB per phase end)."""
    import io

    from ablate.store import atomic

    buf = io.BytesIO()
    np.savez(buf, reps=np.stack([np.asarray(r, dtype=np.float32) for r in reps]), probe_key=np.array(key))
    atomic.write_bytes(path, buf.getvalue())


def load_representations(path: Path) -> tuple[np.ndarray, str]:
    """(reps (layers, n, d) float32, probe key) of a file written by save_representations."""
    with np.load(path) as f:
        return f["reps"], str(f["probe_key"])


def cka_vs_base_hook(spec, run_dir: Path | None = None):
    """A phase-end hook for the training loop: per-layer linear CKA between the model now and the base model
    on `spec.probe.n_texts` held-out texts (data.valid_corpus), chosen by `spec.probe.seed`; with `run_dir`
    it also saves the representations to records/reps/<phase>.npz (for cross-run CKA at every phase end).

    The base representations are computed once, from a fresh load of the base model (same seed, so the
    same weights the run started from, also when the run resumes from a checkpoint)."""
    from ablate.models.sources import load_masked_lm, load_tokenizer

    texts = probe_texts(held_out_texts(spec), spec.probe.n_texts, spec.probe.seed, corpus=spec.data.valid_corpus)
    tokenizer = load_tokenizer(spec.tokenizer or spec.model)
    base = load_masked_lm(spec.model, spec.attn_implementation, seed=spec.seed)
    base_reps = representations_for(base, tokenizer, texts, spec.probe.max_length)
    del base

    key = probe_key(texts, spec.probe.max_length)

    def hook(phase: str, model) -> list[dict]:
        reps = representations_for(model, tokenizer, texts, spec.probe.max_length)
        if run_dir is not None:
            save_representations(Path(run_dir).joinpath(*REPS_DIR, f"{phase}.npz"), reps, key)
        return [{"layer": i - 1, "measure": "cka_vs_base", "value": v}
                for i, v in enumerate(cka_vs_reference(reps, base_reps))]

    return hook


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
    texts = probe_texts(held_out_texts(spec, str(sweep_dir)), n_texts, spec.probe.seed,
                        corpus=spec.data.valid_corpus, key="--cka-ratio")
    ratio = cka_ratio(done, texts, max_length=spec.probe.max_length)
    if ratio.empty:
        return 0
    layers = tables["layers"]
    layers = layers[layers["measure"] != RATIO_MEASURE] if "measure" in layers else layers
    tables["layers"] = pd.concat([layers, ratio], ignore_index=True)
    return int(ratio["run_id"].nunique())


"""Per-layer measures: how far continued pretraining moved each layer of an encoder.

- representations: mean-pooled (non-pad tokens) hidden states of the embeddings output and of each block,
  on a fixed set of held-out texts, in float64;
- linear CKA between two models' representations of the same texts, per layer;
- relative weight change and gradient norms per layer group;
(the paper's ratio across runs of a sweep: ablate.analysis.ratio).

Layer indices follow the `layers` table: -1 is the embeddings output, 0..n-1 the blocks. Weight groups are
named "embeddings", "0", "1", ...; parameters outside them (MLM head, BERT pooler, ModernBERT final_norm)
belong to no group.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import numpy as np

from ablate.config.errors import SpecError
from ablate.config.spec import PROBE_TASK

TaskReader = Callable[[str, str, "str | None"], list]  # (task, split, data root) -> its texts

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


def probe_texts(
    valid_texts: Sequence[str],
    n: int,
    seed: int,
    *,
    corpus: str = "data.valid_corpus",
    key: str = "probe.n_texts",
    file: str | None = None,
) -> list[str]:
    """A fixed set of `n` held-out texts, chosen by `seed`, in corpus order. SpecError (naming the corpus, and
    `key` in `file`) when it has fewer usable (non-blank) texts: a probe never measures fewer than it says."""
    candidates = [t for t in valid_texts if t and t.strip()]
    if n > len(candidates):
        raise SpecError(
            f"the layer probe asks for {n} held-out texts, but its texts ({corpus}) have "
            f"{len(candidates)} usable (non-blank) texts",
            file=file or corpus,
            key=key,
            value=n,
            allowed=f"at most {len(candidates)} (0: no probe), or probe texts (probe.texts, "
            f"data.valid_corpus) with at least {n} texts",
        )
    if n == len(candidates):
        return candidates
    idx = np.sort(np.random.default_rng(seed).choice(len(candidates), size=n, replace=False))
    return [candidates[i] for i in idx]


def probe_sources(spec) -> tuple[str, ...]:
    """Where the run's probe texts come from: probe.texts, else its data.valid_corpus (SpecError: neither)."""
    if spec.probe.texts is not None:
        return spec.probe.texts
    if spec.data.valid_corpus is None:
        raise SpecError(
            "layer probes need held-out texts",
            key="data.valid_corpus",
            allowed="a corpus path, probe.texts (task:NAME or a corpus), or probe.n_texts: 0",
        )
    return (spec.data.valid_corpus,)


def task_source(source: str) -> tuple[str, str] | None:
    """(task name, split) of a task:NAME[:SPLIT] source (split default test); None for a corpus path."""
    if not source.startswith(PROBE_TASK):
        return None
    name, _, split = source[len(PROBE_TASK) :].partition(":")
    return name, split or "test"


def held_out_texts(spec, file: str | None = None, read_task: TaskReader | None = None) -> list[str]:
    """The pool the probe draws from: the texts of each source of probe_sources, in the listed order (the
    paper pooled DiaMED's and FRACCO's documents and drew its 500 texts from the pool). A task source is read
    by `read_task(name, split, data_root)` (ablate.evaluate.tasks.task_texts: tasks live above analysis); a SpecError without one."""
    from ablate.data.corpus import read_documents

    pool: list[str] = []
    try:
        for source in probe_sources(spec):
            task = task_source(source)
            if task is not None and read_task is None:
                raise SpecError(
                    "task probe texts are read where the tasks are known (ablate sweep / run)",
                    key="probe.texts",
                    value=source,
                    allowed="a corpus path",
                )
            if task is not None:
                pool += read_task(*task, spec.data.data_root)
            elif spec.probe.texts is None:
                pool += read_documents(spec.data, "valid_corpus")
            else:
                pool += read_documents(spec.data.model_copy(update={"valid_corpus": source}), "valid_corpus")
    except SpecError as exc:  # a data file's error is named where the spec reads it, the data file in the message
        inside = exc.file and file and exc.file != file
        message = f"{exc.file}: {exc.message}" if inside else exc.message
        raise SpecError(
            message, file=file or exc.file, key=exc.key, value=exc.value, allowed=exc.allowed
        ) from None
    return pool


def check_probe_texts(
    specs: list, file: str | None, read_task: TaskReader | None = None, absent: Collection[str] = ()
) -> None:
    """Before anything is submitted: each distinct (probe sources, probe.n_texts) of the runs that probe
    has that many usable held-out texts (probe_texts' SpecError otherwise). Reads each source once and loads
    no model. A held-out file, or a probe task source in `absent` (its data missing), is left to the corpus
    and probe-data checks (a dry run's warning, a submission's error). `specs`: RunSpecs; `file`: the grid or
    run file they come from; `read_task`: as held_out_texts'."""
    from ablate.data.readers import CorpusNotFound

    reading = {"valid_corpus", "format", "text_field", "max_documents", "data_root", "errors"}
    texts: dict[str, list[str] | None] = {}
    for spec in (s for s in specs if s.probe.n_texts > 0):
        which = spec.data.model_dump_json(include=reading) + repr(spec.probe.texts)
        if which not in texts:
            try:
                skip = set(absent) & set(spec.probe.texts or ())
                texts[which] = None if skip else held_out_texts(spec, file, read_task)
            except CorpusNotFound:
                texts[which] = None
        if texts[which] is None:
            continue
        probe_texts(
            texts[which], spec.probe.n_texts, spec.probe.seed, corpus=", ".join(probe_sources(spec)), file=file
        )


def _encoder(model):
    # *ForMaskedLM -> its bare encoder (bert / model); a bare encoder is its own base_model.
    return getattr(model, "base_model", model)


def _clear_stale_output_capture() -> None:
    """transformers collects hidden states through hooks that read a context variable, which it swaps for a
    global while torch.compile traces a forward and back when that call ends. A compiled FlexAttention forward
    (ablate.models.flex) leaves it swapped: the next eager forward's hooks then read the global, and
    `output_hidden_states` returns no hidden state at all. Swapped back here, outside any compiled region."""
    import torch

    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # another transformers: nothing of this kind to clear
        return
    if getattr(_active_collector, "compiling", False) and not torch.compiler.is_compiling():
        _active_collector.reset(None)


def layer_representations(model, input_ids_batches, attention_masks) -> list[np.ndarray]:
    """Mean-pooled hidden states over non-pad tokens: [embeddings output, block 0, ...], each (n, d) float64.

    Runs the bare encoder in eval mode without gradients (bidirectional attention, as the model ships).
    Every block's entry is its own output: transformers >= 5 replaces the last one by the final norm's output
    (ModernBERT's final_norm, EuroBERT's norm), which would put the last layer in another space than the
    others; `tie_last_hidden_states` is switched off for the call, as transformers 4 measured it.
    """
    import torch

    encoder = _encoder(model)
    _clear_stale_output_capture()
    was_training, tied = encoder.training, getattr(encoder.config, "tie_last_hidden_states", None)
    encoder.eval()
    encoder.config.tie_last_hidden_states = False
    device = next(encoder.parameters()).device
    pooled: list[list[np.ndarray]] | None = None
    try:
        with torch.no_grad():
            for ids, mask in zip(input_ids_batches, attention_masks, strict=True):
                ids, mask = torch.as_tensor(ids).to(device), torch.as_tensor(mask).to(device)
                out = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
                m = mask.to(torch.float64).unsqueeze(-1)
                count = m.sum(dim=1).clamp_min(1.0)
                per_layer = [
                    ((h.to(torch.float64) * m).sum(dim=1) / count).cpu().numpy() for h in out.hidden_states
                ]
                if pooled is None:
                    pooled = [[] for _ in per_layer]
                for acc, p in zip(pooled, per_layer):
                    acc.append(p)
    finally:
        encoder.train(was_training)
        encoder.config.tie_last_hidden_states = tied
    if pooled is None:
        raise ValueError("layer_representations got no batches")
    return [np.concatenate(acc, axis=0) for acc in pooled]


def representations_for(
    model, tokenizer, texts: Sequence[str], max_length: int = 128, batch_size: int = 32
) -> list[np.ndarray]:
    """Tokenize `texts` (truncated to max_length) and return their per-layer mean-pooled representations."""
    if not texts:
        raise ValueError("representations_for needs at least one text")
    ids, masks = [], []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(
            list(texts[start : start + batch_size]),
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
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
                base_sq += float((w_base**2).sum())
            out[layer] = float(np.sqrt(diff_sq) / np.sqrt(base_sq)) if base_sq > 0 else float("nan")
    return out


# --- during pretraining ----------------------------------------------------------------------------------

REPS_DIR = ("records", "reps")  # <run folder>/records/reps/<phase>.npz: the phase-end representations


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
    """(reps (layers, n, d) float32, probe key) of a file written by save_representations; a SpecError naming
    the file when it is not one (cut short, overwritten, other arrays)."""
    try:
        with np.load(path) as f:
            reps, key = f["reps"], str(f["probe_key"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        reps, key = None, f"{type(exc).__name__}: {exc}"
    if reps is None or reps.ndim != 3 or reps.dtype != np.float32:
        raise SpecError(
            f"not the phase-end representations a run saves ({key if reps is None else f'{reps.dtype} {reps.shape}'});"
            " the run writes them at its phase's end: run it again (delete its folder, run the sweep)",
            file=str(path),
        )
    return reps, key


def cka_vs_base_hook(spec, run_dir: Path | None = None, read_task: TaskReader | None = None):
    """A phase-end hook for the training loop: per-layer linear CKA between the model now and the base model
    on `spec.probe.n_texts` held-out texts (probe.texts, default data.valid_corpus; task sources read by
    `read_task`), chosen by `spec.probe.seed`; with `run_dir`
    it also saves the representations to records/reps/<phase>.npz (for cross-run CKA at every phase end).

    The base representations come from a fresh load of the base model (same seed, so the same weights the
    run started from, also when the run resumes from a checkpoint), at the first phase end, on the device of
    the model the hook is given: the run's device, once the process group exists (the hook is built before
    pretraining forms it, and the other ranks would wait on the probe there)."""
    from ablate.models.loading import load_tokenizer

    texts = probe_texts(
        held_out_texts(spec, read_task=read_task),
        spec.probe.n_texts,
        spec.probe.seed,
        corpus=", ".join(probe_sources(spec)),
    )
    tokenizer = load_tokenizer(spec.tokenizer or spec.model)
    key = probe_key(texts, spec.probe.max_length)
    base_reps: list[np.ndarray] = []

    def hook(phase: str, model) -> list[dict]:
        if not base_reps:
            base_reps.extend(base_representations(spec, tokenizer, texts, next(model.parameters()).device))
        reps = representations_for(model, tokenizer, texts, spec.probe.max_length)
        if run_dir is not None:
            save_representations(Path(run_dir).joinpath(*REPS_DIR, f"{phase}.npz"), reps, key)
        return [
            {"layer": i - 1, "measure": "cka_vs_base", "value": v}
            for i, v in enumerate(cka_vs_reference(reps, base_reps))
        ]

    return hook


def base_representations(spec, tokenizer, texts: Sequence[str], device) -> list[np.ndarray]:
    """The probe's representations of the run's base model (a fresh load, seeded as the run's), on `device`.
    Loading seeds torch's generators; they are restored after, so a probe mid-run draws nothing of the run's."""
    import torch

    from ablate.models.loading import load_masked_lm

    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        base = load_masked_lm(spec.model, spec.attn_implementation, seed=spec.seed).to(device)
    return representations_for(base, tokenizer, texts, spec.probe.max_length)

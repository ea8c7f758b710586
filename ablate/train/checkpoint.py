"""Checkpoints of a run: what a resumed run needs (TrainState, weights, AdamW moments by name), written to a
temporary folder and published atomically; the branch points a sweep's children start from (kept under
checkpoints/branch/, adopted by a child as its own first checkpoint); and the final *ForMaskedLM folder.

Weights go through safetensors and tensors through torch.load(weights_only=True): loading runs no code.
A checkpoint loads to CPU, then onto the parameters' devices, whatever device it was saved from.

A checkpoint is checked before a run resumes from it (`checkpoint_problem`: state.json's fields and types,
the safetensors header against the file's size, optimizer.pt's zip CRCs): one that fails is set aside as
`damaged-<name>` (named on stderr, in the run's log) and the run resumes from the newest complete one left;
when none is left, DamagedCheckpoint stops the run once, naming what was set aside, and the next attempt
trains from step 0. A damaged branch point is no branch point: the child trains from step 0.

May import: store, train.optimizer.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model

from ablate.store import atomic
from ablate.store.rundir import TOKEN_HASH_FORMAT  # noqa: F401  (what records/run.json says these hashes are)
from ablate.train.optimizer import Optimizer

STREAM_START = hashlib.sha256(b"ablate-token-stream").hexdigest()
# Every phase's chain starts from one constant, so phase k of two runs that read the same sequences has the
# same hash whatever the phases' names or objectives (format 1 started each phase from sha256(its name)).
PHASE_START = hashlib.sha256(b"ablate-phase-tokens").hexdigest()


@dataclass
class TrainState:
    """Everything besides weights and optimizer moments that a resumed run needs."""

    phase_index: int = 0
    step_in_phase: int = 0
    global_step: int = 0
    data_position: int = 0  # sequences consumed so far
    tokens_seen: int = 0
    token_hash: str = STREAM_START
    phase_token_hashes: dict[str, str] = field(default_factory=dict)
    phase_tokens: dict[str, int] = field(default_factory=dict)
    source_tokens: dict[str, int] = field(default_factory=dict)  # runs that read by members (data.mixture)
    source_token_hashes: dict[str, str] = field(default_factory=dict)  # each source's sequences, chained
    curves: list[dict] = field(default_factory=list)
    grad_norms: list[dict] = field(default_factory=list)
    grad_norm_sums: dict[str, float] = field(default_factory=dict)  # "phase/layer" -> sum over steps
    layer_rows: list[dict] = field(default_factory=list)
    frozen: list[dict] = field(default_factory=list)  # the phase plan as rows: phase, layer (frozen_rows)
    elapsed_s: float = 0.0
    done: bool = False

    def advance(self, phase: str, batch: np.ndarray) -> None:
        """One optimizer step over `batch`: data position, step counters, token counts and hashes."""
        start = self.phase_token_hashes.get(phase, PHASE_START)
        self.token_hash = chain_hash(self.token_hash, batch)
        self.phase_token_hashes[phase] = chain_hash(start, batch)
        self.phase_tokens[phase] = self.phase_tokens.get(phase, 0) + batch.size
        self.data_position += len(batch)
        self.tokens_seen += batch.size
        self.global_step += 1
        self.step_in_phase += 1

    def advance_sources(self, labels: tuple[str, ...], members: np.ndarray, batch: np.ndarray) -> dict:
        """Each source's tokens and hash after a step whose row i came from labels[members[i]]; returns the
        curves' columns tokens/<source> (cumulative)."""
        for k, label in enumerate(labels):
            rows = batch[members == k]
            if len(rows):
                self.source_token_hashes[label] = chain_hash(
                    self.source_token_hashes.get(label, PHASE_START), rows
                )
                self.source_tokens[label] = self.source_tokens.get(label, 0) + rows.size
        return {f"tokens/{label}": n for label, n in self.source_tokens.items()}

    def book_step(
        self,
        phase: str,
        step: int,
        tokens: int,
        loss: float,
        lr: float,
        norms: dict[int, float],
        notes: dict | None = None,
    ) -> None:
        """The curve row (with `notes`' columns) and gradient norms of global step `step` (read back later than
        the step itself: ablate.train.readback)."""
        self.curves.append(
            {"phase": phase, "step": step, "tokens": tokens, "loss": loss, "lr": lr, **(notes or {})}
        )
        for layer, value in norms.items():
            key = f"{phase}/{layer}"
            self.grad_norm_sums[key] = self.grad_norm_sums.get(key, 0.0) + value
        self.grad_norms += [
            {"phase": phase, "step": step, "layer": layer, "grad_norm": value} for layer, value in norms.items()
        ]


def chain_hash(previous: str, tokens: np.ndarray) -> str:
    """The token-stream hash after `tokens` (hashed as int32, whatever the storage dtype)."""
    return hashlib.sha256(
        bytes.fromhex(previous) + np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
    ).hexdigest()


class DamagedCheckpoint(RuntimeError):
    """Every checkpoint of a run failed its check (each set aside): the run stops once, named; the next attempt
    trains from step 0."""


DAMAGED_PREFIX = "damaged-"  # a checkpoint folder set aside: never resumed from, kept for a look


def state_problem(state: object) -> str | None:
    """Why a state.json's content is no TrainState (an unknown field, a value of the wrong type), or None."""
    if not isinstance(state, dict):
        return f"state.json is a JSON {type(state).__name__}, not a mapping"
    defaults = TrainState().__dict__
    for key, value in state.items():
        if key not in defaults:
            return f"state.json has a field {key!r} no TrainState has"
        kind = type(defaults[key])
        fits = isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
        if not fits or (kind is int and (isinstance(value, bool) or value < 0)):
            return f"state.json's {key} is {value!r}, not a {'non-negative int' if kind is int else kind.__name__}"
    missing = [k for k in ("global_step", "phase_index", "step_in_phase", "data_position") if k not in state]
    return f"state.json lacks {', '.join(missing)}" if missing else None


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint folder `path` cannot be resumed from, or None: its state.json read and typed, the
    safetensors header parsed against the file's size, optimizer.pt's zip members against their CRC-32s."""
    path = Path(path)
    try:
        state = json.loads((path / "state.json").read_bytes())
    except FileNotFoundError:
        return "state.json is missing"
    except (OSError, ValueError) as exc:
        return f"state.json is not JSON ({exc})"
    if problem := state_problem(state):
        return problem
    for name in ("model.safetensors", "optimizer.pt"):
        if not (path / name).is_file():
            return f"{name} is missing"
    try:
        with safe_open(str(path / "model.safetensors"), "pt") as weights:
            weights.keys()
    except Exception as exc:  # safetensors raises its own SafetensorError (and OSError): none is resumable
        return f"model.safetensors cannot be read ({type(exc).__name__}: {exc})"
    try:
        with zipfile.ZipFile(path / "optimizer.pt") as moments:
            bad = moments.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        return f"optimizer.pt cannot be read ({type(exc).__name__}: {exc})"
    return f"optimizer.pt's {bad} fails its CRC-32" if bad else None


def _set_aside(path: Path, problem: str) -> str:
    """Rename a damaged checkpoint folder out of the resumable names (another rank may have done it)."""
    target = path.with_name(DAMAGED_PREFIX + path.name)
    try:
        shutil.rmtree(target, ignore_errors=True)
        path.rename(target)
    except OSError:
        pass
    note = f"checkpoint {path} is damaged ({problem}): set aside as {target.name}"
    print(f"warning: {note}", file=sys.stderr)
    return note


def latest_checkpoint(ckpt_root: Path, check: bool = True) -> Path | None:
    """The checkpoint a run resumes from: LATEST's, else the newest complete step-*, else the newest branch
    point, each checked
    (checkpoint_problem) where `check`: a damaged one is set aside and the next one tried. None: there is none;
    DamagedCheckpoint: there were only damaged ones. `check=False`: the candidate by name alone (a message)."""
    ckpt_root = Path(ckpt_root)
    pointer = ckpt_root / "LATEST"
    named = None
    if pointer.is_file():
        try:
            named = ckpt_root / pointer.read_text().strip()
        except (OSError, ValueError):
            named = None
    # the newest first; then the branch points kept for children, each a complete checkpoint of this run
    complete = [
        *sorted((p for p in ckpt_root.glob("step-*") if (p / "state.json").is_file()), reverse=True),
        *sorted((p for p in ckpt_root.glob(f"{BRANCH_DIR}/step-*") if (p / "state.json").is_file()), reverse=True),
    ]
    candidates = [*([named] if named and named.name.startswith("step-") and named.is_dir() else []), *complete]
    notes = []
    for candidate in dict.fromkeys(candidates):
        if not check:
            return candidate
        problem = checkpoint_problem(candidate)
        if problem is None:
            return candidate
        notes.append(_set_aside(candidate, problem))
    if notes:
        raise DamagedCheckpoint(
            "; ".join(notes)
            + "; no complete checkpoint is left: the run stops here, and the next attempt (run the "
            "sweep again) trains it from step 0"
        )
    return None


class DiskFull(OSError):
    """A checkpoint (or the final model) did not fit: where, how much it needs, what is left, and that the
    half-written folder is gone."""


def _written_dir(final: Path, write: Callable[[Path], None], needed_bytes: int, what: str) -> Path:
    """write(tmp) into .tmp-<name> beside `final`, then publish it atomically. On a full disk the half-written
    folder is removed and DiskFull says where and how much; the previous checkpoint is untouched."""
    tmp = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write(tmp)
        atomic.publish_dir(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        free = shutil.disk_usage(final.parent).free if final.parent.exists() else 0
        raise DiskFull(
            exc.errno,
            f"no space left on the device of {final.parent} writing {what} {final.name}: "
            f"it needs about {_mb(needed_bytes)} and {_mb(free)} is free there; the "
            f"half-written {tmp.name} was removed, and the run resumes from its last "
            "complete checkpoint once there is room (run the sweep again)",
        ) from None
    return final


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def _tensor_bytes(tensors) -> int:
    """Their bytes, each storage once (tied weights are saved once)."""
    storages = {
        t.untyped_storage().data_ptr(): t.numel() * t.element_size()
        for t in tensors
        if isinstance(t, torch.Tensor)
    }
    return sum(storages.values())


def checkpoint_bytes(model, opt: Optimizer) -> int:
    """About what one checkpoint takes on disk: the weights (safetensors) and the AdamW moments."""
    moments = [t for m in opt.state_by_name().values() for t in m.values()]
    return _tensor_bytes(model.state_dict().values()) + _tensor_bytes(moments)


def save_checkpoint(ckpt_root: Path, model, opt: Optimizer, state: TrainState, keep: bool = False) -> Path:
    """The state now, published atomically; older checkpoints go, except those kept for children (`keep`:
    this one is a branch point too, linked under branch/ before LATEST names it, so a kill between the two
    re-trains to this step and links it again)."""

    def write(tmp: Path) -> None:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save({"moments": opt.state_by_name()}, tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps(state.__dict__))

    name = f"step-{state.global_step:09d}-p{state.phase_index}"
    final = _written_dir(Path(ckpt_root) / name, write, checkpoint_bytes(model, opt), "checkpoint")
    if keep:
        _link_dir(final, kept_path(ckpt_root, state.global_step))
    atomic.write_text(ckpt_root / "LATEST", name)
    for old in ckpt_root.glob("step-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


BRANCH_DIR = "branch"  # checkpoints/branch/step-<N>: a parent's checkpoints its children start from


def kept_path(ckpt_root: Path, step: int) -> Path:
    return Path(ckpt_root) / BRANCH_DIR / f"step-{step:09d}"


def kept_checkpoint(ckpt_root: Path, step: int, check: bool = True) -> Path | None:
    """The branch-point checkpoint at global step `step`, when it is complete and (`check`, for a child about
    to start from it) passes its check: a damaged one is set aside and is none (the child trains from step 0).
    `check=False`: published (it is written whole or not at all), for the parent that only says so."""
    path = kept_path(ckpt_root, step)
    if not (path / "state.json").is_file():
        return None
    if not check:
        return path
    problem = checkpoint_problem(path)
    if problem is not None:
        _set_aside(path, problem)
        return None
    return path


def _linked(src: Path, names: list[str]):
    """A writer of src's files `names` into a folder: hard links where the filesystem allows (no second copy
    on disk; neither run ever writes into a published checkpoint), copies elsewhere."""

    def write(tmp: Path) -> None:
        for name in names:
            atomic.link_or_copy(Path(src) / name, tmp / name)

    return write


def _link_dir(src: Path, dst: Path) -> None:
    """dst as a copy of src's files, hard links where the filesystem allows, published atomically."""
    names = [f.name for f in src.iterdir()]
    _written_dir(dst, _linked(src, names), sum((src / n).stat().st_size for n in names), "branch checkpoint")


def adopt_checkpoint(src: Path, ckpt_root: Path) -> Path:
    """Start a run from another run's checkpoint: its weights and moments (linked) and its state, not done (a
    parent may end where the child goes on), published as this run's latest checkpoint."""
    state = json.loads((Path(src) / "state.json").read_text())
    state["done"] = False
    name = f"step-{state['global_step']:09d}-p{state['phase_index']}"
    files = ["model.safetensors", "optimizer.pt"]

    def write(tmp: Path) -> None:
        _linked(src, files)(tmp)
        (tmp / "state.json").write_text(json.dumps(state))

    ckpt_root = Path(ckpt_root)
    _written_dir(ckpt_root / name, write, sum((Path(src) / f).stat().st_size for f in files), "checkpoint")
    atomic.write_text(ckpt_root / "LATEST", name)
    return ckpt_root / name


def load_checkpoint(path: Path, model, opt: Optimizer) -> TrainState:
    """Weights via safetensors and tensors via torch.load(weights_only=True): loading runs no code.

    Both are read to CPU and then copied onto each parameter's device: optimizer.pt remembers the device
    rank 0 saved it from (cuda:0), where every rank of a requeued job would otherwise allocate a context
    and the whole set of moments, and which a machine without that device cannot load at all."""
    load_model(model, str(path / "model.safetensors"), device="cpu")
    moments = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)["moments"]
    opt.load_state_by_name(moments)
    return TrainState(**json.loads((path / "state.json").read_text()))


def save_final_model(model, tokenizer, out: Path) -> None:
    """An ordinary *ForMaskedLM folder (safetensors) that AutoModelForMaskedLM loads directly."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    for p in model.parameters():
        p.requires_grad_(True)
    _written_dir(Path(out), write, _tensor_bytes(model.state_dict().values()), "the final model")

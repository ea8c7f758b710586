"""torch.compile of a run's encoder as it runs: each block compiled on its own, its recompiles counted and
named in the run's log, its compiled code kept across processes.

- One graph per block, not one of the whole encoder: a block's graph is small and the same for every block of
  its kind (ModernBERT: the first block, the global ones, the local ones), so 22 blocks compile about three
  graphs, and a freeze change or a new phase recompiles the blocks it touches, not the encoder. The blocks
  share one compiled code object (nn.Module's call), so dynamo's recompile limit counts every block kind x
  phase x frozen-or-not: `recompile_limit` sets it from the run's phases.
- Compiled only inside the training step (`CompiledEncoder.__call__` swaps the compiled blocks in, runs the
  encoder and swaps them back): the preflight, the phase-end probes and saving run the eager blocks and
  trigger no compile at other shapes.
- A recompile, and the eager fallback dynamo takes past its limit, are named in the run's log (the limit
  never silently turns the compiled run into an eager one).
- The compile cache: torch's portable cache artifacts (the compiled kernels, autotuning results) are loaded
  from `cache_dir` before the first compile and saved there after each step that compiled, so the other arms
  of a sweep and a requeued job start warm. Each save is a new file named by its content's digest (written
  atomically), so concurrent jobs never write the same file; a file whose bytes no longer match its name, or
  that torch declines, is named in the log and removed (load_cache).

May import: models, store.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch

from ablate.models.families import Family
from ablate.store.atomic import write_bytes

Log = Callable[[str], None]
CACHE_SUFFIX = ".torchcache"
CACHE_ENV = "ABLATE_COMPILE_CACHE"  # a compile cache folder shared more widely (e.g. by several sweeps)
_LIMIT_LOGGER = "torch._dynamo.convert_frame"  # dynamo warns there when a code object hits its limit


def blocks(encoder: torch.nn.Module, family: Family) -> list[tuple[str, torch.nn.Module]]:
    """(name inside the encoder, module) of each block, in order: the modules whose parameter names the
    family's `layers` pattern maps to a block index."""
    found = []
    for name, module in encoder.named_modules():
        match = family.layers.match(name + ".")
        if match and match.end() == len(name) + 1:
            found.append((int(match.group(1)), name, module))
    return [(name, module) for _, name, module in sorted(found, key=lambda t: t[0])]


def block_kinds(encoder: torch.nn.Module, family: Family) -> int:
    """How many different graphs the blocks trace: blocks of one class with the same submodule classes and
    the same attention window trace the same graph."""

    def kind(module: torch.nn.Module) -> tuple:
        windows = tuple(getattr(m, "sliding_window", None) for m in module.modules())
        return type(module), tuple(type(m) for m in module.modules()), windows

    return len({kind(m) for _, m in blocks(encoder, family)})


def recompile_limit(encoder: torch.nn.Module, family: Family, phase_keys: set) -> int:
    """Dynamo's recompile limit a run needs: every block kind, in each phase (`phase_keys`: its objective and
    freeze mask), frozen or trained, with an input that needs gradients or not (the first trained block after
    frozen ones has none), with room for one more phase (which also takes the one recompile per kind that may
    follow a process's first call); at least torch's default. Documents add no factor: their count and
    longest length reach the attention as runtime values (ablate.models.varlen), not as shapes or constants."""
    graphs = block_kinds(encoder, family) * 4 * (len(phase_keys) + 1)
    return max(torch._dynamo.config.recompile_limit, graphs)


class CompiledEncoder:
    """The encoder with each block compiled (dynamic=False: a run's micro-batches share one shape), callable
    as the encoder is; the blocks are the encoder's own (same parameters), swapped in for the call."""

    def __init__(
        self,
        encoder: torch.nn.Module,
        family: Family,
        log: Log = print,
        limit: int | None = None,
        compiler: Callable | None = None,
    ):
        self.encoder = encoder
        self.compiler = compiler  # what turns a block's graph into code (None: inductor, as a run does)
        self.eager = blocks(encoder, family)
        self.graphs = 0  # graphs compiled so far (first compiles and recompiles)
        self.fallbacks: list[str] = []
        self.log = log
        if limit is not None:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
        backend = self._counted
        self.compiled = [(name, torch.compile(m, dynamic=False, backend=backend)) for name, m in self.eager]
        self._watch = _FallbackWatch(self)

    def _counted(self, graph: torch.fx.GraphModule, example_inputs):
        """Inductor (or `compiler`), after naming the compile in the run's log (TORCH_LOGS=recompiles says why
        dynamo recompiled: a new block kind, attention pattern or freeze state)."""
        from torch._inductor.compile_fx import compile_fx

        self.graphs += 1
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        grads = sum(t.requires_grad for t in tensors)
        self.log(
            f"torch.compile: encoder block graph {self.graphs} compiled ({grads} of its {len(tensors)} tensor "
            "inputs need gradients)"
        )
        return (self.compiler or compile_fx)(graph, example_inputs)

    def __call__(self, *args, **kwargs):
        watched = logging.getLogger(_LIMIT_LOGGER)
        watched.addHandler(self._watch)
        for name, module in self.compiled:
            self.encoder.set_submodule(name, module)
        try:
            return self.encoder(*args, **kwargs)
        finally:
            for name, module in self.eager:
                self.encoder.set_submodule(name, module)
            watched.removeHandler(self._watch)


class _FallbackWatch(logging.Handler):
    """Dynamo's warning that a code object hit its recompile limit (it then runs eager), into the run's
    log."""

    def __init__(self, owner: CompiledEncoder):
        super().__init__(logging.WARNING)
        self.owner = owner

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "recompile_limit" in message or "cache_size_limit" in message:
            first = re.sub(r"\s+", " ", message.splitlines()[0])
            self.owner.fallbacks.append(first)
            self.owner.log(f"torch.compile fell back to eager: {first} (see ablate.train.compiled)")


def cache_dir(run_dir: Path) -> Path:
    """Where a run keeps its compile cache: $ABLATE_COMPILE_CACHE, else its sweep's `compile-cache/` (shared by
    the sweep's arms; results/<sweep>/runs/<id>), else the run folder's own."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen)
    run_dir = Path(run_dir)
    return (run_dir.parent.parent if run_dir.parent.name == "runs" else run_dir) / "compile-cache"


def load_cache(cache_dir: Path | None, log: Log = print) -> int:
    """Load every saved artifact file of `cache_dir` into torch's compile caches; how many loaded. A file is
    checked before torch reads it (its name is the digest of its bytes: a cut or altered file fails) and after
    (torch declines a file from another torch, or one it cannot parse, by returning None): one that fails is
    named in the log and removed, and its kernels are compiled again (and saved anew)."""
    if cache_dir is None or not Path(cache_dir).is_dir():
        return 0
    loaded = 0
    for path in sorted(Path(cache_dir).glob(f"*{CACHE_SUFFIX}")):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # removed by a concurrent job since the listing
            continue
        if _digest(data) != path.name.removesuffix(CACHE_SUFFIX):
            why = "its bytes do not match the digest it was saved under (cut or altered)"
        else:
            try:
                why = None if torch.compiler.load_cache_artifacts(data) is not None else "torch declined it"
            except Exception as error:  # torch raises on some damage instead of declining
                why = f"{type(error).__name__}: {error}"
        if why is None:
            loaded += 1
            continue
        log(f"torch.compile cache: skipped and removed {path} ({why}); its kernels compile again")
        path.unlink(missing_ok=True)
    return loaded


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def save_cache(cache_dir: Path | None, replaces: Path | None = None) -> Path | None:
    """Save what this process has compiled into `cache_dir` (a new file named by its digest), removing
    `replaces` (this process's previous save, which the new one contains); None when there is nothing."""
    if cache_dir is None:
        return None
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    data, _info = saved
    path = Path(cache_dir) / f"{_digest(data)}{CACHE_SUFFIX}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, data)
    if replaces is not None and replaces != path:
        replaces.unlink(missing_ok=True)
    return path

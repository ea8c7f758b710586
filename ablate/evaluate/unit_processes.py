"""Several (task, seed) units fine-tuned at once, each in a process of its own: the units of a task share a
device k at a time when the caller's placement says k fit (launch.shares reads k from `eval.units_per_gpu`
and each task's predicted memory), units of several tasks share it by the same account (a unit of a task
whose k is 4 takes a quarter of the device), and on a process with several GPUs the units spread over them.

Each unit is a spawned process (CUDA cannot be forked) that runs the caller's `compute` (evaluate.score_files.
compute_unit), which writes the unit's score file itself, atomically, as one process does; so a resumed run
reads back what is done, whichever process did it. A unit's scores do not depend on what runs beside it: on
the CPU bit for bit, the child computing with this process's torch threads, deterministic-algorithms switch
and float32 matmul precision. Its log lines come back here prefixed with the unit, its progress reports as
they are; this process waits on the children's pipes (no polling, no threads).

An out-of-memory in a unit that shared its device is said in the log, naming the unit, its device and the
units beside it, and the unit runs again alone once the others are done; one that ran out of memory alone is
the run's failure (torch.OutOfMemoryError naming the unit: launch.oom says it with the task's predicted
peak). Any other failure starts no new unit, lets the running ones finish (their scores are kept) and is
raised here with the child's traceback as a note. A child whose parent died ends at its next progress report
(its pipe is closed). ABLATE_OOM_UNIT=TASK:SEED makes that unit's first process raise an out-of-memory before
it fine-tunes: how the tests exercise the retry (its retry alone runs normally).

May import: config.faults, train (precision).
"""

from __future__ import annotations

import multiprocessing
import pickle
import traceback
from dataclasses import dataclass, field
from fractions import Fraction
from multiprocessing.connection import Connection, wait
from typing import Callable, Mapping

import torch

from ablate.config.faults import OOM_UNIT, oom_unit


@dataclass(frozen=True)
class Placement:
    """Where units run and how many at once: `devices`, each GPU this process may use (or the CPU);
    `at_once`, task -> how many of its units fit one device together (a task not named: 1, alone)."""

    devices: tuple[str, ...]
    at_once: Mapping[str, int] = field(default_factory=dict)

    def share(self, task: str) -> Fraction:
        """The part of a device one unit of `task` takes."""
        return Fraction(1, self.at_once.get(task, 1))

    def one_at_a_time(self, units: int) -> bool:
        """Whether `units` units would run one after another anyway (then no process is worth spawning)."""
        return units <= 1 or (len(self.devices) == 1 and all(k == 1 for k in self.at_once.values()))

    def describe(self) -> str:
        at_once = ", ".join(f"{task} {k}" for task, k in self.at_once.items())
        return f"on {', '.join(self.devices)}" + (f", at once per device: {at_once}" if at_once else "")


def fitting_device(load: Mapping[str, Fraction], share: Fraction) -> str | None:
    """The least loaded device (the first of equals) with room for a unit taking `share` of it; None: none."""
    fits = [device for device, taken in load.items() if taken + share <= 1]
    return min(fits, key=lambda device: load[device]) if fits else None


@dataclass
class _Child:
    index: int  # the unit's position in the units run
    device: str
    share: Fraction
    process: multiprocessing.process.BaseProcess
    alone: bool  # a retry after an out-of-memory beside others


def run_units(
    units: list,
    compute: Callable[..., list[dict]],
    placement: Placement,
    log: Callable[[str], None],
    progress: Callable[[dict], None] | None = None,
) -> list[list[dict]]:
    """Each unit's rows, in the order of `units` (each has `name`, `task.name` and `seed`), computed by
    compute(unit, device=, log=, progress=) in processes of their own, as many at once as `placement` allows."""
    return _Pool(units, compute, placement, log, progress).run()


class _Pool:
    def __init__(self, units, compute, placement: Placement, log, progress):
        self.units, self.compute, self.placement = units, compute, placement
        self.log, self.progress = log, progress
        self.waiting: list[int] = list(range(len(units)))
        self.retry: list[int] = []  # out of memory beside others: again alone, once the others are done
        self.alone = False  # the retries' turn
        self.running: dict[Connection, _Child] = {}
        self.load = {device: Fraction(0) for device in placement.devices}
        self.beside: dict[int, set[int]] = {i: set() for i in range(len(units))}
        self.rows: dict[int, list[dict]] = {}
        self.failure: BaseException | None = None
        self.context = multiprocessing.get_context("spawn")
        self.state = _torch_state()

    def run(self) -> list[list[dict]]:
        self.log(f"fine-tuning {len(self.units)} units, each in a process of its own, {self.placement.describe()}")
        if any(d.startswith("cuda") for d in self.placement.devices) and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # what pretraining left cached in this process goes to the units
        try:
            while self.waiting or self.retry or self.running:
                if not self.waiting and not self.running:
                    self.waiting, self.retry, self.alone = self.retry, [], True
                if self.failure is None:
                    self._start_what_fits()
                if not self.running:
                    break  # a failure, and nothing left running
                for conn in wait(list(self.running)):
                    self._receive(conn)
        finally:
            for conn, child in self.running.items():  # interrupted: the units still running go too
                child.process.terminate()
                child.process.join()
                conn.close()
        if self.failure is not None:
            raise self.failure
        return [self.rows[i] for i in range(len(self.units))]

    def _start_what_fits(self) -> None:
        """Start each waiting unit, in order, on the least loaded device it fits (a later, smaller unit may
        start while an earlier one waits for room)."""
        for index in list(self.waiting):
            share = Fraction(1) if self.alone else self.placement.share(self.units[index].task.name)
            device = fitting_device(self.load, share)
            if device is not None:
                self.waiting.remove(index)
                self._start(index, device, share)

    def _start(self, index: int, device: str, share: Fraction) -> None:
        others = [c.index for c in self.running.values() if c.device == device]
        for other in others:
            self.beside[other].add(index)
            self.beside[index].add(other)
        receiving, sending = self.context.Pipe(duplex=False)
        unit = self.units[index]
        process = self.context.Process(
            target=_child,
            args=(sending, unit, self.compute, device, self.state, not self.alone),
            name=f"ablate fine-tuning {unit.name}",
            daemon=True,
        )
        process.start()
        sending.close()  # the child holds the only sending end: its exit is the pipe's end
        self.running[receiving] = _Child(index, device, share, process, self.alone)
        self.load[device] += share
        names = ", ".join(self.units[i].name for i in others)
        self.log(
            f"{unit.name}: started on {device}" + (f" beside {names}" if names else "") + (" (alone)" * self.alone)
        )

    def _receive(self, conn: Connection) -> None:
        child = self.running[conn]
        unit = self.units[child.index]
        try:
            kind, payload = conn.recv()
        except EOFError:
            kind, payload = "ended", None
        if kind == "log":
            self.log(f"{unit.name}: {payload}")
            return
        if kind == "progress":
            if self.progress is not None:
                self.progress(payload)
            return
        del self.running[conn]
        conn.close()
        child.process.join()
        self.load[child.device] -= child.share
        if kind == "done":
            self.rows[child.index] = payload
        elif kind == "oom":
            self._out_of_memory(child, payload)
        elif kind == "error":
            exc, trace = payload
            exc.add_note(f"in the process that fine-tuned {unit.name} on {child.device}:\n{trace}")
            self._fail(exc, unit)
        else:
            code = child.process.exitcode
            self._fail(
                RuntimeError(f"the process fine-tuning {unit.name} ended without a result (exit code {code})"),
                unit,
            )

    def _out_of_memory(self, child: _Child, message: str) -> None:
        unit = self.units[child.index]
        beside = sorted(self.beside[child.index])
        if beside and not child.alone:
            names = ", ".join(self.units[i].name for i in beside)
            self.log(
                f"{unit.name}: out of GPU memory on {child.device} beside {names}; it runs again alone once the "
                f"others are done ({message.splitlines()[0] if message else 'no message'})"
            )
            self.retry.append(child.index)
            return
        exc = torch.OutOfMemoryError(f"{unit.name} ran out of GPU memory alone on {child.device}: {message}")
        exc.finetune_unit = {"task": unit.task.name, "seed": unit.seed}  # launch.oom names it
        self._fail(exc, unit)

    def _fail(self, exc: BaseException, unit) -> None:
        self.log(
            f"{unit.name}: failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "no new fine-tuning starts, the running ones finish"
        )
        if self.failure is None:
            self.failure = exc


def _torch_state() -> tuple[int, bool, str]:
    """What a child computes with, as this process does: torch's threads, the deterministic-algorithms switch,
    the float32 matmul precision (a child starts from torch's defaults otherwise)."""
    return (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_float32_matmul_precision(),
    )


def _child(conn: Connection, unit, compute, device: str, state: tuple, first_try: bool) -> None:
    """A unit's process: computes it, and says what came of it on `conn` (its log lines and progress first)."""
    try:
        _take_state(state, device)
        if first_try and oom_unit() == (unit.task.name, unit.seed):
            raise torch.OutOfMemoryError(f"CUDA out of memory ({OOM_UNIT}: injected)")
        rows = compute(
            unit,
            device=device,
            log=lambda message: conn.send(("log", message)),
            progress=lambda report: conn.send(("progress", report)),
        )
        conn.send(("done", rows))
    except torch.OutOfMemoryError as exc:
        conn.send(("oom", str(exc)))
    except BaseException as exc:  # noqa: BLE001  (said to the parent, which raises it)
        conn.send(("error", (_picklable(exc), traceback.format_exc())))
    finally:
        conn.close()


def _take_state(state: tuple, device: str) -> None:
    from ablate.train.precision import set_determinism

    threads, deterministic, matmul = state
    torch.set_num_threads(threads)
    set_determinism(deterministic)
    torch.set_float32_matmul_precision(matmul)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # the device of whatever the loop leaves implicit


def _picklable(exc: BaseException) -> BaseException:
    """`exc` if it travels through a pipe and back, else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")

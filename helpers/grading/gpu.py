"""The GPU's turns: the grader, not the submissions, decides who uses the GPU when.

The grader grades notebooks in parallel, on one GPU. Work that is only checked (a cell, a
correctness collection) shares the GPU; a *timing* must have it alone, or two
submissions timed at once would each see half the bandwidth and one could starve
another. So the grader takes a turn around everything it sends a submission's processes
in GPU mode:

* :func:`shared` for untimed work: any number at once, but none while a timing runs;
* :func:`alone` for a timed collection: it waits for the shared turns in progress to
  end (new ones wait behind it) and runs with nothing else on the GPU.

The turns are file locks in the grader's own temporary folder (which no sandbox sees), so
they hold across the grader's threads and across several graders on one machine. Both
wait at most ``timeout`` seconds and raise :class:`GpuBusy` past it: a submission whose
cells keep the GPU busy cannot hold a timing up for longer than that.

:class:`gpu_lock`, the older lock a notebook's own ``check_*`` calls take around their
timings, still serialises timings made in one notebook process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path

POLL = 0.02


class GpuBusy(TimeoutError):
    """The GPU did not come free within the time the grader waits for it."""


def _folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"course-grading-gpu-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _take(path: Path, mode: int, deadline: float):
    f = open(path, "a+")  # noqa: SIM115 - held until the turn ends
    while True:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise GpuBusy(f"the GPU stayed busy past the {deadline:.0f} s the grader "
                              "waits") from None
            time.sleep(POLL)


@contextlib.contextmanager
def shared(timeout: float):
    """A turn beside other untimed work; none while a timing has the GPU."""
    deadline = time.monotonic() + timeout
    folder = _folder()
    gate = _take(folder / "gate", fcntl.LOCK_EX, deadline)   # a timing waiting holds it
    gate.close()
    turn = _take(folder / "turn", fcntl.LOCK_SH, deadline)
    try:
        yield
    finally:
        turn.close()


@contextlib.contextmanager
def alone(timeout: float):
    """The GPU alone: new shared turns wait at the gate, those in progress end first."""
    deadline = time.monotonic() + timeout
    folder = _folder()
    gate = _take(folder / "gate", fcntl.LOCK_EX, deadline)
    try:
        turn = _take(folder / "turn", fcntl.LOCK_EX, deadline)
    except GpuBusy:
        gate.close()
        raise
    try:
        yield
    finally:
        turn.close()
        gate.close()


def cell_turn(mode: str, limits):
    """A shared turn for one of a notebook's cells in GPU mode; nothing in CPU mode."""
    if mode != "gpu":
        return contextlib.nullcontext()
    return shared(limits.cell_timeout + limits.part_timeout)


class gpu_lock:  # noqa: N801 - used as a context manager, like a function
    """``with gpu_lock(): ...`` runs the block alone among this machine's users of the
    same lock file (in one process's view of /tmp)."""

    def __enter__(self):
        self._f = open(Path(tempfile.gettempdir()) / "course-grading-gpu.lock", "w")  # noqa: SIM115
        fcntl.flock(self._f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self._f, fcntl.LOCK_UN)
        self._f.close()

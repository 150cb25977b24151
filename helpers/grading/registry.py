"""The graded parts of every assignment, and how one part is checked.

An assignment is the list of its parts. A part has points, the names it reads from the
learner's notebook (``add_bytes``, ``vector_add``, ...) and a check: a function from the
notebook's globals to a :class:`~helpers.feedback.Feedback`. The same check serves twice:

* in the notebook, a ``check_*`` call runs it on the learner's globals and prints the
  verdict at once;
* in the grader, it runs inside the submission's own kernel process, after the notebook
  has executed, on the very names the learner defined (:func:`grade_to_file`).

So the learner and the gradebook can never disagree. Adding an assignment: write a module
with its checks and an :class:`Assignment`, and list it in :data:`MODULES`.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from ..feedback import Feedback, needs_gpu, not_implemented

# The assignment name is the notebook's file name without ``.ipynb``.
MODULES = {
    "03_vector_add_intensity": "helpers.grading.vector_add",
    "04_tiling": "helpers.grading.tiling",
    "05_fusion": "helpers.grading.fusion",
}


@dataclass(frozen=True)
class Part:
    key: str                                   # "1a", "3b": how reports refer to it
    title: str
    points: float
    check: Callable[[dict], Feedback]
    names: tuple[str, ...] = ()                # notebook names the check reads
    gpu: bool = False                          # graded only in GPU mode
    group: str = ""                            # parts that share one (possibly slow) run

    @property
    def label(self) -> str:
        return f"{self.key} {self.title}"


@dataclass(frozen=True)
class Assignment:
    name: str
    title: str
    parts: tuple[Part, ...]

    def part(self, key: str) -> Part:
        for p in self.parts:
            if p.key == key:
                return p
        raise KeyError(f"{self.name} has no part {key!r}; parts: {[p.key for p in self.parts]}")

    @property
    def max_points(self) -> float:
        return sum(p.points for p in self.parts)

    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for p in self.parts for n in p.names))


def get(name: str) -> Assignment:
    """The assignment called ``name`` (e.g. ``"03_vector_add_intensity"``)."""
    if name not in MODULES:
        raise KeyError(f"no graded assignment {name!r}; known: {', '.join(sorted(MODULES))}")
    return importlib.import_module(MODULES[name]).ASSIGNMENT


# ------------------------------------------------------------------------------------
# Reading answers out of a notebook's globals.
# ------------------------------------------------------------------------------------


class MissingAnswer(LookupError):
    """A graded name is not defined in the notebook (never run, renamed or deleted)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def answer(namespace: dict, name: str, *, callable_: bool = False):
    """``namespace[name]``, or :class:`MissingAnswer` if the learner has not defined it."""
    if name not in namespace:
        raise MissingAnswer(name)
    value = namespace[name]
    if callable_ and not callable(value):
        raise TypeError(f"`{name}` should be a function, but it is {type(value).__name__} "
                        f"{value!r:.60}")
    return value


def is_not_implemented(err: BaseException) -> bool:
    """True if ``err`` is (or was caused by) a stub's ``raise NotImplementedError``.

    Triton's interpreter wraps an exception raised inside a kernel in its own error
    (``InterpreterError(repr(e))``), so the message is searched too.
    """
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, NotImplementedError) or "NotImplementedError" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def evaluate(part: Part, namespace: dict) -> tuple[Feedback, list[str]]:
    """Run one part's check; never raises (but lets KeyboardInterrupt through).

    Returns the feedback and the graded names that were missing.
    """
    from .. import runtime

    if part.gpu and not runtime.is_gpu():
        return needs_gpu(part.label), []
    try:
        return part.check(namespace), []
    except MissingAnswer as missing:
        return Feedback(part.label, False,
                        f"`{missing.name}` is not defined: run the cell that defines it (the "
                        f"grader looks for this exact name)", status="not implemented"), \
            [missing.name]
    except Exception as err:  # noqa: BLE001 - a check must report, never crash
        if is_not_implemented(err):
            return not_implemented(part.label), []
        return Feedback(part.label, False, f"could not be checked: {type(err).__name__}: "
                        f"{err}", status="error"), []


class Results(list):
    """Feedback lines of one ``check_*`` call, with the points they are worth."""

    def __init__(self, rows: list[tuple[Part, Feedback]]):
        super().__init__(fb for _, fb in rows)
        self.rows = rows

    @property
    def points(self) -> float:
        return sum(p.points for p, fb in self.rows if fb.passed)

    @property
    def max_points(self) -> float:
        return sum(p.points for p, fb in self.rows if fb.status != "needs a GPU")

    def __repr__(self) -> str:
        lines = [str(fb) for fb in self]
        lines.append(f"{_num(self.points)} / {_num(self.max_points)} points"
                     + (" (parts marked … are graded on a GPU)"
                        if any(fb.status == "needs a GPU" for fb in self) else ""))
        return "\n".join(lines)

    __str__ = __repr__


def _num(x: float) -> str:
    return f"{x:g}"


def caller_namespace(namespace: dict | None) -> dict:
    """The globals of the notebook that called a ``check_*`` function (two frames up).

    ``check_kernel()`` with no argument checks the names the learner's notebook defined.
    """
    return namespace if namespace is not None else sys._getframe(2).f_globals


def run_checks(assignment: Assignment, keys, namespace: dict) -> Results:
    """Check the parts ``keys`` of ``assignment`` on ``namespace`` (for ``check_*`` calls)."""
    return Results([(p, evaluate(p, namespace)[0]) for p in map(assignment.part, keys)])


# ------------------------------------------------------------------------------------
# Inside the grader's kernel: check one part, write the verdict to a file.
# ------------------------------------------------------------------------------------


def grade_to_file(assignment_name: str, key: str, namespace: dict, path: str) -> None:
    """Check part ``key`` on ``namespace`` and write the outcome as JSON to ``path``.

    The grader runs this in the submission's kernel. It writes a file rather than
    printing, so nothing the learner did to ``print`` or ``sys.stdout`` can garble it.
    """
    start = time.perf_counter()
    try:
        part = get(assignment_name).part(key)
        feedback, missing = evaluate(part, namespace)
        out = {"passed": feedback.passed, "status": feedback.status,
               "message": feedback.message, "missing": missing}
    except Exception as err:  # noqa: BLE001 - the grader's own failure, reported as such
        out = {"passed": False, "status": "error", "missing": [],
               "message": f"the grader failed on this part: {type(err).__name__}: {err}",
               "traceback": traceback.format_exc()}
    out["seconds"] = round(time.perf_counter() - start, 3)
    with open(path, "w") as f:
        json.dump(out, f)
    sys.stdout.flush()

"""The graded parts of every assignment; collecting a notebook's answers; judging them.

An assignment is the list of its parts. A part has points, the names it reads from the
learner's notebook (``add_bytes``, ``vector_add``, ...) and two halves:

* **collect** runs where the learner's code is: it reads the plain values of the part's
  names (numbers, words, sets of words), or, for a graded function, runs it on inputs
  made from a seed it is handed and records what happened (:mod:`.harness`). It returns
  *raw results* and decides nothing.
* **judge** turns raw results into a :class:`~helpers.feedback.Feedback`. In the notebook
  (``check_*`` calls) both halves run right there, for immediate feedback. When grading,
  collection runs in a clean process that imported the course first and then only the
  notebook's definitions (:mod:`.clean_run`), on a seed drawn for each collection after
  the notebook has run, and the grader judges the raw results in its own process, which
  the notebook cannot reach: nothing a notebook patches, shadows or imports decides its
  own verdict.

Assignments are found, not listed: every module of :mod:`helpers.grading.assignments`
defines ``ASSIGNMENT``, named after the notebook it grades (``03_vector_add_intensity``).
"""

from __future__ import annotations

import importlib
import os
import io
import math
import pkgutil
import sys
from dataclasses import dataclass
from typing import Callable

from .. import runtime
from ..feedback import Feedback, needs_gpu, not_implemented


@dataclass(frozen=True)
class Part:
    key: str                                   # "1a", "3b": how reports refer to it
    title: str
    points: float
    judge: Callable[[dict], Feedback]          # raw results -> verdict (any process)
    names: tuple[str, ...] = ()                # notebook names it reads
    gpu: bool = False                          # graded only in GPU mode
    group: str = ""                            # parts that share one collection
    # (namespace, seed) -> raw results, in the learner's process. None: the plain values
    # of ``names`` (napkin math).
    collect: Callable[[dict, int], dict] | None = None
    after: str = ""                            # a group whose parts must all pass first

    @property
    def label(self) -> str:
        return f"{self.key} {self.title}"

    @property
    def unit(self) -> str:
        """The key of the collection this part's raw results come from."""
        return self.group or self.key


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

    def unit(self, key: str) -> list[Part]:
        """The parts collected together under ``key`` (a group, or a lone part's key)."""
        return [p for p in self.parts if p.unit == key]

    @property
    def max_points(self) -> float:
        return sum(p.points for p in self.parts)

    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for p in self.parts for n in p.names))


# ------------------------------------------------------------------------------------
# Finding the assignments.
# ------------------------------------------------------------------------------------

_found: dict[str, str] = {}


def modules() -> dict[str, str]:
    """``{assignment name: module}`` for every module of :mod:`helpers.grading.assignments`."""
    if not _found:
        from . import assignments

        for info in sorted(pkgutil.iter_modules(assignments.__path__), key=lambda i: i.name):
            module = f"{assignments.__name__}.{info.name}"
            spec = getattr(importlib.import_module(module), "ASSIGNMENT", None)
            if isinstance(spec, Assignment):
                _found[spec.name] = module
    return dict(_found)


def __getattr__(name: str):
    if name == "MODULES":    # found on first use: the assignment modules import this one
        return modules()
    raise AttributeError(name)


def get(name: str) -> Assignment:
    """The assignment called ``name`` (e.g. ``"03_vector_add_intensity"``)."""
    found = modules()
    if name not in found:
        raise KeyError(f"no graded assignment {name!r}; known: {', '.join(sorted(found))}")
    return importlib.import_module(found[name]).ASSIGNMENT


# ------------------------------------------------------------------------------------
# Collecting: the plain values of a notebook's answers.
# ------------------------------------------------------------------------------------


class MissingAnswer(LookupError):
    """A graded name is not defined in the notebook (never run, renamed or deleted)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


@dataclass(frozen=True)
class Opaque:
    """An answer that is not a plain value (a function, an array, ...): its type and look."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return self.text


def plain(value):
    """``value`` as data a check can read without running any of the learner's code.

    Numbers become ``int``/``float`` (NumPy and torch scalars too), words stay words, a
    set, list or tuple of words becomes a ``set``; anything else an :class:`Opaque`.
    """
    if value is None or value is Ellipsis or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value):
        return {str(v) for v in value}
    if hasattr(value, "__float__") and getattr(value, "ndim", 0) == 0 \
            and not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except Exception:  # noqa: BLE001 - a strange object: shown as it is
            pass
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = object.__repr__(value)
    return Opaque(type(value).__name__, text[:80])


def collect_answers(names, namespace: dict) -> dict:
    """``{name: plain value}`` of the names the notebook defines (missing ones left out)."""
    return {name: plain(namespace[name]) for name in names if name in namespace}


def answer(values: dict, name: str):
    """``values[name]``, or :class:`MissingAnswer` if the learner has not defined it."""
    if name not in values:
        raise MissingAnswer(name)
    return values[name]


ANSWERS = "answers"     # the key that collects every napkin-math answer at once
SEED = "__seed__"       # set by whoever drew the seed (never by the learner's process)


def collect(assignment: Assignment, key: str, namespace: dict, seed: int):
    """The raw results of the parts collected under ``key``, from ``namespace``."""
    if key == ANSWERS:
        return collect_answers(dict.fromkeys(n for p in assignment.parts if p.collect is None
                                             for n in p.names), namespace)
    parts = assignment.unit(key)
    collector = next((p.collect for p in parts if p.collect is not None), None)
    if collector is not None:
        return collector(namespace, seed)
    return collect_answers(dict.fromkeys(n for p in parts for n in p.names), namespace)


# ------------------------------------------------------------------------------------
# Judging.
# ------------------------------------------------------------------------------------


def call_on_draws(ns: dict, name: str, calls, plain) -> dict:
    """In the learner's process: the notebook's function ``name`` on each argument tuple of
    ``calls`` (drawn from the grader's seed), each result made plain data by ``plain``, an
    exception recorded as text; ``{"missing": name}`` or ``{"not_implemented": True}`` when
    it is not defined or still a stub."""
    try:
        fn, out = answer(ns, name), {}
    except MissingAnswer:               # judged "not defined"
        return {"missing": name}
    for i, args in enumerate(calls):
        try:
            out[i] = plain(fn(*args))
        except Exception as err:  # noqa: BLE001 - the learner's error, reported
            if is_not_implemented(err):
                return {"not_implemented": True}
            out[i] = f"raised {type(err).__name__}: {str(err)[:200]}"
    return {"values": out}


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


def judge(part: Part, raw) -> tuple[Feedback, list[str]]:
    """One part's verdict on its raw results; never raises (but lets KeyboardInterrupt by).

    Returns the feedback and the graded names that were missing.
    """
    if part.gpu and not runtime.is_gpu():
        return needs_gpu(part.label), []
    try:
        return part.judge(raw), []
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
        return sum(p.points for p, fb in self.rows if fb.status not in WAITING)

    def __repr__(self) -> str:
        lines = [str(fb) for fb in self]
        lines.append(f"{self.points:g} / {self.max_points:g} points"
                     + (" (parts marked … are graded on a GPU)"
                        if any(fb.status == "needs a GPU" for fb in self) else ""))
        return "\n".join(lines)

    __str__ = __repr__


def caller_namespace(namespace: dict | None) -> dict:
    """The globals of the notebook that called a ``check_*`` function (two frames up).

    ``check_kernel()`` with no argument checks the names the learner's notebook defined.
    """
    return namespace if namespace is not None else sys._getframe(2).f_globals


def check_function(assignment: Assignment, keys: tuple[str, ...], doc: str):
    """The ``check_*`` function a notebook calls for the parts ``keys``: with no argument it
    checks the names the learner's notebook defined, and prints one line per part."""
    def check(namespace: dict | None = None) -> Results:
        if os.environ.get("COURSE_GRADING") == "1":
            # The grader runs the notebook for its cells' report and checks every part
            # itself, in a clean process: a check here would only repeat that work.
            print("check skipped: the grader runs this notebook and checks every part itself")
            return Results([])
        return run_checks(assignment, keys, caller_namespace(namespace))

    check.__doc__ = doc
    return check


NOTEBOOK_SEED = 0   # in the notebook the inputs are the same on every call
# Verdicts this machine cannot give: they cost no points and block nothing.
WAITING = ("needs a GPU", "not checked here")


def run_checks(assignment: Assignment, keys, namespace: dict) -> Results:
    """Collect and judge the parts ``keys`` of ``assignment`` (for ``check_*`` calls).

    A part that must wait for a group (``after``) gets that group's verdicts first.
    """
    wanted = [assignment.part(k) for k in keys]
    raws: dict[str, object] = {}
    verdicts: dict[str, Feedback] = {}

    def verdict(part: Part) -> Feedback:
        if part.key not in verdicts:
            blocked = _blocked(assignment, part, verdict)
            if blocked is not None:
                verdicts[part.key] = blocked
            else:
                if part.unit not in raws and not (part.gpu and not runtime.is_gpu()):
                    raws[part.unit] = collect(assignment, part.unit, namespace, NOTEBOOK_SEED)
                    if isinstance(raws[part.unit], dict):
                        raws[part.unit][SEED] = NOTEBOOK_SEED
                verdicts[part.key] = judge(part, raws.get(part.unit))[0]
        return verdicts[part.key]

    return Results([(p, verdict(p)) for p in wanted])


def _blocked(assignment: Assignment, part: Part, verdict) -> Feedback | None:
    """A failed verdict for ``part`` if the group it waits for did not pass, else None."""
    if not part.after or (part.gpu and not runtime.is_gpu()):
        return None
    first = assignment.unit(part.after)
    failed = [p for p in first if not verdict(p).passed and verdict(p).status not in WAITING]
    if not failed:
        return None
    if all(verdict(p).status == "not implemented" for p in failed):
        return not_implemented(part.label)
    keys = ", ".join(p.key for p in first)
    return Feedback(part.label, False, f"needs a correct, in-bounds kernel first (parts {keys})")


# ------------------------------------------------------------------------------------
# Between the clean collection process and the grader: raw results as bytes.
# ------------------------------------------------------------------------------------

MAX_RAW_BYTES = 128 << 20   # raw results larger than this are refused (a battery is ~50 MB)


def _encode(obj):
    """Raw results in the few types that ``torch.load(weights_only=True)`` accepts."""
    if isinstance(obj, (set, frozenset)):
        return {"__set__": sorted(map(str, obj))}
    if isinstance(obj, Opaque):
        return {"__opaque__": obj.type_name, "text": obj.text}
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if obj is Ellipsis:
        return {"__ellipsis__": True}
    return obj


encode = _encode     # the clean collection process writes raw results with it


def _decode(obj):
    if isinstance(obj, dict):
        if set(obj) == {"__set__"}:
            return set(obj["__set__"])
        if set(obj) == {"__opaque__", "text"}:
            return Opaque(str(obj["__opaque__"]), str(obj["text"]))
        if set(obj) == {"__ellipsis__"}:
            return Ellipsis
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


class UnreadableResults(ValueError):
    """Raw results too large or not what the grader's collector wrote."""


decode = _decode     # ... and the grader reads them back


def read_data(data: bytes):
    """Bytes a collection process wrote with ``torch.save``, read as data only
    (``weights_only=True``: numbers, words, lists, dicts and tensors; no code runs)."""
    import torch

    if len(data) > MAX_RAW_BYTES:
        raise UnreadableResults(f"the results are larger than {MAX_RAW_BYTES >> 20} MiB")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - anything but our own data
        raise UnreadableResults(f"the results could not be read as data "
                                f"({type(err).__name__})") from None


def read_bytes(data: bytes) -> dict:
    """Raw results from their bytes, read as data only (:func:`read_data`)."""
    data = read_data(data)
    if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
        raise UnreadableResults("the results file is not one the grader wrote")
    if data["ok"]:
        try:
            data["raw"] = _decode(data.get("raw"))
        except RecursionError:
            raise UnreadableResults("the results are nested deeper than the grader ever "
                                    "writes them") from None
    return data


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

"""Hidden checks: graded parts an instructor keeps outside the course, added at grading time.

    ./course grade submissions/ --extra-checks ~/hidden/hidden_03.py

A checks module is a Python file, kept anywhere but in the course (and not in a folder a
sandboxed kernel sees: ``/usr``, ``/etc``, ``/opt`` or the Python environment). It names
the assignment it extends and its parts, written exactly as an assignment module writes
its own (:class:`~helpers.grading.registry.Part`: key, title, points, judge, the names it
reads, and for a graded function a ``collect`` run in the learner's process)::

    from helpers.feedback import Feedback
    from helpers.grading.registry import Part, answer

    EXTENDS = "03_vector_add_intensity"

    def _collect(ns, seed):              # in the clean collection process
        ...                              # run answer(ns, "vector_add") on inputs from seed
        return {"out": ...}

    def _judge(raw):                     # in the grader's judge process
        return Feedback("H1 odd sizes", ok, "what is wrong, never the expected value")

    PARTS = (Part("H1", "odd sizes", 2, _judge, ("vector_add",), collect=_collect,
                  group="hidden"),)

Its parts are graded after the assignment's own, and reported like them:
points, status and message in the table, the JSON report, the learner's Markdown feedback and
a gradebook column each. Their keys must differ from the assignment's. A part may wait for
a group of the assignment (``after="kernel"``), be graded only on a GPU (``gpu=True``) or
share a group's collection with another hidden part; a graded kernel is held to the same rule
as the built-in ones (it must launch a kernel of the notebook's own).

Where it runs: the module is imported here, in the grader's process, and again in each
submission's judge process (:mod:`.judging`), where its judges run with the part's limits.
For collection its *source* is sent to a clean collection process of its own
(:mod:`.clean_run`: the notebook's definitions, never its cells) only after the definitions
have run, and executed there in memory: it is never written into the sandbox, so no cell
and no definition can read it. (The learner's functions run while it collects and could
see it in memory, but a sandboxed process has no way out: no network, and its scratch
folder is deleted.)
Without the sandbox (``--no-sandbox``) a notebook can read any file this user can, hidden
checks included.
"""

from __future__ import annotations

import secrets
import sys
import types
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from . import judging, parts, registry, static
from .report import (
    ERROR,
    FAILED,
    NEEDS_GPU,
    NOT_IMPLEMENTED,
    PASSED,
    UNCHECKED,
    PartResult,
)


class ChecksError(ValueError):
    """A checks module that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Checks:
    path: str                    # where the instructor keeps it (for messages)
    source: str
    extends: str                 # the assignment's name
    parts: tuple[registry.Part, ...]

    def merged(self, spec: registry.Assignment) -> registry.Assignment:
        """The assignment with these parts after its own."""
        return registry.Assignment(spec.name, spec.title, spec.parts + self.parts)


def from_source(source: str, filename: str) -> Checks:
    """A checks module from its source text, executed in a fresh module (never imported by
    name, so two instructors' files cannot clash and nothing lands on ``sys.path``)."""
    module = types.ModuleType(f"course_hidden_checks_{secrets.token_hex(4)}")
    module.__file__ = filename
    sys.modules[module.__name__] = module      # for dataclasses and pickling inside it
    try:
        exec(compile(source, filename, "exec"), module.__dict__)   # noqa: S102 - the instructor's
    finally:
        sys.modules.pop(module.__name__, None)
    extends = getattr(module, "EXTENDS", None)
    found = getattr(module, "PARTS", None)
    if not isinstance(extends, str):
        raise ChecksError(f"{filename}: set EXTENDS to the assignment these checks add to "
                          f"(one of {sorted(registry.MODULES)})")
    if not isinstance(found, (list, tuple)) or not found or \
            not all(isinstance(p, registry.Part) for p in found):
        raise ChecksError(f"{filename}: PARTS must be a non-empty tuple of "
                          "helpers.grading.registry.Part")
    return Checks(filename, source, extends, tuple(found))


def merged_spec(source: str, filename: str) -> registry.Assignment:
    """The assignment with the checks of ``source`` after its own parts (how a judge process,
    :mod:`.judging`, rebuilds them from their source)."""
    checks = from_source(source, filename)
    return checks.merged(registry.get(checks.extends))


def load(path) -> Checks:
    """Read and check the checks module at ``path`` (an assignment it extends, new keys)."""
    path = Path(path).expanduser()
    try:
        source = path.read_text()
    except OSError as err:
        raise ChecksError(f"cannot read the checks module {path}: {err}") from None
    try:
        checks = from_source(source, str(path))
    except ChecksError:
        raise
    except Exception as err:  # noqa: BLE001 - the instructor's file: say where it failed
        raise ChecksError(f"{path} failed to load: {type(err).__name__}: {err}") from None
    if checks.extends not in registry.MODULES:
        raise ChecksError(f"{path}: EXTENDS = {checks.extends!r} is not a graded assignment "
                          f"(one of {sorted(registry.MODULES)})")
    spec = registry.get(checks.extends)
    keys = [p.key for p in spec.parts + checks.parts]
    clash = sorted({k for k in keys if keys.count(k) > 1})
    if clash:
        raise ChecksError(f"{path}: part keys {clash} are used twice (the assignment's keys: "
                          f"{[p.key for p in spec.parts]}); give hidden parts keys of their own")
    merged = checks.merged(spec)
    for p in checks.parts:
        if p.after and not merged.unit(p.after):
            raise ChecksError(f"{path}: part {p.key} waits for group {p.after!r}, which no "
                              "part has")
    return checks


# --------------------------------------------------------------------------------------
# Grading: collected in the clean process (:mod:`.clean_run`), judged in :mod:`.judging`.
# --------------------------------------------------------------------------------------


def _result(part, status: str, message: str, seconds: float = 0.0) -> PartResult:
    return PartResult(part.key, part.title, 0, part.points, status, message, seconds)


def grade_parts(checks: Checks, spec: registry.Assignment, run, cells, cell_results, tmp: str,
                mode: str, limits, done: list[PartResult]) -> list[PartResult]:
    """The hidden parts of one notebook, after the assignment's own parts (``done``),
    collected in a clean process of their own with a seed of their own, judged in a judge
    process (:mod:`.judging`)."""
    merged = checks.merged(spec)
    changes, hidden = static.tampering(cells)
    if changes or hidden:      # the assignment's parts are withheld: so are these
        why = changes[0] if changes else f"code the grader cannot read: {hidden[0]}"
        return [_result(p, NEEDS_GPU if p.gpu and mode == "cpu" else ERROR,
                        f"not graded: the notebook interferes with the grader ({why}); your "
                        "instructor will look at it") for p in checks.parts]
    launches = static.launches_a_kernel(cells)
    seed = secrets.randbits(31)
    collector = parts.clean_collector(spec, cells, tmp, mode, limits)
    try:
        build = partial(merged_spec, checks.source, checks.path)
        with judging.Judge(merged.name, limits, build) as judge:
            return _grade(checks, merged, collector, judge, cells, cell_results, mode, limits,
                          done, seed, launches)
    finally:
        collector.stop()


def _grade(checks, merged, collector, judge, cells, cell_results, mode, limits, done, seed,
           launches):
    from .reuse import problem

    results = {r.key: r for r in done}
    collections: dict[str, parts.Collection] = {}
    request = {"checks": checks.source, "path": checks.path}
    out = []
    for part in checks.parts:
        result = None
        if part.gpu and mode == "cpu":
            result = _result(part, NEEDS_GPU, "needs a GPU: this part is graded on a GPU and "
                             "costs no points in CPU mode")
        elif part.after:
            first = [results[p.key] for p in merged.unit(part.after) if p.key in results]
            failed = [r for r in first if r.status not in (PASSED, NEEDS_GPU, UNCHECKED)]
            if failed:
                result = _result(part, NOT_IMPLEMENTED if all(
                    r.status == NOT_IMPLEMENTED for r in failed) else FAILED,
                    f"needs a correct, in-bounds kernel first (parts "
                    f"{', '.join(r.key for r in first)})")
        if result is None:
            unit = parts.unit_of(part)
            if unit not in collections:
                collections[unit] = parts.in_turn(collector, merged, unit, seed, mode, limits,
                                                  request)
                data = collections[unit].data
                if data is not None and data.get("ok") and isinstance(data.get("raw"), dict):
                    data["raw"][registry.SEED] = parts.unit_seed(seed, unit)
            collection = collections[unit]
            if collection.failure is not None:
                f = collection.failure
                result = f if f.key == part.key else _result(
                    part, f.status, f"not checked: part {f.key} {f.status} on the same code")
            else:
                result = parts._judged(part, collection, cells, cell_results, judge)
                if result.status == PASSED and part.collect is not None and not part.gpu \
                        and not launches and parts._kernel_trials(collection):
                    result = _result(part, FAILED, "the notebook launches no @triton.jit "
                                     "kernel of its own: the graded function must launch one",
                                     result.seconds)
                reused = problem(part, collection.data, collection.calls,
                                 collector.statement_calls, merged.name)
                if reused and result.status == PASSED:
                    result = _result(part, FAILED, reused, result.seconds)
        results[part.key] = result
        out.append(result)
    return out

"""Grading the parts of a notebook that has run: collect in a clean process, then judge.

After the grader has run a submission's cells in its kernel (:mod:`.grader`: what each
cell did is the learner's report), each graded part gets its verdict in two steps:

1. **Collect**, in a clean process (:mod:`.clean`, :mod:`.clean_run`): a fresh sandboxed
   process that imports the course and the collector first, then runs only the notebook's
   definitions, then collects one unit at a time: the plain values of all the napkin-math
   answers at once, then each graded function's trials, on inputs made from a seed drawn
   for that unit here, after the notebook has run. The notebook's kernel takes no part.
2. **Judge**, in a child of the grader with the part's time limit and a memory cap
   (:mod:`.judging`): the raw results are read as data only
   (``torch.load(weights_only=True)``) and each part's judge makes the verdict. A part
   that the course's own code decided scores 0 (:mod:`.reuse`); a clean process that saw
   the course rebound withholds the verdicts. In GPU mode each collection takes its turn
   on the GPU (:mod:`.gpu`), alone when it is timed.
"""

from __future__ import annotations

import re
import secrets
import zlib

from . import judging, registry, static
from .report import (
    CRASHED,
    ERROR,
    FAILED,
    NEEDS_GPU,
    NOT_IMPLEMENTED,
    PASSED,
    TIMED_OUT,
    UNCHECKED,
    PartResult,
)

ANSWERS = registry.ANSWERS     # the collection of every napkin-math answer
SEED = registry.SEED


def unit_of(part: registry.Part) -> str:
    """The collection a part's raw results come from."""
    return part.unit if part.collect is not None else ANSWERS


def _defining_cell(cells, name: str):
    """The code cell that defines ``name`` (``def name``, ``name = ...``), if any."""
    pattern = re.compile(rf"^\s*(def\s+{re.escape(name)}\b|class\s+{re.escape(name)}\b|"
                         rf"{re.escape(name)}\s*(:[^=\n]*)?=(?!=))", re.MULTILINE)
    for number, source in cells:
        if pattern.search(source):
            return number
    return None


def explain_missing(result: PartResult, names, cells, cell_results) -> None:
    """Say *why* a graded name is missing: which cell should define it, what it raised."""
    stub_left = any(c.ename == "NotImplementedError" for c in cell_results.values())
    for name in names:
        number = _defining_cell(cells, name)
        failed = cell_results.get(number) if number is not None else None
        if number is None:
            if stub_left:
                result.message = (f"not implemented yet: `{name}` is not defined and a cell "
                                  "still raises NotImplementedError")
            else:
                result.status = FAILED
                result.message = (f"`{name}` is not defined, and no code cell defines it: if "
                                  "you renamed it, give it its name back")
        elif failed is None:
            result.status = FAILED
            result.message = (f"`{name}` is defined in code cell {number} but no longer exists "
                              "once the notebook has run: a later cell deleted it (del?)")
        elif failed.status == "error" and failed.ename == "NotImplementedError":
            continue  # the stub is still there: "not implemented" says it all
        else:
            result.status = ERROR
            result.message = (f"`{name}` is not defined because code cell {number} "
                              f"({failed.first_line!r}) " + failed.what() + ".")


_UNDEFINED = re.compile(r"name '(\w+)' is not defined")


def explain_undefined(result: PartResult, cells, cell_results) -> None:
    """A check that hit ``NameError: name 'x'``: point at the cell that should define x."""
    match = _UNDEFINED.search(result.message)
    if not match:
        return
    number = _defining_cell(cells, match.group(1))
    failed = cell_results.get(number) if number is not None else None
    if failed is not None:
        result.message += (f" (code cell {number}, which defines `{match.group(1)}`, "
                           f"{failed.what()})")


class Collection:
    """What one collection gave: raw results, or why there are none (a failed result)."""

    def __init__(self, data: dict | None = None, failure: PartResult | None = None,
                 calls=(), tampered: str = ""):
        self.data, self.failure = data, failure
        self.calls, self.tampered = list(calls), tampered


def unit_seed(seed: int, unit: str) -> int:
    """The seed one unit is collected on: the grader's seed never leaves the grader."""
    return zlib.crc32(f"{seed}/{unit}".encode()) & 0x7FFFFFFF


def clean_collector(spec, cells, tmp: str, mode: str, limits):
    from .clean import CleanCollector

    return CleanCollector(spec.name, cells, cwd=tmp, mode=mode, limits=limits)


def collected(reply, first, limits, names: str) -> Collection:
    """A :class:`~helpers.grading.clean.Reply` as a collection (or the failure it is)."""
    def fail(status, message):
        return Collection(failure=PartResult(first.key, first.title, 0, first.points, status,
                                             message, reply.seconds), calls=reply.calls)
    if reply.kind == "raw":
        return Collection(reply.data, calls=reply.calls)
    if reply.kind == "tampered":
        return Collection(failure=PartResult(
            first.key, first.title, 0, first.points, ERROR,
            "not graded: the notebook's code changes the course's code while it is graded; "
            "your instructor will look at it"), tampered=reply.text)
    if reply.kind == "timeout":
        return fail(TIMED_OUT, f"the check was stopped after {limits.part_timeout:g} s (the "
                               f"time limit): something in {names} never finishes (an "
                               "infinite loop?)")
    if reply.kind == "died":
        return fail(CRASHED, f"checking this part crashed the collection process: "
                             f"{reply.text}")
    if reply.kind == "defined":
        return fail(ERROR, "the check could not run (the collection process restarted)")
    return fail(ERROR, f"the check could not run: {reply.text}")


def in_turn(collector, spec, unit: str, seed: int, mode: str, limits,
            checks: dict | None = None) -> Collection:
    """A unit collected in its turn on the GPU (:mod:`.gpu`): alone when it is timed."""
    from . import gpu

    if mode != "gpu":
        return _collect(collector, spec, unit, seed, limits, checks)
    timed = any(p.gpu for p in spec.parts if unit_of(p) == unit)
    wait = limits.cell_timeout + limits.part_timeout   # the longest another turn lasts
    try:
        with (gpu.alone if timed else gpu.shared)(wait):
            return _collect(collector, spec, unit, seed, limits, checks)
    except gpu.GpuBusy as err:
        first = next(p for p in spec.parts if unit_of(p) == unit)
        return Collection(failure=PartResult(first.key, first.title, 0, first.points, ERROR,
                                             f"not checked: {err}; grade it again"))


def _collect(collector, spec, unit: str, seed: int, limits, checks=None) -> Collection:
    parts = [p for p in spec.parts if unit_of(p) == unit]
    names = ", ".join(dict.fromkeys(n for p in parts for n in p.names)) or "the notebook"
    return collected(collector.collect(unit, unit_seed(seed, unit), checks), parts[0], limits,
                     names)


def _judged(part, collection: Collection, cells, cell_results, judge) -> PartResult:
    data = collection.data
    seconds = float(data.get("seconds") or 0.0) if isinstance(data.get("seconds"), (int, float)) \
        else 0.0
    if not data["ok"]:
        if data.get("missing"):
            result = PartResult(part.key, part.title, 0, part.points, NOT_IMPLEMENTED,
                                f"`{data['missing']}` is not defined", seconds)
            explain_missing(result, [str(data["missing"])], cells, cell_results)
            return result
        if data.get("not_implemented"):
            return PartResult(part.key, part.title, 0, part.points, NOT_IMPLEMENTED,
                              "not implemented yet: replace the `raise NotImplementedError` "
                              "with your code", seconds)
        result = PartResult(part.key, part.title, 0, part.points, ERROR,
                            f"could not be checked: {data.get('error', '')}", seconds)
        explain_undefined(result, cells, cell_results)
        return result
    feedback, missing = judge.verdict(part, data["raw"])
    status = PASSED if feedback.passed else (feedback.status or FAILED)
    result = PartResult(part.key, part.title, part.points if feedback.passed else 0,
                        part.points, status, feedback.message, seconds)
    if result.status == NOT_IMPLEMENTED and missing:
        explain_missing(result, missing, cells, cell_results)
    elif result.status != PASSED:
        explain_undefined(result, cells, cell_results)
    return result


def grade_parts(spec: registry.Assignment, run, cells, cell_results, tmp: str, mode: str,
                limits) -> tuple[list[PartResult], list[str]]:
    """Every part of ``spec``, collected in a clean process and judged in a judge process
    (:mod:`.judging`; ``run``, the notebook's kernel, is not used: its cells have run).

    Returns the results and the notes for the instructor: code that tampers with the
    grader's tools (its verdicts are withheld), code that hides what it runs, kernels
    copied from the course.
    """

    changes, hidden = static.tampering(cells)
    notes = [f"possible tampering with the grader: {c}" for c in changes]
    notes += [f"possible tampering with the grader, hidden: {h}" for h in hidden]
    if changes or hidden:
        why = (f"the notebook changes what the grader relies on ({changes[0]})" if changes
               else f"the notebook runs code the grader cannot read ({hidden[0]})")
        return [PartResult(p.key, p.title, 0, p.points,
                           NEEDS_GPU if p.gpu and mode == "cpu" else ERROR,
                           f"not graded: {why}; your instructor will look at it")
                for p in spec.parts], notes
    launches = static.launches_a_kernel(cells)
    seed = secrets.randbits(31)     # drawn now: the notebook has finished running
    collector = clean_collector(spec, cells, tmp, mode, limits)
    try:
        with judging.Judge(spec.name, limits) as judge:
            return _grade(spec, collector, judge, cells, cell_results, mode, limits, seed,
                          launches, notes)
    finally:
        collector.stop()


def _grade(spec, collector, judge, cells, cell_results, mode, limits, seed, launches, notes):
    from ..feedback import needs_gpu
    from .reuse import problem

    collections: dict[str, Collection] = {}
    results: dict[str, PartResult] = {}
    for part in spec.parts:
        if part.gpu and mode == "cpu":
            results[part.key] = PartResult(part.key, part.title, 0, part.points, NEEDS_GPU,
                                           needs_gpu(part.label).message)
            continue
        if part.after:
            first = [results[p.key] for p in spec.unit(part.after) if p.key in results]
            failed = [r for r in first if r.status not in (PASSED, NEEDS_GPU, UNCHECKED)]
            if failed:
                status = NOT_IMPLEMENTED if all(r.status == NOT_IMPLEMENTED for r in failed) \
                    else FAILED
                results[part.key] = PartResult(
                    part.key, part.title, 0, part.points, status,
                    f"needs a correct, in-bounds kernel first (parts "
                    f"{', '.join(r.key for r in first)})")
                continue
        unit = unit_of(part)
        if unit not in collections:
            collections[unit] = in_turn(collector, spec, unit, seed, mode, limits)
            data = collections[unit].data
            if data is not None and data.get("ok") and isinstance(data.get("raw"), dict):
                data["raw"][SEED] = unit_seed(seed, unit)   # the judge checks every trial
            if collections[unit].tampered:
                notes.append("possible tampering with the grader, at run time: "
                             + collections[unit].tampered.replace("\n", "; "))
        collection = collections[unit]
        if collection.failure is not None:
            failure = collection.failure
            if failure.key == part.key:
                results[part.key] = failure
            else:
                results[part.key] = PartResult(part.key, part.title, 0, part.points,
                                               failure.status, f"not checked: part "
                                               f"{failure.key} {failure.status} on the same code")
            continue
        result = _judged(part, collection, cells, cell_results, judge)
        if result.status == PASSED and part.collect is not None and not part.gpu \
                and not launches and _kernel_trials(collection):
            result = PartResult(part.key, part.title, 0, part.points, FAILED,
                                "the notebook launches no @triton.jit kernel of its own "
                                "(no kernel[grid](...) anywhere in it): the graded function "
                                "must launch one", result.seconds)
        reused = problem(part, collection.data, collection.calls, collector.statement_calls,
                         spec.name)
        if reused:
            notes.append(f"part {part.key}: {reused}")
            if result.status == PASSED:
                result = PartResult(part.key, part.title, 0, part.points, FAILED, reused,
                                    result.seconds)
        results[part.key] = result
    refused = {r for c in collections.values() if c.data for r in c.data.get("refused") or ()}
    notes += [f"refused at run time: {r}" for r in sorted(refused)]
    return [results[p.key] for p in spec.parts], notes


def _kernel_trials(collection: Collection) -> bool:
    """Whether a collection holds a graded kernel's trials (:func:`harness.collect`): only a
    kernel part needs a launch of the notebook's own kernel, not a plain Python function
    (a pruning rule, a key) graded on the grader's inputs."""
    raw = (collection.data or {}).get("raw")
    return isinstance(raw, dict) and "trials" in raw

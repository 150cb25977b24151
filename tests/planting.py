"""The grader tests' one harness: plant mistakes in a solution, grade, assert what was lost.

A *plant* is the solution notebook with one mistake put in, the kind a learner makes. Each
assignment lists its plants as ``name -> (plant, {part: words})`` (optionally a third item,
parts whose outcome depends on the machine or the grader's seed): lessons 04-08 in
``tests/plants_NN.py``, graded from one table by ``tests/test_grading_lessons.py`` under
:data:`LIMITS`; lesson 03 in ``tests/test_grading_03.py``. They use:

* :func:`edit`: make a plant (replacements that must each match exactly one code cell, so
  a plant that no longer applies fails loudly instead of testing nothing); :func:`together`
  puts slips of parts that do not read one another into one notebook;
* :func:`grade_plants`: grade every plant, the solution and the blank assignment in one
  parallel run of the grader, as an instructor would, and return the reports by name (in
  CPU mode, a plant that loses only parts graded on a GPU is left out: :func:`counted_in`);
* :func:`assert_loses_exactly`: a plant loses exactly the points of the parts it breaks,
  each with a message that names the mistake; every other part keeps its points.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest

from helpers.grading import grader, registry

REPO = Path(__file__).resolve().parents[1]

# The limits lessons 04-08 are graded under in these tests: room for the interpreter, which
# runs a kernel far slower than a GPU, on a machine busy with other tests.
LIMITS = grader.Limits(cell_timeout=120, part_timeout=120, total_timeout=600, memory_mb=3072)


def edit(replace=(), append=(), insert_after_first=()):
    """A function that plants a mistake in a copy of the solution notebook.

    ``replace`` pairs must each match exactly one code cell of the solution, so a plant
    that no longer applies (the solution changed) fails loudly instead of testing nothing.
    """

    def apply(nb):
        nb = copy.deepcopy(nb)
        for old, new in replace:
            hits = [c for c in nb.cells if c.cell_type == "code" and old in c.source]
            assert len(hits) == 1, f"the solution changed: {old!r} found {len(hits)} times"
            hits[0].source = hits[0].source.replace(old, new)
        for i, src in enumerate(insert_after_first):
            first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
            nb.cells.insert(first + 1 + i, nbformat.v4.new_code_cell(src))
        for src in append:
            nb.cells.append(nbformat.v4.new_code_cell(src))
        return nb

    return apply


def together(*entries):
    """Several plants in one notebook: their edits one after another, the parts they lose
    taken together (and those that may go either way). Only for slips in parts that do not
    read one another, so that each must still lose exactly its own parts with its own
    message: a plant's cost is a whole run of the grader, not its one slip."""
    def apply(nb):
        for plant, *_ in entries:
            nb = plant(nb)
        return nb
    expected, either = {}, ()
    for _, lost, *rest in entries:
        assert not set(lost) & set(expected), "slips in one notebook must lose other parts"
        expected.update(lost)
        either += tuple(rest[0]) if rest else ()
    return apply, expected, either


def solution(assignment: str) -> Path:
    return REPO / "solutions" / f"{assignment}.ipynb"


def blank(assignment: str) -> Path:
    return REPO / "assignments" / f"{assignment}.ipynb"


def cpu_mode_problem() -> str | None:
    """Why CPU mode cannot run on this machine (a known-bad Triton/NumPy pair), or None."""
    import numpy
    import triton

    from helpers import runtime

    try:
        runtime.check_versions(runtime.CPU, triton.__version__, numpy.__version__)
    except runtime.SetupError as err:
        return str(err)
    return None


def write_plants(folder: Path, assignment: str, plants: dict) -> list[tuple[Path, str]]:
    """Each plant as ``<folder>/<name>/<assignment>.ipynb``; ``(path, name)`` pairs."""
    source = nbformat.read(solution(assignment), as_version=4)
    out = []
    for name, entry in plants.items():
        path = folder / name / f"{assignment}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(entry[0](source), path)
        out.append((path, name))
    return out


def counted_in(plants: dict, assignment: str, mode: str) -> dict:
    """The plants that lose a part counted in ``mode``. In CPU mode a plant whose every lost
    part is graded on a GPU only ("needs a GPU" there) would score as the solution does: its
    grading, a whole run of the grader, is left to GPU mode."""
    if mode != "cpu":
        return dict(plants)
    gpu = {p.key for p in registry.get(assignment).parts if p.gpu}
    return {name: entry for name, entry in plants.items()
            if not entry[1] or not set(entry[1]) <= gpu}


def grade_plants(tmp_path_factory, assignment: str, plants: dict, *, limits, mode="cpu",
                 jobs: int = 2) -> dict:
    """Grade the plants that count in ``mode`` (:func:`counted_in`), the solution
    (``"solution"``) and the blank assignment (``"blank"``) in one parallel run; the reports
    as dicts, by name."""
    problem = cpu_mode_problem() if mode == "cpu" else None
    if problem:
        pytest.skip(f"CPU-mode grading cannot run here: {problem}")
    root = tmp_path_factory.mktemp(f"submissions_{assignment[:2]}")
    notebooks = write_plants(root, assignment, counted_in(plants, assignment, mode))
    notebooks += [(solution(assignment), "solution"), (blank(assignment), "blank")]
    reports = grader.grade_many(notebooks, assignment=assignment, limits=limits, mode=mode,
                                jobs=jobs)
    return {r.student: r.to_dict() for r in reports}


def parts_of(report) -> dict:
    return {p["key"]: p for p in report["parts"]}


def assert_loses_exactly(report, spec, expected: dict, either=()):
    """``report`` loses the points of the parts in ``expected`` (each message containing
    its words), keeps all others; parts in ``either`` may go either way. Parts graded on
    a GPU are "needs a GPU" in CPU mode and count nowhere."""
    points = {p.key: p.points for p in spec.parts}
    waiting = {k for k, p in parts_of(report).items() if p["status"] == "needs a GPU"}
    counted = 0.0
    lost = 0.0
    for key, part in parts_of(report).items():
        if part["status"] == "needs a GPU":
            assert part["points"] == 0 and part["max_points"] == points[key], part
            continue
        counted += points[key]
        if key in expected:
            assert part["points"] == 0, f"part {key} should lose its points: {part}"
            assert expected[key].lower() in part["message"].lower(), (
                f"part {key}'s message should name the mistake ({expected[key]!r}): "
                f"{part['message']}")
        elif key in either:
            assert part["points"] in (0, part["max_points"]), part
        else:
            assert part["points"] == part["max_points"], f"part {key} should pass: {part}"
        lost += part["max_points"] - part["points"]
    due = sum(points[k] for k in expected if k not in waiting)
    assert lost >= due, (
        f"lost {lost} points, expected at least {due}: " + "; ".join(
            f"{p['key']} {p['points']}/{p['max_points']} {p['status']}"
            for p in report["parts"]) + f" (error: {report.get('error')!r}; "
        f"notes: {report.get('notes')!r})")
    assert report["score"] == counted - lost and report["max_score"] == counted


def assert_full_marks(report, spec):
    """The solution: every part that counts here passes, and no cell failed."""
    assert report["score"] == report["max_score"], report
    gpu = {p.key for p in spec.parts if p.gpu}
    waiting = {k for k, p in parts_of(report).items() if p["status"] == "needs a GPU"}
    assert waiting <= gpu, waiting
    assert report["cells"] == [], "the solution notebook should run without errors"


def assert_blank(report, spec):
    """The blank assignment: zero, every part "not implemented" (or "needs a GPU")."""
    assert report["score"] == 0, report
    for key, part in parts_of(report).items():
        assert part["status"] in ("not implemented", "needs a GPU"), part
    assert {c["ename"] for c in report["cells"]} <= {"NotImplementedError", "NameError"}, \
        report["cells"]


GPU_MODE_EMULATION = """
import sys
import triton.language as tl
from triton.runtime.jit import JITFunction
import learner                      # defined before helpers: compiled-kernel JITFunctions
assert isinstance(learner.{kernel}, JITFunction)
assert isinstance(tl.standard.sum, JITFunction)
from helpers import runtime
runtime.MODE = "gpu"                # as the grader runs on a GPU, with host tensors
runtime.device = lambda: "cpu"
from helpers.grading.assignments import {module} as graded
graded.TASK.compiled_cases = lambda blocks: []
results = graded.check_kernel(vars(learner))
print(results)
sys.exit(0 if all(results) else 1)
"""


def check_kernel_as_on_a_gpu(folder: Path, learner: str, module: str, kernel: str) -> str:
    """``check_kernel()`` of ``helpers.grading.assignments.<module>`` on the source
    ``learner`` as the grader runs it on a GPU: the notebook's kernels (``kernel`` among
    them) and Triton's own ``tl.sum`` are compiled-kernel functions, which the checks must
    run interpreted to watch them. Emulated on the CPU in a fresh process where Triton is
    imported without the interpreter; returns what the check printed (it must pass)."""
    import os
    import subprocess
    import sys

    problem = cpu_mode_problem()
    if problem:
        pytest.skip(f"this machine's interpreter cannot run the kernel: {problem}")
    (folder / "learner.py").write_text(learner)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_MODE")}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(REPO)])
    out = subprocess.run([sys.executable, "-c", GPU_MODE_EMULATION.format(
        module=module, kernel=kernel)], env=env, cwd=folder, capture_output=True, text=True,
        timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    return out.stdout

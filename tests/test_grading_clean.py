"""Collection in a clean process: what a notebook does in its own kernel decides nothing.

Each plant is an attack of one class, written the way the grader's source reading does not
see it (an alias it does not follow, a name put together at run time), on assignment 03:

* top-level code that is not a definition (``globals().update(answer=...)``): it runs in
  the notebook's kernel, never in the clean process;
* a hook the notebook's own interpreter offers (IPython's events) that rewrites the record
  of a collection as it is saved: the clean process has no IPython and never runs the
  notebook's top-level calls, so the hook never runs where the record is made;
* the course rebound through an alias (``setattr`` on the grader's registry): the clean
  process sees the rebinding and withholds the verdicts;
* a trace hook installed through a name put together at run time: refused by the audit
  hook, the attempt named for the instructor;
* graded numbers computed by the course's own napkin math, reached through a default
  argument: those parts score 0, with a note;
* a kernel that hands its work to the course's kernel, called as a device function;
* the course's kernel pasted with trivial edits (renamed, lines swapped, a no-op added).

Every attack scores at most what the blank notebook scores on the parts it attacks, the
honest student beside them keeps full marks, and the grader exits 0 with a gradebook.
"""

from __future__ import annotations

import nbformat
import pytest
from planting import (
    LIMITS,
    assert_loses_exactly,
    blank,
    cpu_mode_problem,
    edit,
    write_plants,  # tests/planting.py
)

import helpers
from helpers.grading import grader, registry

ASSIGNMENT = "03_vector_add_intensity"
# On a GPU, part 4 (timed) waits for the kernel parts: it is lost with them.
LOST_WITH_THE_KERNEL = {"4": "needs a correct"} if helpers.is_gpu() else {}

# After the collection in the notebook's kernel, rewrite the record it saved with the
# right napkin numbers (the path is in the collection code's text).
IPYTHON_EVENT = """
import re as _re
import torch as _torch
from helpers import intensity as _intensity
_shell = get_ipython()
def _after_each_cell(*args):
    text = _shell.user_ns.get("_ih", [""])[-1]
    found = _re.search(r"'(/[^']*raw-[0-9a-f]+\\.pt)'", text)
    if found:
        work = _intensity.vector_add(10**9, _torch.float16)
        _torch.save({"ok": True, "seconds": 0.0, "raw": {
            "add_flops": work.flops, "add_bytes": work.nbytes,
            "add_intensity": work.intensity}}, found.group(1))
_shell.events.register("post_execute", _after_each_cell)
"""

# The registry rebound through a name the source reading does not follow.
REBIND = """
import helpers
from helpers.feedback import Feedback as _Feedback
_course = helpers
_registry = _course.grading.registry
def _everything(assignment, key, namespace, seed):
    return {"add_flops": 1e9}
_done = setattr(_registry, "collect", _everything)
"""

# Top-level code that is not a definition: run in the notebook's kernel (its check would
# pass there), never in the clean process, where the answer is then not defined.
EXPRESSION_ONLY = """
globals().update(add_flops=10**9)
"""

TRACE = """
import sys as _s
_name = "set" + "trace"
def _tracer(frame, event, arg):
    return None
_on = getattr(_s, _name)(_tracer)
"""

DEFAULT_ARGUMENT = """
import torch
import helpers
def _count(n, _work=helpers.intensity.vector_add):
    return _work(n, torch.float16)
add_flops = _count(10**9).flops
add_bytes = _count(10**9).nbytes
add_intensity = _count(10**9).intensity
"""

DEVICE_CALL = """
from helpers.kernels import vector_add as _course_kernels

@triton.jit
def add_kernel(a_ptr, b_ptr, c_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    _course_kernels.add_kernel(a_ptr, b_ptr, c_ptr, n_elements, BLOCK_SIZE)
"""

PASTED = '''
@triton.jit
def add_kernel(x, y, out, n, BLOCK_SIZE: tl.constexpr):
    """my own kernel"""
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n
    yv = tl.load(y + offs, mask=m)
    xv = tl.load(x + offs, mask=m)
    pid = pid + 0
    s = xv.to(tl.float32) + yv.to(tl.float32)
    tl.store(out + offs, s.to(out.dtype.element_ty), mask=m)
'''

NAPKIN = ("1a", "1b", "1c", "1d", "1e", "2a", "2b", "2c", "2d", "2e", "5a", "5b", "5e")


def _blank_plus(source):
    def plant(solution):
        return edit(append=[source])(nbformat.read(blank(ASSIGNMENT), as_version=4))
    return plant


def _kernel_cell_replaced(source):
    """The solution with its add_kernel cell's kernel replaced by ``source``."""
    def plant(solution):
        nb = edit()(solution)
        (cell,) = [c for c in nb.cells if c.cell_type == "code" and "def add_kernel" in c.source]
        cell.source = source.strip() + "\n"
        return nb
    return plant


PLANTS = {
    "ipython_event": (_blank_plus(IPYTHON_EVENT), {}),
    "rebind": (_blank_plus(REBIND), {}),
    "expression_only": (_blank_plus(EXPRESSION_ONLY), {}),
    "trace": (_blank_plus(TRACE), {}),
    "default_argument": (_blank_plus(DEFAULT_ARGUMENT), {}),
    "device_call": (_kernel_cell_replaced(DEVICE_CALL),
                    {"3a": "course", "3b": "", **LOST_WITH_THE_KERNEL}),
    "pasted": (_kernel_cell_replaced(PASTED),
               {"3a": "up to renaming", "3b": "", **LOST_WITH_THE_KERNEL}),
}


@pytest.fixture(scope="module")
def graded_plants(tmp_path_factory):
    """The plants graded in one parallel run (the solution and the blank are graded, and
    asserted, by tests/test_grading_03.py: the blank scores 0 in CPU mode)."""
    problem = None if helpers.is_gpu() else cpu_mode_problem()
    if problem:
        pytest.skip(f"CPU-mode grading cannot run here: {problem}")
    root = tmp_path_factory.mktemp("clean_plants")
    found = grader.grade_many(write_plants(root, ASSIGNMENT, PLANTS), assignment=ASSIGNMENT,
                              limits=LIMITS, jobs=2)
    return {r.student: r.to_dict() for r in found}


def _parts(report):
    return {p["key"]: p for p in report["parts"]}


@pytest.mark.parametrize("name", ["ipython_event", "rebind", "trace", "default_argument",
                                  "expression_only"])
def test_an_attack_on_a_blank_notebook_scores_what_the_blank_scores(graded_plants, name):
    report = graded_plants[name]
    assert report["score"] == 0, report
    assert not report.get("error"), report["error"]


def test_a_rebound_course_is_seen_in_the_clean_process_and_its_verdicts_withheld(graded_plants):
    report = graded_plants["rebind"]
    assert any("at run time" in n and "registry.collect" in n for n in report["notes"]), \
        report["notes"]
    assert all(p["points"] == 0 for p in report["parts"]), report
    withheld = [p for p in report["parts"] if "not graded" in p["message"]]
    assert withheld and all(p["status"] == "error" for p in withheld), report


def test_what_the_notebook_set_outside_its_definitions_is_not_what_is_judged(graded_plants):
    part = _parts(graded_plants["expression_only"])["1a"]
    assert part["points"] == 0 and "not defined" in part["message"], part


def test_a_trace_hook_is_refused_and_named_for_the_instructor(graded_plants):
    assert any("sys.settrace" in n for n in graded_plants["trace"]["notes"]), graded_plants["trace"]


def test_numbers_computed_by_the_course_score_zero_with_a_note(graded_plants):
    parts = _parts(graded_plants["default_argument"])
    for key in ("1a", "1b", "1c"):
        assert parts[key]["points"] == 0, parts[key]
        assert "helpers.intensity" in parts[key]["message"], parts[key]
    notes = graded_plants["default_argument"]["notes"]
    assert any("part 1a" in n and "helpers.intensity" in n for n in notes), notes


@pytest.mark.parametrize("name", ["device_call", "pasted"])
def test_a_kernel_that_is_the_courses_loses_exactly_its_parts(graded_plants, name):
    _, expected = PLANTS[name]
    assert_loses_exactly(graded_plants[name], registry.get(ASSIGNMENT), expected)
    assert any("part 3a" in n for n in graded_plants[name]["notes"]), graded_plants[name]["notes"]

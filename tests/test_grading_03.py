"""The grader, end to end: the solution, the blank assignment and planted wrong submissions.

Every planted submission is the solution notebook with one mistake put in, the kind a
learner makes (forgetting the write of C, no mask, computing with torch, a syntax error,
an infinite loop, ...), or a few napkin-math slips in parts that do not read one
another. Each must lose exactly the points of the parts it breaks, with a
message that names the mistake, and never crash the grader. They are generated here from
solutions/, so they follow the solution when it changes (a replacement that no longer
applies fails loudly).

All notebooks are graded by one run of the grader's command line over a folder, in
parallel, as an instructor would; the tests then read its JSON reports and gradebook.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import shutil
import time
from pathlib import Path

import pytest

import helpers
from helpers.grading import answers, grader, registry
from helpers.grading.assignments import keys_vector_add

from planting import assert_loses_exactly, edit, together, write_plants  # tests/planting.py

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "03_vector_add_intensity.ipynb"
ASSIGNMENT = REPO / "assignments" / "03_vector_add_intensity.ipynb"
SPEC = registry.get("03_vector_add_intensity")
POINTS = {p.key: p.points for p in SPEC.parts}
GPU_PARTS = {p.key for p in SPEC.parts if p.gpu}
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)


_edit = edit


# name -> (how to plant it, {part: words its message must contain}); every other part
# must score full points.
PLANTS = {
    # Napkin-math slips, several to a notebook: each touches parts no other one in its
    # notebook reads, so each must still lose exactly its own parts, with its own message
    # (one notebook graded instead of five: the grader's run is the cost of a plant).
    "napkin_slips_a": (
        _edit([("add_bytes = 3 * N * BYTES_PER_FP16", "add_bytes = 2 * N * BYTES_PER_FP16"),
               ("inplace_intensity = N / (3 * N * 2)", "inplace_intensity = N / (2 * N * 2)"),
               ('ridge_fp32 = h100.ridge_point("fp32")', 'ridge_fp32 = h100.ridge_point("fp16")'),
               ("step_intensity = 2 * 2 * N / step_bytes",
                "step_intensity = 2 * 2 * N / (N * (4 + 4 + 2))"),
               ("bytes_at_pred = step_bytes / N * PRED_N",
                "bytes_at_pred = 8 * step_bytes / N * PRED_N")]),
        {"1b": "forget the write of C", "1c": "forget the write of C",      # forgot the write
         "2b": "in place still writes A back", "2d": "tensor-core ridge",
         "5b": "forget the write", "5e": "bits, not bytes"}),
    "napkin_slips_b": (
        _edit([("floor_bytes / (3 * itemsize)))", "floor_bytes))"),
               ("bandwidth_bytes_per_s * 1e6 + floor_us", "bandwidth_bytes_per_s * 1e6")],
              append=["add_bytes = 8 * 3 * N * BYTES_PER_FP16",
                      'add_intensity = float("nan")', "del add_flops"]),
        {"1d": "elements, not bytes", "5e": "launch floor",
         "1b": "bits, not bytes", "1c": "nan", "1a": "deleted"}),
    # The right count, checked against the course's own model of lesson 02 on the way: a
    # graded answer the course's code helped decide.
    "smallest_add_through_the_courses_model": (
        _edit([("    return max(1, math.ceil(fraction / (1 - fraction) * floor_bytes / (3 * itemsize)))",
                "    n = max(1, math.ceil(fraction / (1 - fraction) * floor_bytes / (3 * itemsize)))\n"
                "    roofline.predicted_time_ms(n, 3 * n * itemsize, h100, \"fp32\")\n"
                "    return n")]),
        {"1d": "uses the course's own helpers.roofline.predicted_time_ms"}),
    "syntax_error": (
        _edit([("mask = offsets < n_elements ", "mask = offsets < n_elements) ")]),
        {"3a": "SyntaxError", "3b": "SyntaxError"}),
    "exception_in_launcher": (
        _edit([("grid = (triton.cdiv(n, BLOCK_SIZE),)", "grid = (triton.cdiv(n, BLOCKSIZE),)")]),
        {"3a": "NameError", "3b": "NameError"}),
    "typo_in_kernel": (   # every call raises inside the kernel: nothing left to bounds-check
        _edit([("b = tl.load(b_ptr + offsets, mask=mask)", "b = tl.lod(b_ptr + offsets, mask=mask)")]),
        {"3a": "lod", "3b": "could not be checked"}),
    "no_mask": (
        _edit([("tl.load(a_ptr + offsets, mask=mask)", "tl.load(a_ptr + offsets)"),
               ("tl.load(b_ptr + offsets, mask=mask)", "tl.load(b_ptr + offsets)"),
               ("tl.store(c_ptr + offsets, a + b, mask=mask)", "tl.store(c_ptr + offsets, a + b)")]),
        {"3b": "past the end"}),
    "torch_instead_of_triton": (
        _edit([("add_kernel[grid](a, b, c, n, BLOCK_SIZE=BLOCK_SIZE)\n    return c",
                "return a + b")]),
        {"3a": "launched no Triton kernel", "3b": "launched no Triton kernel"}),
    "course_kernel_instead_of_own": (
        _edit([("add_kernel[grid](a, b, c, n, BLOCK_SIZE=BLOCK_SIZE)\n    return c",
                "from helpers.kernels.vector_add import add\n    return add(a, b)")]),
        {"3a": "not a kernel defined in your notebook",
         "3b": "not a kernel defined in your notebook"}),
    "wrong_dtype": (
        _edit([("c = torch.empty_like(a)", "c = torch.empty_like(a, dtype=torch.float32)")]),
        {"3a": "dtype"}),
    "wrong_shape": (
        _edit([("c = torch.empty_like(a)",
                "c = torch.empty(triton.cdiv(a.numel(), BLOCK_SIZE) * BLOCK_SIZE, "
                "dtype=a.dtype, device=a.device)")]),
        {"3a": "shape"}),
    "grid_too_small_nan": (
        _edit([("c = torch.empty_like(a)", 'c = torch.full_like(a, float("nan"))'),
               ("grid = (triton.cdiv(n, BLOCK_SIZE),)", "grid = (n // BLOCK_SIZE,)")]),
        {"3a": "NaN"}),
    "renamed_launcher": (
        _edit([("def vector_add(", "def my_vector_add(")]),
        {"3a": "renamed", "3b": "renamed"}),
    "segfault_in_a_cell": (
        _edit(append=["import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"]),
        {}),
    "segfault_in_launcher": (
        _edit([("    c = torch.empty_like(a)\n",
                "    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
                "    c = torch.empty_like(a)\n")]),
        {"3a": "crashed", "3b": "crashed"}),
    "memory_hog": (
        _edit(append=["hog = torch.ones(2**33, dtype=torch.uint8)"]),
        {}),
    # Right on every size but the small ones, which it hands to torch.
    "torch_for_small_sizes": (
        _edit([("    c = torch.empty_like(a)\n    n = a.numel()\n",
                "    if a.numel() < 128:   # not worth a launch\n        return a + b\n"
                "    c = torch.empty_like(a)\n    n = a.numel()\n")]),
        {"3a": "launched no Triton kernel"}),
    # A kernel that stores nothing, launched once; torch writes C around it.
    "torch_result_around_an_idle_kernel": (
        _edit([("    add_kernel[grid](a, b, c, n, BLOCK_SIZE=BLOCK_SIZE)\n    return c",
                "    add_kernel[grid](a, b, c, n, BLOCK_SIZE=BLOCK_SIZE)\n    c.copy_(a + b)\n"
                "    return c"),
               ("    tl.store(c_ptr + offsets, a + b, mask=mask)\n", "")]),
        {"3a": "never stored by your kernel", "3b": "did not compute the output"}),
    # torch adds; the kernel only copies the sum into C.
    "torch_result_through_a_copy_kernel": (
        _edit([("    add_kernel[grid](a, b, c, n, BLOCK_SIZE=BLOCK_SIZE)\n    return c",
                "    s = a + b\n    add_kernel[grid](s, s, c, n, BLOCK_SIZE=BLOCK_SIZE)\n"
                "    return c"),
               ("    tl.store(c_ptr + offsets, a + b, mask=mask)\n",
                "    tl.store(c_ptr + offsets, a, mask=mask)\n")]),
        {"3a": "never read A, B", "3b": "did not compute the output"}),
    # Part 5, the fused kernel: each slip loses its own part only.
    "fused_no_mask": (
        _edit([("tl.load(g_ptr + offsets, mask=mask)", "tl.load(g_ptr + offsets)"),
               ("tl.load(m_ptr + offsets, mask=mask)", "tl.load(m_ptr + offsets)"),
               ("tl.load(w_ptr + offsets, mask=mask)", "tl.load(w_ptr + offsets)"),
               ("tl.store(m_out_ptr + offsets, m, mask=mask)", "tl.store(m_out_ptr + offsets, m)"),
               ("tl.store(w_out_ptr + offsets, w, mask=mask)",
                "tl.store(w_out_ptr + offsets, w)")]),
        {"5d": "past the end"}),
    "fused_step_by_torch": (
        _edit([("    momentum_kernel[(triton.cdiv(n, BLOCK_SIZE),)](w, m, g, w_new, m_new, LR, BETA, n,\n"
                "                                                   BLOCK_SIZE=BLOCK_SIZE)\n"
                "    return w_new, m_new",
                "    m_new = BETA * m + g.float()\n    return w - LR * m_new, m_new")]),
        {"5c": "launched no Triton kernel", "5d": "launched no Triton kernel"}),
    # The weights stepped with the old momentum: right m_new, wrong w_new.
    "fused_step_with_the_old_momentum": (
        _edit([("    m = beta * tl.load(m_ptr + offsets, mask=mask) + g ",
                "    m_old = tl.load(m_ptr + offsets, mask=mask)\n"
                "    m = beta * m_old + g "),
               ("    w = tl.load(w_ptr + offsets, mask=mask) - lr * m ",
                "    w = tl.load(w_ptr + offsets, mask=mask) - lr * m_old ")]),
        {"5c": "old momentum"}),
}

# Loopers are graded with short time limits, on their own. The cell spins; the launcher,
# called by three cells and checks, waits for something that never comes (a learner's
# polling loop): the same interrupt stops both, and the wait leaves the cores to the
# other tests for the 24 s the launcher's limits take.
LOOPERS = {
    "infinite_loop_cell": (
        _edit(insert_after_first=["while True:\n    pass"]),
        {}),
    "infinite_loop_in_launcher": (
        _edit([("    c = torch.empty_like(a)\n",
                "    import time\n    while True:\n        time.sleep(0.01)\n"
                "    c = torch.empty_like(a)\n")]),
        {"3a": "time limit", "3b": "timed out"}),
}

# Slips in parts that do not read one another, graded in one notebook each pair (a plant's
# cost is a run of the grader): a launcher slip (3a, 3b) beside a fused-update slip (5c, 5d).
PLANTS["syntax_error_and_fused_step_by_torch"] = together(
    PLANTS.pop("syntax_error"), PLANTS.pop("fused_step_by_torch"))
PLANTS["wrong_dtype_and_fused_no_mask"] = together(
    PLANTS.pop("wrong_dtype"), PLANTS.pop("fused_no_mask"))
# Napkin-math slips (parts 1, 2, 5b and 5e) beside kernel slips (3a, 3b).
PLANTS["napkin_slips_a_and_no_mask"] = together(
    PLANTS.pop("napkin_slips_a"), PLANTS.pop("no_mask"),
    PLANTS.pop("fused_step_with_the_old_momentum"))
PLANTS["napkin_slips_b_and_typo_in_kernel"] = together(
    PLANTS.pop("napkin_slips_b"), PLANTS.pop("typo_in_kernel"))
PLANTS["course_model_and_exception_in_launcher"] = together(
    PLANTS.pop("smallest_add_through_the_courses_model"), PLANTS.pop("exception_in_launcher"))

# The expected scores are CPU mode's (part 4 "needs a GPU"); on a GPU machine the
# solution is graded in GPU mode by test_the_solution_scores_full_marks_on_a_gpu.
cpu_only = pytest.mark.skipif(helpers.is_gpu(), reason="expected scores are CPU mode's")
gpu_only = pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU")

LIMITS = ["--cell-timeout", "60", "--part-timeout", "60", "--memory-gb", "3"]
LOOP_LIMITS = ["--cell-timeout", "8", "--part-timeout", "8", "--memory-gb", "3"]


def _fingerprints(folder: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade every plant, the solution, the blank assignment and a corrupt file: one command."""
    root = tmp_path_factory.mktemp("submissions")
    write_plants(root, SPEC.name, PLANTS)
    (root / "solution").mkdir()
    (root / "solution" / SOLUTION.name).write_bytes(SOLUTION.read_bytes())
    (root / "blank").mkdir()
    (root / "blank" / ASSIGNMENT.name).write_bytes(ASSIGNMENT.read_bytes())
    (root / "corrupt").mkdir()
    (root / "corrupt" / SOLUTION.name).write_text('{"cells": [ this is not json')
    before = _fingerprints(root)
    out = tmp_path_factory.mktemp("grades")
    start = time.monotonic()
    code = grader.main([str(root), "--out", str(out), "--jobs", "2", *LIMITS])
    seconds = time.monotonic() - start
    assert code == 0
    book = out / SPEC.name      # reports and gradebook go to <out>/<assignment>/
    reports = {p.stem: json.loads(p.read_text()) for p in book.glob("*.json")}
    return {"reports": reports, "out": book, "root": root, "before": before, "seconds": seconds}


def _parts(report) -> dict:
    return {p["key"]: p for p in report["parts"]}


def _assert_loses_exactly(report, expected: dict):
    assert_loses_exactly(report, SPEC, expected)
    assert report["max_score"] == CPU_MAX


@cpu_only
def test_the_solution_scores_full_marks(graded):
    report = graded["reports"]["solution"]
    assert report["score"] == report["max_score"] == CPU_MAX, json.dumps(report, indent=1)
    statuses = {p["key"]: p["status"] for p in report["parts"]}
    assert {k for k, s in statuses.items() if s == "needs a GPU"} == GPU_PARTS
    assert report["pending_gpu_points"] == sum(POINTS[k] for k in GPU_PARTS)
    assert report["cells"] == [], "the solution notebook should run without errors"


@cpu_only
def test_the_blank_assignment_scores_zero_and_says_not_implemented(graded):
    report = graded["reports"]["blank"]
    assert report["score"] == 0 and report["max_score"] == CPU_MAX
    for part in report["parts"]:
        expected = "needs a GPU" if part["key"] in GPU_PARTS else "not implemented"
        assert part["status"] == expected, part
        assert expected in part["message"], part


@cpu_only
@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_mistake_loses_exactly_its_points(graded, name):
    _assert_loses_exactly(graded["reports"][name], PLANTS[name][1])


@cpu_only
def test_cells_that_crash_or_hog_memory_are_reported(graded):
    cells = graded["reports"]["segfault_in_a_cell"]["cells"]
    assert [c["status"] for c in cells] == ["died"]
    assert "SIGSEGV" in cells[0]["evalue"]
    hog = graded["reports"]["memory_hog"]["cells"]
    assert len(hog) == 1 and "allocate" in hog[0]["evalue"], hog


@cpu_only
def test_an_unreadable_notebook_gets_zero_and_a_reason(graded):
    report = graded["reports"]["corrupt"]
    assert report["score"] == 0
    assert "could not read the notebook" in report["error"]


@cpu_only
def test_grading_never_modifies_the_submissions(graded):
    assert _fingerprints(graded["root"]) == graded["before"]


@cpu_only
def test_the_folder_becomes_a_gradebook(graded):
    rows = list(csv.DictReader((graded["out"] / "gradebook.csv").open()))
    by_student = {r["student"]: r for r in rows}
    assert set(by_student) == set(PLANTS) | {"solution", "blank", "corrupt"}
    assert by_student["solution"]["score"] == f"{CPU_MAX:g}"
    assert by_student["solution"]["part 4"] == by_student["solution"]["part 5f"] == "GPU"
    assert by_student["napkin_slips_a_and_no_mask"]["part 3b"] == "0"
    assert by_student["napkin_slips_a_and_no_mask"]["part 3a"] == f"{POINTS['3a']:g}"
    assert "SIGSEGV" in by_student["segfault_in_a_cell"]["notes"]


@cpu_only
def test_a_later_run_joins_the_gradebook_and_replaces_a_regraded_row(graded, tmp_path):
    out = tmp_path / "grades"
    shutil.copytree(graded["out"], out / SPEC.name)
    late = tmp_path / "late" / "zoe"
    late.mkdir(parents=True)
    (late / "my copy (1).ipynb").write_text("{ not a notebook")
    assert grader.main([str(late / "my copy (1).ipynb"), "--out", str(out), "--assignment",
                        SPEC.name, *LIMITS]) == 0
    rows = {r["student"]: r for r in csv.DictReader((out / SPEC.name / "gradebook.csv").open())}
    assert set(rows) == set(PLANTS) | {"solution", "blank", "corrupt", "my copy (1)"}
    assert rows["solution"]["score"] == f"{CPU_MAX:g}"
    assert grader.find_notebooks([tmp_path / "late"]) == [(late / "my copy (1).ipynb", "zoe")]


@cpu_only
def test_submissions_that_never_finish_are_stopped_at_their_limits(tmp_path):
    write_plants(tmp_path / "in", SPEC.name, LOOPERS)
    out = tmp_path / "out"
    start = time.monotonic()
    assert grader.main([str(tmp_path / "in"), "--out", str(out), "--jobs", "2", *LOOP_LIMITS]) == 0
    seconds = time.monotonic() - start
    reports = {p.stem: json.loads(p.read_text()) for p in (out / SPEC.name).glob("*.json")}
    for name, (_, expected) in LOOPERS.items():
        _assert_loses_exactly(reports[name], expected)
    stopped = reports["infinite_loop_cell"]["cells"]
    assert stopped[0]["status"] == "timeout" and stopped[0]["seconds"] < 8 + 6
    # Two notebooks in parallel, each stopped (a cell, a demo cell, one check) within its
    # limits: far less than the default limits would allow.
    assert seconds < 90, f"grading the loopers took {seconds:.0f} s"


def test_the_report_table_reads_well():
    report = grader.Report("x.ipynb", "alice", "03_vector_add_intensity", "cpu", parts=[
        grader.PartResult("1a", "FLOPs", 1, 1, "passed", "1e+09 FLOP is right"),
        grader.PartResult("4", "bandwidth", 0, 3, "needs a GPU", "needs a GPU: ...")])
    text = report.to_text()
    assert "alice: 1 / 1 points (100%, 3 more on a GPU)" in text
    assert "1e+09 FLOP is right" in text and "total" in text


@gpu_only
@pytest.mark.gpu
def test_the_solution_scores_full_marks_on_a_gpu(tmp_path):
    """GPU mode: every part counts, the bandwidth part included."""
    report = grader.grade_notebook(SOLUTION)
    print("\n" + report.to_text())
    assert report.score == report.max_score == SPEC.max_points, report.to_text()


# --------------------------------------------------------------------------------------
# The pieces, one at a time (fast, in this process).
# --------------------------------------------------------------------------------------


def test_build_replaces_each_solution_by_a_stub_at_its_indentation():
    from helpers.grading import build

    source = ("x = 1\n"
              "def f(a):\n"
              "    ### BEGIN SOLUTION\n"
              "    return a + 1\n"
              "    ### END SOLUTION\n")
    text, regions = build.strip_solutions(source)
    assert regions == 1
    assert text == ("x = 1\ndef f(a):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n")
    for bad in ("### BEGIN SOLUTION\nx = 1\n",
                "### END SOLUTION\n",
                "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n"):
        with pytest.raises(build.MarkerError):
            build.strip_solutions(bad)


def test_the_bounds_guard_names_the_bad_access_and_cleans_up_after_itself():
    import torch
    import triton.runtime.interpreter as itp
    import triton.runtime.jit as jit

    from helpers import bounds

    from helpers.kernels.first_kernel import scale_shift_kernel

    run_before = jit.JITFunction.run
    x = torch.arange(100, dtype=torch.float32, device=helpers.device())
    y = torch.zeros(100, device=helpers.device())
    with bounds.watch() as log:
        scale_shift_kernel[(2,)](x, y, 2.0, 1.0, 100, BLOCK_SIZE=64)   # masked: in bounds
    assert [launch.name for launch in log.launches] == ["scale_shift_kernel"]
    assert log.violations == [] and torch.equal(y, 2 * x + 1)
    assert jit.JITFunction.run is run_before
    assert "create_masked_load" not in vars(itp.interpreter_builder)


def test_checks_run_on_a_namespace_without_a_notebook():
    from helpers.grading.assignments import vector_add as checks

    def smallest(f, s, bw, floor):
        return max(1, math.ceil(f / (1 - f) * bw * 1e3 * floor / (3 * s)))

    right = {"add_flops": 1e9, "add_bytes": 6e9, "add_intensity": 1 / 6,
             "smallest_add": smallest}
    assert all(checks.check_napkin_math(right))
    wrong = dict(right, add_bytes=4.8e10, smallest_add=lambda *a: smallest(*a) * 3 * a[1])
    fb = {f.part[:2]: f for f in checks.check_napkin_math(wrong)}
    assert "bits, not bytes" in fb["1b"].message and "not bytes" in fb["1d"].message
    off = checks.check_napkin_math(dict(right, smallest_add=lambda *a: smallest(*a) + 1))
    assert "one element fewer" in off[-1].message
    short = checks.check_napkin_math(dict(right, smallest_add=lambda *a: smallest(*a) // 2))
    assert "more elements are needed" in short[-1].message
    blank = checks.check_variants({})
    assert [f.status for f in blank] == ["not implemented"] * 5
    odd = checks.check_variants({"could_cross": "fma chain"})
    assert "expected a set" in odd[-1].message


def _judge_prediction(key, value):
    from helpers.grading.assignments import vector_add as va

    saved, va.KEY = va.KEY, key
    try:
        return SPEC.part("5e").judge({"step_predicted_us": value})
    finally:
        va.KEY = saved


def test_the_prediction_passes_the_model_and_names_each_slip():
    """5e against lesson 02's model (bytes / table bandwidth + launch floor): the model
    passes; each slip fails with its name, and no message shows the model's value."""
    from helpers.grading.assignments import vector_add as va

    k = keys_vector_add
    assert va.PRED_N == k.PRED_N
    values = k.answer_key()
    key = answers.exact_key(values)
    floor, n, bw = k.launch_floor_us(), k.PRED_N, k.GPU.hbm_bandwidth_gbs * 1e9
    per_element = k.STEP_BYTES / k.N
    right = n * per_element / bw * 1e6 + floor
    assert _judge_prediction(key, right), _judge_prediction(key, right)
    slips = {"bits, not bytes": 8 * n * per_element / bw * 1e6 + floor,
             "forget the writes": n * (per_element - 8) / bw * 1e6 + floor,
             "launch floor": n * per_element / bw * 1e6,
             "milliseconds": right / 1e3}
    for words, value in slips.items():
        fb = _judge_prediction(key, value)
        assert not fb and words in fb.message, (words, fb)
        assert f"{right:.4g}" not in fb.message and f"{right:.3g}" not in fb.message
"""Assignment 05 (fuse residual add + RMSNorm), graded end to end.

The solution scores full marks, the blank assignment zero (every part "not implemented"),
and each planted mistake, the solution with one slip a learner makes, loses exactly the
points of the parts it breaks, with a message that names the slip. The plants are made
from solutions/05_fusion.ipynb here, so they follow it when it changes (a replacement that
no longer applies fails loudly). All are graded in CPU mode by the grader's own code, in
fresh kernel processes, two at a time; on a GPU machine one more test grades the solution
in GPU mode, where the timed parts count.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

import helpers
from helpers.grading import fusion, grader, registry

from planting import edit  # tests/planting.py

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "05_fusion.ipynb"
ASSIGNMENT = REPO / "assignments" / "05_fusion.ipynb"
SPEC = registry.get("05_fusion")
POINTS = {p.key: p.points for p in SPEC.parts}
GPU_PARTS = {p.key for p in SPEC.parts if p.gpu}
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
LIMITS = grader.Limits(cell_timeout=120, part_timeout=120, total_timeout=600, memory_mb=3072)


_edit = edit


KERNEL_STORE = "tl.store(y_ptr + offsets, (hf * inv_rms * w).to(y_ptr.dtype.element_ty), mask=mask)"
LAUNCH = ("residual_rmsnorm_kernel[(M,)](x, residual, weight, h, y, N, eps,\n"
          "                                  BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)\n"
          "    return h, y")

# name -> (how to plant it, {part: words its message must contain}); every other part
# must keep its full points.
PLANTS = {
    "forgot_to_write_h": (
        _edit([("fused_bytes = 4 * MN * BF16 + N * BF16",
                "fused_bytes = 3 * MN * BF16 + N * BF16")]),
        {"1b": "forget to write h", "1c": "off by", "1d": "off by"}),
    "fp32_as_bf16_and_datasheet_bandwidth": (
        _edit([("BF16, FP32 = 2, 4", "BF16, FP32 = 2, 2"),
               ("fused_bytes / (copy_gbps * 1e9) * 1e3", "fused_bytes / (3350 * 1e9) * 1e3")]),
        {"1a": "fp32 copies at 2 bytes", "1c": "fp32 copies counted at 2 bytes",
         "1d": "datasheet"}),
    "nan_inverted_and_seconds": (
        _edit([("predicted_speedup = eager_bytes / fused_bytes",
                "predicted_speedup = fused_bytes / eager_bytes"),
               ("fused_bytes / (copy_gbps * 1e9) * 1e3", "fused_bytes / (copy_gbps * 1e9)")],
              append=['eager_bytes = float("nan")']),
        {"1a": "nan", "1c": "divide fused bytes by eager bytes", "1d": "seconds"}),
    "mean_over_block_and_unmasked_weight": (
        _edit([("tl.sum(hf * hf, axis=0) / n_cols + eps",
                "tl.sum(hf * hf, axis=0) / BLOCK_SIZE + eps"),
               ("w = tl.load(w_ptr + cols, mask=mask, other=0.0)", "w = tl.load(w_ptr + cols)")]),
        {"2a": "divide by n_cols", "2b": "past the end of w_ptr"}),
    "forgot_the_weight": (
        _edit([(KERNEL_STORE, KERNEL_STORE.replace("hf * inv_rms * w", "hf * inv_rms"))]),
        {"2a": "without the weight"}),
    "wrong_output_dtype": (
        _edit([("h, y = torch.empty_like(x), torch.empty_like(x)",
                "h, y = torch.empty_like(x, dtype=torch.float32), torch.empty_like(x)")]),
        {"2a": "float32 for float16 inputs"}),
    "torch_instead_of_triton": (
        _edit([(LAUNCH, "return rmsnorm.residual_rmsnorm_reference(x, residual, weight, eps)")]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel"}),
    "course_kernel_instead_of_own": (
        _edit([(LAUNCH, "return rmsnorm.residual_rmsnorm(x, residual, weight, eps)")]),
        {"2a": "not a kernel defined in your notebook",
         "2b": "not a kernel defined in your notebook"}),
    "syntax_error_in_kernel": (
        _edit([("mask = cols < n_cols\n", "mask = cols < n_cols)\n")]),
        {"2a": "SyntaxError", "2b": "SyntaxError"}),
}


def _cpu_mode_problem() -> str | None:
    """Why CPU mode cannot run on this machine (a known-bad Triton/NumPy pair), or None."""
    import numpy
    import triton

    from helpers import runtime

    try:
        runtime.check_versions(runtime.CPU, triton.__version__, numpy.__version__)
    except runtime.SetupError as err:
        return str(err)
    return None


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    problem = _cpu_mode_problem()
    if problem:
        pytest.skip(f"CPU-mode grading cannot run here: {problem}")
    root = tmp_path_factory.mktemp("submissions_05")
    solution = nbformat.read(SOLUTION, as_version=4)
    notebooks = []
    for name, (plant, _) in PLANTS.items():
        path = root / name / SOLUTION.name
        path.parent.mkdir()
        nbformat.write(plant(solution), path)
        notebooks.append((path, name))
    notebooks += [(SOLUTION, "solution"), (ASSIGNMENT, "blank")]
    reports = grader.grade_many(notebooks, assignment="05_fusion", limits=LIMITS, mode="cpu",
                                jobs=2)
    return {r.student: r.to_dict() for r in reports}


def _parts(report) -> dict:
    return {p["key"]: p for p in report["parts"]}


def test_the_solution_scores_full_marks(graded):
    report = graded["solution"]
    assert report["score"] == report["max_score"] == CPU_MAX, report
    assert {k for k, p in _parts(report).items() if p["status"] == "needs a GPU"} == GPU_PARTS
    assert report["pending_gpu_points"] == sum(POINTS[k] for k in GPU_PARTS)
    assert report["cells"] == [], "the solution notebook should run without errors"


def test_the_blank_assignment_scores_zero_without_crashing(graded):
    report = graded["blank"]
    assert report["score"] == 0 and report["max_score"] == CPU_MAX, report
    for key, part in _parts(report).items():
        expected = "needs a GPU" if key in GPU_PARTS else "not implemented"
        assert part["status"] == expected, part
    assert {c["ename"] for c in report["cells"]} == {"NotImplementedError"}, report["cells"]


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_mistake_loses_exactly_its_points(graded, name):
    report, expected = graded[name], PLANTS[name][1]
    for key, part in _parts(report).items():
        if key in GPU_PARTS:
            assert part["status"] == "needs a GPU" and part["points"] == 0
        elif key in expected:
            assert part["points"] == 0, f"part {key} should lose its points: {part}"
            assert expected[key].lower() in part["message"].lower(), (
                f"part {key}'s message should name the mistake ({expected[key]!r}): "
                f"{part['message']}")
        else:
            assert part["points"] == part["max_points"], f"part {key} should pass: {part}"
    assert report["score"] == CPU_MAX - sum(POINTS[k] for k in expected)


def test_the_assignment_is_registered_and_counts_20_points():
    assert registry.MODULES["05_fusion"] == "helpers.grading.fusion"
    assert SPEC.max_points == 20 and CPU_MAX == 15
    assert fusion.PREDICTED_SPEEDUP == pytest.approx(42 / 8, rel=1e-3)


def test_napkin_checks_name_the_classic_slips_without_a_notebook():
    right = {"eager_bytes": fusion.EAGER_BYTES, "fused_bytes": fusion.FUSED_BYTES,
             "predicted_speedup": fusion.PREDICTED_SPEEDUP,
             "predicted_ms": fusion.FUSED_BYTES / (fusion.reference_copy_gbps()[0] * 1e9) * 1e3}
    assert all(fusion.check_napkin_math(right))
    reads_only = sum(r for _, r, _ in rmsnorm_ops())
    wrong = dict(right, eager_bytes=reads_only, fused_bytes=2 * fusion.MN * 2)
    fb = {f.part[:2]: f for f in fusion.check_napkin_math(wrong)}
    assert "only what the kernels read" in fb["1a"].message
    assert "x and y only" in fb["1b"].message
    blank = fusion.check_napkin_math({})
    assert [f.status for f in blank] == ["not implemented"] * 4


def rmsnorm_ops():
    from helpers.kernels import rmsnorm

    return rmsnorm.eager_kernels(fusion.M, fusion.N, fusion.BF16)


@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed parts)")
def test_the_solution_scores_full_marks_on_a_gpu():
    (report,) = grader.grade_many([(SOLUTION, "solution")], assignment="05_fusion",
                                  limits=LIMITS, mode="gpu", jobs=1)
    parts = _parts(report.to_dict())
    assert report.score == report.max_score == SPEC.max_points, report.to_text()
    assert "faster" in parts["3a"]["message"] or "x (the bytes predict" in parts["3a"]["message"]


def test_the_timed_parts_need_a_correct_kernel_first():
    # Called directly (the registry would report "needs a GPU" in CPU mode): a submission
    # whose kernel is wrong or missing gets no timing points, and no GPU is touched.
    from helpers.kernels import rmsnorm

    torch_only = {"residual_rmsnorm": lambda x, r, w, eps=1e-6:
                  rmsnorm.residual_rmsnorm_reference(x, r, w, eps)}
    fusion._memo.clear()
    for key in ("3a", "3b"):
        fb = SPEC.part(key).check(torch_only)
        assert not fb.passed and "needs a correct, in-bounds kernel first" in fb.message, fb


LEARNER = """
import torch, triton, triton.language as tl

@triton.jit
def residual_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n_cols, eps,
                            BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    offsets = row * n_cols + cols
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + offsets, h, mask=mask)
    hf = h.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, (hf * inv_rms * w).to(y_ptr.dtype.element_ty), mask=mask)

def residual_rmsnorm(x, residual, weight, eps=1e-6):
    h, y = torch.empty_like(x), torch.empty_like(x)
    residual_rmsnorm_kernel[(x.shape[0],)](x, residual, weight, h, y, x.shape[1], eps,
                                           BLOCK_SIZE=triton.next_power_of_2(x.shape[1]))
    return h, y
"""

GPU_MODE_EMULATION = """
import sys
import triton.language as tl
from triton.runtime.jit import JITFunction
import learner                      # defined before helpers: a compiled-kernel JITFunction
assert isinstance(learner.residual_rmsnorm_kernel, JITFunction)
assert isinstance(tl.standard.sum, JITFunction)
from helpers import runtime
runtime.MODE = "gpu"                # as the grader runs on a GPU, with host tensors
runtime.device = lambda: "cpu"
from helpers.grading import fusion
fusion._compiled_run = lambda fn, ns: None
results = fusion.check_kernel(vars(learner))
print(results)
sys.exit(0 if all(results) else 1)
"""


def test_gpu_mode_bounds_check_runs_kernels_that_use_reductions(tmp_path):
    # On a GPU the checks run the learner's kernel interpreted (to watch its accesses)
    # while tl.sum stays a compiled-kernel function that refuses a Python call; the grader
    # lets the interpreted kernel call it through the interpreter. Emulated on the CPU in
    # a fresh process where Triton was imported without the interpreter.
    import os
    import subprocess
    import sys

    (tmp_path / "learner.py").write_text(LEARNER)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_MODE")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    out = subprocess.run([sys.executable, "-c", GPU_MODE_EMULATION], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "7 / 7 points" in out.stdout

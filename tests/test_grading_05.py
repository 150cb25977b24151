"""Assignment 05 (fuse residual add + LayerNorm): the grader's pieces.

The solution, the blank assignment and the planted mistakes (tests/plants_05.py) are
graded end to end by tests/test_grading_lessons.py. Here: the answer key against PyTorch's
own dispatch, the napkin checks and the hints judged without a notebook, the speed goal
against the bytes, the kernel check as the grader runs it on a GPU; on a GPU machine one
more test grades the solution in GPU mode, where the timed parts count.
"""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.grading import grader, leaks, registry
from helpers.grading.assignments import fusion, keys_fusion

from planting import LIMITS, check_kernel_as_on_a_gpu, parts_of, solution  # tests/planting.py

SOLUTION = solution("05_fusion")
SPEC = registry.get("05_fusion")
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
KEY = keys_fusion.answer_key()


def test_the_assignment_is_registered_and_counts_20_points():
    assert registry.MODULES["05_fusion"] == "helpers.grading.assignments.fusion"
    assert SPEC.max_points == 20 and CPU_MAX == 15


def test_the_key_is_what_pytorch_dispatches_for_the_eager_version():
    """Part 1a's answer is the eager version's trace: twelve kernels, every fp32
    intermediate of M x N counted at 4 bytes (the solution's count by hand agrees)."""
    k = keys_fusion
    calls = k.dispatched("eager")
    assert len(calls) == 12 and calls.bytes == KEY["1a"][0]
    mn, m, n = k.M * k.N, k.M, k.N
    assert calls.bytes == 58 * mn + 8 * m * 4 + 2 * n * 2
    assert KEY["1c"][0] == pytest.approx(calls.bytes / k.FUSED_BYTES)


def test_the_course_ships_no_layernorm_kernel_that_answers_part_2():
    """No course module holds the answer (the strict release's list of known answers has
    no entry for assignment 05 any more)."""
    assert not [k for k in leaks.KNOWN_ANSWERS if "rmsnorm" in k or "layernorm" in k]
    import helpers.kernels as kernels

    names = {n for m in vars(kernels).values() for n in dir(m)} | set(dir(kernels))
    assert not [n for n in names if "layernorm" in n.lower() or "layer_norm" in n.lower()]


def test_napkin_checks_name_the_classic_slips_without_a_notebook():
    k = keys_fusion
    right = {"eager_bytes": KEY["1a"][0], "fused_bytes": k.FUSED_BYTES,
             "predicted_speedup": KEY["1c"][0],
             "predicted_ms": k.FUSED_BYTES / (k.reference_copy_gbps()[0] * 1e9) * 1e3}
    assert all(fusion.check_napkin_math(right))
    reads_only = sum(c.read for c in k.dispatched("eager"))
    wrong = dict(right, eager_bytes=reads_only, fused_bytes=6 * k.MN * 2 + 4 * k.N)
    fb = {f.part[:2]: f for f in fusion.check_napkin_math(wrong)}
    assert "only what the kernels read" in fb["1a"].message
    assert "read the row twice" in fb["1b"].message
    torch_only = dict(right, predicted_speedup=k.dispatched("torch").bytes / k.FUSED_BYTES)
    fb = {f.part[:2]: f for f in fusion.check_napkin_math(torch_only)}
    assert "over add + F.layer_norm" in fb["1c"].message
    blank = fusion.check_napkin_math({})
    assert [f.status for f in blank] == ["not implemented"] * 4


@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed parts)")
def test_the_solution_scores_full_marks_on_a_gpu():
    (report,) = grader.grade_many([(SOLUTION, "solution")], assignment="05_fusion",
                                  limits=LIMITS, mode="gpu", jobs=1)
    parts = parts_of(report.to_dict())
    assert report.score == report.max_score == SPEC.max_points, report.to_text()
    assert "add + F.layer_norm" in parts["3a"]["message"]


def test_the_timed_parts_need_a_correct_kernel_first(monkeypatch):
    # A torch-only launcher fails the kernel parts, so the timed parts are refused before
    # anything is timed (judged as in GPU mode; no GPU is touched).
    from helpers import runtime

    torch_only = {"residual_layernorm": fusion.residual_layernorm_torch}
    raw = registry.collect(SPEC, "kernel", torch_only, 0)
    kernel = {p.key: registry.judge(p, raw)[0] for p in SPEC.unit("kernel")}
    assert kernel and not any(fb.passed for fb in kernel.values()), kernel
    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    for key in ("3a", "3b"):
        fb = registry._blocked(SPEC, SPEC.part(key), lambda p: kernel[p.key])
        assert fb is not None and not fb.passed, fb
        assert "needs a correct, in-bounds kernel first" in fb.message, fb


def test_the_speed_goal_needs_the_fusion_not_only_bandwidth():
    """3a races add + F.layer_norm: the add and the norm as two kernels at full bandwidth
    would reach what the bytes predict, 1.25x; the goal asks for more, which only a fused
    kernel near the copy bandwidth reaches (1.57x on an H100: the GPU test below)."""
    k = keys_fusion
    torch_bytes = k.dispatched("torch").bytes
    assert 1 < torch_bytes / k.FUSED_BYTES < fusion.SPEEDUP_GOAL < 1.5


def _timings(ratio):
    return {"yours": 0.1, "torch": 0.1 * ratio, "norm_only": 0.08, "eager": 0.9,
            "gpu": "a GPU", "copy_gbps": 3000.0, "bytes": keys_fusion.FUSED_BYTES}


def test_a_kernel_below_the_speed_goal_loses_3a():
    assert fusion._speed(_timings(1.02 * fusion.SPEEDUP_GOAL)).passed
    fb = fusion._speed(_timings(0.98 * fusion.SPEEDUP_GOAL))
    assert not fb.passed and f"the goal is {fusion.SPEEDUP_GOAL:g}x" in fb.message, fb
    assert "count what your kernel reads" in fb.message
    assert "F.layer_norm alone ran at 56% of the copy bandwidth" in fb.message


LEARNER = """
import torch, triton, triton.language as tl

@triton.jit
def residual_layernorm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, h_ptr, y_ptr, n_cols, eps,
                              BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offsets = row * n_cols + cols
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + offsets, h, mask=mask)
    hf = h.to(tl.float32)
    mean = tl.sum(hf, axis=0) / n_cols
    d = tl.where(mask, hf - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)

def residual_layernorm(x, residual, weight, bias, eps=1e-5):
    h, y = torch.empty_like(x), torch.empty_like(x)
    residual_layernorm_kernel[(x.shape[0],)](x, residual, weight, bias, h, y, x.shape[1], eps,
                                             BLOCK=triton.next_power_of_2(x.shape[1]))
    return h, y
"""


def test_gpu_mode_bounds_check_runs_kernels_that_use_reductions(tmp_path):
    # On a GPU the checks run the learner's kernel interpreted (to watch its accesses)
    # while tl.sum stays a compiled-kernel function that refuses a Python call; the grader
    # lets the interpreted kernel call it through the interpreter.
    out = check_kernel_as_on_a_gpu(tmp_path, LEARNER, "fusion", "residual_layernorm_kernel")
    assert "7 / 7 points" in out


def _row(seed, cols=1000):
    g = torch.Generator().manual_seed(seed)
    h = 0.5 + 2 * torch.randn(5, cols, generator=g) + torch.randn(5, cols, generator=g)
    w = 1 + 0.1 * torch.randn(cols, generator=g)
    b = 0.5 * torch.randn(cols, generator=g)
    return h, w, b


@pytest.mark.parametrize("slip, words", [
    (lambda n, w, b, h: n * w, "without the bias"),
    (lambda n, w, b, h: n + b, "without the weight"),
    (lambda n, w, b, h: fusion._layernorm(h, centred=False) * w + b, "RMSNorm"),
    (lambda n, w, b, h: fusion._layernorm(h, unbiased=True) * w + b, "n_cols - 1"),
    (lambda n, w, b, h: n * 1.07 * w + b, "not the block size"),
    (lambda n, w, b, h: n * (1 + fusion.EPS * (h - h.mean(-1, keepdim=True)).double().pow(2)
                             .mean(-1, keepdim=True).sqrt()) * w + b, "eps belongs inside"),
])
def test_each_slip_in_y_is_named_whatever_the_seed(slip, words):
    for seed in range(20):
        h, w, b = _row(seed)
        normed = fusion._layernorm(h)
        got = slip(normed, w.double(), b.double(), h).float()
        hint = fusion._diagnose_y(got, h, w, b)
        assert words in hint, (seed, hint)


def test_the_shortcut_variance_fails_only_on_rows_far_from_zero():
    """mean(h^2) - mean(h)^2 in fp32 passes ordinary rows and fails the far ones, with the
    hint that names it; the centred variance passes both."""
    task = fusion.TASK

    def shortcut(h):
        hf = h.float()
        mean = hf.mean(-1, keepdim=True)
        return (hf - mean) * torch.rsqrt((hf * hf).mean(-1, keepdim=True) - mean * mean
                                         + fusion.EPS)

    for rows, fails in (("randn", False), ("far from zero", True)):
        case = task.case((4, 1000), torch.float32, rows).seeded(3)
        x, r, w, b = task.inputs(case, "cpu")
        h, want = task.reference(case, (x, r, w, b))
        got = (shortcut(h) * w + b).to(h.dtype)
        problem = task.compare(case, (h, got), (h, want), (x, r, w, b), {})
        assert (problem is not None) == fails, problem
        if fails:
            assert "lost its digits" in problem, problem


def test_the_trace_opens_only_once_part_1a_is_right():
    """The trace's total is part 1a's answer: before 1a is right it shows nothing of it."""
    right = KEY["1a"][0]
    for before in (None, ..., "many", 1e9, right // 8):
        text = fusion.trace_after_1a(before)
        assert "opens once part 1a is right" in text
        assert f"{right:,}" not in text and "aten" not in text
    text = fusion.trace_after_1a(right)
    assert "aten.add" in text and f"traced: {right:,}" in text

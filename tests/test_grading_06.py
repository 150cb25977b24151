"""Assignment 06 (FlashAttention for sliding windows and soft-capped scores): the grader's
pieces.

The solution, the blank assignment and the planted mistakes (tests/plants_06.py) are
graded end to end by tests/test_grading_lessons.py. Here: the merge check and the timed
parts judged without a notebook or a GPU, the kernel check as the grader runs it on a GPU;
on a GPU machine one more test grades the solution in GPU mode, where the timed parts count.
"""

from __future__ import annotations

import math

import nbformat
import pytest
import torch

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import attention as graded
from helpers.grading.assignments import attention_backward as backward
from helpers.grading.assignments.keys_attention import merge_exact

from planting import LIMITS, check_kernel_as_on_a_gpu, parts_of, solution  # tests/planting.py

SOLUTION = solution("06_flash_attention")
SPEC = registry.get("06_flash_attention")
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)


def test_the_assignment_is_registered_and_counts_33_points():
    assert registry.MODULES["06_flash_attention"] == "helpers.grading.assignments.attention"
    assert SPEC.max_points == 33 and CPU_MAX == 27


def test_merge_check_names_the_slips_without_a_notebook():
    inf = math.inf

    def right(m_a, l_a, acc_a, m_b, l_b, acc_b):
        return tuple(t.float() for t in merge_exact(m_a, l_a, acc_a, m_b, l_b, acc_b))

    def unscaled(m_a, l_a, acc_a, m_b, l_b, acc_b):     # exp of the raw maxima
        m = torch.maximum(m_a, m_b)
        a, b, back = torch.exp(m_a), torch.exp(m_b), torch.exp(-torch.where(m == -inf, 0, m))
        return m, (a * l_a + b * l_b) * back, (a[:, None] * acc_a + b[:, None] * acc_b) \
            * back[:, None]

    assert all(graded.check_merge({"merge_states": right}))
    (fb,) = graded.check_merge({"merge_states": unscaled})
    assert not fb.passed and "overflows" in fb.message, fb
    (fb,) = graded.check_merge({"merge_states": lambda *args: args[:2]})
    assert not fb.passed and "expected three tensors" in fb.message, fb
    def stub(*args):
        raise NotImplementedError()

    (fb,) = graded.check_merge({"merge_states": stub})
    assert fb.status == "not implemented", fb


def test_the_timed_parts_judge_the_window_and_both_masks_against_their_goals():
    # Judged as on a GPU, from raw timings (no GPU is touched).
    from helpers.grading.assignments import attention_speed as speed

    def raw(yours_causal, yours_window):
        return {"gpu": "a GPU", "no mask": dict(error=1e-3, yours=1.0, course=0.9),
                "causal": dict(error=1e-3, yours=yours_causal, course=0.5),
                "window": dict(error=1e-3, yours=yours_window, course=0.5)}

    fast = raw(0.55, 0.5 / (1.05 * speed.WINDOW_GOAL))
    assert SPEC.part("3a").judge(fast).passed and SPEC.part("3b").judge(fast).passed
    skips_nothing = raw(1.0, 0.5 / (0.95 * speed.WINDOW_GOAL))
    fb = SPEC.part("3b").judge(skips_nothing)
    assert not fb.passed and "stop at the diagonal" in fb.message, fb
    fb = SPEC.part("3a").judge(skips_nothing)
    assert not fb.passed and "the tile its first query's window reaches" in fb.message, fb
    wrong = {**fast, "window": {**fast["window"], "error": 1.0}}
    assert "SDPA's with the window as a mask" in SPEC.part("3a").judge(wrong).message
    wrong = {**fast, "causal": {**fast["causal"], "error": 1.0}}
    assert "differs from the course's kernel" in SPEC.part("3b").judge(wrong).message


def test_the_timed_parts_need_a_correct_kernel_first(monkeypatch):
    # A torch-only launcher fails the kernel parts, so the timed parts are refused before
    # anything is timed (judged as in GPU mode; no GPU is touched).
    from helpers import runtime

    torch_only = {"attention_forward": lambda q, k, v, causal=False, window=None, softcap=None:
                  tuple(t.float() for t in graded.variant_reference(q, k, v, causal, window,
                                                                     softcap))}
    raw = registry.collect(SPEC, "kernel", torch_only, 0)
    kernel = {p.key: registry.judge(p, raw)[0] for p in SPEC.unit("kernel")}
    assert kernel and not any(fb.passed for fb in kernel.values()), kernel
    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    for key in ("3a", "3b"):
        fb = registry._blocked(SPEC, SPEC.part(key), lambda p: kernel[p.key])
        assert fb is not None and not fb.passed, fb
        assert "needs a correct, in-bounds kernel first" in fb.message, fb


def test_the_variant_reference_is_the_courses_without_a_window_or_a_cap():
    from helpers.kernels import attention

    q, k, v = (torch.randn(2, 9, 16, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        want = attention.attention_reference(q, k, v, causal)
        got = graded.variant_reference(q, k, v, causal)
        assert all(torch.allclose(a, b) for a, b in zip(got, want))
    o, _ = graded.variant_reference(q, k, v, True, window=1)
    assert torch.allclose(o, v)                          # a window of one: each row its own v


@pytest.mark.parametrize("how, words", [
    (dict(window=None), "sliding window is missing"),
    (dict(window=38), "one key too many"),
    (dict(window=36), "one key too few"),
    (dict(window=37, softcap=None, cap_case=5.0), "not soft-capped"),
])
def test_each_mask_and_cap_slip_is_named(how, words):
    cap_case = how.pop("cap_case", None)
    case = graded.TASK.case(67, 16, torch.float32, True, window=37, softcap=cap_case).seeded(3)
    inputs = graded.TASK.inputs(case, "cpu")
    got = graded.variant_reference(*inputs, causal=True, **{"softcap": None, **how})[0].float()
    problem = graded.TASK.compare(case, (got,), None, inputs, {"BLOCK_M": 32, "BLOCK_N": 32})
    assert problem and words in problem, problem


def test_the_backward_written_out_is_autograds():
    # The hints compare a wrong gradient with the backward written out step by step, each
    # step left out in turn: with every step in, it is float64 autograd's.
    for causal, window, softcap in ((False, None, 2.0), (True, 9, None), (True, 5, 3.0)):
        case = backward.TASK.case(23, 16, torch.float32, causal, window=window,
                                  softcap=softcap).seeded(1)
        inputs = backward.TASK.inputs(case, "cpu")
        for want, got in zip(backward.reference_grads(case, inputs),
                             backward._by_hand(case, inputs)):
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("slip, words", [
    (dict(cap_derivative=False), "back through that function"),
    (dict(scaled=False), "1/sqrt(d)"),
    (dict(delta=False), "normalisation"),
    (dict(windowed=False), "left of a query's window"),
    (dict(masked=False), "a query does not see"),
])
def test_each_backward_slip_is_named(slip, words):
    case = backward.TASK.case(67, 16, torch.float32, True, window=37, softcap=2.0).seeded(3)
    inputs = backward.TASK.inputs(case, "cpu")
    got = tuple(g.float() for g in backward._by_hand(case, inputs, **slip))
    problem = backward.TASK.compare(case, got, None, inputs, {"BLOCK_M": 32, "BLOCK_N": 32})
    assert problem and words in problem, problem
    assert backward.TASK.compare(case, tuple(g.float() for g in backward._by_hand(
        case, inputs)), None, inputs, {}) is None


def test_gpu_mode_watches_a_kernel_that_calls_its_own_helper(tmp_path):
    # On a GPU the checks run the notebook's kernel interpreted (to watch its loads), and
    # the kernel calls attend_tiles, another @triton.jit function of the notebook.
    nb = nbformat.read(SOLUTION, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"
             and ("@triton.jit" in c.source or "def attention_forward" in c.source)]
    out = check_kernel_as_on_a_gpu(
        tmp_path, "import math\nimport torch\nimport triton\nimport triton.language as tl\n\n"
        + "\n\n".join(cells) + "\n\nfrom helpers.kernels import attention  # after the kernels\n",
        "attention", "flash_forward_kernel")
    assert "16 / 16 points" in out


@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed parts)")
def test_the_solution_scores_full_marks_on_a_gpu():
    (report,) = grader.grade_many([(SOLUTION, "solution")], assignment="06_flash_attention",
                                  limits=LIMITS, mode="gpu", jobs=1)
    parts = parts_of(report.to_dict())
    assert report.score == report.max_score, report.to_text()
    # 2d, 2e and 4c may be unwatched (an interpreter that cannot run loops on that machine).
    assert report.max_score >= SPEC.max_points - 6, report.to_text()
    assert "window of 512" in parts["3a"]["message"] and "course" in parts["3b"]["message"]

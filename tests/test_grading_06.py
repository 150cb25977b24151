"""Assignment 06 (a FlashAttention forward kernel), graded end to end.

The solution scores full marks, the blank assignment zero (every part "not implemented"),
and each planted mistake, the solution with one slip a learner makes, loses exactly the
points of the parts it breaks, with a message that names the slip. The plants are made
from solutions/06_flash_attention.ipynb here, so they follow it when it changes (a
replacement that no longer applies fails loudly). All are graded in CPU mode by the
grader's own code, in fresh kernel processes, two at a time; on a GPU machine one more test
grades the solution in GPU mode, where the timed parts count.
"""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest
import torch

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import attention as graded

from planting import (assert_blank, assert_full_marks,  # tests/planting.py
                      assert_loses_exactly, check_kernel_as_on_a_gpu, edit, grade_plants,
                      parts_of)

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "06_flash_attention.ipynb"
SPEC = registry.get("06_flash_attention")
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
LIMITS = grader.Limits(cell_timeout=120, part_timeout=120, total_timeout=600, memory_mb=3072)

RESCALED_L = "l_i = l_i * rescale + tl.sum(p, 1)"
RESCALED_ACC = "acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None])"
LAUNCH = "    flash_forward_kernel[grid]("
LSE = "lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453"

# name -> (how to plant it, {part: words its message must contain}); every other part
# must keep its full points.
PLANTS = {
    "no_rescaling": (
        edit([(RESCALED_L, "l_i = l_i + tl.sum(p, 1)"),
              (RESCALED_ACC, "acc = tl.dot(p.to(v.dtype), v, acc)")]),
        {"2a": "rescale l and acc", "2b": "rescale l and acc"}),
    # The textbook softmax sum: right on ordinary scores, inf/NaN on scores in the hundreds.
    "max_not_subtracted": (
        edit([(RESCALED_L, "l_i = l_i + tl.sum(p, 1)"),
              (RESCALED_ACC, "acc = tl.dot(p.to(v.dtype), v, acc)"),
              ("p = tl.math.exp2(s - m_new[:, None])", "p = tl.math.exp2(s)"),
              (LSE, "lse = tl.math.log2(l_i) * 0.6931471805599453")]),
        {"2a": "exp overflows", "2b": "exp overflows"}),
    "causal_mask_j_less_than_i": (
        edit([("cols[None, :] <= rows[:, None]", "cols[None, :] < rows[:, None]")]),
        {"2b": "j <= i"}),
    # The unmasked loop runs one tile too far: into the tile where the diagonal starts.
    "diagonal_tile_without_mask": (
        edit([("unmasked_end = tl.minimum(start_m, full_end)",
               "unmasked_end = tl.minimum(start_m + BLOCK_N, full_end)")]),
        {"2b": "tile where the diagonal starts"}),
    "lse_not_stored": (
        edit([("    tl.store(lse_ptr + head + rows, lse, mask=rows < seq_len)\n", "")]),
        {"2c": "never stored by your kernel"}),
    "lse_in_base_2": (
        edit([(LSE, "lse = m_i + tl.math.log2(l_i)")]),
        {"2c": "base 2"}),
    "fp16_accumulator": (
        edit([("acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)",
               "acc = tl.zeros((BLOCK_M, HEAD_DIM), q.dtype)"),
              (RESCALED_ACC, "acc = tl.dot(p.to(v.dtype), v, (acc * rescale[:, None])"
                             ".to(v.dtype), out_dtype=v.dtype)")]),
        {"2f": "65504"}),
    "every_causal_tile_visited": (
        edit([("stop = tl.minimum(start_m + BLOCK_M, seq_len)", "stop = seq_len")]),
        {"2d": "wholly above the diagonal"}),
    # Right on every length that is a multiple of the tile; wrong only where the last tile
    # is partial: the mask tests the rows, so the padding keys count with score 0.
    "padded_keys_unmasked": (
        edit([("visible = cols[None, :] < seq_len", "visible = rows[:, None] < seq_len")]),
        {"2a": "padded keys"}),
    # Right on every row that sees a key; NaN only on the fully masked rows.
    "merge_nan_on_fully_masked_rows": (
        edit([('shift = torch.where(m == float("-inf"), 0.0, m)', "shift = m")]),
        {"1": "exp(-inf - (-inf)) is NaN"}),
    "torch_instead_of_triton": (
        edit([(LAUNCH, "    return attention.attention_reference(q, k, v, causal)\n" + LAUNCH)]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel",
         "2c": "make 2a and 2b pass first", "2d": "launched no Triton kernel",
         "2e": "no kernel of yours ran", "2f": "launched no Triton kernel"}),
}


@pytest.fixture(scope="module")
def graded_plants(tmp_path_factory):
    return grade_plants(tmp_path_factory, "06_flash_attention", PLANTS, limits=LIMITS)


def test_the_solution_scores_full_marks(graded_plants):
    assert_full_marks(graded_plants["solution"], SPEC)
    assert graded_plants["solution"]["max_score"] == CPU_MAX


def test_the_blank_assignment_scores_zero_without_crashing(graded_plants):
    assert_blank(graded_plants["blank"], SPEC)


# Parts a plant may lose or keep, depending on the grader's random inputs: without its
# rescale, l (and so the lse) is off only for rows whose maximum rises in a later key
# tile, by more than the tolerance only where it rises enough; whether the lse part's
# cases have such a row depends on the seed (a full CI run once lost 2c to it).
EITHER = {"no_rescaling": ("2c",)}


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_mistake_loses_exactly_its_points(graded_plants, name):
    assert_loses_exactly(graded_plants[name], SPEC, PLANTS[name][1], EITHER.get(name, ()))


def test_the_assignment_is_registered_and_counts_25_points():
    assert registry.MODULES["06_flash_attention"] == "helpers.grading.assignments.attention"
    assert SPEC.max_points == 25 and CPU_MAX == 19


def test_merge_check_names_the_slips_without_a_notebook():
    inf = math.inf

    def right(m_a, l_a, acc_a, m_b, l_b, acc_b):
        return tuple(t.float() for t in graded.merge_exact(m_a, l_a, acc_a, m_b, l_b, acc_b))

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


def test_the_timed_parts_judge_both_masks_against_their_goals():
    # Judged as on a GPU, from raw timings (no GPU is touched).
    def raw(yours_causal):
        modes = {"no mask": dict(error=1e-3, yours=1.0, naive=4.0, course=0.9),
                 "causal": dict(error=1e-3, yours=yours_causal, naive=4.0, course=0.5)}
        return {"gpu": "a GPU", **modes}

    fast, skips_nothing = raw(0.55), raw(1.0)
    assert SPEC.part("3a").judge(fast).passed and SPEC.part("3b").judge(fast).passed
    assert SPEC.part("3a").judge(skips_nothing).passed
    fb = SPEC.part("3b").judge(skips_nothing)
    assert not fb.passed and "stop at the diagonal" in fb.message, fb
    wrong = {**fast, "causal": {**fast["causal"], "error": 1.0}}
    assert "differs from the course's kernel" in SPEC.part("3a").judge(wrong).message


def test_the_timed_parts_need_a_correct_kernel_first(monkeypatch):
    # A torch-only launcher fails the kernel parts, so the timed parts are refused before
    # anything is timed (judged as in GPU mode; no GPU is touched).
    from helpers import runtime
    from helpers.kernels import attention

    torch_only = {"attention_forward": lambda q, k, v, causal=False: tuple(
        t.float() for t in attention.attention_reference(q, k, v, causal))}
    raw = registry.collect(SPEC, "kernel", torch_only, 0)
    kernel = {p.key: registry.judge(p, raw)[0] for p in SPEC.unit("kernel")}
    assert kernel and not any(fb.passed for fb in kernel.values()), kernel
    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    for key in ("3a", "3b"):
        fb = registry._blocked(SPEC, SPEC.part(key), lambda p: kernel[p.key])
        assert fb is not None and not fb.passed, fb
        assert "needs a correct, in-bounds kernel first" in fb.message, fb


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
    assert report.max_score >= SPEC.max_points - 4, report.to_text()   # 2d, 2e may be unwatched
    assert "naive" in parts["3a"]["message"] and "course" in parts["3b"]["message"]

"""Assignment 04 (a tiled matmul designed for the H100), graded end to end.

The solution scores full marks, the blank assignment zero (every part "not implemented"),
and each planted mistake, the solution with one slip a learner makes (a missing K mask, a
wrong K stride, an fp16 accumulator, torch.matmul instead of a kernel, an H100 choice that
overflows shared memory or spills registers, ...), loses exactly
the points of the parts it breaks, with a message that names the slip. The plants are made
from solutions/04_tiling.ipynb here, so they follow it when it changes (a replacement that
no longer applies fails loudly). All are graded in CPU mode by the grader's own code, in
fresh kernel processes, two at a time; on a GPU machine one more test grades the solution
in GPU mode, where the timed part counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import keys_tiling, tiling
from helpers import intensity

from planting import (assert_blank, assert_full_marks,  # tests/planting.py
                      assert_loses_exactly, edit, grade_plants, parts_of)

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "04_tiling.ipynb"
ASSIGNMENT = REPO / "assignments" / "04_tiling.ipynb"
SPEC = registry.get("04_tiling")
POINTS = {p.key: p.points for p in SPEC.parts}
GPU_PARTS = {p.key for p in SPEC.parts if p.gpu}
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
LIMITS = grader.Limits(cell_timeout=120, part_timeout=120, total_timeout=600, memory_mb=3072)


_edit = edit


LOAD_A = "a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)"
LOAD_B = "b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)"
LAUNCH = ("matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), "
          "b.stride(1),")
CONFIG = "H100_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8)"

# name -> (how to plant it, {part: words its message must contain}, parts whose outcome
# depends on the machine); every other part must keep its full points.
#
# Why "depends on the machine": in CPU mode the grader's bounds guard turns a load outside
# every tensor into a masked load (zeros), so an unmasked read past the end of B multiplies
# by zero and the values can still come out right; a read that lands in the memory of the
# launch's other tensors is not outside any of them. Where the allocator puts A, B and C
# decides which happens. The part that grades bounds always catches the slip.
PLANTS = {
    "fp32_bytes": (
        _edit([("BYTES_BF16 = 64, 128, 32, 5, 2", "BYTES_BF16 = 64, 128, 32, 5, 4")]),
        {"1a": "4 bytes per element", "1b": "4 bytes per element"}, ()),
    "one_stage": (
        _edit([("tile_sram_bytes = STAGES_1 * bytes_per_step",
                "tile_sram_bytes = bytes_per_step")]),
        {"1b": "one stage"}, ()),
    "no_k_mask": (
        _edit([(LOAD_A, "a = tl.load(a_ptrs, mask=offs_m[:, None] < M, other=0.0)"),
               (LOAD_B, "b = tl.load(b_ptrs, mask=offs_n[None, :] < N, other=0.0)")]),
        {"2b": "mask offs_k < K - k", "2c": "the K tail"}, ("2a",)),
    "wrong_k_stride": (
        _edit([("b_ptrs += BLOCK_K * stride_bk", "b_ptrs += BLOCK_K * stride_bn")]),
        {"2a": "BLOCK_K * stride_bk", "2b": "BLOCK_K * stride_bk", "2d": "wrong result"},
        ("2c",)),
    "fp16_accumulator": (
        _edit([("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
                "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)"),
               ("acc = tl.dot(a, b, acc)", "acc += tl.dot(a, b).to(tl.float16)")]),
        {"2d": "keep the running sum in fp32"}, ()),
    "torch_matmul": (
        _edit([(LAUNCH, "return torch.matmul(a, b)\n    " + LAUNCH)]),
        {"2a": "launched no Triton kernel", "2b": "launched no Triton kernel",
         "2c": "no kernel of yours ran", "2d": "launched no Triton kernel",
         "3c": "the kernel matmul launches", "3d": "the kernel matmul launches"}, ()),
    "syntax_error_in_kernel": (
        _edit([("offs_k = tl.arange(0, BLOCK_K)\n", "offs_k = tl.arange(0, BLOCK_K))\n")]),
        {"2a": "SyntaxError", "2b": "SyntaxError", "2c": "SyntaxError", "2d": "SyntaxError",
         "3c": "SyntaxError", "3d": "SyntaxError"}, ()),
    # Right everywhere but on a single row, where it hands the product to torch.
    "torch_for_a_single_row": (
        _edit([("    M, K = a.shape\n    N = b.shape[1]\n",
                "    M, K = a.shape\n    N = b.shape[1]\n    if M == 1:   # a matrix-vector "
                "product: torch will do\n        return (a.float() @ b.float()).to(a.dtype)\n")]),
        {"2a": "launched no Triton kernel"}, ()),
    # A kernel that stores nothing; torch writes C around it.
    "torch_result_around_an_idle_kernel": (
        _edit([("    return c\n", "    c.copy_(torch.matmul(a.float(), b.float()).to(a.dtype))\n"
                "    return c\n"),
               ("    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),\n"
                "             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))\n", "")]),
        {"2a": "never stored by your kernel", "2b": "never stored by your kernel",
         "2c": "did not compute the output", "2d": "never stored by your kernel",
         "3b": "the compiled kernel asks for"}, ()),
    # Part 3, the H100 design, graded on the kernel compiled for sm_90.
    "overflowing_config": (
        _edit([(CONFIG, CONFIG.replace("num_stages=4", "num_stages=5"))]),
        {"3c": "out of resource: shared memory"}, ()),
    "spilling_config": (
        _edit([(CONFIG, CONFIG.replace("num_warps=8", "num_warps=4"))]),
        {"3d": "spilled to local memory"}, ()),
    "sram_without_stages": (
        _edit([("h100_sram_bytes = H100_CONFIG[\"num_stages\"] * h100_step_bytes",
                "h100_sram_bytes = h100_step_bytes")]),
        {"3b": "one stage"}, ()),
    "intensity_off_by_2x": (
        _edit([("h100_intensity = 2 * bm * bn * bk / h100_step_bytes",
                "h100_intensity = bm * bn * bk / h100_step_bytes")]),
        {"3a": "one FLOP per multiply-add"}, ()),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return grade_plants(tmp_path_factory, "04_tiling", PLANTS, limits=LIMITS)


def test_the_solution_scores_full_marks(graded):
    assert_full_marks(graded["solution"], SPEC)
    assert graded["solution"]["max_score"] == CPU_MAX


def test_the_blank_assignment_scores_zero_without_crashing(graded):
    assert_blank(graded["blank"], SPEC)


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_mistake_loses_exactly_its_points(graded, name):
    _, expected, either = PLANTS[name]
    assert_loses_exactly(graded[name], SPEC, expected, either)


def test_the_assignment_is_registered_and_its_answers_come_from_the_napkin_math():
    assert registry.MODULES["04_tiling"] == "helpers.grading.assignments.tiling"
    assert SPEC.max_points == 22 and CPU_MAX == 18
    k = keys_tiling
    assert k.INTENSITY == pytest.approx(intensity.tile_intensity(64, 128, 32, torch.bfloat16))
    assert k.SRAM == 5 * (64 * 32 + 32 * 128) * 2


def test_napkin_checks_name_the_classic_slips_without_a_notebook():
    right = {"tile_intensity": keys_tiling.INTENSITY, "tile_sram_bytes": keys_tiling.SRAM}
    assert all(tiling.check_napkin_math(right))
    wrong = {"tile_intensity": 8 * keys_tiling.INTENSITY,
             "tile_sram_bytes": keys_tiling.SRAM // keys_tiling.TILE_STAGES}
    fb = {f.part[:2]: f for f in tiling.check_napkin_math(wrong)}
    assert not fb["1a"].passed and "bits vs bytes" in fb["1a"].message
    assert "one stage" in fb["1b"].message
    blank = tiling.check_napkin_math({})
    assert [f.status for f in blank] == ["not implemented"] * 2


def test_shapes_put_a_partial_tile_on_every_edge():
    for blocks in [(32, 32, 32), (128, 256, 64), (16, 64, 16)]:
        shapes = tiling.shapes_for(blocks)
        bm, bn, bk = blocks
        assert any(M % bm and N % bn and K % bk for M, N, K in shapes)
        assert any(K < bk for _, _, K in shapes), "a K shorter than one block"
        assert (1, 1, 1) in shapes


@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed part)")
def test_the_solution_scores_full_marks_on_a_gpu():
    (report,) = grader.grade_many([(SOLUTION, "solution")], assignment="04_tiling",
                                  limits=LIMITS, mode="gpu", jobs=1)
    parts = parts_of(report.to_dict())
    if tiling.TASK.unwatchable():
        # Triton < 3.7 with NumPy >= 2.4 (not the course's pins): the bounds part cannot be
        # graded here, says why and counts nowhere; everything else must pass, compiled.
        assert parts["2c"]["status"] == "not checked here" and "Triton" in parts["2c"]["message"]
        assert report.score == report.max_score == SPEC.max_points - POINTS["2c"], \
            report.to_text()
    else:
        assert report.score == report.max_score == SPEC.max_points, report.to_text()

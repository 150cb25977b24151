"""Assignment 04 (a tiled matmul), graded end to end.

The solution scores full marks, the blank assignment zero (every part "not implemented"),
and each planted mistake, the solution with one slip a learner makes (a missing K mask, a
wrong K stride, an fp16 accumulator, torch.matmul instead of a kernel, ...), loses exactly
the points of the parts it breaks, with a message that names the slip. The plants are made
from solutions/04_tiling.ipynb here, so they follow it when it changes (a replacement that
no longer applies fails loudly). All are graded in CPU mode by the grader's own code, in
fresh kernel processes, two at a time; on a GPU machine one more test grades the solution
in GPU mode, where the timed part counts.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch

import helpers
from helpers.grading import grader, registry, tiling
from helpers.kernels import matmul as mm

from planting import edit  # tests/planting.py

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
        _edit([("BYTES_BF16 = 64, 128, 32, 4, 2", "BYTES_BF16 = 64, 128, 32, 4, 4")]),
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
         "2c": "no kernel of yours ran", "2d": "launched no Triton kernel"}, ()),
    "syntax_error_in_kernel": (
        _edit([("offs_k = tl.arange(0, BLOCK_K)\n", "offs_k = tl.arange(0, BLOCK_K))\n")]),
        {"2a": "SyntaxError", "2b": "SyntaxError", "2c": "SyntaxError", "2d": "SyntaxError"},
        ()),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("submissions_04")
    solution = nbformat.read(SOLUTION, as_version=4)
    notebooks = []
    for name, (plant, _, _) in PLANTS.items():
        path = root / name / SOLUTION.name
        path.parent.mkdir()
        nbformat.write(plant(solution), path)
        notebooks.append((path, name))
    notebooks += [(SOLUTION, "solution"), (ASSIGNMENT, "blank")]
    reports = grader.grade_many(notebooks, assignment="04_tiling", limits=LIMITS, mode="cpu",
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
    assert {c["ename"] for c in report["cells"]} <= {"NotImplementedError", "NameError"}, \
        report["cells"]


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_mistake_loses_exactly_its_points(graded, name):
    report, (_, expected, either) = graded[name], PLANTS[name]
    lost = 0
    for key, part in _parts(report).items():
        if key in GPU_PARTS:
            assert part["status"] == "needs a GPU" and part["points"] == 0
        elif key in expected:
            assert part["points"] == 0, f"part {key} should lose its points: {part}"
            assert expected[key].lower() in part["message"].lower(), (
                f"part {key}'s message should name the mistake ({expected[key]!r}): "
                f"{part['message']}")
        elif key in either:
            assert part["points"] in (0, part["max_points"]), part
        else:
            assert part["points"] == part["max_points"], f"part {key} should pass: {part}"
        lost += part["max_points"] - part["points"] if key not in GPU_PARTS else 0
    assert lost >= sum(POINTS[k] for k in expected)
    assert report["score"] == CPU_MAX - lost


def test_the_assignment_is_registered_and_its_answers_come_from_the_napkin_math():
    assert registry.MODULES["04_tiling"] == "helpers.grading.tiling"
    assert SPEC.max_points == 15 and CPU_MAX == 12
    assert tiling.INTENSITY == pytest.approx(mm.tile_intensity(64, 128, 32, torch.bfloat16))
    assert tiling.SRAM == 4 * (64 * 32 + 32 * 128) * 2


def test_napkin_checks_name_the_classic_slips_without_a_notebook():
    right = {"tile_intensity": tiling.INTENSITY, "tile_sram_bytes": tiling.SRAM}
    assert all(tiling.check_napkin_math(right))
    wrong = {"tile_intensity": 8 * tiling.INTENSITY, "tile_sram_bytes": tiling.SRAM // 4}
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
    parts = _parts(report.to_dict())
    if tiling._unguarded_reason():
        # Triton < 3.7 with NumPy >= 2.4 (not the course's pins): the bounds part cannot be
        # graded and says why; everything else must still pass, compiled.
        assert parts["2c"]["status"] == "error" and "Triton" in parts["2c"]["message"]
        assert report.score == SPEC.max_points - POINTS["2c"], report.to_text()
    else:
        assert report.score == report.max_score == SPEC.max_points, report.to_text()

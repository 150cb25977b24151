"""Assignment 09 (FP8 by design): the grader's pieces.

The solution, the blank assignment and the planted mistakes (tests/plants_09.py) are graded
end to end by tests/test_grading_lessons.py. Here: the spec of the power-of-two scales, the
grader's draws (budgets no error sits near, a cheapest granularity that depends on the
shape), the course's own quantisation refused by part 2's check, and on a GPU the solution
graded in GPU mode, where the timed parts count.
"""

from __future__ import annotations

import math

import pytest
import torch

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import fp8 as graded
from helpers.grading.assignments import fp8_granularity as g1
from helpers.kernels import fp8

from planting import parts_of, solution  # tests/planting.py

SOLUTION = solution("09_fp8")
SPEC = registry.get("09_fp8")


def test_the_assignment_is_registered_and_counts_24_points():
    assert registry.MODULES["09_fp8"] == "helpers.grading.assignments.fp8"
    assert SPEC.max_points == 24
    assert sum(p.points for p in SPEC.parts if not p.gpu) == 18


def test_the_spec_puts_each_groups_largest_value_in_256_to_512():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 300, generator=g) * 10 ** (4 * torch.rand(9, 1, generator=g) - 2)
    x[4] = 0
    q, s = graded.quantize_1x128_reference(x)
    assert s.shape == (9, 3) and s.dtype == torch.float32
    assert torch.equal(torch.frexp(s)[0], torch.full_like(s, 0.5)), "powers of two"
    assert (s[4] == 1).all(), "a group of zeros takes the scale 1"
    pad = torch.zeros(9, 384)
    pad[:, :300] = x
    top = pad.view(9, 3, 128).abs().amax(-1) / s
    live = top > 0
    assert ((top[live] >= 256) & (top[live] < 512)).all()
    assert q.float().abs().max() == 448, "values past 448 saturate"
    assert not q.float().isnan().any()


def test_the_course_quantisation_is_not_the_assignments_spec():
    """Part 2 asks for what the course does not ship: lesson 09's quantize (amax / 448)
    fails the check, with a message that names the difference."""
    task = graded.TASK
    case = task.case((7, 1000), torch.float32).seeded(3)
    inputs = task.inputs(case, helpers.device())
    got = fp8.quantize(inputs[0], "1x128")
    problem = task.compare(case, got, task.reference(case, inputs), inputs, {})
    assert problem and "powers of two" in problem


def test_the_cheapest_granularity_depends_on_the_shape():
    # Tall and narrow: a scale per row costs more than 128 x 128 blocks; short and wide:
    # the other way round. The check's hint says so without naming the order.
    assert math.prod(g1.true_scale_shape((384, 256), "row")) > \
        math.prod(g1.true_scale_shape((384, 256), "128x128"))
    assert math.prod(g1.true_scale_shape((2, 4096), "row")) < \
        math.prod(g1.true_scale_shape((2, 4096), "128x128"))


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_budget_sits_clear_of_every_error_and_has_an_answer(seed):
    for i, (kind, shape, size) in enumerate(g1._tensor_draws(seed)):
        x = g1.drawn_tensor(kind, shape, size, seed + i)
        budget, best, errors = g1._budget_and_answer(x, seed + i)
        assert errors[best] <= budget
        assert all(abs(budget - e) > 0.05 * e for e in errors.values()), (kind, budget, errors)


def test_part_1_names_the_slips_without_the_answer():
    shapes = g1._shape_draws(5)
    right = {i: list(g1.true_scale_shape(s, g)) for i, (s, g) in enumerate(shapes)}
    raw = {"values": right, registry.SEED: 5}
    assert g1._judge_shapes(raw).passed
    floor = {i: [s[0] // {"tensor": s[0], "row": 1, "1x128": 1, "128x128": 128}[g],
                 s[1] // {"tensor": s[1], "row": s[1], "1x128": 128, "128x128": 128}[g]]
             for i, (s, g) in enumerate(shapes)}
    fb = g1._judge_shapes({"values": floor, registry.SEED: 5})
    assert not fb.passed and "round the count of groups up" in fb.message
    bytes_as_count = {i: g1.true_overhead(s, g) / 4 for i, (s, g) in enumerate(shapes)}
    fb = g1._judge_overhead({"values": bytes_as_count, registry.SEED: 5})
    assert not fb.passed and "4 bytes" in fb.message
    assert str(g1.true_overhead(*shapes[0])) not in fb.message


@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed parts)")
def test_the_solution_scores_full_marks_on_a_gpu():
    (report,) = grader.grade_many([(SOLUTION, "solution")], assignment="09_fp8",
                                  limits=grader.Limits(cell_timeout=300, part_timeout=300,
                                                       total_timeout=900, memory_mb=16384),
                                  mode="gpu", jobs=1)
    parts = parts_of(report.to_dict())
    assert report.score >= report.max_score - 2, report.to_text()   # 2b may be unwatched
    assert parts["3a"]["points"] == 3 and parts["3b"]["points"] == 3, report.to_text()

"""Assignment 09 (FP8 by design): the grader's pieces.

The solution, the blank assignment and the planted mistakes (tests/plants_09.py) are graded
end to end by tests/test_grading_lessons.py. Here: the spec of the power-of-two scales, the
grader's draws (budgets no error sits near, a cheapest granularity that depends on the
shape), the course's own quantisation refused by part 2's check, part 3c's budgets and
expected answers from stubbed error tables (its errors need a GPU's tensor cores), and on a
GPU the solution and the plant that never promotes graded in GPU mode, where part 3 counts.
"""

from __future__ import annotations

import math
import re

import nbformat
import pytest
import torch

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import fp8 as graded
from helpers.grading.assignments import fp8_granularity as g1
from helpers.grading.assignments import fp8_promotion as g3
from helpers.kernels import fp8

import plants_09  # tests/plants_09.py
from planting import parts_of, solution, write_plants  # tests/planting.py

SOLUTION = solution("09_fp8")
SPEC = registry.get("09_fp8")


def test_the_assignment_is_registered_and_counts_27_points():
    assert registry.MODULES["09_fp8"] == "helpers.grading.assignments.fp8"
    assert SPEC.max_points == 27
    assert sum(p.points for p in SPEC.parts if not p.gpu) == 18
    assert sum(p.points for p in SPEC.parts if p.gpu) == 9
    part = SPEC.part("3c")
    assert part.points == 3 and part.gpu and part.names == ("pick_promotion",)


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


# Part 3c: the promotion picked from an error table the grader measures on a GPU. Tables
# shaped as an H100 measured them (lesson 09's record: all-positive sums drift with K far
# past the promoted errors, mixed signs less). The record holds 0 and 128 only: the errors
# at 64 and 32 here are a guess, a little below 128's.

def h100_like(draw) -> dict:
    K = draw["shape"][2]
    if draw["signs"] == "positive":
        return {0: 1.5e-2 * K / 1024, 128: 6.0e-4, 64: 5.0e-4, 32: 2.5e-4}
    return {0: 5.4e-4 * (K / 1024) ** 0.5, 128: 1.28e-4, 64: 1.25e-4, 32: 1.2e-4}


def raw_for(seed, answers, tables=None):
    draws = g3.promotion_draws(seed)
    tables = tables or [h100_like(d) for d in draws]
    return {"values": {i: answers(d, t) for i, (d, t) in enumerate(zip(draws, tables))},
            "errors": [[t[P] for P in g3.PROMOTIONS] for t in tables], registry.SEED: seed,
            "gpu": "a stub"}


@pytest.mark.skipif(helpers.is_gpu(), reason="CPU mode's verdict")
def test_part_3c_is_graded_on_a_gpu_only():
    # In CPU mode the check waits for a GPU without collecting: nothing is called.
    def never_called(*args):
        raise AssertionError("part 3c collected in CPU mode")

    results = graded.check_promotion({"pick_promotion": never_called})
    assert [fb.status for fb in results] == ["needs a GPU"] and results.max_points == 0


def test_the_expected_promotion_is_the_cheapest_within_budget():
    table = {0: 0.23, 128: 6e-4, 64: 5.5e-4, 32: 2e-4}
    assert g3.cheapest_within(table, 1.0) == 0
    assert g3.cheapest_within(table, 1e-3) == 128
    assert g3.cheapest_within(table, 3e-4) == 32
    assert g3.cheapest_within(table, 1e-4) is None
    # Not monotone (a measured table need not be): the cheapest within budget still wins.
    assert g3.cheapest_within({0: 1e-3, 128: 2e-4, 64: 3e-4, 32: 1e-4}, 2.5e-4) == 128
    assert g3.separable_budgets(table) == pytest.approx(
        [(2e-4 * 5.5e-4) ** 0.5, (6e-4 * 0.23) ** 0.5, g3.ABOVE * 0.23])


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_the_draws_span_long_sums_of_both_signs(seed):
    draws = g3.promotion_draws(seed)
    assert draws == g3.promotion_draws(seed), "a pure function of the seed"
    assert {d["signs"] for d in draws} == {"positive", "mixed"}
    for d in draws:
        M, N, K = d["shape"]
        assert M == N and M in g3.SIDES and K % 128 == 0 and 1024 <= K <= 65536
    assert any(d["signs"] == "positive" and d["shape"][2] >= 16384 for d in draws)


@pytest.mark.parametrize("seed", range(20))
def test_every_budget_sits_clear_of_every_error(seed):
    """Random tables, neighbouring errors close or far: each draw's budget is at least
    sqrt(1.5) from every error and leaves some setting within it."""
    rng = torch.Generator().manual_seed(seed)
    for draw in g3.promotion_draws(seed):
        levels = 10 ** (-5 + 4 * torch.rand(4, generator=rng))
        if seed % 2:
            levels[1:3] = levels[1] * (1 + 0.3 * torch.rand(2, generator=rng))   # near
        table = dict(zip(g3.PROMOTIONS, levels.tolist()))
        budget = g3.budget_for(table, draw["role"], draw["u"])
        assert g3.cheapest_within(table, budget) is not None
        for e in table.values():
            assert max(e / budget, budget / e) >= g3.SEPARATE ** 0.5 * (1 - 1e-9), (table, budget)


def test_the_h100_tables_ask_for_each_kind_of_answer():
    """On tables like an H100's, the draws ask for no promotion somewhere and for some
    elsewhere: a solution that always or never promotes fails."""
    for seed in range(10):
        answers = set()
        for d in g3.promotion_draws(seed):
            table = h100_like(d)
            answers.add(g3.cheapest_within(table, g3.budget_for(table, d["role"], d["u"])))
        assert 0 in answers and answers - {0}, (seed, answers)


def test_part_3c_names_the_mistake_without_the_answer():
    def right(d, t):
        return float(g3.cheapest_within(t, g3.budget_for(t, d["role"], d["u"])))

    fb = g3._judge_promotion(raw_for(4, right))
    assert fb.passed, fb.message
    fb = g3._judge_promotion(raw_for(4, lambda d, t: 0.0))          # the plant
    assert not fb.passed and "returned 0 (never promote)" in fb.message and "K = " in fb.message
    fb = g3._judge_promotion(raw_for(4, lambda d, t: 32.0))
    assert not fb.passed and "more often than needed" in fb.message
    fb = g3._judge_promotion(raw_for(4, lambda d, t: 16.0))
    assert not fb.passed and "not one of (0, 32, 64, 128)" in fb.message
    fb = g3._judge_promotion(raw_for(4, lambda d, t: True))
    assert not fb.passed and "not one of" in fb.message
    fb = g3._judge_promotion(raw_for(4, lambda d, t: "raised ValueError: no GPU"))
    assert not fb.passed and "raised ValueError: no GPU" in fb.message
    # Promoting too rarely where the cheapest answer promotes more often than every 128.
    tables = [{0: 0.5, 128: 6e-4, 64: 5.8e-4, 32: 1e-4}] * len(g3.promotion_draws(4))
    fb = g3._judge_promotion(raw_for(4, lambda d, t: 128.0, tables))
    assert not fb.passed and "still drifts past the budget" in fb.message
    # The messages name the learner's setting, never the expected one.
    for wrong in (0.0, 32.0):
        fb = g3._judge_promotion(raw_for(4, lambda d, t, wrong=wrong: wrong))
        named = re.findall(r"(?:promote_every=|every )(\d+)", fb.message)
        assert set(named) <= {str(int(wrong))}, fb.message
    assert g3._judge_promotion({"not_implemented": True}).status == "not implemented"
    with pytest.raises(registry.MissingAnswer):
        g3._judge_promotion({"missing": "pick_promotion"})


def test_the_solution_runs_through_the_collector(monkeypatch):
    """The solution's pick_promotion on the grader's collection (tiny sizes, the
    interpreter, where every setting's error is the same), judged as the grader does."""
    nb = nbformat.read(SOLUTION, as_version=4)
    ns = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and ("import helpers" in cell.source
                                         or "def pick_promotion" in cell.source):
            exec(compile(cell.source, "<solution>", "exec"), ns)
    small = [{**d, "shape": (16, 16, 256)} for d in g3.promotion_draws(2)]
    monkeypatch.setattr(g3, "promotion_draws", lambda seed: small)
    raw = g3._collect_promotion(ns, 2)
    raw[registry.SEED] = 2
    assert len(raw["errors"]) == len(small)
    if helpers.is_cpu():
        assert all(len(set(row)) == 1 for row in raw["errors"]), "exact sums"
    fb = g3._judge_promotion(raw)
    assert fb.passed, fb.message
    raw = g3._collect_promotion({"pick_promotion": lambda *a: 1 / 0}, 2)
    raw[registry.SEED] = 2
    assert "raised ZeroDivisionError" in g3._judge_promotion(raw).message


def test_the_drawn_operands_are_e4m3_with_one_scale_each():
    a, b, a_s, b_s = g3.drawn_operands((8, 12, 256), "positive", 3, device="cpu")
    assert a.shape == (8, 256) and b.shape == (12, 256) and a.dtype == torch.float8_e4m3fn
    assert a_s.shape == b_s.shape == (1, 1) and a_s.dtype == torch.float32
    assert (a.float() >= 0).all() and (b.float() >= 0).all()
    assert a.float().abs().max() == 448
    mixed = g3.drawn_operands((8, 12, 256), "mixed", 3, device="cpu")[0]
    assert (mixed.float() < 0).any()


@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed parts)")
def test_the_solution_scores_full_marks_on_a_gpu(tmp_path):
    """GPU mode, where part 3 counts: the solution, and the plant that never promotes,
    which loses part 3c alone."""
    plant = write_plants(tmp_path, "09_fp8",
                         {"promotion_missing": plants_09.PLANTS["promotion_missing"]})
    reports = grader.grade_many([(SOLUTION, "solution"), *plant], assignment="09_fp8",
                                limits=grader.Limits(cell_timeout=300, part_timeout=300,
                                                     total_timeout=900, memory_mb=16384),
                                mode="gpu", jobs=1)
    report, missing = sorted(reports, key=lambda r: r.student != "solution")
    parts = parts_of(report.to_dict())
    assert report.score >= report.max_score - 2, report.to_text()   # 2b may be unwatched
    assert parts["3a"]["points"] == 3 and parts["3b"]["points"] == 3, report.to_text()
    assert parts["3c"]["points"] == 3, report.to_text()
    lost = parts_of(missing.to_dict())
    assert lost["3c"]["points"] == 0 and "never promote" in lost["3c"]["message"], \
        missing.to_text()
    for key in set(parts) - {"2b", "3c"}:                            # 2b: as above
        assert lost[key]["points"] == parts[key]["points"], (key, missing.to_text())

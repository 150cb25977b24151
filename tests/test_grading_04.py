"""Assignment 04 (a tiled linear layer designed for the H100): the grader's pieces.

The solution, the blank assignment and the planted mistakes (tests/plants_04.py) are
graded end to end by tests/test_grading_lessons.py. Here: the answer key comes from the
napkin math, the napkin checks name the classic slips without a notebook, the shapes put a
partial tile on every edge; on a GPU machine one more test grades the solution in GPU
mode, where the timed part counts.
"""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import keys_tiling, tiling
from helpers import intensity

from planting import LIMITS, parts_of, solution  # tests/planting.py

SOLUTION = solution("04_tiling")
SPEC = registry.get("04_tiling")
POINTS = {p.key: p.points for p in SPEC.parts}
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)


def test_the_assignment_is_registered_and_its_answers_come_from_the_napkin_math():
    assert registry.MODULES["04_tiling"] == "helpers.grading.assignments.tiling"
    assert SPEC.max_points == 27 and CPU_MAX == 23
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


def _waves_raw(waves_fn, choose_fn, seed=5):
    from helpers.grading.registry import SEED
    raw = tiling.waves.collect({"waves": waves_fn, "choose_setting": choose_fn}, seed)
    raw[SEED] = seed
    return raw


def test_part_5_passes_the_model_and_names_each_slip():
    w = tiling.waves
    table = w.settings()

    def best(M, N):
        return max(range(len(table)), key=lambda i: w.predicted_tflops(M, N, table[i]))

    raw = _waves_raw(w.wave_count, best)
    assert w.judge_waves(raw).passed and w.judge_choice(raw).passed

    def whole_tiles_only(M, N, s):          # partial tiles forgotten
        return -(-(M * N) // (s["BLOCK_M"] * s["BLOCK_N"] * w.GPU.sm_count * w.per_sm(s)))

    def one_per_sm(M, N, s):
        return -(-(-(-M // s["BLOCK_M"]) * -(-N // s["BLOCK_N"])) // w.GPU.sm_count)

    for slip, words in ((whole_tiles_only, "partial tile"),
                        (one_per_sm, "more than one program")):
        fb = w.judge_waves(_waves_raw(slip, best))
        assert not fb.passed and words in fb.message, fb.message
    fastest = max(range(len(table)), key=lambda i: table[i]["tflops"])
    fb = w.judge_choice(_waves_raw(w.wave_count, lambda M, N: fastest))
    assert not fb.passed and "of the best setting's speed" in fb.message, fb.message
    fb = w.judge_choice(_waves_raw(w.wave_count, lambda M, N: "big"))
    assert not fb.passed and "a row of the table" in fb.message


def test_every_seed_draws_shapes_where_the_fastest_setting_is_not_the_one_to_launch():
    w = tiling.waves
    table = w.settings()
    fastest = max(table, key=lambda r: r["tflops"])
    for seed in range(40):
        shares = [w.predicted_tflops(M, N, fastest)
                  / max(w.predicted_tflops(M, N, s) for s in table) for M, N in w.draws(seed)]
        assert min(shares) < w.GOAL, seed

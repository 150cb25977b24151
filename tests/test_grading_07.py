"""Assignment 07 (autotuning the online softmax from a recorded sweep): the grader's pieces.

The solution, the blank assignment and the planted mistakes (tests/plants_07.py) are
graded end to end by tests/test_grading_lessons.py. Here more slips are judged in this
process, without a notebook: spaces, prune rules and keys called directly, the trials the
grader draws, the tuning judge on made-up timings; on a GPU machine two more tests run the
tuning part for real.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import autotuning as at
from helpers.kernels import softmax as sk

from planting import parts_of, solution  # tests/planting.py

SPEC = registry.get("07_autotuning")
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
GPU_LIMITS = grader.Limits(cell_timeout=540, part_timeout=540, total_timeout=1200,
                           memory_mb=16384)


def test_the_assignment_is_registered_and_counts_15_points():
    assert registry.MODULES["07_autotuning"] == "helpers.grading.assignments.autotuning"
    assert SPEC.max_points == 15 and CPU_MAX == 12


def test_the_sweep_is_whole_and_half_of_it_is_held_out():
    shapes, grid = at.shapes(), at.sweep()["grid"]
    assert len(shapes) == 24 and len(grid) == 66
    assert all(len(at.sweep()["ms"][s]) == len(grid) for s in shapes)
    assert sum(n in at.SHOWN_COLS for _, n in shapes) == 12
    # The course's own rule is more than 10 % off the best on most recorded shapes.
    rec = helpers.records.load("softmax_tuning")
    off = [c[3] / min(ms) > at.COVER for c, ms in zip(rec.results["course_rule"],
                                                      rec.results["ms"])]
    assert sum(off) >= 18


# ------------------------------------------------------------------------------------
# The learner's functions called directly.
# ------------------------------------------------------------------------------------

def cfg(b, w, s=1):
    return triton.Config({"BLOCK_SIZE": b}, num_warps=w, num_stages=s)


def space(per_thread=(4, 16), stages=(1,)):
    return [cfg(b, b // (32 * p), s) for b in (512, 1024, 2048, 4096, 8192, 16384)
            for p in per_thread for s in stages if 1 <= b // (32 * p) <= 32]


def make_prune(whole_row=False, fallback=True, keep_all=False, course=False):
    def prune(configs, named_args, **kwargs):
        rows, cols = named_args["x_ptr"].shape[0], named_args["n_cols"]
        row = triton.next_power_of_2(max(cols, 1))
        if keep_all:
            return list(configs)
        if course:
            block = min(sk.ONLINE_BLOCK, row)
            return [c for c in configs if c.kwargs["BLOCK_SIZE"] == block
                    and c.num_warps == sk.num_warps_for(block)]

        def clamp(b):
            return min(16384, max(512, b))
        blocks = {clamp(row // 4), clamp(row // 2)} | ({8192} if row >= 65536 else set())
        if rows < 256 or whole_row:
            blocks.add(clamp(row))
        if whole_row:                   # one block: the whole row, as lesson 05's first kernel
            blocks = {clamp(row)}
        kept = [c for c in configs if c.kwargs["BLOCK_SIZE"] in blocks
                and c.kwargs["BLOCK_SIZE"] // (32 * c.num_warps) in (4, 8, 16)]
        if not kept and fallback:
            kept = [min(configs, key=lambda c: abs(math.log2(c.kwargs["BLOCK_SIZE"])
                                                   - math.log2(clamp(row // 2))))]
        return kept
    return prune


def key(M, N):
    return (0 if M < 256 else 1 if M < 4096 else 2), min(triton.next_power_of_2(max(N, 1)), 65536)


RIGHT = {"config_space": space, "prune": make_prune(), "shape_key": key}


def mutating(configs, named_args, **kwargs):
    kept = make_prune()(configs, named_args)
    configs[:] = kept
    return configs


SLIPS = [  # (answers, {part: words}); every other part of 1a-3b must pass
    ({}, {}),
    ({"config_space": lambda: [cfg(512, 4, 2)] + space()}, {"1a": "not one of the settings"}),
    ({"config_space": lambda: space() + [cfg(512, 4)]}, {"1a": "appears twice"}),
    ({"config_space": lambda: space(per_thread=(4, 8, 16))}, {"1a": "at most 12"}),
    ({"config_space": lambda: [triton.Config({"BLOCK_SIZE": 512, "num_warps": 4})]},
     {"1a": "exactly BLOCK_SIZE", "1b": "no valid setting"}),
    # The course's own rule as the space: one setting per block.
    ({"config_space": lambda: [cfg(b, sk.num_warps_for(b), 3) for b in (512, 1024, 2048, 4096,
                                                                          8192, 16384)]},
     {"1b": "slower than the sweep's best"}),
    ({"config_space": lambda: space(per_thread=(16,))}, {"1b": "slower than the sweep's best"}),
    ({"prune": make_prune(keep_all=True)}, {"2b": "at most 18"}),
    ({"prune": make_prune(course=True)},
     {"2a": "drops every setting within", "2c": "keeps nothing"}),
    ({"prune": make_prune(whole_row=True)}, {"2a": "drops every setting within"}),
    ({"prune": make_prune(fallback=False)}, {"2c": "keeps nothing"}),
    ({"prune": mutating}, {"2a": "changes the list", "2b": "changes the list",
                           "2c": "changes the list"}),
    ({"prune": lambda configs, named_args: make_prune()(configs, named_args)},
     {"2a": "**kwargs", "2b": "**kwargs", "2c": "**kwargs"}),
    ({"shape_key": lambda M, N: (M, N)}, {"3b": "at most 64"}),
    ({"shape_key": lambda M, N: tuple(max(16, triton.next_power_of_2(n)) for n in (M, N))},
     {"3b": "at most 64"}),
    ({"shape_key": lambda M, N: (min(triton.next_power_of_2(N), 65536),)},
     {"3a": "share your key"}),
    ({"shape_key": lambda M, N: [M < 256, N]}, {"3a": "hashable", "3b": "hashable"}),
]


def verdicts(**answers):
    ns = {**RIGHT, **answers, registry.SEED: 3}
    return {fb.part.split()[0]: fb for fb in [*at.check_space(ns), *at.check_prune(ns),
                                               *at.check_key(ns)]}


@pytest.mark.parametrize("answers, expected", SLIPS, ids=range(len(SLIPS)))
def test_each_slip_loses_its_parts_with_a_message_that_names_it(answers, expected):
    for part, fb in verdicts(**answers).items():
        if part in expected:
            assert not fb.passed and expected[part] in fb.message, fb
        else:
            assert fb.passed, fb


def test_unanswered_parts_say_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    results = verdicts(config_space=stub, prune=stub, shape_key=stub)
    assert {fb.status for fb in results.values()} == {"not implemented"}, results


def test_the_drawn_trials_come_from_the_seed_and_reach_the_edges():
    assert at.drawn_prunes(1) != at.drawn_prunes(2)
    assert {(t["M"], t["N"]) for t in at.drawn_prunes(1)} >= {(1, 1), (65536, 262144)}
    shapes = at.drawn_shapes(5)
    assert len(shapes) == at.KEY_DRAWS and shapes != at.drawn_shapes(6)
    assert max(m for m, _ in shapes) == 65536 and min(n for _, n in shapes) == 1
    M, N = at.tuning_shape(4)
    assert 100 <= M <= 16384 and 700 <= N <= 120000 and (M, N) not in at.sweep()["ms"]


def tuning_raw(seed, chosen_ms, **extra):
    return {registry.SEED: seed, "shape": list(at.tuning_shape(seed)), "gpu": "a GPU",
            "space": 10, "kept": 3, "tune_s": 1.5, "max_error": 1e-4,
            "chosen": [1024, 8, 1], "sweep": [{"config": [2048, 16, 1], "ms": 0.1},
                                              {"config": [1024, 8, 1], "ms": chosen_ms}],
            **extra}


def test_the_tuning_judge_holds_the_tuned_setting_to_10_percent_of_the_space():
    judge = SPEC.part("4").judge         # called directly: registry.judge waits for a GPU
    assert judge(tuning_raw(7, 0.109)).passed
    fb = judge(tuning_raw(7, 0.115))
    assert not fb.passed and "1.150x" in fb.message and "BLOCK_SIZE=2048" in fb.message
    assert "grader's shape" in judge({**tuning_raw(7, 0.1), registry.SEED: 8}).message
    assert "softmax is wrong" in judge(tuning_raw(7, 0.1, max_error=0.5)).message
    assert "tuner failed" in judge(tuning_raw(7, 0.1, error="AutotunerError: no configs")).message


# ------------------------------------------------------------------------------------
# On a GPU machine: the tuning part for real.
# ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed parts)")
def test_the_solution_scores_full_marks_on_a_gpu():
    (report,) = grader.grade_many([(solution("07_autotuning"), "solution")],
                                  assignment="07_autotuning", limits=GPU_LIMITS, mode="gpu",
                                  jobs=1)
    parts = parts_of(report.to_dict())
    assert report.score == report.max_score == SPEC.max_points, report.to_text()
    assert "the best of the space's full sweep" in parts["4"]["message"]


@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed parts)")
def test_a_prune_that_keeps_only_the_smallest_block_misses_the_goal_on_a_gpu():
    def smallest(configs, named_args, **kwargs):
        return [min(configs, key=lambda c: (c.kwargs["BLOCK_SIZE"], c.num_warps))]

    raw = at.tune_and_sweep(space, smallest, key, *at.tuning_shape(1), seed=1)
    fb = SPEC.part("4").judge({**raw, registry.SEED: 1})
    assert not fb.passed and "does your prune drop it" in fb.message, fb
    assert torch.cuda.is_available()

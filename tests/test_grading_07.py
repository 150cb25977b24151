"""Assignment 07 (autotuning): the grader's pieces.

The solution, the blank assignment and the planted mistakes (tests/plants_07.py) are
graded end to end by tests/test_grading_lessons.py. Here more slips are judged in this
process, without a notebook: spaces, prune rules and keys called directly, the trials the
grader draws, the tuning judge on made-up timings; on a GPU machine two more tests run the
tuning part for real.
"""

from __future__ import annotations

import pytest
import torch
import triton

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import autotuning as at

from planting import parts_of, solution  # tests/planting.py

SPEC = registry.get("07_autotuning")
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
GPU_LIMITS = grader.Limits(cell_timeout=540, part_timeout=540, total_timeout=1200,
                           memory_mb=16384)


def test_the_assignment_is_registered_and_counts_15_points():
    assert registry.MODULES["07_autotuning"] == "helpers.grading.assignments.autotuning"
    assert SPEC.max_points == 15 and CPU_MAX == 12
    assert at.SMEM_LIMIT == 227 * 1024      # the H100's shared memory a program, from the table


# ------------------------------------------------------------------------------------
# More slips, judged in this process: the learner's functions called directly.
# ------------------------------------------------------------------------------------

def bucket(n):
    return max(16, triton.next_power_of_2(n))


def make_prune(limit=at.SMEM_LIMIT, stages=True, size=None, regs_ok=None, small=None):
    def prune(configs, named_args, **kwargs):
        M, N = named_args["M"], named_args["N"]
        s = size or named_args["a_ptr"].element_size()
        kept = []
        for c in configs:
            bm, bn, bk = (c.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
            shared = (c.num_stages if stages else 1) * (bm * bk + bk * bn) * s
            regs = bm * bn / (32 * c.num_warps)
            if shared <= limit and (regs_ok or (lambda r: r <= 128))(regs) \
                    and (small or (lambda m, n: bm <= bucket(m) and bn <= bucket(n)))(M, N):
                kept.append(c)
        return kept
    return prune


def space(*extra):
    return lambda: [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                                  num_warps=w, num_stages=s) for bm, bn, bk, w, s in (
        (128, 256, 64, 8, 4), (128, 128, 64, 4, 3), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3),
        (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 32, 4, 5),
        (128, 256, 64, 8, 3), (256, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 5),
        (16, 64, 128, 4, 4), (16, 128, 128, 4, 3), (32, 64, 128, 4, 4), (32, 128, 64, 4, 4))
        + extra]


RIGHT = {"config_space": space(), "prune": make_prune(),
         "shape_key": lambda M, N, K: tuple(bucket(n) for n in (M, N, K))}


def verdicts(**answers):
    ns = dict(RIGHT, **answers)
    results = [*at.check_space(ns), *at.check_prune(ns), *at.check_key(ns)]
    return {fb.part.split()[0]: fb for fb in results}


SLIPS = [  # (answers, {part: words}); every other CPU part must pass
    ({}, {}),
    ({"prune": make_prune(limit=10 ** 9)}, {"2a": "it never checks the shared memory"}),
    ({"prune": make_prune(regs_ok=lambda r: True)}, {"2a": "never checks the accumulator"}),
    ({"prune": make_prune(small=lambda m, n: True)}, {"2b": "keeps tiles of any size"}),
    ({"prune": lambda c, a, **k: list(c)}, {"2a": "keeps it", "2b": "keeps it"}),
    ({"prune": lambda configs, named_args: configs}, {"2a": "**kwargs", "2b": "**kwargs",
                                                     "2c": "**kwargs"}),
    ({"prune": lambda c, a, **k: None}, {"2a": "returns a NoneType", "2b": "NoneType",
                                        "2c": "NoneType"}),
    ({"prune": lambda c, a, **k: c.clear() or c},
     {"2a": "changes the list it is given", "2b": "drops it", "2c": "drops 128x256x64"}),
    ({"shape_key": lambda M, N, K: tuple(triton.next_power_of_2(n) for n in (M, N, K))},
     {"3b": "the floor"}),
    ({"shape_key": lambda M, N, K: (bucket(M), bucket(N))},
     {"3a": "ignores K", "3b": "ignores K"}),
    ({"shape_key": lambda M, N, K: [bucket(M), bucket(N), bucket(K)]},
     {"3a": "hashable", "3b": "hashable"}),
    ({"shape_key": lambda M, N, K: 0}, {"3a": "different buckets", "3b": "different buckets"}),
    ({"config_space": space((64, 64, 64, 4, 4))}, {"1b": "appears twice"}),
    ({"config_space": lambda: space()()[:8]}, {"1b": "12 to 40"}),
    ({"config_space": lambda: [c for c in space()() if c.kwargs["BLOCK_M"] > 32]},
     {"1b": "BLOCK_M <= 32"}),
    ({"config_space": lambda: [c.kwargs for c in space()()]},
     {"1a": "not a triton.Config", "1b": "0 valid"}),
    ({"config_space": lambda: space()() + [triton.Config(
        {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "PRECISION": "tf32"})]},
     {"1a": "PRECISION is passed at the launch"}),
    ({"config_space": space((64, 64, 64, 3, 4))}, {"1a": "num_warps = 3"}),
]


@pytest.mark.parametrize("answers, expected", SLIPS, ids=range(len(SLIPS)))
def test_each_slip_loses_its_parts_with_a_message_that_names_it(answers, expected):
    got = verdicts(**answers)
    for key, fb in got.items():
        if key in expected:
            assert not fb.passed and expected[key] in fb.message, fb
        else:
            assert fb.passed, fb


def test_unanswered_parts_say_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    ns = {"config_space": stub, "prune": stub, "shape_key": stub}
    results = [*at.check_space(ns), *at.check_prune(ns), *at.check_key(ns)]
    assert [fb.status for fb in results] == ["not implemented"] * 7, results


def test_the_trials_come_from_the_seed_and_hold_the_edges():
    assert at.budget_trials(3) == at.budget_trials(3) != at.budget_trials(4)
    assert at.ordinary_shapes(3) != at.ordinary_shapes(4)
    budget = [(t, tr["dtype"]) for tr in at.budget_trials(3) for t in tr["configs"]]
    assert any(at.registers(t) == 128 and at.fits(t, d) for t, d in budget)
    assert any(not at.fits(t, d) for t, d in budget) and any(at.fits(t, d) for t, d in budget)
    for trial in at.size_trials(3):          # only the size rule decides there
        assert all(at.fits(t, trial["dtype"]) for t in trial["configs"])
    (fastest,) = {tr["fastest"] for tr in at.recorded_trials()}    # H100 and H200 agree
    assert at.fits(fastest, "float16") and at.registers(fastest) == 128
    M, N, K = at.tuning_shape(3)
    assert all(v % 16 == 0 and v % 128 for v in (M, N, K)) and at.tuning_shape(3) != \
        at.tuning_shape(4)


def tuning_raw(seed, chosen_ms, best_ms=0.100, **extra):
    chosen, best = (128, 256, 64, 8, 8, 4), (128, 128, 64, 8, 4, 3)
    return {"shape": list(at.tuning_shape(seed)), "gpu": "a GPU", "space": 12, "kept": 12,
            "tune_s": 3.0, "rel_error": 1e-3, "chosen": list(chosen), registry.SEED: seed,
            "sweep": [{"config": list(chosen), "ms": chosen_ms},
                      {"config": list(best), "ms": best_ms}], **extra}


def test_the_tuning_judge_holds_the_tuned_config_to_5_percent_of_the_sweep():
    judge = SPEC.part("4").judge         # called directly: registry.judge waits for a GPU
    assert judge(tuning_raw(7, 0.104)).passed
    fb = judge(tuning_raw(7, 0.110))
    assert not fb.passed and "1.100x" in fb.message and "128x128x64" in fb.message
    assert "grader's shape" in judge({**tuning_raw(7, 0.1), registry.SEED: 8}).message
    assert "product is wrong" in judge(tuning_raw(7, 0.1, rel_error=0.5)).message
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
    assert "the best of the full sweep" in parts["4"]["message"]


@pytest.mark.gpu
@pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU (timed parts)")
def test_a_prune_that_keeps_only_a_small_tile_misses_the_goal_on_a_gpu():
    def smallest(configs, named_args, **kwargs):
        return [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]

    raw = at.tune_and_sweep(space(), smallest, RIGHT["shape_key"], *at.tuning_shape(1), seed=1)
    fb = SPEC.part("4").judge({**raw, registry.SEED: 1})
    assert not fb.passed and "does your prune drop it" in fb.message, fb
    assert torch.cuda.is_available()

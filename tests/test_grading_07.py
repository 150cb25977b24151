"""Assignment 07 (autotuning), graded end to end.

The solution scores full marks, the blank assignment zero (every part "not implemented"),
and each planted mistake, the solution with one slip a learner makes, loses exactly the
points of the parts it breaks, with a message that names the slip: a configuration that
overflows shared memory kept, pruning rules that drop the fastest configuration, a key that
never buckets or buckets wrongly at the edges, a space with an invalid entry. The plants are
made from solutions/07_autotuning.ipynb here and graded in CPU mode by the grader's own
code, two at a time. More slips are judged in this process, without a notebook; on a GPU
machine two more tests run the tuning part for real.
"""

from __future__ import annotations

import pytest
import torch
import triton

import helpers
from helpers.grading import grader, registry
from helpers.grading.assignments import autotuning as at

from planting import (REPO, assert_blank, assert_full_marks,  # tests/planting.py
                      assert_loses_exactly, edit, grade_plants, parts_of)

SPEC = registry.get("07_autotuning")
CPU_MAX = sum(p.points for p in SPEC.parts if not p.gpu)
LIMITS = grader.Limits(cell_timeout=120, part_timeout=120, total_timeout=600, memory_mb=3072)
GPU_LIMITS = grader.Limits(cell_timeout=540, part_timeout=540, total_timeout=1200,
                           memory_mb=16384)

KEY = "return tuple(max(16, triton.next_power_of_2(n)) for n in (M, N, K))"

# name -> (how to plant it, {part: words its message must contain}); every other part
# must keep its full points.
PLANTS = {
    # The pipeline's stages forgotten: 128 x 128 x 64 with 8 stages (256 KiB) is kept.
    "overflowing_config_kept": (
        edit([("shared = c.num_stages * (bm * bk + bk * bn) * size",
               "shared = (bm * bk + bk * bn) * size")]),
        {"2a": "your prune keeps it (it counts one stage"}),
    # A budget written for another GPU drops the H100's fastest recorded configuration.
    "a100_budget_drops_the_best": (
        edit([("shared <= SMEM_LIMIT", "shared <= 166_912")]),
        {"2a": "but your prune drops it", "2c": "the fastest configuration of lesson 04's"}),
    # The fastest recorded configuration holds exactly 128 registers a thread.
    "registers_strictly_below_the_limit": (
        edit([("registers <= MAX_ACC_REGISTERS", "registers < MAX_ACC_REGISTERS")]),
        {"2a": "use <=, not <", "2c": "your prune drops 128x256x64"}),
    "two_bytes_for_every_dtype": (
        edit([('size = named_args["a_ptr"].element_size()', "size = 2")]),
        {"2a": "2 bytes an element"}),
    "tiles_compared_with_m_itself": (
        edit([("biggest_m = max(16, triton.next_power_of_2(M))", "biggest_m = M"),
              ("biggest_n = max(16, triton.next_power_of_2(N))", "biggest_n = N")]),
        {"2b": "compares with M and N themselves"}),
    "key_never_buckets": (
        edit([(KEY, "return (M, N, K)")]),
        {"3a": "never buckets", "3b": "never buckets"}),
    # Right away from the edges; 16 -> 32 and 1024 -> 2048 at them.
    "key_doubles_exact_powers_of_two": (
        edit([(KEY, "return tuple(max(16, 1 << n.bit_length()) for n in (M, N, K))")]),
        {"3b": "an exact power of two is its own bucket"}),
    "block_k_of_8": (
        edit([("(64, 128, 32, 4, 5)", "(64, 128, 8, 4, 5)")]),
        {"1a": "BLOCK_K = 8"}),
    "block_n_not_a_power_of_two": (
        edit([("(64, 64, 64, 4, 4)", "(64, 96, 64, 4, 4)")]),
        {"1a": "BLOCK_N = 96"}),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return grade_plants(tmp_path_factory, "07_autotuning", PLANTS, limits=LIMITS)


def test_the_solution_scores_full_marks(graded):
    assert_full_marks(graded["solution"], SPEC)
    assert graded["solution"]["max_score"] == CPU_MAX


def test_the_blank_assignment_scores_zero_without_crashing(graded):
    assert_blank(graded["blank"], SPEC)


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_a_planted_mistake_loses_exactly_its_points(graded, name):
    assert_loses_exactly(graded[name], SPEC, PLANTS[name][1])


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
    (report,) = grader.grade_many([(REPO / "solutions" / "07_autotuning.ipynb", "solution")],
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

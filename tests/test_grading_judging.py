"""The judge runs in a process of its own (helpers/grading/judging.py): a verdict past the
part's time limit or memory cap, or one that kills its process, is "not graded" for that part,
and the next part gets a fresh judge."""

from __future__ import annotations

import time
from functools import partial

import pytest

from helpers.grading import extra, judging, registry
from helpers.grading.grader import Limits

NAME = "03_vector_add_intensity"
CHECKS = '''
import os

from helpers.feedback import Feedback
from helpers.grading.registry import Part

EXTENDS = "03_vector_add_intensity"


def _never_ends(raw):
    while True:
        pass


def _hoards(raw):
    kept = [bytearray(2**28) for _ in range(32)]      # 8 GiB, 256 MiB at a time
    return Feedback("H2 hoards", True, str(len(kept)))


def _exits(raw):
    os._exit(3)


def _reads(raw):
    return Feedback("H4 reads", raw.get("x") == 7, f"x is {raw.get('x')}")


PARTS = (Part("H1", "never ends", 1, _never_ends, ("x",)),
         Part("H2", "hoards", 1, _hoards, ("x",)),
         Part("H3", "exits", 1, _exits, ("x",)),
         Part("H4", "reads", 1, _reads, ("x",)))
'''
LIMITS = Limits(part_timeout=2.0, memory_mb=256)


@pytest.fixture(scope="module")
def verdicts():
    """Each planted judge's verdict and its seconds; the memory hog under a long time limit,
    so that only the memory cap can stop it, however busy the machine."""
    checks = extra.from_source(CHECKS, "hidden_judging.py")
    build = partial(extra.merged_spec, CHECKS, "hidden_judging.py")
    found = {}
    for keys, limits in (("H1 H3 H4", LIMITS), ("H2", Limits(part_timeout=300, memory_mb=256))):
        with judging.Judge(NAME, limits, build) as judge:
            judge.verdict(checks.parts[3], {"x": 7})          # the fork server starts
            for part in (p for p in checks.parts if p.key in keys.split()):
                start = time.monotonic()
                feedback, _ = judge.verdict(part, {"x": 7})
                found[part.key] = feedback, time.monotonic() - start
    return found


def test_a_verdict_past_the_time_limit_is_not_graded(verdicts):
    feedback, seconds = verdicts["H1"]
    assert not feedback.passed and feedback.status == "error", feedback
    assert "not graded" in feedback.message and "time limit" in feedback.message, feedback
    assert seconds < LIMITS.part_timeout + 5, seconds


def test_a_verdict_past_the_memory_cap_is_not_graded(verdicts):
    feedback, _ = verdicts["H2"]
    assert not feedback.passed and "memory" in feedback.message, feedback


def test_a_verdict_that_ends_its_process_is_not_graded(verdicts):
    feedback, _ = verdicts["H3"]
    assert not feedback.passed and "not graded" in feedback.message, feedback


def test_the_next_part_gets_a_fresh_judge_and_its_verdict(verdicts):
    feedback, _ = verdicts["H4"]
    assert feedback.passed, feedback


@pytest.mark.parametrize("value", [1e9, 2.0, "many"])
def test_the_judge_process_says_what_the_grader_would(value):
    spec = registry.get(NAME)
    part = spec.part("1a")
    raw = {"add_flops": value, registry.SEED: 5}
    with judging.Judge(NAME, Limits()) as judge:
        assert judge.verdict(part, raw) == registry.judge(part, raw)

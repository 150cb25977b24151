"""Assignments 04 to 08 graded end to end, from one table of lessons.

For each graded lesson the solution scores full marks, the blank assignment zero (every
part "not implemented", no crash), and each planted mistake, the solution with one slip a
learner makes (``tests/plants_NN.py``), loses exactly the points of the parts it breaks,
with a message that names the slip. A lesson's solution, blank assignment and plants are
graded together, once, in CPU mode by the grader's own code, in fresh kernel processes two
at a time (``planting.grade_plants``); the tests then read the reports.

One class per lesson: test runners that keep a class on one worker (pytest-xdist's
``--dist loadscope``) grade the lessons side by side, each lesson's grading still run once.
A lesson's other tests (napkin checks, prune verdicts, timed parts, GPU mode) stay in
``tests/test_grading_NN.py``. Lesson 03's grading (``tests/test_grading_03.py``) runs the
grader's command line over a folder and tests that run's gradebook too, so it stays there.
"""

from __future__ import annotations

import nbformat
import pytest

from helpers.grading import registry

import plants_04  # tests/plants_NN.py: each lesson's planted mistakes
import plants_05
import plants_06
import plants_07
import plants_08
import plants_09
from planting import (LIMITS, assert_blank, assert_full_marks,  # tests/planting.py
                      assert_loses_exactly, grade_plants, solution)


class GradedLesson:
    """A row of the table: ``assignment``, the registry's name of the lesson (the solution
    is ``solutions/<assignment>.ipynb``, the blank ``assignments/<assignment>.ipynb``),
    its ``plants`` (name -> (plant, {part: words}[, parts that may go either way])) and
    the grading ``limits``. Not collected itself (no ``Test`` prefix): each lesson is a
    subclass."""

    assignment: str
    plants: dict
    limits = LIMITS

    @pytest.fixture(scope="class")
    @classmethod
    def graded(cls, tmp_path_factory):
        """The reports of the plants, ``"solution"`` and ``"blank"``: one grading."""
        return grade_plants(tmp_path_factory, cls.assignment, cls.plants, limits=cls.limits)

    @property
    def spec(self):
        return registry.get(self.assignment)

    def test_the_solution_scores_full_marks(self, graded):
        assert_full_marks(graded["solution"], self.spec)
        assert graded["solution"]["max_score"] == sum(
            p.points for p in self.spec.parts if not p.gpu)

    def test_the_blank_assignment_scores_zero_without_crashing(self, graded):
        assert_blank(graded["blank"], self.spec)

    def test_a_planted_mistake_loses_exactly_its_points(self, graded, plant):
        make, expected, *either = self.plants[plant]
        if plant not in graded:
            make(nbformat.read(solution(self.assignment), as_version=4))   # still applies
            pytest.skip(f"{plant} loses only parts graded on a GPU (tests/test_grading_"
                        f"{self.assignment[:2]}.py grades it in GPU mode on a GPU machine)")
        assert_loses_exactly(graded[plant], self.spec, expected, *either)


def pytest_generate_tests(metafunc):
    """Each lesson's plant test, once per plant of that lesson."""
    if "plant" in metafunc.fixturenames:
        metafunc.parametrize("plant", sorted(metafunc.cls.plants))


# The table: one lesson a class.

class TestTiling04(GradedLesson):
    assignment, plants = "04_tiling", plants_04.PLANTS


class TestFusion05(GradedLesson):
    assignment, plants = "05_fusion", plants_05.PLANTS


class TestFlashAttention06(GradedLesson):
    assignment, plants = "06_flash_attention", plants_06.PLANTS


class TestAutotuning07(GradedLesson):
    assignment, plants = "07_autotuning", plants_07.PLANTS


class TestMoe08(GradedLesson):
    assignment, plants = "08_moe", plants_08.PLANTS


class TestFp809(GradedLesson):
    assignment, plants = "09_fp8", plants_09.PLANTS

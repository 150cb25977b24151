"""The answer key of assignment 09 (FP8 by design): no graded number.

Instructor's side only: ``./course release`` leaves this module out and seals what it
returns. Assignment 09 grades functions and a kernel, not numbers: every verdict is computed
from shapes, tensors and budgets the grader draws from its seed
(:mod:`helpers.grading.assignments.fp8_granularity`), from the errors it measures on the
matmuls it draws (:mod:`helpers.grading.assignments.fp8_promotion`) and from the spec of the
power-of-two quantisation (:mod:`helpers.grading.assignments.fp8`). There is no expected
value to keep from the learner, so the key is empty.
"""

from __future__ import annotations


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [known mistakes])}``: none for this assignment."""
    return {}

"""The answer key of assignment 07 (autotuning): no graded number.

Instructor's side only: ``./course release`` leaves this module out and seals what it
returns. Assignment 07 grades functions, not numbers: every verdict is read from the
recorded sweep of the online softmax (helpers/records/softmax_tuning__*.json, which the
lesson's learner reads too) and from shapes the grader draws, by
:mod:`helpers.grading.assignments.autotuning`. There is no expected value to keep from the
learner, so the key is empty.
"""

from __future__ import annotations


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [known mistakes])}``: none for this assignment."""
    return {}

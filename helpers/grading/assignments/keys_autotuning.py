"""The answer key of assignment 07 (autotuning): no graded number.

Instructor's side only: ``./course release`` leaves this module out and seals what it
returns. Assignment 07 grades functions, not numbers: every verdict follows from rules the
notebook states (the shared-memory and register budget, the size rule, the buckets), which
:mod:`helpers.grading.assignments.autotuning` applies to the grader's own configuration
lists and shapes. There is no expected value to keep from the learner, so the key is empty.
"""

from __future__ import annotations


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [known mistakes])}``: none for this assignment."""
    return {}

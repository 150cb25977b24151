"""The answer key of assignment 06 (a FlashAttention forward kernel): part 1's reference merge.

Instructor's side only: ``./course release`` leaves this module out. ``merge_exact`` answers
part 1 (``merge_states``), so the student's copy of the grader never holds it: a release
carries its outputs on the inputs of the notebook's ``check_merge()``, sealed
(:func:`reference_outputs`, :mod:`helpers.grading.outputs`). The kernel parts are judged
against the course's float64 spec and need no key; nor is any number graded (no napkin
math: :func:`answer_key` is empty).
"""

from __future__ import annotations

import torch

from ..registry import NOTEBOOK_SEED
from .attention_merge import INF, MERGE_TOL, merge_inputs, merge_seed


def merge_exact(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """The spec of the merge, in float64: the state of all the keys of both."""
    m_a, l_a, acc_a, m_b, l_b, acc_b = (t.double() for t in (m_a, l_a, acc_a, m_b, l_b, acc_b))
    m = torch.maximum(m_a, m_b)
    a, b = (torch.exp(x - torch.where(m == -INF, 0.0, m)) for x in (m_a, m_b))
    return m, a * l_a + b * l_b, a[:, None] * acc_a + b[:, None] * acc_b


def answer_key() -> dict:
    """No graded number in assignment 06."""
    return {}


def reference_outputs() -> dict:
    """``{part: {"seed", "atol", "rtol", "outputs"}}``: what a release seals, the reference's
    outputs on the inputs of the notebook's check (:func:`helpers.grading.outputs.seal`)."""
    seed = merge_seed(NOTEBOOK_SEED)
    return {"1": {"seed": seed, "atol": MERGE_TOL[0], "rtol": MERGE_TOL[1],
                  "outputs": [t.tolist() for t in merge_exact(*merge_inputs(seed))]}}

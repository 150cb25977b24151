"""Assignment 06, part 1: ``merge_states``, two partial softmax states merged (PyTorch).

:mod:`helpers.grading.assignments.attention` holds the assignment; this module holds part
1's inputs, collection and judge. The merge is judged element by element against the
reference merge, which answers the part and so lives in the instructor-only
:mod:`.keys_attention` (``merge_exact``); a student release judges by the sealed outputs of
that reference on the inputs of the notebook's ``check_merge()`` (:mod:`..outputs`).
"""

from __future__ import annotations

import functools
import math

import torch

from ...feedback import Feedback, not_implemented
from .. import harness, outputs
from ..registry import NOTEBOOK_SEED, SEED, answer, is_not_implemented

INF = math.inf
MERGE_TOL = (1e-4, 1e-5)        # (atol, rtol), fp32 whatever the inputs
MERGE = harness.Case("merge", {})
ROWS = ("random rows", "scores near +-1000", "masked keys", "fully masked rows")  # 4 each
FORMULAS = "helpers.grading.assignments.keys_attention"
UNKNOWN = "no reference for these inputs"


def merge_seed(seed: int) -> int:
    """The seed of the inputs, from the grader's (or the notebook's) seed."""
    return MERGE.seeded(seed).seed


def merge_inputs(seed: int):
    """``(m_a, l_a, acc_a, m_b, l_b, acc_b)``, fp32: two states of 16 rows, 4 of each kind."""
    def state(s, v):
        m = s.amax(-1)
        p = torch.exp(s - torch.where(m == -INF, 0.0, m)[..., None])
        return m, p.sum(-1), (p[..., None] * v).sum(-2)

    g = harness.generator(seed)
    sa, sb = 2 * torch.randn(16, 5, generator=g), 2 * torch.randn(16, 7, generator=g)
    va, vb = torch.randn(16, 5, 8, generator=g), torch.randn(16, 7, 8, generator=g)
    big = 1000 * torch.tensor([1.0, -1, 1, -1])[:, None]    # the larger maximum on either side
    sa[4:8], sb[4:8] = sa[4:8] + big, sb[4:8] + big + 30 * torch.tensor([1.0, -1, -1, 1])[:, None]
    sa[8:10, :2], sb[10:12, -3:], sa[8], sb[11] = -INF, -INF, -INF, -INF   # one side empty
    sa[12::2], sb[12::2] = -INF, -INF                        # rows 12, 14 see no key at all
    return tuple(t.float() for t in (*state(sa, va), *state(sb, vb)))


@functools.cache
def reference():
    """Exact (``keys_attention.merge_exact``) in the instructor's course, sealed in a release."""
    return outputs.load("06_flash_attention", FORMULAS, "1", "merge_exact", merge_inputs,
                        *MERGE_TOL)


def _run(fn, seed: int) -> dict:
    inputs, rec = merge_inputs(seed), {"seed": seed, "error": None, "outputs": None}
    try:
        out = fn(*inputs)
        rec["outputs"] = [t.detach().cpu().clone() if isinstance(t, torch.Tensor) else
                          repr(t)[:60] for t in out] if isinstance(out, (tuple, list)) \
            else repr(out)[:60]
    except Exception as err:  # noqa: BLE001 - the learner's error, reported
        rec["error"] = f"{type(err).__name__}: {str(err)[:200]}"
        rec["not_implemented"] = is_not_implemented(err)
    return rec


def collect_merge(ns, seed):
    """On the inputs of the grader's seed; and on the notebook's inputs too, which a release's
    sealed reference knows (a release grading itself judges those)."""
    fn = answer(ns, "merge_states")
    rec = _run(fn, merge_seed(seed))
    if rec["seed"] != merge_seed(NOTEBOOK_SEED) and not rec["error"]:
        rec["notebook"] = _run(fn, merge_seed(NOTEBOOK_SEED))
    return rec


def _problem(rec, ref) -> str | None:
    out, inputs = rec.get("outputs"), merge_inputs(rec["seed"])
    if rec.get("error"):
        return f"merge_states raised {rec['error']}"
    if not isinstance(out, list) or [tuple(t.shape) if isinstance(t, torch.Tensor) else t
                                     for t in out] != [tuple(t.shape) for t in inputs[:3]]:
        return (f"merge_states returned {out!r:.60}; expected three tensors (m, l, acc) "
                "shaped like m_a, l_a and acc_a")
    empty = inputs[1] + inputs[4] == 0
    if any(t[empty].isnan().any() for t in out):
        return (f"on {ROWS[3]}: rows where both states are empty (m = -inf, l = 0) come out "
                "NaN: exp(-inf - (-inf)) is NaN. Shift by 0 where the new maximum is -inf, so "
                "that the merged state stays empty (l = 0, acc = 0): output 0, lse -inf")
    if not all(torch.isfinite(t[~empty]).all() for t in out):
        return (f"on {ROWS[1]}: inf or NaN, exp of a raw maximum overflows. Scale each side "
                "by exp(m_side - m) with m = max(m_a, m_b): both factors are <= 1")
    close = ref.close(rec["seed"], out)
    if close is None:
        return UNKNOWN
    wrong = torch.zeros(len(empty), dtype=torch.bool)
    for ok in close:
        wrong |= ~ok if ok.dim() == 1 else ~ok.all(-1)
    if not wrong.any():
        return None
    where = ", ".join(dict.fromkeys(ROWS[r // 4] for r in wrong.nonzero().flatten().tolist()))
    if torch.allclose(out[1].double(), inputs[1].double() + inputs[4], *MERGE_TOL[::-1]):
        return (f"on {where}: you add the two sums as they are, but each was taken relative to "
                "its own maximum: rescale l and acc of each side by exp(m_side - m) first")
    return (f"on {where}: the merged state is not the state of both sets of keys: m = max(m_a, "
            "m_b), l = l_a exp(m_a - m) + l_b exp(m_b - m), acc likewise")


def judge_merge(raw):
    part = "1 merge_states"
    if raw.get("not_implemented"):
        return not_implemented(part)
    if isinstance(raw.get(SEED), int) and raw.get("seed") != merge_seed(raw[SEED]):
        return Feedback(part, False, "the record of the run is not the grader's (was the "
                        "grader tampered with?)")
    ref, notebook = reference(), raw.get("notebook")
    known = ref.knows(raw["seed"]) or not isinstance(notebook, dict) \
        or notebook.get("seed") != merge_seed(NOTEBOOK_SEED)
    problem = _problem(raw if known else notebook, ref)
    if problem is UNKNOWN:
        return Feedback(part, False, "not checked here: this copy of the course holds no "
                        "reference merge for these inputs", status="not checked here")
    return Feedback(part, not problem, problem or f"right on {', '.join(ROWS)}")

"""Checks for lesson 06 (FlashAttention): predict, then see the answer.

Each expected value comes from a formula, never from a typed-in number: the size of the
score matrix from its shape and dtype, the rescale factor from the online-softmax update,
the backward's FLOPs from :func:`helpers.intensity.attention`, the causal tiles from
:func:`helpers.plots.attention_steps.causal_tile_kinds`. A wrong answer that matches a
classic slip (bits for bytes, the batch or the heads forgotten, causal counted as full)
gets a message that names it.
"""

from __future__ import annotations

import math

import torch

from .. import intensity
from ..dtypes import element_size
from ..feedback import Feedback, check_number
from ..plots.attention_steps import causal_tile_kinds

# The matrix products of attention, per head, each 2 x (rows x cols x inner) FLOPs; all of
# them are seq x seq x d (or seq x d x seq) products, so each costs the same 2 seq^2 d
# (helpers.intensity.attention counts them the same way). They name the slips below.
FORWARD_MATMULS = ("S = Q K^T", "O = P V")
BACKWARD_MATMULS = ("S = Q K^T (recomputed: P = exp(S - lse))", "dV = P^T dO", "dP = dO V^T",
                    "dQ = dS K", "dK = dS^T Q")


def score_matrix_bytes(seq: int, dtype=torch.float16, batch: int = 1, heads: int = 1) -> int:
    """Bytes of one ``seq x seq`` score matrix per head, for every batch element and head."""
    return batch * heads * seq * seq * element_size(dtype)


def check_score_bytes(answer, seq: int, dtype=torch.float16, batch: int = 1,
                      heads: int = 1) -> Feedback:
    """Exercise: the bytes of the score matrix ``S = Q K^T`` that standard attention writes
    to HBM, for ``batch`` sequences of ``seq`` tokens and ``heads`` heads, in ``dtype``."""
    s = element_size(dtype)
    expected = score_matrix_bytes(seq, dtype, batch, heads)
    pair = "you counted S and P together; the question asks for S alone"
    if s == 2:                        # 2 x fp16 is also the size of fp32 scores
        pair = ("you counted S and P together, or 4-byte fp32 scores; the question asks for "
                "S alone, in the inputs' dtype")
    mistakes = [(8 * expected, "you counted bits, not bytes"),
                (2 * expected, pair),
                (expected / 2**20, "you gave MiB, not bytes"),
                (expected / 2**30, "you gave GiB, not bytes")]
    if s != 1:
        mistakes.append((expected / s, "you counted elements, not bytes"))
    if s not in (2, 4):
        mistakes.append((expected / s * 4, "you counted 4-byte fp32 scores; S is written in "
                                           "the inputs' dtype"))
    if batch > 1 and heads > 1:
        mistakes.append((expected / (batch * heads), "you forgot the batch and the heads: every "
                                                     "head of every sequence has its own S"))
    if batch > 1:
        mistakes.append((expected / batch, "you forgot the batch"))
    if heads > 1:
        mistakes.append((expected / heads, "you forgot the heads: each head has its own S"))
    return check_number(f"bytes of S at seq = {seq:,}", answer, expected, rel=0.01, unit="B",
                        mistakes=mistakes, hint="batch x heads x seq x seq elements")


def rescale_factor(running_max: float, block_max: float) -> float:
    """``exp(m_old - m_new)`` with ``m_new = max(m_old, block_max)``: what the old sum is
    multiplied by when the block arrives."""
    return math.exp(running_max - max(running_max, block_max))


def check_rescale(answer, running_max: float, block_max: float) -> Feedback:
    """Exercise: the factor the running sum is multiplied by when a block whose maximum is
    ``block_max`` arrives after a running maximum of ``running_max``."""
    expected = rescale_factor(running_max, block_max)
    new = max(running_max, block_max)
    mistakes = [(math.exp(new - running_max), "you swapped old and new: exp(m_new - m_old). "
                 "The old sum was counted against a smaller maximum, so it must shrink "
                 "(a factor <= 1)"),
                (running_max - new, "you forgot the exp: the factor is exp(m_old - m_new)")]
    if block_max < running_max:
        mistakes.append((math.exp(running_max - block_max),
                         "you took the block's max as the new maximum; the running maximum "
                         "is the larger of the two, and here it does not change"))
        mistakes.append((math.exp(block_max - running_max),
                         "you took the block's max as the new maximum; the running maximum "
                         "is the larger of the two, and here it does not change"))
    return check_number("rescale factor", answer, expected, rel=0.01, mistakes=[
        (v, d) for v, d in mistakes if not math.isclose(v, expected, rel_tol=0.01)],
        hint="m_new = max(m_old, block max); the factor is exp(m_old - m_new)")


def backward_flops_ratio(seq: int = 4096, head_dim: int = 128) -> float:
    """The backward's FLOPs over the forward's, from :func:`helpers.intensity.attention`:
    the matmuls each runs, all of the same size."""
    fwd, bwd = (intensity.attention(1, 1, seq, seq, head_dim, pass_=p).flops
                for p in ("forward", "backward"))
    return bwd / fwd


def check_backward_ratio(answer) -> Feedback:
    """Exercise: how many times the forward's FLOPs does FlashAttention's backward do?"""
    fwd, bwd = len(FORWARD_MATMULS), len(BACKWARD_MATMULS)
    return check_number("backward / forward FLOPs", answer, backward_flops_ratio(), rel=0.01,
                        mistakes=[
        ((bwd - 1) / fwd, "you left out the recomputation of S = Q K^T: the backward keeps "
                          "only lse, so it makes P again before it can use it (the 2x of a "
                          "linear layer's backward does not hold here)"),
        ((bwd + 1) / fwd, "you also recomputed O = P V: O is saved, and delta = rowsum(dO * O) "
                          "is elementwise, not a matmul"),
        ((bwd + fwd) / fwd, "you counted the forward and the backward together (or the 7 "
                            "matmuls of a backward split in a dK/dV and a dQ kernel, which "
                            "recomputes S and dP twice; FLOP/s count the 5 the algorithm "
                            "needs)"),
        (fwd / bwd, "you divided the forward by the backward")],
        hint="count the seq x seq x d matmuls: " + "; ".join(BACKWARD_MATMULS))


def _tile_counts(seq: int, block_m: int, block_n: int, q_tile: int) -> dict:
    kinds = causal_tile_kinds(seq, block_m, block_n)
    if not 0 <= q_tile < len(kinds):
        raise ValueError(f"q_tile must be 0 to {len(kinds) - 1} for seq {seq} and "
                         f"block_m {block_m}, got {q_tile}")
    line = kinds[q_tile]
    return {k: line.count(k) for k in ("full", "diagonal", "skipped")}


def check_causal_tiles(answer, seq: int, block_m: int, block_n: int, q_tile: int) -> Feedback:
    """Exercise: how many K/V tiles does Q tile ``q_tile`` (0-based) load in causal
    attention, with ``block_m`` queries and ``block_n`` keys a tile?"""
    c = _tile_counts(seq, block_m, block_n, q_tile)
    visited, every = c["full"] + c["diagonal"], sum(c.values())
    mistakes = [(every, "you counted causal as full: tiles wholly right of the diagonal are "
                        "skipped, never loaded"),
                (c["full"], "you left out the diagonal tiles: some of their keys are visible, "
                            "so they are loaded and masked"),
                (visited - 1, "you are one short: count the diagonal tile too")]
    if block_m != block_n:
        mistakes.append((q_tile + 1, f"you assumed square tiles: a Q tile of {block_m} "
                                     f"queries spans {block_m / block_n:g} K/V tiles of "
                                     f"{block_n} keys"))
    return check_number(f"K/V tiles of Q tile {q_tile}", answer, visited, rel=0.001,
                        mistakes=[(v, d) for v, d in mistakes if v != visited],
                        hint=f"queries {q_tile * block_m} to "
                             f"{min((q_tile + 1) * block_m, seq) - 1} see keys up to their "
                             "own position")


def causal_work_fraction(seq: int, block_m: int, block_n: int) -> float:
    """The fraction of the non-causal tiles that causal attention computes."""
    kinds = [k for line in causal_tile_kinds(seq, block_m, block_n) for k in line]
    return sum(k != "skipped" for k in kinds) / len(kinds)


def check_causal_fraction(answer, seq: int, block_m: int, block_n: int) -> Feedback:
    """Exercise: which fraction of the tiles of full attention does causal attention
    compute (whole tiles: a diagonal tile costs as much as a full one)?"""
    expected = causal_work_fraction(seq, block_m, block_n)
    return check_number("fraction of tiles computed", answer, expected, rel=0.01, mistakes=[
        (v, d) for v, d in ((0.5, "you took the triangle's area; the diagonal tiles are "
                                  "computed whole, so causal does more than half"),
                            (1.0, "you counted causal as full: the skipped tiles cost "
                                  "nothing")) if not math.isclose(v, expected, rel_tol=0.01)],
        hint="count the Q tiles' visited K/V tiles and divide by all tiles")


def forward_extra_bytes(seq: int, version: str, head_dim: int = 128, dtype=torch.bfloat16,
                        batch: int = 1, heads: int = 1) -> int:
    """The memory one attention forward allocates beyond its inputs, at its largest:
    ``"naive"`` holds S and P (``seq x seq`` each, in ``dtype``) beside its output;
    ``"fused"`` only its output and one fp32 log-sum-exp a row. (PyTorch's naive version
    also keeps fp32 copies of S and P for its softmax: more bytes, the same N^2 growth.)"""
    s = element_size(dtype)
    rows = batch * heads * seq
    out = rows * head_dim * s
    if version == "naive":
        return 2 * score_matrix_bytes(seq, dtype, batch, heads) + out
    if version == "fused":
        return out + rows * 4
    raise ValueError(f"version must be 'naive' or 'fused', got {version!r}")


def check_memory_growth(answer, version: str, seq: int = 8192) -> Feedback:
    """Exercise: by what factor does the peak memory of one ``version`` forward grow when the
    sequence doubles from ``seq`` to ``2 seq``?"""
    expected = forward_extra_bytes(2 * seq, version) / forward_extra_bytes(seq, version)
    slips = {"naive": (2.0, "you counted the inputs and the output, which grow with N; S and "
                            "P are N x N, and they dominate"),
             "fused": (4.0, "that is naive attention: the fused kernel keeps nothing N x N, "
                            "only the output and one log-sum-exp a row")}
    return check_number(f"{version} memory when N doubles", answer, expected, rel=0.05,
                        unit="x", mistakes=[slips[version]],
                        hint="which of its tensors grow with N, and which with N^2?")

"""The router of an MoE layer, and the routings lesson 08 studies it with.

* :func:`route`: the router itself. Softmax over the experts' logits in fp32, the
  ``top_k`` largest, renormalised to sum to 1 (Mixtral's convention).
* :func:`router_logits`: a random router's logits for random tokens, scaled as
  :func:`helpers.kernels.moe.make_weights` scales its router: no expert favoured.
* :func:`skew_bias`, :func:`skewed_route`: the same logits pushed toward a few "hot"
  experts by a strength ``s``, the way a real router drifts when some experts become
  popular: the grouped GEMM's imbalance, padding and capacity are studied on these.
* :func:`load_summary`: how balanced a routing is: tokens per expert, the padding rows of
  a grouped GEMM's tiles, the busiest expert's load against the mean, idle experts.

None of it needs a GPU: the lesson's imbalance explorer routes with the same recipe as
the recorded experiment (:mod:`helpers.experiments.moe`), live, in either mode.
"""

from __future__ import annotations

import math

import torch

from ...intensity.moe import padding_rows

HOT_EXPERTS = 4     # experts a skewed router favours, unless told otherwise


def route(logits: torch.Tensor, top_k: int, renormalize: bool = True):
    """``(weights, ids)``, both ``(T, top_k)``: each token's experts, largest first, and
    their softmax probabilities (fp32, or float64 for float64 logits), renormalised to
    sum to 1 over the chosen experts."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (tokens, experts), got shape {tuple(logits.shape)}")
    E = logits.shape[1]
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be between 1 and the number of experts ({E}), got {top_k}")
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def router_logits(tokens: int, hidden: int, experts: int, seed: int = 0, device=None):
    """``x @ w_router`` in fp32 for random tokens and a random router, scaled like
    :func:`helpers.kernels.moe.make_weights`: logits of order 1, no expert favoured."""
    g = torch.Generator(device=device or "cpu").manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g, device=device)
    w = torch.randn(hidden, experts, generator=g, device=device) / math.sqrt(hidden)
    return x @ w


def skew_bias(experts: int, strength: float, hot: int = HOT_EXPERTS, device=None):
    """``strength`` added to the logits of experts ``0 .. hot - 1``, 0 to the others."""
    if not 0 < hot <= experts:
        raise ValueError(f"hot must be between 1 and the number of experts ({experts}), got {hot}")
    bias = torch.zeros(experts, device=device)
    bias[:hot] = strength
    return bias


def skewed_route(logits: torch.Tensor, top_k: int, strength: float, hot: int = HOT_EXPERTS):
    """:func:`route` of ``logits`` pushed toward the ``hot`` experts by ``strength``."""
    logits = logits.float()
    return route(logits + skew_bias(logits.shape[1], strength, hot, logits.device), top_k)


def load_summary(counts, block_m: int) -> dict:
    """Tokens per expert, the padding rows at ``block_m`` and the busiest expert's load."""
    c = [int(v) for v in counts]
    mean = sum(c) / len(c)
    return {"counts": c, "padding_rows": padding_rows(c, block_m), "block_m": block_m,
            "max_over_mean": max(c) / mean if mean else 0.0, "idle_experts": c.count(0)}

"""Lesson 08's load-balancing runs: a small MoE router trained four ways, in seconds on a CPU.

The model is small on purpose (32 features, 8 linear experts, top-2, 256 tokens a step from
16 clusters, a fixed random target ``tanh(x @ A)``), and it is plain PyTorch: the router's
dynamics, not the kernels, are the subject. The router starts with a mild preference for
two experts (:func:`helpers.kernels.moe.routing.skew_bias`, strength 1), the way a real
router drifts early in training. Four runs from the same start and the same tokens:

* ``"none"``: the task loss alone;
* ``"auxiliary"``: plus Switch's auxiliary loss (weight ``aux_weight``);
* ``"z-loss"``: plus the auxiliary loss and ST-MoE's router z-loss (``z_weight``);
* ``"bias"``: DeepSeek-V3's bias on the choice, no extra loss (speed ``gamma``).

Each step records the busiest expert's load over the mean (1 is even), the task loss and
the router's z (mean squared log-sum-exp). The recipes are in
:mod:`helpers.kernels.moe.balancing`; :func:`check_most_even` is the lesson's prediction.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..feedback import Feedback, check_choice
from ..kernels.moe import balancing as bal
from ..kernels.moe.routing import skew_bias

POLICIES = ("none", "auxiliary", "z-loss", "bias")


@dataclass(frozen=True)
class Run:
    policy: str
    load_over_mean: tuple      # per step: the busiest expert's copies over the mean
    task_loss: tuple           # per step
    z: tuple                   # per step: mean logsumexp(logits)^2
    final_load: tuple          # copies per expert at the last step


def train_router(policy: str, *, steps: int = 120, tokens: int = 256, experts: int = 8,
                 top_k: int = 2, hidden: int = 32, skew: float = 1.0, aux_weight: float = 0.1,
                 z_weight: float = 1e-3, gamma: float = 0.03, lr: float = 1e-2,
                 seed: int = 0) -> Run:
    """Train the small MoE with one balancing ``policy`` (one of :data:`POLICIES`)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    g = torch.Generator().manual_seed(seed)
    router = (torch.randn(hidden, experts, generator=g) / math.sqrt(hidden)).requires_grad_()
    router_bias = skew_bias(experts, skew, hot=2).requires_grad_()
    w = (torch.randn(experts, hidden, hidden, generator=g) / math.sqrt(hidden)).requires_grad_()
    target = torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)
    centres = 2 * torch.randn(16, hidden, generator=g)
    opt = torch.optim.Adam([router, router_bias, w], lr=lr)
    choice_bias = torch.zeros(experts)
    ratio, task_loss, z = [], [], []
    for _ in range(steps):
        x = centres[torch.randint(0, 16, (tokens,), generator=g)] \
            + torch.randn(tokens, hidden, generator=g)
        logits = x @ router + router_bias
        if policy == "bias":
            weights, ids = bal.biased_route(logits, choice_bias, top_k)
        else:
            weights, ids = bal.route(logits, top_k)
        out = (weights[..., None] * torch.einsum("th,tkhj->tkj", x, w[ids])).sum(dim=1)
        task = (out - torch.tanh(x @ target)).square().mean()
        loss = task
        if policy in ("auxiliary", "z-loss"):
            loss = loss + aux_weight * bal.switch_aux_loss(logits, ids)
        if policy == "z-loss":
            loss = loss + z_weight * bal.router_z_loss(logits)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if policy == "bias":
            choice_bias = bal.update_bias(choice_bias, ids, gamma)
        load = bal.expert_load(ids, experts)
        ratio.append((load.max() / load.mean()).item())
        task_loss.append(task.item())
        z.append(bal.router_z_loss(logits.detach()).item())
    return Run(policy, tuple(ratio), tuple(task_loss), tuple(z),
               tuple(int(c) for c in load.tolist()))


@functools.lru_cache(maxsize=4)
def train_all(**options) -> dict[str, Run]:
    """:func:`train_router` for every policy, with the same ``options`` (cached)."""
    return {p: train_router(p, **options) for p in POLICIES}


def check_most_even(answer, runs: dict[str, Run] | None = None) -> Feedback:
    """Prediction: which run ends with the most even load (lowest busiest-over-mean,
    averaged over the last 20 steps)? One of :data:`POLICIES`."""
    runs = runs or train_all()
    late = {p: sum(r.load_over_mean[-20:]) / 20 for p, r in runs.items()}
    best = min(late, key=late.get)
    why = ", ".join(f"{p} {v:.2f}" for p, v in late.items())
    return check_choice("the most even router", answer, best, POLICIES,
                        f"Busiest expert over the mean, last 20 steps: {why}.")

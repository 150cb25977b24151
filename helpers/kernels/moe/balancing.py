"""Keeping an MoE router's load even while it trains: three recipes the field uses.

A router learns which expert suits which token, and left alone it tends to collapse onto a
few: an expert that gets more tokens trains faster, looks better, and is chosen more. The
grouped GEMM then waits on its busiest expert (lesson 08, section 6), and with a capacity
the overflow is dropped. Three remedies, each a few lines on top of :func:`route`:

* :func:`switch_aux_loss`, Switch Transformer's auxiliary loss (Fedus et al., 2021, eq. 4):
  ``E * sum_i f_i * P_i``, where ``f_i`` is the share of the token copies sent to expert
  ``i`` (a count: no gradient) and ``P_i`` the router's mean probability for it (the
  gradient's path). It is 1 for a perfectly even router and grows with imbalance; added to
  the task loss with a small weight (0.01 in the paper).
* :func:`router_z_loss`, ST-MoE's router z-loss (Zoph et al., 2022, eq. 5): the mean
  squared log-sum-exp of each token's logits. It keeps the logits small, so the softmax
  does not saturate and bf16 rounding of large logits does not flip choices; weight 0.001.
* :func:`biased_route` with :func:`update_bias`, DeepSeek-V3's balancing without an
  auxiliary loss (DeepSeek-V3 technical report, 2024, section 2.1.2; Wang et al., 2024): a
  bias per expert is added to the scores for *choosing* the top-k only, never to the
  weights the outputs are mixed with; after each step the bias of an overloaded expert
  goes down and that of an underloaded one up by a fixed speed ``gamma``. No gradient is
  involved, so the task loss is untouched.
"""

from __future__ import annotations

import torch

from .routing import route


def expert_load(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """Token copies per expert (float, ``E``) for the routing ``ids`` (``T x top_k``)."""
    return torch.zeros(experts, device=ids.device).scatter_add_(
        0, ids.reshape(-1), torch.ones(ids.numel(), device=ids.device))


def switch_aux_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``E * sum_i f_i * P_i`` (1 when even): ``f`` the share of copies per expert,
    ``P`` the mean softmax probability per expert, over the ``T`` tokens."""
    E = logits.shape[1]
    probs = torch.softmax(logits.float(), dim=-1)
    share = expert_load(ids, E) / max(ids.numel(), 1)
    return E * (share * probs.mean(dim=0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """The mean over tokens of ``logsumexp(logits)^2``."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


def biased_route(logits: torch.Tensor, bias: torch.Tensor, top_k: int):
    """:func:`route` whose choice of experts sees ``logits + bias`` while the weights
    come from the unbiased softmax at the chosen experts, renormalised."""
    _, ids = torch.topk(logits.float() + bias, top_k, dim=-1)
    probs = torch.softmax(logits.float(), dim=-1)
    weights = probs.gather(1, ids)
    return weights / weights.sum(dim=-1, keepdim=True), ids


def update_bias(bias: torch.Tensor, ids: torch.Tensor, gamma: float) -> torch.Tensor:
    """One step of the bias: ``bias + gamma * sign(mean load - load)`` per expert."""
    load = expert_load(ids, bias.numel())
    return bias + gamma * torch.sign(load.mean() - load)


__all__ = ["expert_load", "switch_aux_loss", "router_z_loss", "biased_route", "update_bias",
           "route"]

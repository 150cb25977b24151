"""Lesson 08's load balancing (helpers.kernels.moe.balancing) and the router runs the lesson
trains with it (helpers.exercises.moe_balancing): each recipe's formula on cases worked by
hand, then the runs, whose outcome the lesson's prediction asks about."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.exercises import moe_balancing as mb
from helpers.kernels.moe import balancing as bal


def test_the_auxiliary_loss_is_one_when_even_and_grows_with_imbalance():
    E, T = 4, 8
    even_ids = torch.arange(T * 2).remainder(E).view(T, 2)
    flat = torch.zeros(T, E)
    assert bal.switch_aux_loss(flat, even_ids).item() == pytest.approx(1.0)
    # Everything to expert 0, and the router sure of it: E * 1 * P_0 -> E.
    sure = torch.full((T, E), -30.0)
    sure[:, 0] = 30.0
    collapsed = torch.zeros(T, 1, dtype=torch.long)
    assert bal.switch_aux_loss(sure, collapsed).item() == pytest.approx(E, rel=1e-6)


def test_the_auxiliary_losss_gradient_lowers_the_busy_experts_probability():
    logits = torch.zeros(6, 3, requires_grad=True)
    ids = torch.zeros(6, 1, dtype=torch.long)          # every copy to expert 0
    bal.switch_aux_loss(logits, ids).backward()
    assert (logits.grad[:, 0] > 0).all() and (logits.grad[:, 1:] < 0).all(), (
        "descending the loss must move probability away from the overloaded expert")


def test_the_z_loss_of_equal_logits_is_log_e_squared():
    assert bal.router_z_loss(torch.zeros(5, 8)).item() == pytest.approx(math.log(8) ** 2)
    assert bal.router_z_loss(torch.full((5, 8), 3.0)).item() == pytest.approx((3 + math.log(8)) ** 2)


def test_the_bias_chooses_but_does_not_weigh():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    weights, ids = bal.biased_route(logits, bias, 2)
    assert ids.tolist() == [[2, 0]], "the bias moved expert 2 into the top 2"
    p = torch.softmax(logits, -1)[0]
    assert weights[0].tolist() == pytest.approx([(p[2] / (p[2] + p[0])).item(),
                                                 (p[0] / (p[2] + p[0])).item()])


def test_the_bias_moves_against_the_load():
    ids = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 1]])   # loads 3, 3, 1, 1: mean 2
    assert bal.expert_load(ids, 5).tolist() == [3, 3, 1, 1, 0]
    new = bal.update_bias(torch.zeros(4), ids, 0.1)
    assert new.tolist() == pytest.approx([-0.1, -0.1, 0.1, 0.1])


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="policy must be one of"):
        mb.train_router("dropout")


def test_the_runs_the_lesson_draws():
    """The lesson's reading of its figure: the bias ends most even and the unbalanced
    router least; the auxiliary loss evens it; the z-loss shrinks the logits; no recipe
    costs much task loss."""
    runs = mb.train_all()
    late = {p: sum(r.load_over_mean[-20:]) / 20 for p, r in runs.items()}
    assert min(late, key=late.get) == "bias" and max(late, key=late.get) == "none", late
    assert late["auxiliary"] < 0.8 * late["none"], late
    assert runs["none"].load_over_mean[-1] > runs["none"].load_over_mean[0], (
        "without balancing the router's early preference must grow")
    assert runs["z-loss"].z[-1] < 0.8 * runs["auxiliary"].z[-1]
    final = [r.task_loss[-1] for r in runs.values()]
    assert max(final) < 1.5 * min(final), final
    assert "'bias' is right" in str(mb.check_most_even("bias", runs))
    assert "is not it" in str(mb.check_most_even("none", runs))

"""Lesson 08's router and dispatch (helpers.kernels.moe), checked by plain PyTorch.

The router's weights against a float64 softmax; the dispatch against a dispatch written
the slow, obvious way (scan the copies once per expert, keep the first ``capacity``),
which shares no code with the sort it checks: the permutation, rows, counts, offsets and
the inverse ``position``, on the awkward cases (experts with no tokens, one token, every
token to one expert, ``top_k`` equal to the number of experts, capacity drops), then the
routings lesson 08 studies (helpers.kernels.moe.routing: a router skewed toward a few
experts, a routing's balance). No kernels here: these run in a second.
"""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.kernels import moe as M
from helpers.kernels.moe import routing

DEVICE = helpers.device()


def logits(tokens, experts, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, experts, generator=g).to(DEVICE, dtype)


def random_ids(tokens, experts, top_k, seed=0):
    """Distinct experts per token, as a router picks them, in random order."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(experts, generator=g)[:top_k]
                        for _ in range(tokens)]).to(DEVICE)


# --------------------------------------------------------------------------------------
# route
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("experts,top_k", [(8, 1), (8, 2), (16, 4), (4, 4)])
def test_route_keeps_the_largest_probabilities_renormalised(experts, top_k):
    x = logits(37, experts)
    weights, ids = M.route(x, top_k)
    assert weights.shape == ids.shape == (37, top_k)
    probs = torch.softmax(x.double(), dim=-1)
    chosen = probs.gather(1, ids)
    # Largest first, and no expert left out was larger than one kept.
    assert (chosen[:, :-1] >= chosen[:, 1:]).all(), "ids must come largest first"
    others = probs.scatter(1, ids, -1.0)
    assert (others.max(dim=1).values <= chosen[:, -1]).all(), (
        "an expert that was not chosen has a larger probability than one that was")
    assert torch.allclose(weights.sum(dim=1), torch.ones(37, device=DEVICE), atol=1e-6), (
        "the chosen experts' weights must sum to 1 (renormalised over the top_k)")
    assert torch.allclose(weights.double(), chosen / chosen.sum(dim=1, keepdim=True),
                          atol=1e-6), "weights are the chosen probabilities over their sum"


def test_route_without_renormalising_gives_the_softmax_probabilities():
    x = logits(9, 8)
    weights, ids = M.route(x, 2, renormalize=False)
    want = torch.softmax(x.double(), dim=-1).gather(1, ids)
    assert torch.allclose(weights.double(), want, atol=1e-6)
    assert (weights.sum(dim=1) < 1).all(), "two of eight probabilities sum to less than 1"


def test_route_with_every_expert_is_a_sorted_softmax():
    x = logits(5, 4)
    weights, ids = M.route(x, 4)
    assert torch.equal(ids.sort(dim=1).values, torch.arange(4, device=DEVICE).expand(5, 4)), (
        "top_k = E: every expert, each once")
    want = torch.softmax(x.double(), dim=-1).sort(dim=1, descending=True).values
    assert torch.allclose(weights.double(), want, atol=1e-6)


def test_route_computes_in_fp32_or_better():
    assert M.route(logits(3, 4, dtype=torch.float16), 2)[0].dtype == torch.float32, (
        "fp16 logits: the softmax runs in fp32")
    assert M.route(logits(3, 4, dtype=torch.float64), 2)[0].dtype == torch.float64


@pytest.mark.parametrize("top_k,message", [(0, "top_k must be between 1"),
                                           (5, "number of experts \\(4\\), got 5")])
def test_route_refuses_a_top_k_it_cannot_pick(top_k, message):
    with pytest.raises(ValueError, match=message):
        M.route(logits(3, 4), top_k)


def test_route_refuses_one_dimensional_logits():
    with pytest.raises(ValueError, match="must be \\(tokens, experts\\)"):
        M.route(logits(1, 4)[0], 2)


# --------------------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------------------


def plain_dispatch(ids, experts, capacity=None):
    """The obvious way: for each expert, scan the copies in order, keep the first
    ``capacity``. Returns ``(order, counts)`` as lists."""
    flat = ids.reshape(-1).tolist()
    order, counts = [], []
    for e in range(experts):
        mine = [c for c, f in enumerate(flat) if f == e][:capacity]
        order += mine
        counts.append(len(mine))
    return order, counts


def check_dispatch(ids, experts, capacity=None):
    """Every field of ``dispatch`` against :func:`plain_dispatch`; returns the Dispatch."""
    T, top_k = ids.shape
    d = M.dispatch(ids, experts, capacity)
    order, counts = plain_dispatch(ids, experts, capacity)
    what = f"ids {tuple(ids.shape)}, {experts} experts, capacity {capacity}"
    assert d.order.tolist() == order, (
        f"{what}: order must list the copies by expert and, within an expert, in token "
        f"order (a stable sort); got {d.order.tolist()[:12]}..., expected {order[:12]}...")
    assert d.counts.tolist() == counts, f"{what}: counts {d.counts.tolist()}, expected {counts}"
    assert d.offsets.tolist() == [sum(counts[:e]) for e in range(experts + 1)], (
        f"{what}: offsets must be the running sum of counts, starting at 0")
    assert d.rows.dtype == torch.int32 and d.counts.dtype == torch.int32
    assert d.rows.tolist() == [c // top_k for c in order], "rows: the token of each copy"
    # position is the inverse permutation, -1 for the dropped copies.
    want = [-1] * (T * top_k)
    for r, c in enumerate(order):
        want[c] = r
    assert d.position.shape == (T, top_k) and d.position.reshape(-1).tolist() == want, (
        f"{what}: position[t, j] must be the sorted row of copy (t, j), -1 if dropped")
    assert d.dropped == want.count(-1)
    return d


@pytest.mark.parametrize("tokens,experts,top_k", [(37, 8, 2), (7, 16, 1), (20, 4, 4),
                                                  (64, 16, 8)])
def test_dispatch_sorts_the_copies_by_expert_stably(tokens, experts, top_k):
    d = check_dispatch(random_ids(tokens, experts, top_k), experts)
    assert d.dropped == 0 and int(d.counts.sum()) == tokens * top_k


def test_position_undoes_the_sort():
    """Sort per-copy values by ``order``, read them back through ``position``: unchanged."""
    ids = random_ids(29, 8, 3, seed=1)
    d = M.dispatch(ids, 8)
    values = torch.randn(29 * 3, 5, device=DEVICE)
    sorted_values = values[d.order]
    assert torch.equal(sorted_values[d.position.reshape(-1)], values)
    assert torch.equal(d.order[d.position.reshape(-1)], torch.arange(29 * 3, device=DEVICE))
    x = torch.randn(29, 5, device=DEVICE)
    assert torch.equal(x[d.rows.long()], x.repeat_interleave(3, dim=0)[d.order]), (
        "rows[r] is the token whose copy sits at sorted row r")


def test_experts_with_no_tokens_get_empty_ranges():
    ids = torch.tensor([[5, 1], [1, 5], [5, 7]], device=DEVICE)
    d = check_dispatch(ids, 8)
    assert d.counts.tolist() == [0, 2, 0, 0, 0, 3, 0, 1]
    assert d.offsets.tolist() == [0, 0, 2, 2, 2, 2, 5, 5, 6]


def test_a_single_token():
    d = check_dispatch(torch.tensor([[3, 0]], device=DEVICE), 4)
    assert d.order.tolist() == [1, 0] and d.position.tolist() == [[1, 0]]


def test_every_token_to_one_expert():
    d = check_dispatch(torch.full((11, 1), 2, device=DEVICE), 4)
    assert d.counts.tolist() == [0, 0, 11, 0]
    assert d.order.tolist() == list(range(11)), "one expert: the tokens stay in order"


def test_top_k_equal_to_the_number_of_experts():
    ids = random_ids(9, 4, 4, seed=2)
    d = check_dispatch(ids, 4)
    assert d.counts.tolist() == [9] * 4, "every expert sees every token once"
    for e in range(4):
        lo, hi = d.offsets[e], d.offsets[e + 1]
        assert d.rows[lo:hi].tolist() == list(range(9)), f"expert {e}: tokens in order"


@pytest.mark.parametrize("cap", [0, 1, 3, 100])
def test_capacity_keeps_each_experts_earliest_tokens(cap):
    ids = random_ids(23, 4, 2, seed=3)
    d = check_dispatch(ids, 4, cap)
    full = torch.bincount(ids.reshape(-1), minlength=4)
    assert d.counts.tolist() == full.clamp(max=cap).tolist()
    assert d.dropped == int((full - full.clamp(max=cap)).sum())
    for t, j in (d.position < 0).nonzero().tolist():
        e = int(ids[t, j])
        kept = d.rows[d.offsets[e]:d.offsets[e + 1]].tolist()
        assert len(kept) == cap and all(k < t for k in kept), (
            f"token {t}'s copy to expert {e} was dropped while the expert kept tokens "
            f"{kept}: capacity drops the latest tokens, not the earliest")


def test_dispatch_of_no_tokens():
    d = M.dispatch(torch.zeros(0, 2, dtype=torch.long, device=DEVICE), 4)
    assert d.order.numel() == 0 and d.counts.tolist() == [0] * 4 and d.position.shape == (0, 2)


@pytest.mark.parametrize("bad", [[[0, 4]], [[-1, 2]]])
def test_dispatch_refuses_expert_ids_out_of_range(bad):
    with pytest.raises(ValueError, match="expert ids must lie in \\[0, 4\\)"):
        M.dispatch(torch.tensor(bad, device=DEVICE), 4)


def test_dispatch_refuses_one_dimensional_ids():
    with pytest.raises(ValueError, match="must be \\(tokens, top_k\\)"):
        M.dispatch(torch.tensor([0, 1], device=DEVICE), 4)


def test_capacity_is_the_fair_share_times_the_factor_rounded_up():
    assert M.capacity(64, 2, 8, 1.0) == 16
    assert M.capacity(7, 2, 4, 1.0) == 4, "3.5 rows rounds up to 4"
    assert M.capacity(64, 2, 8, 1.25) == 20
    assert M.capacity(1, 1, 128, 1.0) == 1


# --------------------------------------------------------------------------------------
# Skewed routes and a routing's balance
# --------------------------------------------------------------------------------------


def test_the_skew_favours_the_hot_experts_more_as_it_grows():
    logits = routing.router_logits(4096, 256, 32, seed=3)
    assert torch.equal(routing.skew_bias(32, 0.0), torch.zeros(32))
    loads = []
    for s in (0.0, 1.0, 4.0):
        weights, ids = routing.skewed_route(logits, 4, s, hot=2)
        assert torch.allclose(weights.sum(-1), torch.ones(4096))
        counts = torch.bincount(ids.reshape(-1), minlength=32)
        loads.append(routing.load_summary(counts, 64)["max_over_mean"])
    assert loads[0] < 1.5 < loads[1] < loads[2] <= 32 / 4 + 1e-9, loads
    with pytest.raises(ValueError, match="hot"):
        routing.skew_bias(8, 1.0, hot=9)


def test_load_summary():
    s = routing.load_summary([100, 0, 28], block_m=64)
    assert s["padding_rows"] == 28 + 36 and s["idle_experts"] == 1
    assert s["max_over_mean"] == pytest.approx(100 / (128 / 3)) and s["counts"] == [100, 0, 28]


def test_the_family_face_routes_with_the_routing_module():
    # Lessons call moe.route and moe.router_logits; they are the routing module's.
    assert M.route is routing.route and M.router_logits is routing.router_logits
    assert M.skewed_route is routing.skewed_route

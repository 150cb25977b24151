"""Lesson 08's trainable layer: the backward kernels and the autograd Function against
float64 autograd.

``swiglu_backward`` and ``grouped_weight_grad`` (helpers.kernels.moe.backward) against the
chain rule written out in float64, on the grouped problem's awkward counts (idle experts,
a row, counts that are not whole tiles); then ``experts_train`` and ``MoELayer``: every
gradient (x, router, gate_up, down) against float64 autograd through the spec, on the
routings the dispatch tests use (top-1 to top-k = E, capacity drops, no tokens), and a
few steps of training that lower a loss. In CPU mode the kernels run in Triton's
interpreter with small tiles; the tests marked ``gpu`` run them compiled and autotuned,
bf16 included.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support import assert_close as _assert_close

import helpers
from helpers.kernels import moe as M
from helpers.kernels.moe import backward as B
from helpers.kernels.moe import grouped as G
from helpers.kernels.moe import training as MT

DEVICE = helpers.device()
FP32_TOL = 1e-2 if helpers.is_gpu() else 1e-4
TABLE = [(torch.float32, FP32_TOL, FP32_TOL), (torch.float16, 2e-2, 2e-2)]
GPU_TABLE = TABLE + [(torch.bfloat16, 8e-2, 8e-2)]
dtype_ids = [str(row[0]).replace("torch.", "") for row in GPU_TABLE]
# (dtype, atol, rtol, setting): the CPU setting in both dtypes, the smallest tiles once.
SMALLEST = G.TileConfig(16, 16, 16, num_warps=4, num_stages=1, group_m=1)
SETTINGS = [(*TABLE[0], G.CPU_CONFIG), (*TABLE[1], G.CPU_CONFIG), (*TABLE[0], SMALLEST)]
setting_ids = ["fp32", "fp16", "fp32 16x16x16 group 1"]
# Rows per expert, H, I.
GROUPED = {
    "skewed, empty experts": ([0, 1, 40, 0, 3, 17], 48, 40),
    "one expert takes all": ([0, 0, 33, 0], 32, 64),
    "one row": ([0, 1], 16, 16),
}


def assert_close(got, want, atol, rtol, what, hint=""):
    _assert_close(got.double(), want.double(), atol, rtol, what, hint)


def randn(*shape, seed, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def grouped_problem(counts, H, I, dtype, seed=0):
    """Tokens, their sorted rows (shuffled tokens, some read twice) and the weights."""
    R, E = sum(counts), len(counts)
    T = max(R // 2, 1)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, T, (R,), generator=g).to(DEVICE, torch.int32)
    c = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
    offsets = torch.zeros(E + 1, dtype=torch.long, device=DEVICE)
    offsets[1:] = torch.cumsum(c.long(), 0)
    return rows, c, offsets, T


@pytest.mark.parametrize("dtype,atol,rtol,config", SETTINGS, ids=setting_ids)
@pytest.mark.parametrize("counts,H,I", GROUPED.values(), ids=GROUPED.keys())
def test_swiglu_backward_is_the_chain_rule(counts, H, I, dtype, atol, rtol, config):
    rows, c, _, T = grouped_problem(counts, H, I, dtype)
    E, R = len(counts), sum(counts)
    dout = randn(T, H, seed=1, dtype=dtype)
    down = randn(E, I, H, seed=2, scale=I ** -0.5, dtype=dtype)
    pre = randn(R, 2 * I, seed=3, dtype=dtype)
    scale = torch.rand(R, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    dpre, ds = B.swiglu_backward(dout, rows, c, down, pre, scale, config)
    # The same in float64, one sorted row at a time through its expert.
    expert = torch.repeat_interleave(torch.arange(E, device=DEVICE), c.long())
    acc = torch.einsum("rh,rih->ri", dout.double()[rows.long()], down.double()[expert])
    g, u = pre.double()[:, :I], pre.double()[:, I:]
    want_ds = (acc * F.silu(g) * u).sum(1)
    dh = acc * scale.double()[:, None]
    sig = torch.sigmoid(g)
    want = torch.cat([dh * u * sig * (1 + g * (1 - sig)), dh * F.silu(g)], 1)
    what = f"swiglu_backward, counts {counts}, {dtype}"
    assert dpre.dtype == dtype and dpre.shape == (R, 2 * I), f"{what}: dpre {dpre.dtype} {tuple(dpre.shape)}"
    assert_close(dpre, want, atol * 10, rtol, f"{what}: [dg | du]",
                 "dg = dh * u * silu'(g), du = dh * silu(g), dh = s * dout @ Wd^T")
    assert_close(ds, want_ds, atol * 10, rtol, f"{what}: the routing weight's gradient",
                 "ds = <dout @ Wd^T, h> summed over every column tile")


@pytest.mark.parametrize("dtype,atol,rtol,config", SETTINGS, ids=setting_ids)
@pytest.mark.parametrize("counts,H,I", GROUPED.values(), ids=GROUPED.keys())
def test_weight_grad_sums_each_experts_rows(counts, H, I, dtype, atol, rtol, config):
    _, _, offsets, _ = grouped_problem(counts, H, I, dtype)
    E, R = len(counts), sum(counts)
    a, b = randn(R, H, seed=5, dtype=dtype), randn(R, I, seed=6, dtype=dtype)
    got = B.grouped_weight_grad(a, b, offsets, E, config)
    want = torch.stack([a.double()[offsets[e]:offsets[e + 1]].T @ b.double()[offsets[e]:offsets[e + 1]]
                        for e in range(E)])
    what = f"grouped_weight_grad, counts {counts}, {dtype}"
    assert got.shape == (E, H, I) and got.dtype == dtype, f"{what}: {got.dtype} {tuple(got.shape)}"
    assert_close(got, want, atol * 10, rtol, what, "C[e] = A_e^T @ B_e over expert e's rows")
    for e, n in enumerate(counts):
        if n == 0:
            assert torch.count_nonzero(got[e]) == 0, f"{what}: expert {e} had no rows, so its "\
                "gradient is exactly 0 (its tiles must still be written)"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "scaled"])
def test_gather_rows(scaled, dtype):
    src = randn(11, 70, seed=8, dtype=dtype)
    rows = torch.tensor([3, 3, 0, 10, 7, 1, 2, 9, 4, 4, 4, 5, 6, 8, 0, 2, 1, 10, 3],
                        dtype=torch.int32, device=DEVICE)
    scale = torch.rand(rows.numel(), generator=torch.Generator().manual_seed(9)).to(DEVICE) \
        if scaled else None
    want = src.double()[rows.long()] * (scale.double()[:, None] if scaled else 1)
    got = B.gather_rows(src, rows, scale)
    assert got.dtype == dtype
    assert_close(got, want, 1e-3 if dtype == torch.float16 else 1e-6, 1e-3, "gather_rows")
    assert B.gather_rows(src, rows[:0]).shape == (0, 70)


# --------------------------------------------------------------------------------------
# The layer against float64 autograd.
# --------------------------------------------------------------------------------------


def reference_layer(x, router, gate_up, down, ids, kept):
    """The layer in float64 for the given routing: every expert on every token, the
    routing weights from the router's softmax at ``ids``, dropped copies (``~kept``) zero."""
    probs = torch.softmax(x @ router, dim=-1)
    w = probs.gather(1, ids)
    w = w / w.sum(-1, keepdim=True) * kept
    I = down.shape[1]
    every = torch.stack([(F.silu(x @ gate_up[e, :, :I]) * (x @ gate_up[e, :, I:])) @ down[e]
                         for e in range(down.shape[0])])
    tokens = torch.arange(x.shape[0], device=x.device)[:, None]
    return (w[..., None] * every[ids, tokens]).sum(1)


def column_major(t):
    """The same values stored transposed in their last two dimensions (nn.Linear's layout)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def check_layer(T, E, top_k, H, I, dtype, atol, rtol, cap=None, seed=0, layout=None):
    torch.manual_seed(seed)
    layer = M.MoELayer(E, top_k, H, I, dtype=torch.float32, device=DEVICE)
    params = {n: (layout or (lambda t: t))(p.detach().to(dtype)).requires_grad_()
              for n, p in layer.named_parameters()}
    x = randn(T, H, seed=seed + 1, dtype=dtype).requires_grad_()
    dout = randn(T, H, seed=seed + 2, dtype=dtype)
    weights, ids = M.route(x @ params["router"], top_k)
    d = M.dispatch(ids, E, cap)
    got = M.experts_train(x, weights, params["gate_up"], params["down"], d)
    got.backward(dout)
    ref = {n: p.detach().double().requires_grad_() for n, p in params.items()}
    x64 = x.detach().double().requires_grad_()
    want = reference_layer(x64, ref["router"], ref["gate_up"], ref["down"], ids,
                           (d.position >= 0).double())
    want.backward(dout.double())
    what = f"T={T} E={E} top_k={top_k} capacity={cap} {dtype}"
    assert got.dtype == dtype, f"{what}: output {got.dtype}"
    assert_close(got, want, atol, rtol, f"{what}: output")
    for name, mine, theirs in [("x", x, x64), *((n, params[n], ref[n]) for n in params)]:
        # Divided by the largest entry (at least 1: top-1's renormalised weight is always 1,
        # so its router gradient is 0 up to rounding).
        scale = max(theirs.grad.abs().max().item(), 1.0)
        assert mine.grad is not None and mine.grad.dtype == dtype, f"{what}: no gradient for {name}"
        assert_close(mine.grad / scale, theirs.grad / scale, atol, rtol,
                     f"{what}: d loss / d {name} (divided by its largest entry, {scale:.3g})")


# The dispatch tests' routings (top-1 to top-k = E, many experts), fp32; fp16 on one.
ROUTINGS = [(37, 8, 2, *TABLE[0]), (7, 16, 1, *TABLE[0]), (20, 4, 4, *TABLE[0]),
            (24, 16, 8, *TABLE[0]), (37, 8, 2, *TABLE[1])]


@pytest.mark.parametrize("tokens,experts,top_k,dtype,atol,rtol", ROUTINGS,
                         ids=lambda v: str(v).replace("torch.", ""))
def test_every_gradient_matches_float64_autograd(tokens, experts, top_k, dtype, atol, rtol):
    check_layer(tokens, experts, top_k, 32, 48, dtype, atol, rtol)


@pytest.mark.parametrize("cap", [0, 3])
def test_dropped_copies_get_no_gradient_and_add_nothing(cap):
    check_layer(23, 4, 2, 16, 32, torch.float32, FP32_TOL, FP32_TOL, cap=cap, seed=3)


def test_weights_stored_transposed():
    """gate_up and down as nn.Linear stores them (transposed copies): the kernels walk
    them through their strides, the gradients come back right."""
    check_layer(29, 8, 2, 32, 48, torch.float32, FP32_TOL, FP32_TOL, layout=column_major)


def test_only_the_gradients_asked_for_are_computed(monkeypatch):
    """x without grad (the layer fed by the embedding) and a frozen part: the GEMMs behind
    the gradients nobody asked for do not run, and the others match the full backward's."""
    layer = M.MoELayer(8, 2, 16, 32, device=DEVICE)
    x = randn(19, 16, seed=5, dtype=torch.float32)
    layer(x.requires_grad_()).sum().backward()
    full = {n: p.grad.clone() for n, p in layer.named_parameters()}
    calls = []          # in the backward, grouped_matmul is dx's GEMM
    monkeypatch.setattr(MT, "grouped_matmul",
                        lambda *a, **k: calls.append("dx") or G.grouped_matmul(*a, **k))
    monkeypatch.setattr(MT, "grouped_weight_grad",
                        lambda *a, **k: calls.append("dW") or B.grouped_weight_grad(*a, **k))
    # down frozen: gate_up's weight gradient only; the router frozen (and x without grad):
    # no routing-weight gradient, both weight gradients.
    for frozen, expected in (("down", ["dW"]), ("router", ["dW", "dW"])):
        for n, p in layer.named_parameters():
            p.requires_grad_(n != frozen)
            p.grad = None
        out = layer(x.detach())
        calls.clear()
        out.sum().backward()
        assert calls == expected, f"{frozen} frozen, x without grad: ran {calls}"
        for n, p in layer.named_parameters():
            if n != frozen:
                assert_close(p.grad, full[n], FP32_TOL, FP32_TOL, f"d loss / d {n}, {frozen} frozen")


def test_no_tokens():
    layer = M.MoELayer(4, 2, 16, 32, device=DEVICE)
    x = torch.zeros(0, 16, device=DEVICE, requires_grad=True)
    out = layer(x)
    out.sum().backward()
    assert out.shape == (0, 16) and x.grad.shape == (0, 16)
    assert torch.count_nonzero(layer.gate_up.grad) == 0 and torch.count_nonzero(layer.down.grad) == 0


def test_the_layer_trains():
    """A few Adam steps of the layer (a random teacher as target) lower the loss, and the
    router learns too (its weights move)."""
    torch.manual_seed(0)
    T, E, top_k, H, I = 16, 3, 2, 16, 16
    student = M.MoELayer(E, top_k, H, I, device=DEVICE)
    teacher = M.MoELayer(E, top_k, H, I, device=DEVICE)
    x = randn(T, H, seed=9)
    with torch.no_grad():
        target = teacher(x)
    router_before = student.router.detach().clone()
    opt = torch.optim.Adam(student.parameters(), lr=3e-2)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.mse_loss(student(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], f"the loss did not fall: {losses}"
    assert not torch.equal(student.router, router_before), "the router got no gradient"


@pytest.mark.parametrize("gate_up,down,message", [
    ((4, 16, 31), (4, 15, 16), "gate_up .* and down must be"),
    ((4, 16, 32), (4, 8, 16), "gate_up .* and down must be"),
    ((4, 8, 32), (4, 16, 8), "x has 16 features"),
])
def test_wrong_weight_shapes_are_refused(gate_up, down, message):
    x = randn(5, 16, seed=0)
    weights, ids = M.route(torch.randn(5, 4, device=DEVICE), 2)
    d = M.dispatch(ids, 4)
    with pytest.raises(ValueError, match=message):
        M.experts_train(x, weights, torch.zeros(gate_up, device=DEVICE),
                        torch.zeros(down, device=DEVICE), d)


# --------------------------------------------------------------------------------------
# Compiled on a GPU: autotuned, bf16 too.
# --------------------------------------------------------------------------------------


# Each (shape, dtype) tunes five kernels afresh: a few shapes keep the run to a minute.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol,rtol", [GPU_TABLE[0], GPU_TABLE[2]], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(300, 16, 2, 256, 512), (77, 32, 4, 200, 136)],
                         ids=lambda s: "x".join(map(str, s)))
def test_compiled_gradients_at_moderate_sizes(shape, dtype, atol, rtol):
    check_layer(*shape, dtype, atol, rtol)


@pytest.mark.gpu
def test_the_tuned_routing_gradient_sums_each_row_once():
    """Tuning runs every tile width on the same buffers: no share of a trial run may
    survive into the routing weight's gradient (a shape no other test tunes)."""
    counts, H, I = [0, 300, 1, 77, 129, 0, 500, 17], 256, 1024
    rows, c, _, T = grouped_problem(counts, H, I, torch.bfloat16)
    E, R = len(counts), sum(counts)
    dout = randn(T, H, seed=1, dtype=torch.bfloat16)
    down = randn(E, I, H, seed=2, scale=I ** -0.5, dtype=torch.bfloat16)
    pre = randn(R, 2 * I, seed=3, dtype=torch.bfloat16)
    scale = torch.rand(R, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    _, ds = B.swiglu_backward(dout, rows, c, down, pre, scale)
    expert = torch.repeat_interleave(torch.arange(E, device=DEVICE), c.long())
    acc = torch.einsum("rh,rih->ri", dout.double()[rows.long()], down.double()[expert])
    g, u = pre.double()[:, :I], pre.double()[:, I:]
    assert_close(ds, (acc * F.silu(g) * u).sum(1), 0.5, 2e-2, "ds after tuning")


@pytest.mark.gpu
def test_compiled_gradients_with_capacity():
    check_layer(300, 16, 2, 256, 512, torch.bfloat16, 8e-2, 8e-2, cap=30)

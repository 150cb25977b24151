"""Lesson 08's grouped GEMM, combine and whole layer (helpers.kernels.moe) against the spec.

The two grouped kernels against one PyTorch matmul per expert, on skewed counts, empty
experts, counts that are not whole tiles, K not a multiple of BLOCK_K and N not a multiple
of BLOCK_N, under several explicit settings; the combine with dropped copies; then the
layer (``moe_forward``) and its per-expert loop (``moe_loop``) against the float64
reference, with capacity drops and strided weights, and the inputs it refuses. Router and
dispatch are in ``test_moe_dispatch.py``. In CPU mode the kernels run in Triton's
interpreter with small tiles; the tests marked ``gpu`` run them compiled and autotuned,
bf16 included, up to the lesson's two real layer shapes.
"""

from __future__ import annotations

import re

import pytest
import torch

import helpers
from helpers.kernels import moe as M
from helpers.kernels.moe import grouped as G
from helpers.runtime import InterpreterLimitationError

from support import assert_close as _assert_close

DEVICE = helpers.device()

# (dtype, atol, rtol) against float64, for outputs of order 1. fp32 products are exact to
# ~1e-6 in the interpreter but run on TF32 tensor cores on a GPU (~1e-3 relative).
FP32_TOL = 1e-2 if helpers.is_gpu() else 1e-4
TABLE = [(torch.float32, FP32_TOL, FP32_TOL), (torch.float16, 1e-2, 1e-2)]
GPU_TABLE = TABLE + [(torch.bfloat16, 6e-2, 6e-2)]
dtype_ids = [str(row[0]).replace("torch.", "") for row in GPU_TABLE]

# Settings small enough for the interpreter: the lesson's CPU setting, the smallest tiles
# tl.dot takes, and a wide one; GROUP_M 1, 2 and 8 walk the tiles in different orders.
CONFIGS = {
    "cpu default": G.CPU_CONFIG,
    "16x16x16 group 1": G.TileConfig(16, 16, 16, num_warps=4, num_stages=1, group_m=1),
    "32x64x16 group 2": G.TileConfig(32, 64, 16, num_warps=4, num_stages=2, group_m=2),
}

# Rows per expert, K, N: the grouped problem's awkward shapes.
GROUPED = {
    "skewed, empty experts": ([0, 1, 40, 0, 3, 17], 48, 40),   # K % 32, N % 32 != 0
    "one expert takes all": ([0, 0, 33, 0], 32, 64),
    "one row": ([0, 1], 16, 16),
    "three rows, 16 experts": ([0] * 5 + [1] + [0] * 3 + [2] + [0] * 6, 40, 24),
}


def assert_close(got, want, atol, rtol, what, hint=""):
    """Compare in float64 (the references are), after checking ``got``'s own dtype."""
    _assert_close(got.double(), want.double(), atol, rtol, what, hint)


def randn(*shape, seed, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def swiglu(x, gate, up, down=None):
    h = torch.nn.functional.silu(x @ gate) * (x @ up)
    return h if down is None else h @ down


def per_expert(a, rows, counts, w, w2=None, precision=torch.float64):
    """The grouped problem one expert at a time: ``a[rows] @ w[e]`` (with ``w2``, the
    gathered SwiGLU ``silu(a[rows] @ w[e]) * (a[rows] @ w2[e])``), in ``precision``."""
    out, lo = [], 0
    for e, c in enumerate(counts):
        sel = a[rows[lo:lo + c].long()].to(precision)
        if w2 is None:
            out.append(sel @ w[e].to(precision))
        else:
            out.append(swiglu(sel, w[e].to(precision), w2[e].to(precision)))
        lo += c
    return torch.cat(out)


def grouped_problem(counts, K, N, dtype, seed=0, tokens=11):
    """Tokens ``x``, the token of each sorted row, two weight stacks scaled to outputs of
    order 1."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, tokens, (sum(counts),), generator=g, dtype=torch.int32).to(DEVICE)
    x = randn(tokens, K, seed=seed + 1, dtype=dtype)
    w, w2 = (randn(len(counts), K, N, seed=seed + s, scale=K ** -0.5, dtype=dtype)
             for s in (2, 3))
    return x, rows, torch.tensor(counts, dtype=torch.int32, device=DEVICE), w, w2


def check_grouped(kind, counts, K, N, dtype, atol, rtol, config, precision=torch.float64):
    x, rows, c, w, w2 = grouped_problem(counts, K, N, dtype)
    what = f"{kind} counts={counts} K={K} N={N} {dtype} config={config}"
    if kind == "swiglu":
        got = G.grouped_swiglu(x, rows, c, w, w2, config)
        want = per_expert(x, rows, counts, w, w2, precision)
    else:
        a = x[rows.long()]                                    # already sorted rows
        got = G.grouped_matmul(a, c, w, config)
        want = per_expert(a, torch.arange(len(rows), device=DEVICE), counts, w,
                          precision=precision)
    assert got.dtype == dtype, f"{what}: the output keeps the input's dtype"
    assert_close(got, want, atol, rtol, what,
                 "Only some rows off? Check the tile-to-expert arithmetic for the experts "
                 "before them; only the last columns? The N edge; everything? The K loop.")


# --------------------------------------------------------------------------------------
# The grouped kernels and the combine, in CPU mode through the interpreter.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,atol,rtol", TABLE, ids=dtype_ids[:2])
@pytest.mark.parametrize("case", list(GROUPED))
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", ["swiglu", "matmul"])
def test_grouped_kernels_match_one_matmul_per_expert(kind, config, case, dtype, atol, rtol):
    check_grouped(kind, *GROUPED[case], dtype, atol, rtol, CONFIGS[config])


def test_grouped_kernels_with_no_rows_return_an_empty_result():
    x, rows, counts, w, w2 = grouped_problem([0, 0, 0], 16, 24, torch.float32)
    assert G.grouped_swiglu(x, rows, counts, w, w2).shape == (0, 24)
    assert G.grouped_matmul(x[:0], counts, w).shape == (0, 24)


def combine_problem(dtype, cap=5):
    """Sorted rows of a real dispatch with capacity drops, and routing weights."""
    g = torch.Generator().manual_seed(7)
    ids = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(37)]).to(DEVICE)
    d = M.dispatch(ids, 8, capacity=cap)
    y = randn(int(d.counts.sum()), 100, seed=8, dtype=dtype)
    weights = torch.rand(37, 3, generator=g).to(DEVICE)
    return y, d, weights


@pytest.mark.parametrize("dtype,atol,rtol", TABLE, ids=dtype_ids[:2])
def test_combine_sums_each_tokens_weighted_rows_and_skips_dropped_copies(dtype, atol, rtol):
    """37 tokens (three blocks of 16), H = 100 (two blocks of 64 in CPU mode), top_k = 3."""
    y, d, weights = combine_problem(dtype)
    assert d.dropped > 0, "the test needs dropped copies"
    want = torch.zeros(37, 100, dtype=torch.float64, device=DEVICE)
    for t, j in (d.position >= 0).nonzero().tolist():
        want[t] += weights[t, j].double() * y[d.position[t, j]].double()
    got = M.combine(y, d.position, weights)
    assert got.dtype == dtype
    assert_close(got, want, atol, rtol, f"combine {dtype}",
                 "A dropped copy (position -1) must add nothing, not row -1 or row 0.")
    assert torch.equal(got, M.combine(y, d.position, weights)), (
        "the combine sums in a fixed order: the same bits every run")


def test_combine_when_every_copy_was_dropped_gives_zeros():
    y, d, weights = combine_problem(torch.float32, cap=0)
    assert y.shape[0] == 0 and d.dropped == 37 * 3
    assert torch.equal(M.combine(y, d.position, weights), torch.zeros(37, 100, device=DEVICE))


# --------------------------------------------------------------------------------------
# The layer: moe_forward (grouped kernels) and moe_loop (PyTorch) against float64.
# --------------------------------------------------------------------------------------

# (tokens, experts, top_k, hidden, width): one token, odd counts, top_k = 1, 2 and E.
LAYERS = [
    (1, 4, 1, 32, 32),
    (7, 8, 2, 48, 40),
    (37, 8, 2, 64, 96),
    (37, 16, 1, 32, 48),
    (7, 4, 4, 40, 72),
    (37, 4, 2, 96, 64),
    (7, 16, 16, 32, 32),
]


def layer(shape, dtype, seed=0):
    T, E, top_k, H, I = shape
    return randn(T, H, seed=seed + 100, dtype=dtype), M.make_weights(E, H, I, dtype=dtype,
                                                                     seed=seed)


def routing(x, w, top_k, logits_dtype=None):
    """The router's choice on logits computed in ``logits_dtype`` (default: x's, as the
    layer computes them)."""
    dt = logits_dtype or x.dtype
    return M.route(x.to(dt) @ w.router.to(dt), top_k)


def assert_same_routing(x, w, top_k):
    """In fp16 the logits are rounded: a near-tie may pick another expert than float64
    does, and then no tolerance holds. That is the test's data, not the layer, at fault."""
    got, want = routing(x, w, top_k)[1], routing(x, w, top_k, torch.float64)[1]
    assert torch.equal(got, want), (
        f"the {x.dtype} router picks other experts than float64 for tokens "
        f"{(got != want).any(1).nonzero().flatten().tolist()}: a near-tie; pick another seed")


def per_expert_layer(x, w, top_k, cap=None, precision=torch.float64, logits_dtype=None):
    """The layer one expert at a time in ``precision``: each expert keeps its first
    ``cap`` tokens (token order) and a dropped copy adds nothing."""
    weights, ids = routing(x, w, top_k, logits_dtype)
    out = torch.zeros(x.shape, dtype=precision, device=x.device)
    for e in range(w.experts):
        token, slot = (ids == e).nonzero(as_tuple=True)       # row-major: token order
        token, slot = token[:cap], slot[:cap]
        y = swiglu(x[token].to(precision), *(t[e].to(precision) for t in (w.gate, w.up, w.down)))
        out.index_add_(0, token, y * weights[token, slot, None].to(precision))
    return out


@pytest.mark.parametrize("dtype,atol,rtol", TABLE, ids=dtype_ids[:2])
@pytest.mark.parametrize("shape", LAYERS, ids=lambda s: "T{}-E{}-k{}-H{}-I{}".format(*s))
def test_layer_and_loop_match_the_reference(shape, dtype, atol, rtol):
    x, w = layer(shape, dtype)
    top_k = shape[2]
    assert_same_routing(x, w, top_k)
    want = M.moe_reference(x, w, top_k)
    for name, fn in (("moe_forward", M.moe_forward), ("moe_loop", M.moe_loop)):
        got = fn(x, w, top_k)
        assert got.dtype == dtype and got.shape == x.shape, name
        assert_close(got, want, atol, rtol, f"{name} {shape} {dtype}")


@pytest.mark.parametrize("dtype,atol,rtol", TABLE, ids=dtype_ids[:2])
@pytest.mark.parametrize("shape,factor", [((37, 8, 2, 32, 48), 1.0), ((37, 4, 1, 48, 32), 0.5),
                                          ((7, 4, 2, 32, 32), 0.0)])
def test_capacity_drops_each_experts_latest_tokens(shape, factor, dtype, atol, rtol):
    x, w = layer(shape, dtype, seed=1)
    T, E, top_k = shape[:3]
    assert_same_routing(x, w, top_k)
    cap = M.capacity(T, top_k, E, factor)
    assert M.dispatch(routing(x, w, top_k)[1], E, cap).dropped > 0, "the test needs drops"
    got = M.moe_forward(x, w, top_k, capacity_factor=factor)
    assert_close(got, per_expert_layer(x, w, top_k, cap), atol, rtol,
                 f"moe_forward {shape} capacity_factor={factor}",
                 "A dropped copy adds nothing; the weights of the kept ones are not "
                 "renormalised.")


def test_a_capacity_nothing_reaches_changes_nothing():
    x, w = layer((37, 8, 2, 32, 48), torch.float32, seed=2)
    assert_close(M.moe_forward(x, w, 2, capacity_factor=4.0), M.moe_reference(x, w, 2),
                 FP32_TOL, FP32_TOL, "capacity 4x the fair share (37 rows an expert)")


def test_a_batch_of_no_tokens_gives_an_empty_output():
    x, w = layer((0, 4, 2, 32, 48), torch.float32)
    for fn in (M.moe_forward, M.moe_loop):
        assert fn(x, w, 2).shape == (0, 32), fn.__name__


def test_experts_forward_matches_experts_loop_on_the_same_dispatch():
    x, w = layer((37, 8, 2, 64, 40), torch.float32, seed=3)
    d = M.dispatch(routing(x, w, 2)[1], 8, capacity=8)
    want = M.experts_loop(x[d.rows.long()], d.offsets, w)
    assert_close(M.experts_forward(x, d, w, (CONFIGS["16x16x16 group 1"], None)), want,
                 FP32_TOL, FP32_TOL, "experts_forward, sorted rows")


def test_explicit_settings_reach_both_kernels():
    shape = (37, 8, 2, 64, 96)
    x, w = layer(shape, torch.float16)
    configs = (CONFIGS["32x64x16 group 2"], CONFIGS["16x16x16 group 1"])
    assert_close(M.moe_forward(x, w, 2, configs=configs), M.moe_reference(x, w, 2),
                 1e-2, 1e-2, f"moe_forward {shape} configs={configs}")


def transposed(t):
    """The same values, stored the other way round: a ``(E, K, N)`` view of ``(E, N, K)``."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def test_transposed_weight_views_give_the_same_layer():
    x, w = layer((37, 8, 2, 64, 96), torch.float32, seed=4)
    views = M.MoEWeights(*(transposed(t) for t in (w.router, w.gate, w.up, w.down)))
    assert not views.gate.is_contiguous() and views.gate.stride()[1] == 1
    assert_close(M.moe_forward(x, views, 2), M.moe_forward(x, w, 2), FP32_TOL, FP32_TOL,
                 "moe_forward with every weight a transposed view")


@pytest.mark.parametrize("which", ["up", "gate"])
def test_gate_and_up_stored_differently_are_refused(which):
    """The gathered SwiGLU walks w_gate and w_up with one set of strides, so gate and up
    in different layouts would be read wrongly: both entry points refuse them, naming
    the fix, rather than return a wrong layer."""
    x, w = layer((13, 4, 2, 32, 48), torch.float32, seed=5)
    mixed = M.MoEWeights(w.router, w.gate, w.up, w.down)
    setattr(mixed, which, transposed(getattr(w, which)))
    with pytest.raises(ValueError, match="one layout"):
        M.moe_forward(x, mixed, 2)
    with pytest.raises(ValueError, match="one layout"):
        M.grouped_swiglu(x, torch.zeros(0, dtype=torch.int32), torch.zeros(4, dtype=torch.int32),
                         mixed.gate, mixed.up)


# --------------------------------------------------------------------------------------
# Inputs the layer refuses.
# --------------------------------------------------------------------------------------


def test_inputs_that_cannot_work_are_refused_with_a_reason():
    x, w = layer((5, 4, 2, 32, 48), torch.float32)
    E, H, I = 4, 32, 48

    def weights(**change):
        return M.MoEWeights(**{**vars(w), **change})

    cases = [
        ((x.int(), w), TypeError, "x has dtype int32"),
        ((x.half(), w), TypeError, "weights.router has dtype float32"),
        ((x, weights(up=w.up.half())), TypeError, "weights.up has dtype float16"),
        ((x[0], w), ValueError, "x must have 2 dimension"),
        ((torch.zeros(H, 5, device=DEVICE).t(), w), ValueError, "x is not contiguous"),
        ((x, weights(router=w.router[:, :3])), ValueError, re.escape(f"must be {(H, E)}")),
        ((x, weights(up=w.up[:, :, :40])), ValueError, re.escape(f"must be {(E, H, I)}")),
        ((x, weights(down=w.down[:, :, :31])), ValueError, "weights.down has shape"),
        ((x, weights(gate=w.gate[0])), ValueError, "weights.gate must have 3 dimension"),
        ((x[:, :31].contiguous(), w), ValueError, "x has 31 features but the experts take H = 32"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            M.moe_forward(*args, top_k=2)
    with pytest.raises(ValueError, match="top_k must be between 1 and the number of experts"):
        M.moe_forward(x, w, top_k=5)


@pytest.mark.skipif(helpers.is_gpu(), reason="bf16 tl.dot is refused in CPU mode only")
def test_bf16_is_refused_in_cpu_mode():
    x, w = layer((5, 4, 2, 32, 48), torch.bfloat16)
    with pytest.raises(InterpreterLimitationError, match="bf16 tl.dot"):
        M.moe_forward(x, w, 2)


@pytest.mark.skipif(helpers.is_gpu(), reason="bf16 tl.dot is refused in CPU mode only")
def test_experts_forward_refuses_bf16_in_cpu_mode_too():
    """grouped_swiglu says its inputs are checked by experts_forward, which calls it; the
    interpreter's bf16 tl.dot is wrong by orders of magnitude, so it must refuse them."""
    x, w = layer((5, 4, 2, 32, 48), torch.bfloat16)
    d = M.dispatch(routing(x, w, 2)[1], 4)
    with pytest.raises(InterpreterLimitationError, match="bf16 tl.dot"):
        M.experts_forward(x, d, w)


# --------------------------------------------------------------------------------------
# Compiled on a GPU: autotuned, bf16 too, then the lesson's two real layer shapes.
# --------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol,rtol", GPU_TABLE, ids=dtype_ids)
@pytest.mark.parametrize("counts,K,N", [
    ([0, 300, 1, 0, 77, 129, 0, 500] * 2, 512, 384),
    ([3] * 64, 200, 72),
    ([0] * 31 + [1000], 256, 136),
], ids=["skewed", "many-small", "one-expert"])
@pytest.mark.parametrize("kind", ["swiglu", "matmul"])
def test_compiled_autotuned_grouped_kernels(kind, counts, K, N, dtype, atol, rtol):
    check_grouped(kind, counts, K, N, dtype, atol, rtol, None, precision=torch.float32)


def check_layer_compiled(shape, dtype, atol, rtol, factor=None):
    """Both versions against one fp32 PyTorch SwiGLU per expert, routed on the logits the
    layer computes (in bf16, float64 logits would pick other experts on near-ties)."""
    T, E, top_k, H, I = shape
    x, w = layer(shape, dtype)
    cap = None if factor is None else M.capacity(T, top_k, E, factor)
    want = per_expert_layer(x, w, top_k, cap, precision=torch.float32, logits_dtype=dtype)
    got = M.moe_forward(x, w, top_k, capacity_factor=factor)
    assert_close(got, want, atol, rtol, f"moe_forward {shape} {dtype} capacity={factor}")
    assert torch.equal(got, M.moe_forward(x, w, top_k, capacity_factor=factor)), (
        "no atomics: the same bits every run")
    if factor is None:
        assert_close(M.moe_loop(x, w, top_k), want, atol, rtol, f"moe_loop {shape} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol,rtol", GPU_TABLE, ids=dtype_ids)
@pytest.mark.parametrize("shape,factor", [
    ((1, 8, 2, 128, 96), None), ((300, 16, 2, 256, 512), None), ((77, 32, 4, 200, 136), None),
    ((513, 64, 8, 512, 256), None), ((300, 16, 2, 256, 512), 1.0)],
    ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else f"cap{s}")
def test_compiled_layer_at_moderate_sizes(shape, factor, dtype, atol, rtol):
    check_layer_compiled(shape, dtype, atol, rtol, factor)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,tokens", [(M.MANY_SMALL, 256), (M.FEW_LARGE, 64)],
                         ids=["many-small", "few-large"])
def test_compiled_layer_at_the_lessons_real_shapes(shape, tokens):
    atol, rtol = M.TOLERANCES[torch.bfloat16]
    check_layer_compiled((tokens, shape.experts, shape.top_k, shape.hidden, shape.width),
                         torch.bfloat16, atol, rtol)


@pytest.mark.gpu
def test_compiled_layer_refuses_tensors_on_the_cpu():
    x, w = layer((5, 4, 2, 32, 48), torch.float16)
    with pytest.raises(ValueError, match="x is on cpu, but kernels run on cuda"):
        M.moe_forward(x.cpu(), w, 2)
    with pytest.raises(ValueError, match="weights.down is on cpu"):
        M.moe_forward(x, M.MoEWeights(w.router, w.gate, w.up, w.down.cpu()), 2)

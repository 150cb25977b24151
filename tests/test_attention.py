"""Attention (lesson 06): the tiled PyTorch version and the Triton kernels against the spec.

Every version is checked against the float64 reference on power-of-two, odd and
larger-than-block sequence lengths (length 1 included), causal and not, with grouped-query
attention and 3-D inputs: the output, the log-sum-exp and all three gradients. In CPU
mode the kernels run in Triton's interpreter with small blocks (so a short sequence
already spans several tiles); the tests marked ``gpu`` run them compiled, in bf16 too.
"""

from __future__ import annotations

import math

import pytest
import torch

import helpers
from helpers import bounds
from helpers.kernels import attention as A
from helpers.kernels.attention import forward as attention_forward

from support import assert_close as _assert_close
from support import committed_record


def assert_close(got, want, atol, rtol, what):
    """Compare in float64: the reference is float64, the kernels' outputs are not."""
    _assert_close(got.double(), want.double(), atol, rtol, what)

DEVICE = helpers.device()
KERNEL_DTYPES = [torch.float32, torch.float16]      # bf16 tl.dot is wrong in the interpreter

# (batch, heads, kv_heads, seq_q, seq_k, d): one row, odd lengths around the CPU blocks
# (32 rows, 16-32 keys), more keys than queries and fewer, grouped-query attention.
SHAPES = [
    (1, 1, 1, 1, 1, 16),
    (2, 2, 1, 7, 7, 16),
    (1, 2, 2, 33, 33, 32),
    (1, 4, 2, 65, 47, 16),
    (1, 2, 1, 40, 97, 64),
    (2, 2, 2, 64, 64, 32),
]


def make(shape, dtype, seed=0, scale=1.0):
    batch, heads, kv_heads, seq_q, seq_k, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, d, generator=g) * scale
    k = torch.randn(batch, kv_heads, seq_k, d, generator=g) * scale
    v = torch.randn(batch, kv_heads, seq_k, d, generator=g)
    return tuple(x.to(dtype=dtype, device=DEVICE) for x in (q, k, v))


def reference_grads(q, k, v, do, causal):
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o, lse = A.attention_reference(*leaves, causal=causal)
    o.backward(do.double())
    return o, lse, [x.grad for x in leaves]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tiled_pytorch_version_matches_the_reference(shape, causal):
    q, k, v = make(shape, torch.float32)
    o_ref, lse_ref = A.attention_reference(q, k, v, causal)
    o, lse = A.tiled_attention_forward(q, k, v, causal, block_m=16, block_n=16)
    assert_close(o, o_ref, 1e-5, 1e-5, f"tiled output {shape}")
    assert_close(lse, lse_ref, 1e-5, 1e-5, f"tiled lse {shape}")
    do = torch.randn_like(q)
    _, _, grads_ref = reference_grads(q, k, v, do, causal)
    grads = A.tiled_attention_backward(do, q, k, v, o, lse, causal, block_m=16, block_n=16)
    for name, got, want in zip("qkv", grads, grads_ref):
        assert_close(got, want, 1e-5, 1e-4, f"tiled d{name} {shape}")


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernels_match_the_reference(shape, causal, dtype):
    # The log-sum-exp is fp32 whatever the inputs, but on a GPU fp32 scores come from TF32
    # tensor cores (10 mantissa bits): there it carries the output's error (measured on an
    # H100: 2.3e-3 at d = 16), in the interpreter only fp32 rounding.
    tf32 = dtype == torch.float32 and helpers.is_gpu()
    check_kernels(shape, causal, dtype, lse_tol=A.TOLERANCES[dtype][0] if tf32 else 1e-4)


def check_kernels(shape, causal, dtype, lse_tol):
    """Forward (output, lse) and backward (dq, dk, dv) of the kernels against float64.

    Gradients get twice the output's tolerance, relative to their largest element."""
    q, k, v = make(shape, dtype)
    atol, rtol = A.TOLERANCES[dtype]
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(q)
    o_ref, lse_ref, grads_ref = reference_grads(q, k, v, do, causal)
    o, lse = A.flash_attention_forward(q, k, v, causal)
    assert o.dtype == dtype and lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    assert_close(o, o_ref, atol, rtol, f"forward output {shape} causal={causal}")
    blind = lse_ref == math.inf          # rows that see no key: lse +inf exactly
    assert torch.equal(lse == math.inf, blind), f"rows of lse +inf {shape} causal={causal}"
    assert_close(lse.masked_fill(blind, 0), lse_ref.masked_fill(blind, 0), lse_tol, lse_tol,
                 f"forward lse {shape} causal={causal}")
    grads = A.flash_attention_backward(do, q, k, v, o, lse, causal)
    for name, got, want in zip("qkv", grads, grads_ref):
        scale = max(1.0, want.abs().max().item())
        assert_close(got, want, 2 * atol * scale, 2 * rtol, f"d{name} {shape} causal={causal}")


@pytest.mark.parametrize("fn, d", [(A.flash_attention, 32), (A.tiled_attention, 32),
                                   (A.flash_attention, 80)],
                         ids=["flash", "tiled", "flash-split-head"])
def test_autograd_through_three_dimensional_inputs(fn, d):
    q, k, v = (x[:, 0] for x in make((2, 1, 1, 37, 37, d), torch.float32))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = fn(*leaves, causal=True, sm_scale=0.3)
    assert o.shape == q.shape
    do = torch.randn_like(o)
    o.backward(do)
    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out, lse = A.attention_reference(*refs, causal=True, sm_scale=0.3)
    assert lse.shape == q.shape[:-1]
    out.backward(do.double())
    assert_close(o, out, 2e-3, 2e-3, "output")
    for name, leaf, ref in zip("qkv", leaves, refs):
        assert_close(leaf.grad, ref.grad, 4e-3, 4e-3, f"d{name}")


@pytest.mark.parametrize("seq_q", [37, 3], ids=["one-pass", "split-KV"])
def test_three_dimensional_inputs_save_an_lse_of_batch_by_queries(seq_q):
    """CS336's interface: (batch, seq, d) in, the log-sum-exp saved for the backward is
    (batch, queries), whichever forward kernel ran."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, seq_q, 32, generator=g).to(DEVICE)
    k, v = (torch.randn(2, 40, 32, generator=g).to(DEVICE) for _ in range(2))
    o, lse = A.flash_attention_forward(q, k, v, "bottom_right")
    assert o.shape == q.shape and lse.shape == (2, seq_q) and lse.dtype == torch.float32
    o_ref, lse_ref = A.attention_reference(q, k, v, "bottom_right")
    assert_close(lse, lse_ref, 2e-3, 2e-3, "lse of 3-D inputs")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    A.flash_attention(*leaves, causal="bottom_right").sum().backward()
    assert all(leaf.grad is not None and leaf.grad.isfinite().all() for leaf in leaves)


def test_strided_inputs_whose_rows_are_contiguous_are_read_in_place():
    """(batch, seq, heads, d) as models store it, viewed as (batch, heads, seq, d)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 50, 2, 32, generator=g).to(DEVICE).transpose(1, 2)
               for _ in range(3))
    assert not q.is_contiguous()
    o, lse = A.flash_attention_forward(q, k, v)
    o_ref, lse_ref = A.attention_reference(q, k, v)
    assert_close(o, o_ref, 2e-3, 2e-3, "output of strided inputs")
    dq, dk, dv = A.flash_attention_backward(torch.ones_like(q), q, k, v, o, lse)
    assert dq.shape == q.shape and dk.shape == k.shape


def test_large_scores_do_not_overflow():
    """Scores of several hundred: exp would overflow fp32 without the running maximum.

    On a GPU, fp32 ``tl.dot`` runs in TF32 (10 mantissa bits): a score of 300 would be off
    by about 0.15, which is rounding, not overflow. So the inputs carry bf16's 8 bits, which
    TF32 multiplies exactly, and only P @ V's rounding is left (TF32's tolerance).
    """
    q, k, v = (x.to(torch.bfloat16).float()
               for x in make((1, 1, 1, 40, 40, 16), torch.float32, scale=8.0))
    o, lse = A.flash_attention_forward(q, k, v, causal=True)
    o_ref, lse_ref = A.attention_reference(q, k, v, causal=True)
    assert lse_ref.max() > 200
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    tol = A.TOLERANCES[torch.float32] if helpers.is_gpu() else (1e-3, 1e-3)
    assert_close(o, o_ref, *tol, "output with large scores")
    assert_close(lse, lse_ref, 1e-4 * lse_ref.abs().max().item(), 0, "log-sum-exp")


def test_causal_forward_never_loads_the_keys_a_query_block_cannot_see():
    """One block of 32 queries against 128 keys: causal, they see keys 0..31 only, and a
    kernel that skips hidden tiles never loads keys 32..127 at all."""
    if not bounds.guard_available():
        pytest.skip("this Triton's interpreter lacks the hooks the watcher needs")
    q, k, v = make((1, 1, 1, 32, 128, 16), torch.float32)
    with bounds.watch() as log, bounds.interpreted(vars(attention_forward)):
        A.flash_attention_forward(q, k, v, causal=True, block_m=32, block_n=16)
    for name, tensor in (("K", k), ("V", v)):
        read = bounds.elements_read(log.launches, tensor)
        assert read[0, 0, :32].all(), f"rows 0..31 of {name} were not all read"
        assert not read[0, 0, 32:].any(), (
            f"{name} rows {(32 + read[0, 0, 32:].any(-1).nonzero()[0])[:5].tolist()}... were "
            "loaded although no query of the block can see them")


@pytest.mark.parametrize("fn", [A.flash_attention_forward, A.tiled_attention_forward,
                                A.attention_reference], ids=["flash", "tiled", "reference"])
def test_inputs_that_cannot_work_are_refused_with_a_reason(fn):
    q, k, v = make((1, 2, 2, 8, 8, 16), torch.float32)
    cases = [
        ((q[0, 0, 0], k, v), "must be \\(batch, seq, d\\)"),
        ((q, k[:, :, :5], v), "same shape"),
        ((q, k.half(), v), "share a dtype"),
        ((q, k[:, :1].expand(1, 1, 8, 16).contiguous()[:, :, :, :8],
          v[:, :1, :, :8].contiguous()), "head dimension"),
        ((q.expand(1, 2, 8, 16)[:, :, :0], k, v), "empty"),
        ((torch.cat([q, q[:, :1]], dim=1), k, v), "multiple of the key/value heads"),
    ]
    for args, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            fn(*args)


def test_the_kernels_refuse_what_only_they_cannot_take():
    q, k, v = make((1, 1, 1, 8, 8, 16), torch.float32)
    for d in (8, 20, 264):       # below tl.dot's 16, not a multiple of 8, past 256
        with pytest.raises(ValueError, match=f"head dimension {d} is not supported.*multiple "
                                             "of 8 from 16 to 256"):
            A.flash_attention_forward(*(torch.zeros(1, 4, d, device=DEVICE) for _ in range(3)))
    with pytest.raises(ValueError, match="last dimension .* not contiguous"):
        A.flash_attention_forward(q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2))
    with pytest.raises(TypeError, match="dtype int32"):
        A.flash_attention_forward(*(x.int() for x in (q, k, v)))
    o, lse = A.flash_attention_forward(q, k, v)
    with pytest.raises(TypeError, match="lse must be float32"):
        A.flash_attention_backward(o, q, k, v, o, lse.double())
    with pytest.raises(ValueError, match="do and o must have q's shape"):
        A.flash_attention_backward(o[:, :, :4], q, k, v, o, lse)
    if helpers.runtime.is_cpu():
        with pytest.raises(TypeError, match="bfloat16"):
            A.flash_attention_forward(*(x.bfloat16() for x in (q, k, v)))


# Head dimensions that are not a power of two, each class: held in the next power of two
# with its extra columns masked (24 -> 32, 40 -> 64, 136 -> 256), or split in two powers
# of two (48 = 32 + 16, 80 = 64 + 16, 96 = 64 + 32, 144 = 128 + 16, 192 = 128 + 64).
@pytest.mark.parametrize("d", [24, 40, 48, 80, 96, 136, 144, 192, 256])
def test_every_multiple_of_8_up_to_256_is_a_head_dimension(d):
    dtype = torch.float16
    check_kernels((1, 2, 1, 37, 45, d), "bottom_right" if d % 16 else True, dtype,
                  lse_tol=A.TOLERANCES[dtype][0] if helpers.is_gpu() else 1e-4)


def test_a_head_two_powers_of_two_wide_goes_to_the_split_kernel():
    from helpers.kernels.attention import forward, forward_split

    split = {d: forward_split.pieces(d) for d in A.HEAD_DIMS}
    assert {d for d, p in split.items() if p} == {48, 80, 96, 144, 160, 192}
    assert split[80] == (64, 16) and split[192] == (128, 64) and split[112] is None
    for d, p in split.items():
        kernel = forward.kernel_for(d)
        assert (kernel is forward_split.attention_fwd_split_kernel) == bool(p), d
        assert not p or (sum(p) == d and min(p) >= forward_split.LEAST_PIECE)
        assert forward.held(d) == (d if p else A.block_d(d)), d


def test_a_split_head_in_a_heads_after_tokens_layout():
    """(batch, seq, heads, d) memory seen as (batch, heads, seq, d): the split kernel reads
    each piece through the strides, as the padded one does."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 33, 4, 96, generator=g).to(DEVICE).transpose(1, 2)
               for _ in range(3))
    assert not q.is_contiguous()
    o, lse = A.flash_attention_forward(q, k, v, True)
    o_ref, lse_ref = A.attention_reference(q, k, v, True)
    atol, rtol = A.TOLERANCES[torch.float32]
    assert_close(o, o_ref, atol, rtol, "split head, strided")
    assert_close(lse, lse_ref, atol, rtol, "split head lse, strided")


def test_a_split_head_row_that_sees_no_key_has_output_zero_and_lse_infinity():
    q, k, v = make((1, 2, 1, 40, 17, 80), torch.float32)
    o, lse = A.flash_attention_forward(q, k, v, "bottom_right")
    o_ref, _ = A.attention_reference(q, k, v, "bottom_right")
    assert torch.equal(o[:, :, :23], torch.zeros_like(o[:, :, :23]))
    assert (lse[:, :, :23] == math.inf).all() and lse[:, :, 23:].isfinite().all()
    assert_close(o.double(), o_ref.double(), 1e-4, 1e-4, "split head, bottom right")


# (seq_q, seq_k): fewer queries than keys (chunked prefill), one query (decoding), more
# queries than keys (the first ones see nothing), around the CPU blocks of 32 and 16.
UNEQUAL = [(7, 50), (1, 33), (33, 80), (50, 7), (40, 17)]


@pytest.mark.parametrize("lengths", UNEQUAL, ids=lambda n: f"{n[0]}x{n[1]}")
def test_bottom_right_causal_alignment_on_unequal_lengths(lengths):
    seq_q, seq_k = lengths
    shape = (1, 2, 1, seq_q, seq_k, 16)
    check_kernels(shape, "bottom_right", torch.float32,
                  lse_tol=A.TOLERANCES[torch.float32][0] if helpers.is_gpu() else 1e-4)
    q, k, v = make(shape, torch.float32)
    o, lse = A.tiled_attention_forward(q, k, v, "bottom_right", block_m=16, block_n=16)
    o_ref, lse_ref = A.attention_reference(q, k, v, "bottom_right")
    assert_close(o, o_ref, 1e-5, 1e-5, f"tiled output {lengths}")
    assert torch.equal(lse.isinf(), lse_ref.isinf())


def test_the_reference_alignments_are_sdpas():
    """top_left is SDPA's is_causal, bottom_right its causal_lower_right bias."""
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = (x.double() for x in make((1, 2, 2, 9, 21, 16), torch.float32))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert_close(A.attention_reference(q, k, v, "top_left")[0], sdpa(q, k, v, is_causal=True),
                 1e-10, 1e-10, "top_left")
    assert_close(A.attention_reference(q, k, v, "bottom_right")[0],
                 sdpa(q, k, v, attn_mask=causal_lower_right(9, 21)), 1e-10, 1e-10,
                 "bottom_right")
    # One query at the bottom right sees every key: full attention.
    assert_close(A.attention_reference(q[:, :, -1:], k, v, "bottom_right")[0],
                 A.attention_reference(q[:, :, -1:], k, v)[0], 0, 0, "decoding")


def test_a_row_that_sees_no_key_has_output_zero_and_lse_infinity():
    """Bottom right with 40 queries and 17 keys: queries 0..22 see nothing. Their output is
    0 and their lse +inf, so the backward's recomputed P is 0: no NaN anywhere, and their
    rows of dQ are 0."""
    q, k, v = make((1, 2, 1, 40, 17, 16), torch.float32)
    do = torch.randn_like(q)
    for name, fwd, bwd in (("flash", A.flash_attention_forward, A.flash_attention_backward),
                           ("tiled", A.tiled_attention_forward, A.tiled_attention_backward)):
        o, lse = fwd(q, k, v, "bottom_right")
        assert torch.equal(o[:, :, :23], torch.zeros_like(o[:, :, :23])), name
        assert (lse[:, :, :23] == math.inf).all() and lse[:, :, 23:].isfinite().all(), name
        grads = bwd(do, q, k, v, o, lse, "bottom_right")
        assert all(g.isfinite().all() for g in grads), name
        assert torch.equal(grads[0][:, :, :23], torch.zeros_like(grads[0][:, :, :23])), name
    o_ref, lse_ref = A.attention_reference(q, k, v, "bottom_right")
    assert (lse_ref[:, :, :23] == math.inf).all() and (o_ref[:, :, :23] == 0).all()


@pytest.mark.parametrize("causal", ["bottom-right", "upper_left", 2, None, "True"])
def test_an_unknown_causal_alignment_is_refused(causal):
    q, k, v = make((1, 1, 1, 8, 8, 16), torch.float32)
    for fn in (A.flash_attention_forward, A.tiled_attention_forward, A.attention_reference):
        with pytest.raises(ValueError, match="causal=.*pass False, True .*'bottom_right'"):
            fn(q, k, v, causal)


# Decoding: (heads, kv_heads, seq_q, seq_k), a few queries against more keys.
DECODE = [(8, 2, 1, 300), (4, 4, 3, 37), (8, 2, 16, 300), (2, 1, 5, 1), (4, 2, 16, 9)]


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"], ids=str)
@pytest.mark.parametrize("case", DECODE, ids=lambda c: "x".join(map(str, c)))
def test_the_split_kv_forward_matches_the_reference(case, causal, dtype):
    """Many splits (64 programs wanted: 10 splits of 32 keys at 300 keys), merged by their
    log-sum-exps, against float64 and against the one-pass forward kernel."""
    heads, kv_heads, seq_q, seq_k = case
    q, k, v = make((2, heads, kv_heads, seq_q, seq_k, 32), dtype)
    atol, rtol = A.TOLERANCES[dtype]
    o, lse = A.flash_decode_forward(q, k, v, causal, target_programs=64)
    o_ref, lse_ref = A.attention_reference(q, k, v, causal)
    assert_close(o, o_ref, atol, rtol, f"split-KV output {case} causal={causal}")
    blind = lse_ref == math.inf
    assert torch.equal(lse == math.inf, blind)
    tol = atol if helpers.is_gpu() else 1e-4
    assert_close(lse.masked_fill(blind, 0), lse_ref.masked_fill(blind, 0), tol, tol, "lse")
    one_pass = A.flash_attention_forward(q, k, v, causal,
                                         **A.forward_config(32, dtype))
    assert_close(o, one_pass[0], atol, rtol, "split-KV against the one-pass kernel")


def test_a_decoding_loop_reuses_its_plan_and_stays_right():
    """Step after step of one shape: the plan made at the first call (on a GPU, with the
    compiled kernels' own launchers) serves every later one, with new tensors each time;
    an unaligned view gets a plan of its own."""
    from helpers.kernels.attention import decode

    decode._plans.clear()
    for seed in range(3):
        q, k, v = make((2, 8, 2, 1, 70, 32), torch.float32, seed=seed)
        o, lse = A.flash_decode_forward(q, k, v, "bottom_right")
        assert_close(o, A.attention_reference(q, k, v, "bottom_right")[0], 2e-3, 2e-3,
                     f"step {seed}")
    assert len(decode._plans) == 1
    assert all((p["runners"] is not None) == helpers.is_gpu() for p in decode._plans.values())
    q1 = torch.randn(2 * 8 * 32 + 1, device=DEVICE)[1:].view(2, 8, 1, 32)  # 4 bytes in
    assert q1.stride() == q.stride() and q1.data_ptr() % 16
    o, _ = A.flash_decode_forward(q1, k, v, "bottom_right")
    assert_close(o, A.attention_reference(q1, k, v, "bottom_right")[0], 2e-3, 2e-3,
                 "unaligned query")
    assert len(decode._plans) == 2


@pytest.mark.gpu
def test_decoding_steps_share_a_workspace_per_stream_and_stay_right():
    """The splits' partial results go to one workspace per stream, grown as needed: steps
    on one stream reuse it (each step's kernels queue after the last one's), another
    stream gets its own, and steps on two streams at once both come out right."""
    from helpers.kernels.attention import decode

    decode._workspaces.clear()
    dev = torch.device(DEVICE)
    small = decode.workspace(dev, 1000)
    assert decode.workspace(dev, 10) is small, "same stream: the same workspace"
    grown = decode.workspace(dev, 5000)
    assert grown.numel() >= 5000 and decode.workspace(dev, 1000) is grown
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert decode.workspace(dev, 10) is not grown, "another stream: its own"
    steps = [make((2, 8, 2, 1, 3000, 64), torch.bfloat16, seed=s) for s in range(2)]
    want = [A.attention_reference(*qkv, "bottom_right")[0] for qkv in steps]
    for _ in range(3):
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            o_side, _ = A.flash_attention_forward(*steps[1], "bottom_right")
        o_main, _ = A.flash_attention_forward(*steps[0], "bottom_right")
        torch.cuda.synchronize()
        assert_close(o_main, want[0], 2e-2, 2e-2, "main stream's step")
        assert_close(o_side, want[1], 2e-2, 2e-2, "side stream's step")


def test_short_queries_take_the_split_kv_kernels_and_long_ones_do_not():
    from helpers.kernels.attention import decode

    assert A.uses_decoding(32, 8, 1) and A.uses_decoding(32, 8, 16)
    assert not A.uses_decoding(32, 8, 17)           # a prefill: the one-pass kernel
    assert not A.uses_decoding(32, 1, 16)           # 512 rows a K/V head: more than a tile
    assert decode.split_keys(8, 131072, 64, 528) == (64, 2048)   # 8 heads x 64 splits
    assert decode.split_keys(1, 131072, 64, 528) == (64, 2048)   # at most MAX_SPLITS
    assert decode.split_keys(64, 8192, 64, 528) == (8, 1024)     # 16 tiles a split
    assert decode.split_keys(64, 8192, 64, 264) == (4, 2048)     # one wave: not 5
    assert decode.split_keys(64, 8192, 64, 32) == (1, 8192)      # at least one split
    assert decode.split_keys(8, 100, 64, 528) == (2, 64)        # at most one split a tile
    q, k, v = make((1, 8, 2, 2, 90, 16), torch.float32)
    assert torch.equal(A.flash_attention_forward(q, k, v, "bottom_right")[0],
                       A.flash_decode_forward(q, k, v, "bottom_right")[0])
    with pytest.raises(ValueError, match="512 rows, more than the split-KV kernel's tile"):
        A.flash_decode_forward(*make((1, 32, 1, 16, 20, 16), torch.float32))


def test_naive_attention_is_the_same_function():
    q, k, v = make((1, 4, 2, 20, 30, 16), torch.float32)
    for causal in (False, True):
        assert_close(A.naive_attention(q, k, v, causal), A.attention_reference(q, k, v, causal)[0],
                     1e-5, 1e-5, f"naive causal={causal}")


def test_default_scale_is_one_over_root_d():
    q, k, v = make((1, 1, 1, 9, 9, 64), torch.float32)
    o1, _ = A.flash_attention_forward(q, k, v)
    o2, _ = A.flash_attention_forward(q, k, v, sm_scale=1 / math.sqrt(64))
    assert torch.equal(o1, o2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 8, 2, 1000, 1000, 128), (1, 4, 4, 777, 1500, 64),
                                   (2, 4, 1, 257, 257, 16), (1, 16, 16, 2048, 2048, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_compiled_kernels_with_the_tuned_tiles(shape, causal, dtype):
    check_kernels(shape, causal, dtype, lse_tol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"], ids=str)
@pytest.mark.parametrize("d", [40, 80, 96, 192, 256])
def test_compiled_kernels_on_every_head_dimension_class(d, causal, dtype):
    lengths = (600, 1000) if causal == "bottom_right" else (1000, 1000)
    check_kernels((1, 4, 2, *lengths, d), causal, dtype,
                  lse_tol=A.TOLERANCES[dtype][0] if dtype == torch.float32 else 1e-3)


def test_short_sequences_take_smaller_tiles_on_a_gpu():
    for d in (64, 96, 128):
        short = A.forward_config(d, torch.bfloat16, compiled=True, seq_q=A.SHORT)
        long = A.forward_config(d, torch.bfloat16, compiled=True, seq_q=A.SHORT + 1)
        assert (short["block_m"], short["block_n"]) == (64, 64)
        assert long == A.forward_config(d, torch.bfloat16, compiled=True)
        assert long["block_m"] == 128
    assert A.forward_config(64, torch.float16, compiled=False, seq_q=100)["block_m"] == 32


@pytest.mark.parametrize("head_dim", [128, 64])
def test_the_forward_settings_are_the_sweeps_best_or_within_3_percent(head_dim):
    from helpers.experiments.attention_tiles import best

    record = committed_record("attention_tiles")
    chosen = A.forward_config(head_dim, torch.bfloat16, compiled=True)
    for causal in (False, True):
        top = best(record.results, "forward", head_dim, causal, top=100)
        mine = [r for r in top if all(r[k] == v for k, v in chosen.items())]
        assert mine, f"{chosen} was not in the sweep ({record.label})"
        assert mine[0]["ms"] <= 1.03 * top[0]["ms"], (
            f"d={head_dim} causal={causal}: {chosen} took {mine[0]['ms']:.2f} ms, the sweep's "
            f"best {top[0]} {top[0]['ms']:.2f} ms ({record.label})")

"""Attention's streamed tiles through tensor descriptors (``tma=True``).

On Hopper the forward can read its K and V tiles through the tensor memory accelerator
(``tl.make_tensor_descriptor``) instead of pointers, and so can the backward (dK/dV its
Q and dO tiles, dQ its K and V). The descriptor path must give what the
pointer path gives everywhere it is taken (in the interpreter, which emulates descriptors,
the very same bits): partial last tiles, whose rows past the sequence the unit fills with
zeros, both causal alignments on unequal lengths, rows that see no key, grouped-query
heads, 3-D inputs. Where the unit cannot read the tensors (:func:`forward.tma_ok`: a split
or padded head, 4-byte elements, a stride that is not a multiple of 16 bytes, an address
off a 16-byte boundary, heads broadcast with stride 0), a setting that asks for it takes
pointers instead, and the tuner offers such settings only where it can.
"""

from __future__ import annotations

import pytest
import torch

import helpers
from helpers.kernels import attention as A
from helpers.kernels.attention import forward as attention_forward
from helpers.kernels.attention import tuning

from support import assert_close

DEVICE = helpers.device()
COMPILED = helpers.runtime.is_gpu()
# Small tiles in the interpreter (several tiles a head already at 40 rows); the tuner's
# best descriptor setting at d = 128 compiled.
TILES = (dict(block_m=128, block_n=64, num_warps=4, num_stages=2) if COMPILED
         else dict(block_m=32, block_n=16, num_warps=4, num_stages=1))
DTYPE = torch.bfloat16 if COMPILED else torch.float16   # bf16 dots: not in the interpreter

# (batch, heads, kv_heads, seq_q, seq_k, d, causal): odd lengths around the tiles, more keys
# than queries and fewer (bottom right with fewer keys: rows that see none), grouped heads.
CASES = [
    (1, 2, 2, 33, 33, 32, False),
    (1, 4, 2, 65, 47, 16, True),
    (1, 2, 1, 40, 97, 64, "bottom_right"),
    (2, 2, 2, 50, 33, 32, "bottom_right"),
]
if COMPILED:
    CASES = [(b, h, kv, 9 * n, 9 * m, 128 if d == 64 else d * 2, c)
             for b, h, kv, n, m, d, c in CASES] + [(1, 4, 2, 700, 1100, 256, True)]


def make(batch, heads, kv_heads, seq_q, seq_k, d, dtype=DTYPE, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, d, generator=g)
    k = torch.randn(batch, kv_heads, seq_k, d, generator=g)
    v = torch.randn(batch, kv_heads, seq_k, d, generator=g)
    return tuple(x.to(dtype=dtype, device=DEVICE) for x in (q, k, v))


def takes_descriptors(q, k, v, tiles=TILES) -> bool:
    """Whether a launch of ``tiles`` with ``tma=True`` builds the kernel that reads them."""
    o = torch.empty_like(q)
    _, constexprs = attention_forward._arguments(q, k, v, o, None, tiles["block_m"],
                                                 tiles["block_n"], True)
    return constexprs.get("TMA", False)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_descriptors_give_the_pointer_paths_output(case):
    *shape, causal = case
    q, k, v = make(*shape)
    assert takes_descriptors(q, k, v)
    o, lse = A.flash_attention_forward(q, k, v, causal, **TILES, tma=True)
    o_ref, lse_ref = A.attention_reference(q.double(), k.double(), v.double(), causal)
    seen = lse_ref.isfinite()
    assert torch.equal(lse.isfinite(), seen), "the same rows see no key"
    assert torch.equal(o[~seen], torch.zeros_like(o[~seen])), "a row that sees nothing is 0"
    assert_close(o.double(), o_ref, *A.TOLERANCES[DTYPE], "output")
    assert_close(lse[seen].double(), lse_ref[seen], 1e-3, 1e-3, "lse")
    if not COMPILED:      # the interpreter emulates the unit: the very same bits
        o_ptr, lse_ptr = A.flash_attention_forward(q, k, v, causal, **TILES)
        assert torch.equal(o, o_ptr) and torch.equal(lse, lse_ptr)


def test_three_dimensional_inputs_through_descriptors():
    q, k, v = (x[0] for x in make(1, 3, 3, 37, 37, 32))
    o, lse = A.flash_attention_forward(q, k, v, True, **TILES, tma=True)
    want, want_lse = A.flash_attention_forward(q, k, v, True, **TILES)
    assert o.shape == q.shape and lse.shape == q.shape[:2]
    assert_close(o.double(), want.double(), *A.TOLERANCES[DTYPE], "output")
    assert_close(lse.double(), want_lse.double(), 1e-3, 1e-3, "lse")


def _unreadable():
    """Tensors the TMA unit cannot read, each with what makes it so."""
    q, k, v = make(1, 2, 2, 40, 40, 64)
    wide = torch.randn(1, 2, 40, 68, dtype=DTYPE, device=DEVICE)[..., :64]    # 136-byte rows
    flat = torch.randn(2 * 40 * 64 + 1, dtype=DTYPE, device=DEVICE)
    shifted = flat[1:].view(1, 2, 40, 64)                        # 2 bytes off 16
    broadcast = k[:, :1].expand(1, 2, 40, 64)                    # heads with stride 0
    q80, k80, v80 = make(1, 2, 2, 40, 40, 80)
    q112, k112, v112 = make(1, 2, 2, 40, 40, 112)
    return {
        "4-byte elements": (q.float(), k.float(), v.float()),
        "a split head (80)": (q80, k80, v80),
        "a padded head (112)": (q112, k112, v112),
        "a row stride of 136 bytes": (q, wide, v),
        "an address 2 bytes off 16": (q, k, shifted),
        "heads broadcast with stride 0": (q, broadcast, v),
    }


@pytest.mark.parametrize("what", list(_unreadable()))
def test_tensors_the_unit_cannot_read_take_pointers(what):
    q, k, v = _unreadable()[what]
    assert not attention_forward.tma_ok(q, k, v), what
    assert not takes_descriptors(q, k, v), what
    tiles = TILES if q.element_size() == 2 else dict(TILES, block_m=32, block_n=16)
    o, lse = A.flash_attention_forward(q, k, v, False, **tiles, tma=True)
    o_ref, _ = A.attention_reference(q.double(), k.double(), v.double())
    assert_close(o.double(), o_ref, *A.TOLERANCES[q.dtype], what)


def test_the_tuner_offers_descriptor_settings_only_where_they_can_run():
    table = dict(block_m=64, block_n=64, num_warps=4, num_stages=3)
    plain = tuning.candidates("forward", table, 128, 2, 232448)
    both = tuning.candidates("forward", table, 128, 2, 232448, tma=True)
    assert not any(t.get("tma") for t in plain)
    assert [t for t in both if not t.get("tma")] == plain
    assert any(t.get("tma") for t in both)
    assert len({tuning.name_of(t) for t in both}) == len(both), "named apart"
    assert tuning.name_of(dict(table, tma=True)) == "64x64 w4 s3 tma"
    for pass_name in ("dkdv", "dq"):
        plain = tuning.candidates(pass_name, table, 128, 2, 232448)
        both = tuning.candidates(pass_name, table, 128, 2, 232448, tma=True)
        assert not any(t.get("tma") for t in plain) and any(t.get("tma") for t in both)


BACKWARD_TILES = (dict(dkdv=dict(block_m=64, block_n=64, num_warps=4, num_stages=2),
                       dq_tiles=dict(block_m=128, block_n=64, num_warps=8, num_stages=2))
                  if COMPILED else
                  dict(dkdv=dict(block_m=16, block_n=32, num_warps=4, num_stages=1),
                       dq_tiles=dict(block_m=32, block_n=16, num_warps=4, num_stages=1)))


@pytest.mark.parametrize("case", CASES[1:4], ids=lambda c: "x".join(map(str, c)))
def test_the_backward_through_descriptors_gives_the_pointer_paths_gradients(case):
    """dK/dV reads its Q and dO tiles, dQ its K and V tiles through descriptors."""
    *shape, causal = case
    q, k, v = make(*shape)
    do = make(*shape, seed=1)[0]
    assert attention_forward.tma_ok(q, q, do) and attention_forward.tma_ok(q, k, v)
    o, lse = A.flash_attention_forward(q, k, v, causal, **TILES)
    with_tma = {name: dict(tiles, tma=True) for name, tiles in BACKWARD_TILES.items()}
    grads = A.flash_attention_backward(do, q, k, v, o, lse, causal, **with_tma)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o_ref, _ = A.attention_reference(*leaves, causal=causal)
    o_ref.backward(do.double())
    atol, rtol = A.TOLERANCES[DTYPE]      # as tests/test_attention.py: twice the output's,
    for name, got, leaf in zip(("dq", "dk", "dv"), grads, leaves):    # by the largest
        scale = leaf.grad.abs().max().item()
        assert_close(got.double(), leaf.grad, 2 * atol * scale, 2 * rtol, name)
    if not COMPILED:      # the interpreter emulates the unit: the very same bits
        plain = A.flash_attention_backward(do, q, k, v, o, lse, causal, **BACKWARD_TILES)
        assert all(torch.equal(a, b) for a, b in zip(grads, plain))

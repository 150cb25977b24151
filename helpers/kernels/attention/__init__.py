"""Attention, lesson 06: from the N x N score matrix to FlashAttention's fused kernels.

``attention(Q, K, V) = softmax(Q K^T * sm_scale) V``, row by row, with ``sm_scale =
1/sqrt(d)`` unless given. Read top to bottom:

* :func:`attention_reference`: the spec, in float64.
* :func:`naive_attention`: standard attention as separate PyTorch ops. The scores S and
  probabilities P, ``seq_q x seq_k`` per head, are written to HBM and read back: at
  16k tokens that is 512 MiB of bf16 per head, and the memory grows as N^2.
* :func:`tiled_attention_forward`, :func:`tiled_attention_backward`, :func:`tiled_attention`:
  FlashAttention-2 in plain PyTorch over blocks (:mod:`helpers.kernels.attention.tiled`),
  the algorithm before the kernel; it runs on any device and is differentiable.
* :func:`flash_attention_forward`, :func:`flash_attention_backward`, :func:`flash_attention`:
  the same algorithm as Triton kernels (:mod:`helpers.kernels.attention.forward`,
  :mod:`helpers.kernels.attention.backward`), O(N) memory, differentiable through
  :class:`FlashAttention`, which saves the log-sum-exp for the backward pass.
* :func:`flash_decode_forward`: a few queries against many keys (decoding), the keys split
  among programs and merged by their log-sum-exps (:mod:`helpers.kernels.attention.decode`);
  :func:`flash_attention_forward` takes it by itself for short queries (:func:`uses_decoding`).
* Tile settings: :func:`forward_config` and :func:`backward_config` are the table measured
  at 8,192 tokens; on a GPU the kernels take the setting :mod:`~helpers.kernels.attention.tuning`
  timed for each call's head width, length bucket, mask and dtype (the table among the
  candidates), unless the caller passes one.

Shapes: ``q`` is ``(batch, seq_q, d)`` or ``(batch, heads, seq_q, d)``; ``k`` and ``v`` are
``(batch, seq_k, d)`` or ``(batch, kv_heads, seq_k, d)`` with ``heads`` a multiple of
``kv_heads`` (grouped-query attention). The head dimension ``d`` of the kernels is any
multiple of 8 from 16 to 256. ``causal=True`` (or ``"top_left"``) lets query ``i`` see keys
``j <= i``, aligned at the top left like ``scaled_dot_product_attention(is_causal=True)``;
``causal="bottom_right"`` aligns the last query with the last key, as FlashAttention does
(:func:`helpers.kernels.attention.tiled.causal_diagonal`). ``lse`` is the natural-log
log-sum-exp of each row of scaled scores, fp32, shaped like ``q`` without its last
dimension; a row that sees no key (bottom right, more queries than keys) has output 0 and
``lse = +inf``, so that the backward's recomputed ``P = exp(S - lse)`` is exactly 0 there
(FlashAttention's convention; the mathematical log-sum-exp of nothing, -inf, would make
``S - lse`` +inf or NaN).
"""

from __future__ import annotations

import functools
import math

import torch

from ... import runtime
from ...dtypes import FLOAT_DTYPES
from . import backward as attention_backward  # the names lesson 06 shows its code with
from . import decode as attention_decode
from . import forward as attention_forward
from . import kept
from . import tiled as attention_tiled
from . import tuning
from .backward import (attention_bwd_dkdv_kernel, attention_bwd_dq_kernel,
                                 attention_bwd_preprocess_kernel)
from .forward import attention_fwd_kernel
from ..checks import check_tensor

__all__ = [
    "attention_reference", "naive_attention", "tiled_attention_forward",
    "tiled_attention_backward", "tiled_attention", "flash_attention_forward",
    "flash_attention_backward", "flash_attention", "FlashAttention", "TiledAttention",
    "flash_decode_forward", "uses_decoding",
    "attention_fwd_kernel", "attention_bwd_preprocess_kernel", "attention_bwd_dkdv_kernel",
    "attention_bwd_dq_kernel", "HEAD_DIMS", "TOLERANCES",
]

# Multiples of 8 (16-byte rows in fp16) from 16 (tl.dot's least) to 256. The kernels work on
# the next power of two (tl.arange needs one) and mask the columns past d; the forward takes
# a d that two powers of two make up (80 = 64 + 16) in those two pieces (forward_split.py).
HEAD_DIMS = tuple(range(16, 257, 8))

# (atol, rtol) of outputs and gradients against the float64 reference. P is rounded to
# the inputs' dtype before the P @ V matmul (as in every FlashAttention), so the error is
# a few units in the last place of that dtype; fp32 runs through TF32 tensor cores on a
# GPU (10 mantissa bits, like fp16) but exactly in the interpreter.
TOLERANCES = {
    torch.float32: (2e-3, 2e-3),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 3e-2),
}


# --------------------------------------------------------------------------------------
# The spec and the unfused version.
# --------------------------------------------------------------------------------------


def _scale(q: torch.Tensor, sm_scale) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)


def attention_reference(q, k, v, causal: bool = False, sm_scale=None):
    """The spec: ``(o, lse)`` in float64, from the whole score matrix at once."""
    q4, k4, v4, squeeze = _four_dims(q, k, v)
    heads = q4.shape[1]
    k4 = attention_tiled.expand_kv(k4, heads).double()
    v4 = attention_tiled.expand_kv(v4, heads).double()
    s = q4.double() @ k4.transpose(-1, -2) * _scale(q, sm_scale)
    s = _masked(s, causal)
    lse = torch.logsumexp(s, dim=-1)
    # A row that sees no key: output 0 and lse +inf (the module's docstring says why).
    blind = lse == -math.inf
    o = torch.softmax(s.masked_fill(blind[..., None], 0.0), dim=-1) @ v4
    o, lse = o.masked_fill(blind[..., None], 0.0), lse.masked_fill(blind, math.inf)
    return (o.squeeze(1), lse.squeeze(1)) if squeeze else (o, lse)


def _masked(s: torch.Tensor, causal) -> torch.Tensor:
    """Scores ``(..., seq_q, seq_k)`` with what a causal mask hides set to -inf."""
    diagonal = attention_tiled.causal_diagonal(causal, s.shape[-2], s.shape[-1])
    if diagonal is None:
        return s
    rows = torch.arange(s.shape[-2], device=s.device)
    cols = torch.arange(s.shape[-1], device=s.device)
    return s.masked_fill(~attention_tiled.causal_mask(rows, cols, diagonal), -math.inf)


def naive_attention(q, k, v, causal: bool = False, sm_scale=None):
    """Standard attention as separate PyTorch ops, each a kernel with its own HBM round trip.

    Per head: ``S = Q K^T`` writes ``seq_q x seq_k`` scores, the scale and the mask read
    and write them again, the softmax (in fp32) reads them and writes P, and ``P V``
    reads P. The memory this needs grows with ``seq_q * seq_k``.
    """
    q4, k4, v4, squeeze = _four_dims(q, k, v)
    heads = q4.shape[1]
    k4, v4 = attention_tiled.expand_kv(k4, heads), attention_tiled.expand_kv(v4, heads)
    s = (q4 @ k4.transpose(-1, -2)) * _scale(q, sm_scale)          # N x N in HBM
    s = _masked(s, causal)                                          # read, written again
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)                # N x N again
    o = p @ v4
    return o.squeeze(1) if squeeze else o


# --------------------------------------------------------------------------------------
# Input checks: one place, for the tiled version and the kernels alike.
# --------------------------------------------------------------------------------------


def _four_dims(q, k, v):
    """``(q, k, v)`` as 4-D views, and whether the inputs were 3-D; clear errors first."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() not in (3, 4):
            raise ValueError(f"{name} must be (batch, seq, d) or (batch, heads, seq, d), "
                             f"got shape {tuple(x.shape)}")
    if not q.dim() == k.dim() == v.dim():
        raise ValueError(f"q, k and v must have the same number of dimensions, got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    squeeze = q.dim() == 3
    q4, k4, v4 = (x.unsqueeze(1) for x in (q, k, v)) if squeeze else (q, k, v)
    (batch, heads, seq_q, d), (kv_batch, kv_heads, seq_k, kv_d) = q4.shape, k4.shape
    if kv_batch != batch or kv_d != d:
        raise ValueError(f"k and v must match q's batch and head dimension: q is "
                         f"{tuple(q.shape)}, k is {tuple(k.shape)}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q has {heads} heads and k, v have {kv_heads}: the query heads must "
                         "be a multiple of the key/value heads (grouped-query attention)")
    if seq_q == 0 or seq_k == 0 or batch == 0:
        raise ValueError(f"empty attention: q is {tuple(q.shape)}, k is {tuple(k.shape)}")
    return q4, k4, v4, squeeze


def _check_kernel_inputs(q4, k4, v4) -> None:
    dtypes = FLOAT_DTYPES if runtime.is_gpu() else (torch.float16, torch.float32)
    for name, x in (("q", q4), ("k", k4), ("v", v4)):
        check_tensor(x, name, dtypes=dtypes, contiguous=False)
        if x.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension (d) is not contiguous (stride "
                             f"{x.stride(-1)}): the kernels load rows of d elements at once. "
                             f"Pass {name}.contiguous().")
    d = q4.shape[-1]
    if d not in HEAD_DIMS:
        raise ValueError(f"head dimension {d} is not supported: the kernels take d a multiple "
                         "of 8 from 16 to 256 (16 is the least the tensor cores multiply). "
                         "Pad q, k and v with zeros up to the next multiple of 8.")


# --------------------------------------------------------------------------------------
# Block sizes: measured on the GPU (see helpers.experiments.attention), small in CPU mode.
# --------------------------------------------------------------------------------------


SHORT = 1024     # queries up to which the forward takes smaller tiles (forward_config)


def forward_config(head_dim: int, dtype: torch.dtype, compiled: bool | None = None,
                   seq_q: int | None = None) -> dict:
    """The forward kernel's tile and launch settings for this head size and dtype, compiled
    on a GPU (``compiled``, the default in GPU mode) or in the interpreter (small tiles):
    the table, which the tuner (:mod:`~helpers.kernels.attention.tuning`) starts from and
    keeps for problems too small to tune.

    From the tile sweep (:mod:`helpers.experiments.attention_tiles`, recorded in
    ``helpers/records/attention_tiles__H100-SXM.json``: bf16, batch 4, 16 heads, 8192
    tokens, 24 settings): at d = 128, 128 x 128 tiles with 8 warps and 3 stages ran at
    510 TFLOP/s non-causal (the best) and 459 causal, 128 x 64 at 486 and 462. At d = 64,
    128 x 64 with 8 warps ran at 415 and 393 with 3 stages, 420 and 400 with 4. Three
    stages of a 128 x 128 bf16 K tile and V tile take 192 KiB of the H100's 227 KiB of
    shared memory per SM. fp32 tiles are twice the bytes: half the keys per tile.

    Up to ``SHORT`` queries (``seq_q``), 64 x 64 tiles with 4 warps: twice the programs,
    for a GPU that 128-row blocks of a short sequence leave part idle, and a causal
    diagonal band half as wide. bf16 on an H100, 32k tokens a batch, 12 settings against
    SDPA's default (cuDNN): at d = 128, 512 tokens causal 0.74x with it against 0.56x
    with 128 x 128, 1,024 causal 0.74x against 0.64x; at d = 64, 512 causal 0.87x against
    0.79x; non-causal within 2% either way. From 2,048 tokens 128-row blocks win again.
    """
    if not (runtime.is_gpu() if compiled is None else compiled):
        return _tiles(32, 32, 4, 1)
    width = block_d(head_dim)           # what the kernel holds: d up to a power of two
    if width == 256:
        # Twice d = 128's bytes a row: half the keys a tile, two stages (bf16, 4,096 tokens
        # on an H100, 10 settings: 497 TFLOP/s non-causal and 492 causal at d = 256, the
        # best; 64 x 32 with 4 warps next at 419 and 400; 64 x 64, 8 warps, 262 and 250).
        return _tiles(32, 32, 4, 2) if dtype == torch.float32 else _tiles(128, 64, 8, 2)
    if dtype == torch.float32:          # 4-byte tiles: half the keys fit in SRAM
        return _tiles(64, 32, 4, 2)
    if seq_q is not None and seq_q <= SHORT:
        return _tiles(64, 64, 4, 3)
    if width == 128:
        return _tiles(128, 128, 8, 3)
    return _tiles(128, 64, 8 if width == 64 else 4, 3)


def backward_config(head_dim: int, dtype: torch.dtype, compiled: bool | None = None) -> dict:
    """The backward kernels' settings: ``dkdv`` for the dK/dV kernel, ``dq_tiles`` for dQ
    (``compiled`` as in :func:`forward_config`).

    The dK/dV kernel's K/V tile is resident, so its ``block_n`` is a multiple of its
    ``block_m``; the dQ kernel's Q tile is, so there ``block_m`` is a multiple of ``block_n``.
    From the same record, each kernel alone (bf16, d = 128, 8192 tokens, 16 settings
    each): dK/dV took 7.99 ms non-causal with 64 x 64 tiles, 4 warps and 2 stages, the
    best (8.72 for the next); 32 x 128 with 4 warps took 24.1 ms: its two 128 x 128 fp32
    accumulators alone are 256 registers for each of 128 threads, over the 255 a thread
    has. dQ took 5.56 ms with 128 x 64, 8 warps and 3 stages, the best (5.85 for the next).
    """
    if not (runtime.is_gpu() if compiled is None else compiled):
        return dict(dkdv=_tiles(16, 32, 4, 1), dq_tiles=_tiles(32, 16, 4, 1))
    if block_d(head_dim) == 256:
        # Two fp32 accumulators of 256 columns a row. bf16, d = 256, 4,096 tokens on an
        # H100: dK/dV best with 64 x 64 tiles and 8 warps (8 settings), dQ with 128 x 32 and
        # 8 warps (7 settings; 128 x 64 does not fit in shared memory).
        if dtype == torch.float32:
            return dict(dkdv=_tiles(16, 32, 4, 1), dq_tiles=_tiles(32, 16, 4, 1))
        return dict(dkdv=_tiles(64, 64, 8, 2), dq_tiles=_tiles(128, 32, 8, 2))
    if dtype == torch.float32:
        return dict(dkdv=_tiles(32, 64, 4, 2), dq_tiles=_tiles(64, 32, 4, 2))
    return dict(dkdv=_tiles(64, 64, 4, 2), dq_tiles=_tiles(128, 64, 8, 3))


def block_d(head_dim: int) -> int:
    """The width the kernels hold a head in: ``head_dim`` up to a power of two (96 -> 128);
    the columns past ``head_dim`` are masked on every load and store. The forward holds a
    head two powers of two make up in those two pieces instead (:mod:`.forward_split`);
    its table setting is still read for this width (the tuner keys it at its own)."""
    return 1 << (head_dim - 1).bit_length()


def _tiles(block_m: int, block_n: int, num_warps: int, num_stages: int) -> dict:
    return dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)


# --------------------------------------------------------------------------------------
# The public API.
# --------------------------------------------------------------------------------------


def tiled_attention_forward(q, k, v, causal: bool = False, sm_scale=None,
                            block_m: int = 64, block_n: int = 64):
    """``(o, lse)`` by FlashAttention-2's algorithm in plain PyTorch, on any device."""
    q4, k4, v4, squeeze = _four_dims(q, k, v)
    o, lse = attention_tiled.forward(q4, k4, v4, causal, _scale(q, sm_scale), block_m, block_n)
    return (o.squeeze(1), lse.squeeze(1)) if squeeze else (o, lse)


def tiled_attention_backward(do, q, k, v, o, lse, causal: bool = False, sm_scale=None,
                             block_m: int = 64, block_n: int = 64):
    """``(dq, dk, dv)`` recomputed block by block from the saved ``lse``, in plain PyTorch."""
    q4, k4, v4, squeeze = _four_dims(q, k, v)
    do4, o4, lse4 = (do.unsqueeze(1), o.unsqueeze(1), lse.unsqueeze(1)) if squeeze else (do, o, lse)
    grads = attention_tiled.backward(do4, q4, k4, v4, o4, lse4, causal, _scale(q, sm_scale),
                                     block_m, block_n)
    return tuple(g.squeeze(1) for g in grads) if squeeze else grads


def flash_attention_forward(q, k, v, causal: bool = False, sm_scale=None, **config):
    """``(o, lse)`` from the Triton forward kernel. ``config`` overrides
    :func:`forward_config` (``block_m``, ``block_n``, ``num_warps``, ``num_stages``, and
    ``tma``: Q, K and V (and O) through tensor descriptors where the tensors allow).

    Without ``config``, a short query (:func:`uses_decoding`: up to 16 queries a head)
    goes to the split-KV kernels of :func:`flash_decode_forward` instead. Without
    ``config``, a call like one that ran compiled before goes straight to its kept
    launches (:mod:`~helpers.kernels.attention.kept`)."""
    call = None if config else kept.call_key(q, k, v, causal, sm_scale)
    found = kept.lookup(call)
    if found is not None and found is not kept.USUAL:
        return found(q, k, v)
    keeping = found is None and kept.worth_keeping(call)
    q4, k4, v4, squeeze = _four_dims(q, k, v)
    _check_kernel_inputs(q4, k4, v4)
    diagonal = attention_tiled.causal_diagonal(causal, q4.shape[2], k4.shape[2])
    scale = _scale(q, sm_scale)
    if not config and uses_decoding(q4.shape[1], k4.shape[1], q4.shape[2]):
        out = _decode_forward(q4, k4, v4, squeeze, causal, scale, {})
        if keeping:
            kept.keep(call, attention_decode.kept_call(
                q, k, v, *out, diagonal, scale,
                **decode_config(q4.shape[-1], q4.dtype, q4.device)))
        return out
    o = torch.empty_like(q4, memory_format=torch.contiguous_format)
    lse = torch.empty(q4.shape[:-1], dtype=torch.float32, device=q4.device)
    table = forward_config(q4.shape[-1], q4.dtype, seq_q=q4.shape[2])

    def run(tiles, compile_only=False):
        return attention_forward.launch(q4, k4, v4, o, lse, diagonal, scale, **tiles,
                                        compile_only=compile_only)

    # Without config, on a GPU: the setting tuned for this call's key (tuning.choose).
    settings = {**table, **config} if config else tuning.choose(
        "forward", q4, k4, diagonal is not None, table, run,
        attention_forward.kernel_for(q4.shape[-1]), attention_forward.held(q4.shape[-1]),
        attention_forward.tma_ok(q4, q4, k4, v4))
    if settings["block_m"] % settings["block_n"]:
        raise ValueError("block_m must be a multiple of block_n: the causal diagonal band "
                         "is block_m keys wide and is walked in tiles of block_n")
    compiled = run(settings)
    if keeping:
        kept.keep(call, attention_forward.kept_call(compiled, q, k, v, o, lse, diagonal,
                                                    scale, **settings))
    return (o.squeeze(1), lse.squeeze(1)) if squeeze else (o, lse)


DECODE_QUERIES = 16     # queries a head up to which the split-KV kernels take the forward


def uses_decoding(heads: int, kv_heads: int, seq_q: int) -> bool:
    """Whether :func:`flash_attention_forward` splits the keys: at most ``DECODE_QUERIES``
    queries a head, and the query rows of the heads sharing a K/V head fit one tile."""
    return (seq_q <= DECODE_QUERIES
            and attention_decode.rows(heads, kv_heads, seq_q) <= attention_decode.MAX_ROWS)


def decode_config(head_dim: int, dtype: torch.dtype, device: torch.device,
                  compiled: bool | None = None, sms: int | None = None) -> dict:
    """The split-KV kernel's settings: key tile, warps, stages and the programs to aim for
    (splits x batch x K/V heads): two per SM, one wave (``decode.split_keys`` rounds
    down); in the interpreter, small tiles. ``sms``: the GPU's SM count (a record's).

    Swept on an H100 (bf16, 1 query, 32 heads on 8 K/V heads, d = 128, batch 1 and 8, 8k
    to 128k keys, 36 settings, torch.profiler's kernel time): 64-key tiles, 3 stages, 4
    warps, 2 programs per SM, within 6% of each shape's best; on an H200, with splits
    rounded down, 0.98x to 1.04x cuDNN's kernels (``tests/gpu/decode_split_probe.py``)."""
    if not (runtime.is_gpu() if compiled is None else compiled):
        return dict(block_n=16, num_warps=4, num_stages=1, target_programs=8)
    sms = sms or _sm_count(device)
    wide = block_d(head_dim) * (4 if dtype == torch.float32 else 2) > 256
    return dict(block_n=32 if wide else 64, num_warps=4, num_stages=3,
                target_programs=2 * sms)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def flash_decode_forward(q, k, v, causal: bool = False, sm_scale=None, **config):
    """``(o, lse)`` by the split-KV kernels (:mod:`helpers.kernels.attention.decode`):
    each K/V head's keys split among programs, the splits merged by their log-sum-exps.
    For a few queries against many keys; ``causal="bottom_right"`` is decoding's mask.
    ``config`` overrides :func:`decode_config`."""
    q4, k4, v4, squeeze = _four_dims(q, k, v)
    _check_kernel_inputs(q4, k4, v4)
    heads, kv_heads, seq_q = q4.shape[1], k4.shape[1], q4.shape[2]
    if attention_decode.rows(heads, kv_heads, seq_q) > attention_decode.MAX_ROWS:
        raise ValueError(f"{seq_q} queries of {heads // kv_heads} heads per K/V head are "
                         f"{attention_decode.rows(heads, kv_heads, seq_q)} rows, more than the "
                         f"split-KV kernel's tile of {attention_decode.MAX_ROWS}: use "
                         "flash_attention_forward")
    return _decode_forward(q4, k4, v4, squeeze, causal, _scale(q, sm_scale), config)


def _decode_forward(q4, k4, v4, squeeze: bool, causal, sm_scale: float, config: dict):
    """The split-KV launch on checked 4-D inputs (once checked: a decoding step's host
    time is the step's pace)."""
    settings = {**decode_config(q4.shape[-1], q4.dtype, q4.device), **config}
    diagonal = attention_tiled.causal_diagonal(causal, q4.shape[2], k4.shape[2])
    o = torch.empty_like(q4, memory_format=torch.contiguous_format)
    lse = torch.empty(q4.shape[:-1], dtype=torch.float32, device=q4.device)
    attention_decode.launch(q4, k4, v4, o, lse, diagonal, sm_scale, **settings)
    return (o.squeeze(1), lse.squeeze(1)) if squeeze else (o, lse)


def flash_attention_backward(do, q, k, v, o, lse, causal: bool = False, sm_scale=None,
                             **config):
    """``(dq, dk, dv)`` from the Triton backward kernels, recomputing P from ``lse``.
    Without ``config``, a call like one that ran compiled before, on inputs that needed no
    copy, goes straight to its kept launches (:mod:`~helpers.kernels.attention.kept`)."""
    call = None if config else kept.backward_key(do, q, k, v, o, lse, causal, sm_scale)
    found = kept.lookup(call)
    if found is not None and found is not kept.USUAL:
        return found(do, q, k, v, o, lse)
    keeping = found is None and kept.worth_keeping(call)
    q4, k4, v4, squeeze = _four_dims(q, k, v)
    _check_kernel_inputs(q4, k4, v4)
    do4, o4, lse4 = (do.unsqueeze(1), o.unsqueeze(1), lse.unsqueeze(1)) if squeeze else (do, o, lse)
    given = (q4, k4, v4, do4, o4, lse4)
    if do4.shape != q4.shape or o4.shape != q4.shape or lse4.shape != q4.shape[:-1]:
        raise ValueError(f"do and o must have q's shape {tuple(q.shape)} and lse "
                         f"{tuple(q.shape[:-1])}; got {tuple(do.shape)}, {tuple(o.shape)}, "
                         f"{tuple(lse.shape)}")
    if lse4.dtype != torch.float32:
        raise TypeError(f"lse must be float32 (as the forward returns it), got {lse.dtype}")
    # One layout for q, o, do, dq and one for k, v, dk, dv: the kernels share strides.
    q4, k4, v4 = q4.contiguous(), k4.contiguous(), v4.contiguous()
    do4, o4, lse4 = do4.to(q4.dtype).contiguous(), o4.to(q4.dtype).contiguous(), lse4.contiguous()
    dq, dk, dv = torch.empty_like(q4), torch.empty_like(k4), torch.empty_like(v4)
    delta = torch.empty_like(lse4)
    diagonal = attention_tiled.causal_diagonal(causal, q4.shape[2], k4.shape[2])
    scale = _scale(q, sm_scale)
    table = backward_config(q4.shape[-1], q4.dtype)
    if config:
        settings = {**table, **config}
        attention_backward.launch(do4, q4, k4, v4, o4, lse4, dq, dk, dv, delta, diagonal,
                                  scale, **settings)
    else:
        # On a GPU, each kernel's setting tuned for this call's key, each kernel timed alone.
        preprocess = attention_backward.launch_preprocess(do4, o4, delta)
        dkdv = tuning.choose("dkdv", q4, k4, diagonal is not None, table["dkdv"],
                             lambda tiles, **how: attention_backward.launch_dkdv(
                                 do4, q4, k4, v4, lse4, delta, dk, dv, diagonal, scale,
                                 **tiles, **how), attention_bwd_dkdv_kernel,
                             tma=attention_forward.tma_ok(q4, q4, do4))
        dq_tiles = tuning.choose("dq", q4, k4, diagonal is not None, table["dq_tiles"],
                                 lambda tiles, **how: attention_backward.launch_dq(
                                     do4, q4, k4, v4, lse4, delta, dq, diagonal, scale,
                                     **tiles, **how), attention_bwd_dq_kernel,
                                 tma=attention_forward.tma_ok(q4, k4, v4))
        compiled = (preprocess,
                    attention_backward.launch_dkdv(do4, q4, k4, v4, lse4, delta, dk, dv,
                                                   diagonal, scale, **dkdv),
                    attention_backward.launch_dq(do4, q4, k4, v4, lse4, delta, dq, diagonal,
                                                 scale, **dq_tiles))
        if keeping and all(a is b for a, b in zip(given, (q4, k4, v4, do4, o4, lse4))):
            kept.keep(call, attention_backward.kept_call(          # (inputs not copied)
                compiled, do, q, k, v, o, lse, (dq, dk, dv), diagonal, scale, dkdv=dkdv,
                dq_tiles=dq_tiles))
    grads = (dq, dk, dv)
    return tuple(g.squeeze(1) for g in grads) if squeeze else grads


def _differentiable(name: str, run_forward, run_backward, doc: str):
    """An autograd Function from ``run_forward(q, k, v, causal, sm_scale) -> (o, lse)`` and
    ``run_backward(do, q, k, v, o, lse, causal, sm_scale) -> (dq, dk, dv)``: the forward
    saves ``lse`` (one float a row), the backward recomputes the probabilities from it."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, sm_scale):
            o, lse = run_forward(q, k, v, causal, sm_scale)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal, ctx.sm_scale = causal, sm_scale
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            grads = run_backward(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale)
            return (*grads, None, None)           # causal and sm_scale get no gradient

    Attention.__name__ = Attention.__qualname__ = name
    Attention.__doc__ = doc
    return Attention


FlashAttention = _differentiable(
    "FlashAttention", flash_attention_forward, flash_attention_backward,
    "The Triton kernels under autograd: the forward saves ``lse``, the backward uses it.")
TiledAttention = _differentiable(
    "TiledAttention", tiled_attention_forward, tiled_attention_backward,
    "The plain-PyTorch tiled version under autograd, with the kernels' interface.")


def flash_attention(q, k, v, causal: bool = False, sm_scale=None):
    """Attention by the Triton kernels, differentiable: ``o`` shaped like ``q``."""
    return FlashAttention.apply(q, k, v, causal, sm_scale)


def tiled_attention(q, k, v, causal: bool = False, sm_scale=None):
    """Attention by the tiled PyTorch version, differentiable: ``o`` shaped like ``q``."""
    return TiledAttention.apply(q, k, v, causal, sm_scale)

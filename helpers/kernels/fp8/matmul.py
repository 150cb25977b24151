"""A scaled FP8 matmul: ``C = (A * a_scale) @ (B * b_scale)^T``, accumulated in fp32.

``A`` is ``(M, K)`` activations and ``B`` is ``(N, K)`` weights in the ``nn.Linear``
layout, both FP8 (:mod:`~helpers.kernels.fp8.quantize`). Hopper's FP8 tensor cores take
both operands K-major, which this layout is: row ``n`` of ``B`` is column ``n`` of
``B^T``, its K values side by side. The scales decide where the multiply by them happens:

* ``"tensor"``: one scale each. Their product multiplies the whole fp32 tile once, in the
  epilogue: the loop is a plain FP8 matmul.
* ``"row"``: a scale per row of ``A`` (a token) and per row of ``B`` (an output channel):
  still constant along K, so still the epilogue, ``acc * a_s[:, None] * b_s[None, :]``.
* ``"block"``: DeepSeek-V3's 1 x 128 for ``A`` and 128 x 128 for ``B``. The scales change
  every 128 values of K, so they cannot wait for the epilogue: each K block's product
  comes out of the tensor cores on its own, is multiplied by its scales and added into
  the fp32 total on the CUDA cores. ``BLOCK_K`` is 128, one scale step a block.

**Promotion.** DeepSeek-V3 (technical report, section 3.3.2) measured that Hopper's FP8
tensor cores keep only about 14 bits in the accumulator they sum into, so a long K loses
precision, and moved the partial sum into fp32 on the CUDA cores every 128 values of K
(4 WGMMAs). The block path does that by construction (each K block's product is taken on
its own). For the other two, ``promote_every`` asks Triton for the same thing:
``tl.dot(a, b, acc, max_num_imprecise_acc=P)`` makes the compiler add the tensor cores'
partial sum into the fp32 accumulator every ``P`` values of K (0: Triton's default for FP8
on Hopper, 2^30, never). In the interpreter every sum is exact, so only a GPU shows the
difference.

On a Hopper GPU, with operands the TMA can read, :func:`scaled_matmul` runs the same
product on the persistent kernel of :mod:`~helpers.kernels.fp8.persistent`; this one is
the readable version, and the fallback for everything else.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..checks import check_tensor
from ..matmul.ladder import grouped_tile
from . import persistent
from .formats import dequantize

SCALINGS = {"tensor": 0, "row": 1, "block": 2}
# A's and B's scale granularities for each scaling (helpers.kernels.fp8.formats).
GRANULARITY_OF = {"tensor": ("tensor", "tensor"), "row": ("row", "row"),
                  "block": ("1x128", "128x128")}
SCALE_BLOCK = 128
# K values summed by the tensor cores before each promotion (at most one K block of 128).
PROMOTE_CHOICES = (0, 32, 64, 128)
KERNELS = ("auto", "persistent", "pointer")


@triton.jit
def fp8_matmul_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K,
                      stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
                      stride_asm, stride_ask, stride_bsn, stride_bsk,
                      SCALING: tl.constexpr, PROMOTE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N),
                                GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_m, M - 1)       # edge tiles re-read the last row, never stored
    cols = tl.minimum(offs_n, N - 1)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + cols.to(tl.int64)[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)       # fp32, in registers
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if SCALING == 2:
            # This K block's scales: one a row of A, one a 128-column block of B.
            a_s = tl.load(as_ptr + rows * stride_asm + k * stride_ask)
            b_s = tl.load(bs_ptr + (cols // 128) * stride_bsn + k * stride_bsk)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        elif PROMOTE > 0:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=PROMOTE)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SCALING == 0:
        acc = acc * (tl.load(as_ptr) * tl.load(bs_ptr))
    elif SCALING == 1:
        acc = acc * tl.load(as_ptr + rows * stride_asm)[:, None] \
            * tl.load(bs_ptr + cols * stride_bsn)[None, :]
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# One setting per mode, from Triton's FP8 tutorial's H100 tiles; the GPU sweep that picks
# them per shape is the lesson's record. The interpreter takes small tiles (the block path
# keeps BLOCK_K = 128: one scale step a block).
GPU_SETTING = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8,
               "num_warps": 8, "num_stages": 4}
CPU_SETTING = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4,
               "num_warps": 4, "num_stages": 1}


def _check_scales(name, s, want) -> None:
    if tuple(s.shape) != tuple(want):
        raise ValueError(f"{name} has shape {tuple(s.shape)}; this scaling needs {tuple(want)}")
    if s.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 (the scales are kept in fp32), got {s.dtype}")


def scaled_matmul(a, b, a_scale, b_scale, scaling: str = "tensor", *,
                  out_dtype=torch.bfloat16, promote_every: int = 0, kernel: str = "auto",
                  setting=None):
    """``(a * a_scale) @ (b * b_scale)^T`` for FP8 ``a`` ``(M, K)`` and ``b`` ``(N, K)``.

    ``scaling`` and the scales' shapes: ``"tensor"`` ``(1, 1)`` each; ``"row"`` ``(M, 1)``
    and ``(N, 1)``; ``"block"`` ``(M, K/128)`` and ``(N/128, K/128)`` (rounded up), the
    shapes :func:`~helpers.kernels.fp8.quantize.quantize` returns for the matching
    granularities (:data:`GRANULARITY_OF`).

    ``kernel``: ``"persistent"`` (:mod:`~helpers.kernels.fp8.persistent`, tuned per shape on
    a GPU), ``"pointer"`` (this module's) or ``"auto"``: the persistent one on a Hopper GPU
    when the TMA can read the operands, the pointer one otherwise (and in the interpreter).
    ``setting``: that kernel's tile setting, instead of its default or its tuner.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {list(SCALINGS)}, got {scaling!r}")
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    check_tensor(a, "a", dtypes=fp8, ndim=2, contiguous=False)
    check_tensor(b, "b", dtypes=fp8, ndim=2, contiguous=False)
    (M, K), N = a.shape, b.shape[0]
    if b.shape[1] != K:
        raise ValueError(f"a is (M, K) = {tuple(a.shape)} and b must be (N, K) with the same K "
                         f"(the nn.Linear layout); got b {tuple(b.shape)}")
    blocks = -(-K // SCALE_BLOCK)
    want = {"tensor": ((1, 1), (1, 1)), "row": ((M, 1), (N, 1)),
            "block": ((M, blocks), (-(-N // SCALE_BLOCK), blocks))}[scaling]
    _check_scales("a_scale", a_scale, want[0])
    _check_scales("b_scale", b_scale, want[1])
    if promote_every not in PROMOTE_CHOICES or isinstance(promote_every, bool):
        raise ValueError(f"promote_every is the K values the tensor cores sum before the fp32 "
                         f"total takes them: one of {PROMOTE_CHOICES} (0: never); got "
                         f"{promote_every!r}")
    c = torch.empty((M, N), device=a.device, dtype=out_dtype)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    mode = SCALINGS[scaling]
    fits, why = persistent.usable(a, b, out_dtype)
    if kernel == "persistent" and not fits:
        raise ValueError(f"the persistent kernel cannot take these operands: {why}; pass "
                         f"kernel='pointer' (or 'auto')")
    if kernel == "persistent" or (kernel == "auto" and fits and runtime.is_gpu()):
        persistent.launch(a, b, c, a_scale, b_scale, mode, promote_every, setting)
        return c
    setting = dict(setting or (CPU_SETTING if runtime.is_cpu() else GPU_SETTING))
    if scaling == "block":
        setting["BLOCK_K"] = SCALE_BLOCK
    grid = (triton.cdiv(M, setting["BLOCK_M"]) * triton.cdiv(N, setting["BLOCK_N"]),)
    fp8_matmul_kernel[grid](a, b, c, a_scale, b_scale, M, N, K, *a.stride(), *b.stride(),
                            *c.stride(), *a_scale.stride(), *b_scale.stride(), SCALING=mode,
                            PROMOTE=min(promote_every, setting["BLOCK_K"]), **setting)
    return c


def scaled_matmul_reference(a, b, a_scale, b_scale, scaling: str = "tensor") -> torch.Tensor:
    """The same product in float64 from the dequantised operands: the spec."""
    ga, gb = GRANULARITY_OF[scaling]
    return dequantize(a, a_scale, ga) @ dequantize(b, b_scale, gb).T

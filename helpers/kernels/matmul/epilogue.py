"""A matmul with its activation fused into the epilogue: ``C = act(A @ B)`` in one kernel.

After the K loop, a tiled matmul holds its ``BLOCK_M x BLOCK_N`` tile of C in registers,
in fp32, and writes it once. An activation applied there (the *epilogue*) costs a few
instructions per element on data already on chip. Applied afterwards by a second kernel,
it costs a whole memory-bound pass: read C from HBM, write ``act(C)`` back, ``2 M N``
elements. Triton's matmul tutorial fuses ``leaky_relu`` exactly so
(https://triton-lang.org/main/getting-started/tutorials/03-matrix-multiplication.html).

The kernel is lesson 04's v3 (tiles, grouped program order, ``tl.dot``) with one
``ACTIVATION`` switch before the store; ``ACTIVATION="none"`` is the plain matmul, so the
measured difference between the two is the epilogue alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ...dtypes import FLOAT_DTYPES
from ..checks import check_tensor
from .config import TILE_KEYS, TileConfig
from .ladder import grouped_tile

ACTIVATIONS = ("none", "leaky_relu")
NEGATIVE_SLOPE = 0.01                 # leaky_relu's slope below zero, as in the tutorial
_SLOPE = tl.constexpr(NEGATIVE_SLOPE)  # kernels may read a global only as a constexpr

# The default is lesson 04's 128 x 256 x 64 rung with 8 warps and 3 stages (608 to 617
# TFLOP/s in fp16 at 4096^3 and 8192^3 on an H100, tiling record); the interpreter takes
# small tiles (CPU_CONFIG).
CONFIG = TileConfig(128, 256, 64, num_stages=3, num_warps=8)
CPU_CONFIG = TileConfig(32, 32, 32, group_m=4, num_stages=1, num_warps=4)
LAUNCH_KEYS = (*TILE_KEYS, "num_stages", "num_warps")   # what a launch of the kernel takes

# (atol, rtol) for randn inputs and K up to a few hundred, as lesson 04's tests: the kernel
# and the reference both round an fp32 sum once (one ulp apart at most: 2^-10 relative in
# fp16, 2^-7 in bf16); fp32 inputs meet TF32 in tl.dot on a GPU (about 1e-3 per product).
TOLERANCES = {
    torch.float16: (2e-2, 2e-3),
    torch.bfloat16: (1e-1, 1.6e-2),
    torch.float32: (5e-2, 1e-2),
}


def reference(a: torch.Tensor, b: torch.Tensor, activation: str = "leaky_relu") -> torch.Tensor:
    """The spec: ``act(a @ b)``, product and activation in fp32, rounded once."""
    _check_activation(activation)
    c = torch.matmul(a.float(), b.float())
    if activation == "leaky_relu":
        c = torch.nn.functional.leaky_relu(c, NEGATIVE_SLOPE)
    return c.to(a.dtype)


def unfused(a: torch.Tensor, b: torch.Tensor, matmul=torch.matmul) -> torch.Tensor:
    """The same op as two kernels: the product, then a pass of ``F.leaky_relu`` over C."""
    return torch.nn.functional.leaky_relu(matmul(a, b), NEGATIVE_SLOPE)


@triton.jit
def leaky_relu(x):
    return tl.where(x >= 0, x, _SLOPE * x)


@triton.jit
def matmul_act_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, ACTIVATION: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), tl.cdiv(M, BLOCK_M),
                                tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # The epilogue: the finished fp32 tile is still in registers. The activation costs a
    # compare and a select per element here; as a second kernel it would cost a read and a
    # write of all of C in HBM.
    if ACTIVATION == "leaky_relu":
        acc = leaky_relu(acc)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def matmul_act(a: torch.Tensor, b: torch.Tensor, activation: str = "leaky_relu", *,
               config=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``act(a @ b)`` in one kernel; ``activation="none"`` gives the plain product.

    ``config`` is a :class:`~helpers.kernels.matmul.config.TileConfig` (its tile, group,
    stages and warps); by default :data:`CONFIG` on a GPU and :data:`CPU_CONFIG` in the
    interpreter.
    """
    _check_activation(activation)
    check_tensor(a, "a", dtypes=FLOAT_DTYPES, ndim=2, contiguous=False)
    check_tensor(b, "b", dtypes=FLOAT_DTYPES, ndim=2, contiguous=False)
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} and b is {b.dtype}: convert one so both match")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply {tuple(a.shape)} by {tuple(b.shape)}: the inner "
                         f"sizes differ ({a.shape[1]} != {b.shape[0]})")
    runtime.check_dot_dtype(a.dtype)
    config = TileConfig.of(config or (CPU_CONFIG if runtime.is_cpu() else CONFIG))
    if config.split_k != 1 or config.options:
        raise ValueError(f"matmul_act takes a tile, GROUP_M, stages and warps: no split of K, "
                         f"no kernel options; got {config.describe()}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype) if out is None else out
    if c.numel() == 0:
        return c
    if K == 0:                        # an empty sum is zero, and act(0) = 0 for leaky_relu
        return c.zero_()
    grid = (triton.cdiv(M, config.block_m) * triton.cdiv(N, config.block_n),)
    matmul_act_kernel[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
                            **config.as_dict(LAUNCH_KEYS), ACTIVATION=activation)
    return c

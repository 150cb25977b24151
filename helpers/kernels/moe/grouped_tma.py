"""The grouped GEMM on sorted rows, fed by the TMA: a candidate for the weights' GEMMs.

:func:`~helpers.kernels.moe.grouped.grouped_matmul` loads its tiles with ``cp.async``:
every thread computes the addresses of its 16-byte pieces of A and of B. At the 8-expert
training shape those GEMMs ran at 527-566 TFLOP/s on an H200 against CUTLASS's 596-631
(TMA-fed, in ``torch._grouped_mm``). Here both operands come through Hopper's Tensor Memory
Accelerator, as in :mod:`helpers.kernels.matmul.persistent`, from descriptors built on the host:

* **A**, the sorted rows ``(R, K)``: a tile of expert ``e`` is a box at row ``start``.
  A box may run past the expert's last row into the next expert's rows: those rows are
  computed and never stored, as the pointer kernel's padding rows are. Past ``K`` and past
  ``R`` the TMA reads zeros.
* **B**, the experts' weights ``(E, K, N)``, seen as one ``(E K, N)`` matrix: expert
  ``e``'s box at row ``e K + k``. When ``K`` is not a whole number of boxes, the last box
  reaches into expert ``e + 1``'s rows; they meet A's columns past ``K``, which the TMA
  read as zeros, so they add nothing. A transposed view (``B_T``: ``gate_up``'s ``(E, H,
  2I)`` read as ``(E, 2I, H)`` for ``dx``) is described as the ``(E N, K)`` matrix
  underneath and each box used transposed.
* **C** is stored through pointers with a mask: a TMA store writes whole boxes, and a box
  past the expert's end would overwrite the next expert's rows.

One program per SM walks the tiles (``tile``, ``tile + NUM_SMS``, ...), skipping the tiles
past the last real one, with :func:`~helpers.kernels.moe.tiles.expert_of_tile`'s
arithmetic. The TMA needs 16-byte aligned rows: :func:`usable` says when it applies.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import runtime
from ..matmul.config import TileConfig, gpu_in_use
from ..matmul.ladder import grouped_tile
from .tiles import CPU_CONFIG, KEYS, bucket, expert_of_tile


@triton.jit
def grouped_gemm_tma_kernel(a_desc, b_desc, c_ptr, counts_ptr, R, N, K, E, stride_cm,
                            E_POW2: tl.constexpr, B_T: tl.constexpr, NUM_SMS: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """``C[r] = A[r] @ B[e]`` for every sorted row ``r`` of expert ``e``."""
    max_tiles_m = tl.minimum(R, R // BLOCK_M + E)        # the worst case, as the pointer kernel
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), max_tiles_m * tiles_n, NUM_SMS):
        pid_m, pid_n = grouped_tile(tile, max_tiles_m, tiles_n, GROUP_M)
        expert, start, end = expert_of_tile(pid_m, counts_ptr, E, E_POW2, BLOCK_M)
        if start < end:
            col = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                a = a_desc.load([start, k])
                if B_T:
                    b = b_desc.load([expert * N + col, k]).T
                else:
                    b = b_desc.load([expert * K + k, col])
                acc = tl.dot(a, b, acc)
            offs_m = start + tl.arange(0, BLOCK_M)
            offs_n = col + tl.arange(0, BLOCK_N)
            c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
                     mask=(offs_m[:, None] < end) & (offs_n[None, :] < N))


@triton.jit
def weight_grad_tma_kernel(a_desc, b_desc, c_ptr, offsets_ptr, M, N, E,
                           stride_ce, stride_cm,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """``C[e] = A_e^T @ B_e`` (``M x N`` an expert), the reduction over expert ``e``'s
    sorted rows ``offsets[e] : offsets[e + 1]`` of ``A`` ``(R, M)`` and ``B`` ``(R, N)``,
    one program a tile of one expert's ``C`` (the backward's weight gradients,
    :func:`helpers.kernels.moe.backward.grouped_weight_grad`).

    Whole boxes of ``BLOCK_K`` rows go straight from shared memory to the tensor cores;
    the last, partial box of an expert reaches into the next expert's rows, which would
    add to this gradient: that one box is zeroed past ``end`` in registers (both operands,
    so that nothing of the other expert's rows, not even a NaN, gets in).
    """
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(axis=0)
    expert = pid // (tiles_m * tiles_n)
    pid_m, pid_n = grouped_tile(pid % (tiles_m * tiles_n), tiles_m, tiles_n, GROUP_M)
    start = tl.load(offsets_ptr + expert).to(tl.int32)
    end = tl.load(offsets_ptr + expert + 1).to(tl.int32)
    row0, col0 = pid_m * BLOCK_M, pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    whole_end = start + (end - start) // BLOCK_K * BLOCK_K
    for r0 in range(start, whole_end, BLOCK_K):
        a = a_desc.load([r0, row0])               # BLOCK_K rows x BLOCK_M features
        b = b_desc.load([r0, col0])
        acc = tl.dot(a.T, b, acc)
    if whole_end < end:
        valid = (whole_end + tl.arange(0, BLOCK_K)) < end
        a = tl.where(valid[:, None], a_desc.load([whole_end, row0]), 0.0)
        b = tl.where(valid[:, None], b_desc.load([whole_end, col0]), 0.0)
        acc = tl.dot(a.T, b, acc)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = col0 + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + expert.to(tl.int64) * stride_ce + offs_m.to(tl.int64)[:, None] * stride_cm \
        + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def grouped_gather_tma_kernel(a_ptr, rows_ptr, b_desc, c_ptr, pre_ptr, counts_ptr, R, N, K, E,
                              stride_am, stride_cm, E_POW2: tl.constexpr,
                              SWIGLU: tl.constexpr, SAVE_PRE: tl.constexpr, B_T: tl.constexpr,
                              EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr):
    """``C[r] = A[rows[r]] @ B[e]``: rows of A gathered through pointers (the TMA of this
    GPU reads boxes, not lists of rows), the weights through the TMA.

    With ``SWIGLU`` the weights are the training layer's ``gate_up`` ``(E, K, 2N)``, one
    matrix ``(E K, 2N)`` to the TMA: the gate's box at column ``col``, the up's at ``N +
    col``, and ``C[r] = silu(gate) * up``; with ``SAVE_PRE`` both projections are stored in
    ``pre`` (``R x 2N``) too. ``B_T``: the weights are a transposed view, described as the
    ``(E N, K)`` matrix underneath (the backward's ``dout @ Wd^T``). Past ``K`` A's columns
    load as zeros, so B's rows of the next expert that a last box reaches add nothing.
    """
    max_tiles_m = tl.minimum(R, R // BLOCK_M + E)
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), max_tiles_m, tl.cdiv(N, BLOCK_N),
                                GROUP_M)
    expert, start, end = expert_of_tile(pid_m, counts_ptr, E, E_POW2, BLOCK_M)
    if start >= end:
        return
    offs_m = start + tl.arange(0, BLOCK_M)
    real = offs_m < end
    src = tl.load(rows_ptr + tl.where(real, offs_m, start))     # padding re-reads a real row
    col = pid_n * BLOCK_N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + src.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
        if B_T:
            b = b_desc.load([expert * N + col, k]).T
        else:
            b = b_desc.load([expert * K + k, col])
        acc = tl.dot(a, b, acc)
        if SWIGLU:
            acc2 = tl.dot(a, b_desc.load([expert * K + k, N + col]), acc2)
        a_ptrs += BLOCK_K
    offs_n = col + tl.arange(0, BLOCK_N)
    keep = real[:, None] & (offs_n[None, :] < N)
    if SAVE_PRE:
        pre_ptrs = pre_ptr + offs_m.to(tl.int64)[:, None] * (2 * N) + offs_n[None, :]
        tl.store(pre_ptrs, acc.to(pre_ptr.dtype.element_ty), mask=keep)
        tl.store(pre_ptrs + N, acc2.to(pre_ptr.dtype.element_ty), mask=keep)
    if SWIGLU:
        acc = acc * tl.sigmoid(acc) * acc2
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=keep)


# The candidates, the pointer kernel's large tiles (the TMA pays on large tiles).
TMA_SPACE = [
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 256, 64, num_warps=8, num_stages=4),
    TileConfig(128, 256, 64, num_warps=8, num_stages=3, group_m=16),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    TileConfig(128, 128, 64, num_warps=4, num_stages=4),
    TileConfig(128, 128, 64, num_warps=4, num_stages=5),
    TileConfig(64, 128, 64, num_warps=4, num_stages=5),
]


def _default(space, dtype, b_tiles=1):   # for 2-byte types (fp32: 2 stages); SwiGLU: 2 B tiles
    fits = [c for c in space if dtype.itemsize == 2 and replace(
        c, block_n=b_tiles * c.block_n).fits(gpu_in_use()[0], dtype)[0]]
    return CPU_CONFIG if runtime.is_cpu() else (fits or [replace(space[-1], num_stages=2)])[0]


def _transposed(w: torch.Tensor) -> bool:
    """Whether each expert's ``(K, N)`` matrix is a transposed view (N the slow axis)."""
    return w.stride(1) == 1 and w.stride(2) != 1


def usable(a: torch.Tensor, w: torch.Tensor) -> str | None:
    """``None`` where the TMA can read ``a`` ``(R, K)`` and ``w`` ``(E, K, N)`` as they
    are; otherwise why not (the pointer kernel takes any strides)."""
    size = a.element_size()
    if a.stride(1) != 1 or (a.stride(0) * size) % 16 or a.data_ptr() % 16:
        return "A's rows are not contiguous and 16-byte aligned"
    E, K, N = w.shape
    if _transposed(w):
        ok = w.stride(2) == K and w.stride(0) == N * K
        row = K
    else:
        ok = w.stride(2) == 1 and w.stride(1) == N and w.stride(0) == K * N
        row = N
    if not ok:
        return "the experts' weights are not one (E, K, N) tensor or its transposed view"
    if (row * size) % 16 or w.data_ptr() % 16:
        return "the weights' rows are not whole 16-byte pieces"
    return None


def grouped_matmul_tma(a: torch.Tensor, counts: torch.Tensor, w: torch.Tensor,
                       config: TileConfig | None = None, num_sms: int | None = None):
    """:func:`~helpers.kernels.moe.grouped.grouped_matmul` through the TMA: ``a[r] @ w[e]``
    for each expert's rows of the sorted ``a`` ``(R, K)``; ``w`` is ``(E, K, N)`` (or its
    transposed view); returns ``(R, N)``. ``config`` defaults to the first that fits of
    :data:`TMA_SPACE` (the interpreter's small tile in CPU mode)."""
    why = usable(a, w)
    if why is not None:
        raise ValueError(f"grouped_matmul_tma: {why}; use grouped_matmul (cp.async) instead")
    R, (E, K, N) = a.shape[0], w.shape
    c = torch.empty((R, N), device=a.device, dtype=a.dtype)
    if R == 0:
        return c
    config = TileConfig.of(config or _default(TMA_SPACE, a.dtype))
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    a_desc = TensorDescriptor(a, [R, K], [a.stride(0), 1], [bm, bk])
    b_t = _transposed(w)
    if b_t:      # the (E N, K) matrix underneath, a box of BLOCK_N x BLOCK_K
        b_desc = TensorDescriptor(w, [E * N, K], [K, 1], [bn, bk])
    else:
        b_desc = TensorDescriptor(w, [E * K, N], [N, 1], [bk, bn])
    if num_sms is None:
        num_sms = 4 if runtime.is_cpu() else _sm_count(a.device.index)
    tiles = min(R, R // bm + E) * triton.cdiv(N, bn)
    grouped_gemm_tma_kernel[(min(num_sms, tiles),)](
        a_desc, b_desc, c, counts, R, N, K, E, c.stride(0),
        E_POW2=triton.next_power_of_2(E), B_T=b_t, NUM_SMS=num_sms, **config.as_dict(KEYS))
    return c


WEIGHT_GRAD_TMA_SPACE = [
    TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 64, num_warps=4, num_stages=4),
    TileConfig(128, 128, 32, num_warps=4, num_stages=5),
]


def rows_usable(*ts: torch.Tensor) -> str | None:
    """``None`` where the TMA can read each ``(R, *)`` matrix as it is; otherwise why not."""
    for t in ts:
        if t.dim() != 2 or t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 \
                or t.data_ptr() % 16:
            return "a matrix's rows are not contiguous whole 16-byte pieces"
    return None


def grouped_weight_grad_tma(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor,
                            experts: int, config: TileConfig | None = None):
    """:func:`~helpers.kernels.moe.backward.grouped_weight_grad` through the TMA: ``C[e] =
    A_e^T @ B_e`` over expert ``e``'s sorted rows of ``a`` ``(R, M)`` and ``b`` ``(R, N)``;
    returns ``(E, M, N)`` in ``a``'s dtype, zeros for an expert with no rows."""
    why = rows_usable(a, b)
    if why is not None:
        raise ValueError(f"grouped_weight_grad_tma: {why}; use grouped_weight_grad instead")
    (R, M), N = a.shape, b.shape[1]
    if b.shape[0] != R:
        raise ValueError(f"a and b must have one row per sorted copy; got {R} and {b.shape[0]}")
    c = torch.empty((experts, M, N), device=a.device, dtype=a.dtype)
    config = TileConfig.of(config or _default(WEIGHT_GRAD_TMA_SPACE, a.dtype))
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    a_desc = TensorDescriptor(a, [R, M], [a.stride(0), 1], [bk, bm])
    b_desc = TensorDescriptor(b, [R, N], [b.stride(0), 1], [bk, bn])
    grid = (experts * triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    weight_grad_tma_kernel[grid](a_desc, b_desc, c, offsets, M, N, experts, c.stride(0),
                                 c.stride(1), **config.as_dict(KEYS))
    return c


GATHER_TMA_SPACE = [
    TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    TileConfig(128, 128, 64, num_warps=8, num_stages=3, group_m=16),
    TileConfig(128, 128, 64, num_warps=4, num_stages=4),
]
SWIGLU_TMA_SPACE = [
    TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    TileConfig(128, 128, 64, num_warps=8, num_stages=3, group_m=16),
    TileConfig(128, 64, 64, num_warps=4, num_stages=4),
]


def grouped_gather_tma(x: torch.Tensor, rows: torch.Tensor, counts: torch.Tensor,
                       w: torch.Tensor, config: TileConfig | None = None, *,
                       swiglu: bool = False, pre: torch.Tensor | None = None):
    """``x[rows[r]] @ w[e]`` for each expert's sorted rows, the weights through the TMA:
    :func:`~helpers.kernels.moe.grouped.grouped_gather_matmul` (``w`` ``(E, K, N)`` or its
    transposed view) or, with ``swiglu``, the training layer's fused
    :func:`~helpers.kernels.moe.grouped.grouped_swiglu` on ``w`` = ``gate_up`` ``(E, K,
    2N)`` (contiguous), returning ``silu(x @ gate) * (x @ up)`` ``(R, N)`` and storing both
    projections in ``pre`` ``(R, 2N)`` if given."""
    if x.stride(1) != 1:
        raise ValueError("grouped_gather_tma: x's rows must be contiguous")
    E, K, N = w.shape
    if swiglu:
        N //= 2
        if not w.is_contiguous() or N * 2 != w.shape[2]:
            raise ValueError("grouped_gather_tma(swiglu=True) takes gate_up (E, K, 2N), "
                             "contiguous; use grouped_swiglu otherwise")
        b_t = False
    else:
        why = usable(x, w)
        if why is not None:
            raise ValueError(f"grouped_gather_tma: {why}; use grouped_gather_matmul instead")
        b_t = _transposed(w)
    if (w.shape[2] if not b_t else K) * w.element_size() % 16:
        raise ValueError("grouped_gather_tma: the weights' rows are not whole 16-byte pieces")
    R = rows.numel()
    c = torch.empty((R, N), device=x.device, dtype=x.dtype)
    if R == 0:
        return c
    space = SWIGLU_TMA_SPACE if swiglu else GATHER_TMA_SPACE
    config = TileConfig.of(config or _default(space, x.dtype, 2 if swiglu else 1))
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    if b_t:
        b_desc = TensorDescriptor(w, [E * N, K], [K, 1], [bn, bk])
    else:
        b_desc = TensorDescriptor(w, [E * K, w.shape[2]], [w.shape[2], 1], [bk, bn])
    grid = (min(R, R // bm + E) * triton.cdiv(N, bn),)
    grouped_gather_tma_kernel[grid](
        x, rows, b_desc, c, pre if pre is not None else c, counts, R, N, K, E, x.stride(0),
        c.stride(0), E_POW2=triton.next_power_of_2(E), SWIGLU=swiglu,
        SAVE_PRE=pre is not None, B_T=b_t, EVEN_K=K % bk == 0, **config.as_dict(KEYS))
    return c


@functools.lru_cache(maxsize=None)
def _sm_count(index) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# --------------------------------------------------------------------------------------
# Which kernel runs: timed once per key, as an autotuner would.
# --------------------------------------------------------------------------------------

# (product, rows bucketed, shapes, transposed weights, dtype, device) -> ("tma", setting) or
# ("cp.async", None). On an H200 (bf16, tests/gpu/grouped_tma_bench.py) the TMA kernel ran
# 1.11-1.22x the cp.async one on the 8-expert down projection and input gradient, 1.09x at
# 128 experts; cp.async's small tiles may still win where experts get few rows.
_PLANS: dict = {}
# (key, setting) -> why a TMA setting was left out of a choice (too much shared memory for
# this GPU, a compile error, or an output that is not the cp.async kernel's on the same
# call): as an autotuner prunes a setting that fails, the choice goes on without it.
SKIPPED: dict = {}


def tma_supported(a: torch.Tensor, w: torch.Tensor | None = None) -> bool:
    """Whether this call could take a TMA kernel: a Hopper (or newer) GPU, compiled mode,
    and (given ``w``) operands the TMA reads as they are (:func:`usable`)."""
    return (a.is_cuda and not runtime.is_cpu()
            and torch.cuda.get_device_capability(a.device)[0] >= 9
            and (w is None or usable(a, w) is None))


def gather_supported(x: torch.Tensor, w: torch.Tensor, swiglu: bool = False) -> bool:
    """Whether :func:`grouped_gather_tma` takes this call: a TMA GPU, ``x``'s rows
    contiguous, and the weights as the TMA reads them (``gate_up`` contiguous for
    ``swiglu``)."""
    if not tma_supported(x) or x.stride(1) != 1:
        return False
    if swiglu:
        return w.is_contiguous() and (w.shape[2] * w.element_size()) % 16 == 0 \
            and w.data_ptr() % 16 == 0
    return usable(x, w) is None


def fused_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor | None:
    """``gate_up`` ``(E, K, 2N)`` when ``w_gate`` and ``w_up`` are its two halves (the
    training layer's :func:`~helpers.kernels.moe.training.split_gate_up` views), else
    ``None``."""
    E, K, N = w_gate.shape
    whole = (K * 2 * N, 2 * N, 1)
    if w_gate.stride() != whole or w_up.stride() != whole or w_up.shape != w_gate.shape \
            or w_up.data_ptr() != w_gate.data_ptr() + N * w_gate.element_size():
        return None
    return w_gate.as_strided((E, K, 2 * N), whole)


def _choose(key: tuple, pointer_kernel, tma_kernel, space) -> tuple:
    """The plan for ``key``: ``pointer_kernel()`` (the tuned cp.async launch) and
    ``tma_kernel(setting)`` for each setting of ``space``, each timed once (do_bench's
    median of a few runs) the first time the key is seen, the fastest kept. A TMA setting
    whose output is not the pointer kernel's (:func:`_disagreement`) is left out."""
    if key not in _PLANS:
        candidates = {("cp.async", None): pointer_kernel,
                      **{("tma", c): functools.partial(tma_kernel, c) for c in space}}
        reference = pointer_kernel()        # the tuned pointer kernel: it must run
        times = {}
        for plan, fn in candidates.items():
            if plan[0] == "cp.async":
                times[plan] = triton.testing.do_bench(fn, warmup=5, rep=20,
                                                      return_mode="median")
                continue
            try:
                why = _disagreement(fn(), reference)
                if why is None:
                    times[plan] = triton.testing.do_bench(fn, warmup=5, rep=20,
                                                          return_mode="median")
            except Exception as err:  # noqa: BLE001 - a setting that does not build is skipped
                why = f"{type(err).__name__}: {str(err)[:200]}"
            if why is not None:
                SKIPPED[(key, plan[1])] = why
        _PLANS[key] = min(times, key=times.get)
    return _PLANS[key]


def _disagreement(out: torch.Tensor, reference: torch.Tensor,
                  chunk: int = 1 << 24) -> str | None:
    """Why a TMA setting's output is not the pointer kernel's on the same call (the two
    sum in different orders and round to the same dtype: 2 % of the largest entry is far
    above that, and far below a tile read from the wrong rows). Compared a slice at a time,
    in fp32, so a weight gradient of gigabytes needs no full fp32 copy."""
    if out.shape != reference.shape:
        return f"its output has shape {tuple(out.shape)}, not {tuple(reference.shape)}"
    out, reference = out.reshape(-1), reference.reshape(-1)
    scale = diff = 0.0
    for i in range(0, reference.numel(), chunk):
        o, r = out[i:i + chunk].float(), reference[i:i + chunk].float()
        finite = torch.isfinite(r)
        if not torch.equal(torch.isfinite(o), finite):
            return "its output has NaN or inf where the cp.async kernel's has none (or not)"
        if finite.any():
            scale = max(scale, r[finite].abs().max().item())
            diff = max(diff, (o - r)[finite].abs().max().item())
    if diff > 0.02 * scale + 1e-6:
        return f"it differs from the cp.async kernel by {diff:.3g} (largest entry {scale:.3g})"
    return None


def _run(plan: tuple, pointer_kernel, tma_kernel):
    kind, config = plan
    return pointer_kernel() if kind == "cp.async" else tma_kernel(config)


def tuned_grouped_matmul(a, counts, w, pointer_kernel):
    """``a[r] @ w[e]`` by whichever of the TMA settings of :data:`TMA_SPACE` and
    ``pointer_kernel()`` ran fastest for this key (:func:`_choose`)."""
    if a.shape[0] == 0:
        return pointer_kernel()
    E, K, N = w.shape
    key = ("matmul", bucket(a.shape[0]), K, N, E, _transposed(w), a.dtype, a.device.index)

    def tma_kernel(config):
        return grouped_matmul_tma(a, counts, w, config)

    return _run(_choose(key, pointer_kernel, tma_kernel, TMA_SPACE), pointer_kernel,
                tma_kernel)


def tuned_gather(x, rows, counts, w, pointer_kernel, *, swiglu=False, pre=None):
    """:func:`grouped_gather_tma` or ``pointer_kernel()``, whichever ran fastest for this
    key: the gathering GEMM (``w`` ``(E, K, N)`` or its transposed view) or, with
    ``swiglu``, the fused SwiGLU on ``w`` = ``gate_up``."""
    if rows.numel() == 0:
        return pointer_kernel()
    E, K, N = w.shape
    key = ("swiglu" if swiglu else "gather", pre is not None, bucket(rows.numel()), K, N, E,
           _transposed(w), x.dtype, x.device.index)

    def tma_kernel(config):
        return grouped_gather_tma(x, rows, counts, w, config, swiglu=swiglu, pre=pre)

    space = SWIGLU_TMA_SPACE if swiglu else GATHER_TMA_SPACE
    return _run(_choose(key, pointer_kernel, tma_kernel, space), pointer_kernel, tma_kernel)


def tuned_weight_grad(a, b, offsets, experts: int, pointer_kernel):
    """:func:`grouped_weight_grad_tma` or ``pointer_kernel()``, whichever ran fastest for
    this key."""
    if a.shape[0] == 0:
        return pointer_kernel()
    key = ("weight grad", bucket(a.shape[0]), a.shape[1], b.shape[1], experts, a.dtype,
           a.device.index)

    def tma_kernel(config):
        return grouped_weight_grad_tma(a, b, offsets, experts, config)

    return _run(_choose(key, pointer_kernel, tma_kernel, WEIGHT_GRAD_TMA_SPACE),
                pointer_kernel, tma_kernel)


def chosen_plans() -> dict:
    """The kernel and setting each key ran with so far, and the TMA settings left out and
    why, for records."""
    plans = {str(k): (kind if config is None else f"{kind} {config.describe()}")
             for k, (kind, config) in _PLANS.items()}
    return {**plans, **{f"{k} {c.describe()}: skipped": why for (k, c), why in SKIPPED.items()}}

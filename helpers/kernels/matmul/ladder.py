"""The matmul ladder's kernels, side by side: from one dot product per program to TMA.

``C = A @ B`` with ``A`` ``M x K``, ``B`` ``K x N``. Each rung is one step closer to
reading each value of A and B from DRAM once (see :mod:`helpers.kernels.matmul` for the
lesson's overview, the launchers that check inputs and pick grids, and :func:`matmul`):

* ``_v1`` naive, on the CUDA cores; ``_v2`` tiled, ``tl.dot`` on the tensor cores;
* ``_v3`` the same tiles in a grouped ("swizzled") program order that shares strips of
  A and B through L2; ``_v4`` v3 autotuned per problem shape;
* ``_v5`` TMA copies and a persistent grid (Hopper and newer).

The versions repeat each other's tile loop on purpose: each reads on its own, and the
differences between neighbours are the lesson.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import TileConfig

# --------------------------------------------------------------------------------------
# v1: naive. One program per strip of BLOCK_N elements of one row of C.
# --------------------------------------------------------------------------------------


@triton.jit
def matmul_kernel_v1(a_ptr, b_ptr, c_ptr, M, N, K,
                     stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(axis=0)                    # which BLOCK_N columns of C
    m = tl.program_id(axis=1)                        # which row of C
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)     # BLOCK_N dot products, in registers
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        # BLOCK_K values of row m of A, and the BLOCK_K x BLOCK_N block of B below them.
        # Every value of B is used for one multiply-add and thrown away: the program of
        # row m + 1 loads the very same block of B again. M programs, M reads of B.
        a = tl.load(a_ptr + m * stride_am + offs_k * stride_ak, mask=offs_k < K, other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        # Plain multiply-adds on the CUDA cores, summed down the K axis: no tensor cores.
        acc += tl.sum(a.to(tl.float32)[:, None] * b.to(tl.float32), axis=0)
    tl.store(c_ptr + m * stride_cm + offs_n * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=offs_n < N)


# --------------------------------------------------------------------------------------
# v2: tiled. One program per BLOCK_M x BLOCK_N tile of C, tl.dot on the tensor cores.
# --------------------------------------------------------------------------------------


@triton.jit
def matmul_kernel_v2(a_ptr, b_ptr, c_ptr, M, N, K,
                     stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PRECISION: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n                         # row-major order: program 0, 1, 2 ...
    pid_n = pid % num_pid_n                          # walk along the first row of tiles
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Pointers to the first A tile (BLOCK_M x BLOCK_K) and B tile (BLOCK_K x BLOCK_N).
    # Strides, not shapes, say where element (i, j) lives: a transposed or sliced view
    # works as it is, with no copy.
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    # The accumulator: BLOCK_M x BLOCK_N fp32 values spread over the program's registers.
    # fp16 could not hold a sum of thousands of products without losing digits.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # Rows past M, columns past N and the K tail read as zeros: a zero adds nothing
        # to a dot product, so the edge tiles need no special case.
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        # 2 BLOCK_M BLOCK_N BLOCK_K FLOPs on the tensor cores for (BLOCK_M + BLOCK_N)
        # BLOCK_K loaded values: each A value is used BLOCK_N times, each B value BLOCK_M.
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak                # slide both tiles along K
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),  # one rounding, at the very end
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# --------------------------------------------------------------------------------------
# v3: grouped program order. The same tile loop; programs visit tiles in groups.
# --------------------------------------------------------------------------------------


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile (pid_m, pid_n) of program ``pid``: down GROUP_M rows, then the next column.

    The GPU starts programs roughly in the order of their ids. Row-major order (v2) puts
    whole rows of tiles on the chip at once: a few strips of A, but *every* strip of B,
    which for a large B is more than the L2 cache holds, so B streams from DRAM again for
    the next rows. Going down a column of GROUP_M tiles first keeps GROUP_M strips of A and
    a few strips of B busy at a time: a smaller footprint, so more of it is still in L2
    when it is reused.
    """
    num_pid_in_group = GROUP_M * num_pid_n            # programs per band of GROUP_M rows
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)  # the last band may be shorter
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def matmul_kernel_v3(a_ptr, b_ptr, c_ptr, M, N, K,
                     stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    # The only change from v2: which tile this program owns.
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), tl.cdiv(M, BLOCK_M),
                                tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # With num_stages = S the compiler turns this loop into a pipeline: the loads of the
    # next S - 1 steps are in flight (asynchronous copies into S SRAM buffers) while the
    # tensor cores work on this one.
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k0) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# Masks, not index wrapping: an earlier v3 replaced the M/N masks by wrapping the
# out-of-range rows to row 0 (tl.where(offs < N, offs, 0)), as some tutorials do. Without
# extra hints the compiler then no longer knew that the BLOCK_N columns of a B tile are
# contiguous, loaded B one element at a time, and fell from 384 to 38 TFLOP/s (fp16,
# 4096^3, NVIDIA H200, Triton 3.6, measured while this lesson was written). A mask keeps
# the addresses as they are.


# --------------------------------------------------------------------------------------
# v4: v3 autotuned. The configurations the GPU autotuner chooses from.
# --------------------------------------------------------------------------------------

# Large tiles for large problems (more reuse per load), smaller ones so small problems
# still fill the 100+ SMs of a big GPU; GROUP_M = 8 throughout. 128 x 256 x 64 with 3
# stages needs 144 KiB of SRAM (TileConfig.shared_memory_bytes), which fits Hopper's
# 227 KiB per program but not the 99 KiB of an Ada GPU; the autotuner skips configurations
# that do not fit.
CONFIGS = (
    TileConfig(128, 256, 64, num_stages=3, num_warps=8),
    TileConfig(128, 256, 64, num_stages=4, num_warps=8),
    TileConfig(256, 128, 64, num_stages=3, num_warps=8),
    TileConfig(128, 128, 64, num_stages=4, num_warps=8),
    TileConfig(128, 128, 64, num_stages=3, num_warps=4),
    TileConfig(128, 64, 64, num_stages=4, num_warps=4),
    TileConfig(64, 128, 64, num_stages=4, num_warps=4),
    TileConfig(64, 64, 64, num_stages=4, num_warps=4),
)
# How lesson 04's records name a setting of v3 and v4 (try_configs' rows, the records).
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")


def _autotune_configs(configs=CONFIGS):
    return [c.triton_config() for c in configs]


# Keyed on the problem shape and the layout of B: one search per distinct problem, then
# a dictionary lookup on every later call. (The autotuner adds the dtypes to the key.)
matmul_kernel_v4 = triton.autotune(configs=_autotune_configs(),
                                   key=["M", "N", "K", "stride_ak", "stride_bk"])(
    matmul_kernel_v3)


# --------------------------------------------------------------------------------------
# v5: TMA and a persistent grid (Hopper and newer).
# --------------------------------------------------------------------------------------


@triton.jit
def matmul_kernel_v5(a_desc, b_desc, c_desc, M, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                     EPILOGUE_SPLIT: tl.constexpr):
    # a_desc, b_desc, c_desc are TMA descriptors: a 128-byte record of a matrix's base
    # address, shape, strides and tile shape. desc.load([row, col]) asks the TMA unit to
    # copy one whole tile into SRAM; rows and columns past the edge arrive as zeros and
    # stores past the edge are dropped, by the hardware, so no masks appear here.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    # Persistent: as many programs as the GPU runs at once. Each walks the tiles
    # pid, pid + NUM_PROGRAMS, ... so the launch cost is paid once, and the next tile's
    # loads start while this tile's result is still being written (flatten=True lets the
    # compiler pipeline across the tile boundary).
    for tile in tl.range(tl.program_id(axis=0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([off_m, k0])
            b = b_desc.load([k0, off_n])
            acc = tl.dot(a, b, acc)
        if EPILOGUE_SPLIT:
            # Store the tile as two halves: the SRAM staging buffer of the store shrinks
            # by half, which leaves room for one more pipeline stage of A and B.
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)),
                                              (0, 2, 1)))
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
        else:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


# The 128 x 256 x 64 tile with 8 warps wins on Hopper at 4096^3 and 8192^3 (the `matmul`
# record's sweep); the others are there for other shapes and GPUs. Splitting the epilogue
# (the EPILOGUE_SPLIT option) frees the room of a fourth stage: 128 x 256 x 64 with 4
# stages and a whole-tile store needs 262,176 bytes of shared memory, over the 232,448 a
# program may have on an H100 or H200.
_HALVES, _WHOLE = {"EPILOGUE_SPLIT": True}, {"EPILOGUE_SPLIT": False}
TMA_CONFIGS = (
    TileConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8, options=_HALVES),
    TileConfig(128, 256, 64, group_m=16, num_stages=3, num_warps=8, options=_HALVES),
    TileConfig(128, 256, 64, group_m=8, num_stages=4, num_warps=8, options=_HALVES),
    TileConfig(128, 256, 64, group_m=16, num_stages=4, num_warps=8, options=_HALVES),
    TileConfig(128, 256, 64, group_m=8, num_stages=3, num_warps=8, options=_WHOLE),
    TileConfig(128, 128, 64, group_m=8, num_stages=4, num_warps=4, options=_WHOLE),
)
TMA_CONFIG_KEYS = CONFIG_KEYS + ("EPILOGUE_SPLIT",)
TMA_DTYPES = (torch.float16, torch.bfloat16)


def _v5_hook(nargs):
    # Tile shapes live in the descriptors, so each configuration re-shapes them.
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn // 2 if nargs["EPILOGUE_SPLIT"] else bn]


def _v5_tuner():
    return triton.autotune(
        configs=[c.triton_config(pre_hook=_v5_hook) for c in TMA_CONFIGS],
        key=["M", "N", "K"])(matmul_kernel_v5)


# One autotuner per dtype: an autotuner adds the dtypes of its *tensor* arguments to its
# key, and descriptors are not tensors, so a single one would tune fp16 and reuse the
# choice for bf16.
matmul_kernel_v5_tuned = {dtype: _v5_tuner() for dtype in TMA_DTYPES}

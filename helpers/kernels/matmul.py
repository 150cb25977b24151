"""Matrix multiplication, ``C = A @ B``: from one dot product per program to tensor cores.

``A`` is ``M x K``, ``B`` is ``K x N``, ``C`` is ``M x N``. Each of the ``M N`` outputs is a
dot product of length ``K``: ``2 M N K`` FLOPs in all (one multiply-add is two FLOPs).
The three matrices hold only ``M K + K N + M N`` values, so a matmul *could* do about
``2n/3`` FLOPs per value it loads for square ``n x n`` matrices: thousands for n = 4096,
far right of any GPU's ridge point. Whether a kernel gets there depends on one thing:
how many times it re-reads each value from DRAM. The versions below are the course's
ladder, each one step closer to reading each value once:

* ``_v1`` naive: one program per strip of a row of C, dot products on the CUDA cores.
  Each value of B it loads serves one multiply-add, and every row's program loads all
  of B again: B is read ``M`` times over.
* ``_v2`` tiled: one program per ``BLOCK_M x BLOCK_N`` tile of C. It walks the K axis in
  steps of ``BLOCK_K``, loads an A tile and a B tile into SRAM (shared memory) and hands
  them to ``tl.dot``, which runs on the tensor cores. A value loaded once is used
  ``BLOCK_N`` (A) or ``BLOCK_M`` (B) times.
* ``_v3`` grouped: the same tiles, run in a different *order* ("swizzled"), so that the
  programs on the GPU at the same time share their A and B strips through the L2 cache.
  Its launch knobs ``num_stages`` (software pipelining: load the next tiles while the
  tensor cores chew on this one) and ``num_warps`` (threads per program) are the next
  rungs of the ladder; they change how the compiler schedules the same kernel.
* ``_v4`` tuned: ``_v3``'s kernel with its configuration picked per problem shape by
  ``@triton.autotune`` on a GPU (tile sizes, group size, stages, warps).
* ``_v5`` TMA: Hopper's Tensor Memory Accelerator copies whole tiles from DRAM into SRAM
  by itself, so the warps issue no address arithmetic and no loads at all, and one
  program per SM (*persistent*) walks many tiles. The best the course has on a Hopper GPU.

Then the launchers (input checks, grid, dispatch) and the napkin math: ``flops``,
``bytes_moved`` (compulsory, or as a tiled kernel without cache reuse would move them),
``tile_intensity`` and ``sram_bytes`` (what one program needs on chip).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .. import runtime
from .checks import check_tensor

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The spec: ``a @ b`` computed in fp32, rounded once to the inputs' dtype.

    fp32 accumulation is the course's contract for every kernel below, so the reference
    accumulates in fp32 too (PyTorch does on its own for fp16/bf16 on the GPU, but not
    always on the CPU). fp32 inputs are multiplied in true fp32 here: see ``precision``.
    """
    return torch.matmul(a.float(), b.float()).to(a.dtype)


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

# Each entry: BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps. Large tiles for
# large problems (more reuse per load), smaller ones so small problems still fill the
# 100+ SMs of a big GPU. 128 x 256 x 64 with 3 stages needs 144 KiB of SRAM (see
# sram_bytes), which fits Hopper's 227 KiB per program but not the 99 KiB of an Ada GPU;
# the autotuner skips configurations that do not fit.
CONFIGS = (
    (128, 256, 64, 8, 3, 8),
    (128, 256, 64, 8, 4, 8),
    (256, 128, 64, 8, 3, 8),
    (128, 128, 64, 8, 4, 8),
    (128, 128, 64, 8, 3, 4),
    (128, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4),
    (64, 64, 64, 8, 4, 4),
)
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")


def config_dict(config) -> dict:
    return dict(zip(CONFIG_KEYS, config))


def _autotune_configs(configs=CONFIGS):
    return [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g),
                          num_stages=s, num_warps=w) for bm, bn, bk, g, s, w in configs]


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


# Each entry: BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps, EPILOGUE_SPLIT.
# The 128 x 256 x 64 tile with 8 warps wins on Hopper at 4096^3 and 8192^3 (the
# `matmul` record's sweep); the others are there for other shapes and GPUs. Splitting
# the epilogue frees the room of a fourth stage: 128 x 256 x 64 with 4 stages and a
# whole-tile store needs 262,176 bytes of shared memory, over the 232,448 a program may
# have on an H100 or H200.
TMA_CONFIGS = (
    (128, 256, 64, 8, 3, 8, True),
    (128, 256, 64, 16, 3, 8, True),
    (128, 256, 64, 8, 4, 8, True),
    (128, 256, 64, 16, 4, 8, True),
    (128, 256, 64, 8, 3, 8, False),
    (128, 128, 64, 8, 4, 4, False),
)
TMA_CONFIG_KEYS = CONFIG_KEYS + ("EPILOGUE_SPLIT",)
TMA_DTYPES = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------------------
# Launchers.
# --------------------------------------------------------------------------------------

PRECISIONS = ("tf32", "ieee")


def _check_inputs(a: torch.Tensor, b: torch.Tensor, *, dot: bool) -> None:
    # Views are welcome: the kernels take strides, so a.t() or a[:, ::2] need no copy.
    check_tensor(a, "a", dtypes=FLOAT_DTYPES, ndim=2, contiguous=False)
    check_tensor(b, "b", dtypes=FLOAT_DTYPES, ndim=2, contiguous=False)
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} and b is {b.dtype}: convert one so both match "
                        "(these kernels do not mix precisions)")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply {tuple(a.shape)} by {tuple(b.shape)}: the inner "
                         f"sizes differ ({a.shape[1]} != {b.shape[0]}); A is M x K, B is K x N")
    if dot:
        runtime.check_dot_dtype(a.dtype)


def _check_block(**blocks: int) -> None:
    for name, value in blocks.items():
        if not isinstance(value, int) or value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two of at least 16 (tl.arange "
                             f"needs a power of two, tl.dot at least 16), got {value!r}")


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def _output(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype)


def _empty(a, b, c) -> bool:
    """Nothing to launch: C has no elements, or K = 0 (C is then all zeros)."""
    if c.numel() == 0:
        return True
    if a.shape[1] == 0:
        c.zero_()
        return True
    return False


def _strides(a, b, c) -> tuple:
    return (*a.stride(), *b.stride(), *c.stride())


def matmul_v1(a: torch.Tensor, b: torch.Tensor, *, block_n: int = 64,
              block_k: int = 32) -> torch.Tensor:
    """Naive: program (j, m) computes ``C[m, j*block_n : (j+1)*block_n]`` on the CUDA cores."""
    _check_inputs(a, b, dot=False)
    for name, value in (("block_n", block_n), ("block_k", block_k)):
        if not isinstance(value, int) or value <= 0 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two (tl.arange needs one), got {value!r}")
    M, K = a.shape
    N = b.shape[1]
    c = _output(a, b)
    if _empty(a, b, c):
        return c
    if M > 65535:
        raise ValueError(f"M = {M}: the naive kernel puts rows on grid axis 1, which holds "
                         "at most 65535 programs")
    grid = (triton.cdiv(N, block_n), M)
    matmul_kernel_v1[grid](a, b, c, M, N, K, *_strides(a, b, c), BLOCK_N=block_n,
                           BLOCK_K=block_k)
    return c


def matmul_v2(a: torch.Tensor, b: torch.Tensor, *, block_m: int = 128, block_n: int = 128,
              block_k: int = 64, num_warps: int = 4, num_stages: int = 1,
              precision: str = "tf32") -> torch.Tensor:
    """Tiled with ``tl.dot``, tiles in row-major order, no pipelining (``num_stages=1``).

    ``precision`` matters for fp32 inputs only: ``"tf32"`` (the default of ``tl.dot``)
    rounds each input to 10 mantissa bits on the tensor cores; ``"ieee"`` multiplies in
    true fp32 on the CUDA cores, several times slower. The interpreter always computes in
    fp32, so the difference shows on a GPU only.
    """
    _check_inputs(a, b, dot=True)
    _check_block(block_m=block_m, block_n=block_n, block_k=block_k)
    _check_precision(precision)
    M, K = a.shape
    N = b.shape[1]
    c = _output(a, b)
    if _empty(a, b, c):
        return c
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    matmul_kernel_v2[grid](a, b, c, M, N, K, *_strides(a, b, c), BLOCK_M=block_m,
                           BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision,
                           num_warps=num_warps, num_stages=num_stages)
    return c


def matmul_v3(a: torch.Tensor, b: torch.Tensor, *, block_m: int = 128, block_n: int = 128,
              block_k: int = 64, group_m: int = 8, num_warps: int = 4, num_stages: int = 1,
              precision: str = "tf32") -> torch.Tensor:
    """Tiled, grouped program order; every launch knob exposed (the ladder turns them)."""
    _check_inputs(a, b, dot=True)
    _check_block(block_m=block_m, block_n=block_n, block_k=block_k)
    _check_precision(precision)
    if not isinstance(group_m, int) or group_m < 1:
        raise ValueError(f"group_m must be a positive whole number, got {group_m!r}")
    M, K = a.shape
    N = b.shape[1]
    c = _output(a, b)
    if _empty(a, b, c):
        return c
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    matmul_kernel_v3[grid](a, b, c, M, N, K, *_strides(a, b, c), BLOCK_M=block_m,
                           BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
                           PRECISION=precision, num_warps=num_warps, num_stages=num_stages)
    return c


# What v4 runs in CPU mode, where there is no autotuning: a middle-sized configuration.
CPU_CONFIG = (64, 64, 32, 4, 1, 4)


def matmul_v4(a: torch.Tensor, b: torch.Tensor, *, precision: str = "tf32") -> torch.Tensor:
    """v3 with the configuration chosen by ``@triton.autotune`` for this shape (GPU mode).

    The first call for a new (M, N, K, layout, dtype) times every configuration in
    :data:`CONFIGS` (a few seconds) and keeps the fastest. The interpreter cannot time
    anything, so CPU mode runs :data:`CPU_CONFIG`; :func:`try_configs` checks that every
    configuration computes the right answer.
    """
    if runtime.is_cpu():
        bm, bn, bk, g, s, w = CPU_CONFIG
        return matmul_v3(a, b, block_m=bm, block_n=bn, block_k=bk, group_m=g, num_stages=s,
                         num_warps=w, precision=precision)
    _check_inputs(a, b, dot=True)
    _check_precision(precision)
    M, K = a.shape
    N = b.shape[1]
    c = _output(a, b)
    if _empty(a, b, c):
        return c

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    matmul_kernel_v4[grid](a, b, c, M, N, K, *_strides(a, b, c), PRECISION=precision)
    return c


def tma_compatible(*tensors: torch.Tensor) -> str | None:
    """Why the TMA unit cannot read these matrices, or ``None`` if it can.

    A TMA descriptor needs a row-major layout (last stride 1), a 16-byte aligned base and
    a row stride that is a multiple of 16 bytes: an fp16 matrix with 45 columns is out.
    """
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1:
            return "a matrix is not row-major (its last stride is not 1)"
        if t.data_ptr() % 16:
            return "a matrix does not start on a 16-byte boundary"
        if (t.stride(0) * size) % 16:
            return (f"a row is {t.stride(0) * size} bytes apart from the next, not a "
                    "multiple of 16")
    return None


@functools.lru_cache(maxsize=None)
def _num_sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@functools.lru_cache(maxsize=None)
def _major_capability() -> int:
    # Asked once: a small product takes microseconds, so the launcher's host work counts.
    return torch.cuda.get_device_capability()[0]


def _tma_descriptors(a, b, c, bm, bn, bk, split):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(a, [bm, bk]),
            TensorDescriptor.from_tensor(b, [bk, bn]),
            TensorDescriptor.from_tensor(c, [bm, bn // 2 if split else bn]))


def _v5_hook(nargs):
    # Tile shapes live in the descriptors, so each configuration re-shapes them.
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn // 2 if nargs["EPILOGUE_SPLIT"] else bn]


def _v5_tuner():
    return triton.autotune(
        configs=[triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g,
                                    EPILOGUE_SPLIT=sp),
                               num_stages=s, num_warps=w, pre_hook=_v5_hook)
                 for bm, bn, bk, g, s, w, sp in TMA_CONFIGS],
        key=["M", "N", "K"])(matmul_kernel_v5)


# One autotuner per dtype: an autotuner adds the dtypes of its *tensor* arguments to its
# key, and descriptors are not tensors, so a single one would tune fp16 and reuse the
# choice for bf16.
matmul_kernel_v5_tuned = {dtype: _v5_tuner() for dtype in TMA_DTYPES}


def matmul_v5(a: torch.Tensor, b: torch.Tensor, *, config=None) -> torch.Tensor:
    """TMA loads, persistent grid, autotuned (GPU mode, compute capability 9.0 or newer).

    ``config`` (a tuple as in :data:`TMA_CONFIGS`) runs one configuration instead of
    autotuning. In CPU mode the interpreter emulates the descriptors (one configuration,
    a grid of one program per tile); the layout rules of :func:`tma_compatible` apply in
    both modes.
    """
    _check_inputs(a, b, dot=True)
    if a.dtype not in TMA_DTYPES:
        raise TypeError(f"matmul_v5 takes fp16 or bf16, got {a.dtype}: fp32 (TF32) tensor "
                        "cores want both operands K-contiguous, which this kernel does not "
                        "arrange. Use matmul_v4 for fp32.")
    why = tma_compatible(a, b)
    if why:
        raise ValueError(f"matmul_v5 reads through TMA descriptors, but {why}. Use "
                         "matmul_v4, or matmul(), which picks a version that fits.")
    M, K = a.shape
    N = b.shape[1]
    c = _output(a, b)
    if _empty(a, b, c):
        return c
    if config is not None and len(config) != len(TMA_CONFIG_KEYS):
        raise ValueError(f"config must give {len(TMA_CONFIG_KEYS)} values, "
                         f"{', '.join(TMA_CONFIG_KEYS)}; got {tuple(config)!r}")
    if runtime.is_cpu() or config is not None:
        bm, bn, bk, g, s, w, sp = config or (64, 64, 32, 4, 1, 4, False)
        _check_block(block_m=bm, block_n=bn, block_k=bk)
        descs = _tma_descriptors(a, b, c, bm, bn, bk, sp)
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        programs = tiles if runtime.is_cpu() else min(tiles, _num_sms())
        matmul_kernel_v5[(programs,)](*descs, M, N, K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                      GROUP_M=g, NUM_PROGRAMS=programs, EPILOGUE_SPLIT=sp,
                                      num_stages=s, num_warps=w)
        return c
    descs = _tma_descriptors(a, b, c, 128, 128, 64, False)  # re-shaped by _v5_hook
    sms = _num_sms()

    def grid(meta):
        return (min(sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)

    matmul_kernel_v5_tuned[a.dtype][grid](*descs, M, N, K, NUM_PROGRAMS=sms)
    return c


VERSIONS = {"v1": matmul_v1, "v2": matmul_v2, "v3": matmul_v3, "v4": matmul_v4,
            "v5": matmul_v5}


# Below this much work (M N K) v4 beats v5: the host encodes three TMA descriptors per
# call (microseconds each) and a persistent grid gains nothing when there is about one
# tile per SM. In the `matmul` records (ladder rows of v4 and v5, fp16 and bf16 alike) v4
# is far ahead at 1024^3 and v5 ahead at 4096^3; at 2048^3 they tie within 2 % on the
# H100 and v4 leads on the H200. The line sits between 2048^3 and 4096^3.
TMA_MIN_WORK = 2**35


def best_version(a: torch.Tensor, b: torch.Tensor) -> str:
    """The fastest version for these inputs here: v5 for large 16-bit products on a
    Hopper (or newer) GPU when the TMA can read the matrices, else v4."""
    M, K = a.shape
    N = b.shape[1]
    if runtime.is_gpu() and _major_capability() >= 9 \
            and a.dtype in TMA_DTYPES and M * N * K >= TMA_MIN_WORK \
            and tma_compatible(a, b) is None:
        return "v5"
    return "v4"


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` by the course's best kernel for these inputs (:func:`best_version`)."""
    return VERSIONS[best_version(a, b)](a, b)


def try_configs(a: torch.Tensor, b: torch.Tensor, configs=CONFIGS) -> list[dict]:
    """Run v3 once with every configuration; report whether each is right. Times nothing.

    This is the autotuner's search without the stopwatch: it works in CPU mode too, where
    the question "which is fastest?" has no answer and the recorded GPU sweep gives it.
    """
    want = matmul_reference(a, b).float()
    out = []
    for config in configs:
        bm, bn, bk, g, s, w = config
        got = matmul_v3(a, b, block_m=bm, block_n=bn, block_k=bk, group_m=g, num_stages=s,
                        num_warps=w).float()
        err = (got - want).abs().max().item()
        out.append({**config_dict(config), "max_abs_error": err})
    return out


# --------------------------------------------------------------------------------------
# Judging a result: errors in units of the output's last place.
# --------------------------------------------------------------------------------------

MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}


def ulp(x: torch.Tensor, dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s numbers at ``x``: one unit in the last place."""
    tiny = torch.finfo(dtype).tiny                  # below it the spacing stays constant
    x = x.double().abs().clamp_min(tiny)
    return torch.exp2(torch.floor(torch.log2(x)) - MANTISSA_BITS[dtype])


def ulp_error(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``|got - exact|`` in units of the last place of ``got``'s dtype, element by element.

    A kernel that accumulates in fp32 and rounds once at the end is within half a unit
    of the exact product (plus a sliver of fp32 rounding). One that keeps its running sum
    in fp16 rounds at every K step and drifts by several units on long dot products.
    """
    return (got.double() - exact.double()).abs() / ulp(exact, got.dtype)


# --------------------------------------------------------------------------------------
# The program order, in plain Python (the same arithmetic as grouped_tile).
# --------------------------------------------------------------------------------------


def tile_of_program(pid: int, num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """(pid_m, pid_n) of program ``pid``; ``group_m = 1`` is v2's row-major order."""
    if group_m < 1:
        raise ValueError(f"group_m must be at least 1 (1 is row-major order), got {group_m}")
    num_pid_in_group = group_m * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * group_m
    group_size_m = min(num_pid_m - first_pid_m, group_m)
    return (first_pid_m + (pid % num_pid_in_group) % group_size_m,
            (pid % num_pid_in_group) // group_size_m)


def program_order(num_pid_m: int, num_pid_n: int, group_m: int) -> list[list[int]]:
    """``order[i][j]``: the id of the program that computes tile (i, j) of C."""
    order = [[-1] * num_pid_n for _ in range(num_pid_m)]
    for pid in range(num_pid_m * num_pid_n):
        i, j = tile_of_program(pid, num_pid_m, num_pid_n, group_m)
        order[i][j] = pid
    return order


def wave_footprint(M: int, N: int, K: int, dtype, block_m: int, block_n: int,
                   group_m: int, programs: int) -> dict:
    """What the first ``programs`` programs (one wave on the GPU) read between them.

    They touch some strips of A (``block_m`` rows by K) and some strips of B (K by
    ``block_n``). The fewer distinct strips, the more loads hit in L2. Returns the number
    of A and B strips and their bytes.
    """
    num_pid_m, num_pid_n = math.ceil(M / block_m), math.ceil(N / block_n)
    tiles = [tile_of_program(p, num_pid_m, num_pid_n, group_m)
             for p in range(min(programs, num_pid_m * num_pid_n))]
    rows = {i for i, _ in tiles}
    cols = {j for _, j in tiles}
    s = element_size(dtype)
    nbytes = (len(rows) * block_m * K + len(cols) * block_n * K) * s
    return {"tiles": len(tiles), "a_strips": len(rows), "b_strips": len(cols), "bytes": nbytes}


# --------------------------------------------------------------------------------------
# Napkin math.
# --------------------------------------------------------------------------------------


DTYPE_NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def element_size(dtype) -> int:
    """Bytes per value of ``dtype``: a torch dtype or one of ``"fp16"``, ``"bf16"``, ``"fp32"``."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(DTYPE_NAMES)} "
                             "or a torch dtype such as torch.float16")
        dtype = DTYPE_NAMES[dtype]
    return torch.empty((), dtype=dtype).element_size()


def flops(M: int, N: int, K: int) -> int:
    """``M N`` dot products of length ``K``: ``K`` multiply-adds each, two FLOPs apiece."""
    return 2 * M * N * K


def bytes_moved(M: int, N: int, K: int, dtype, block_m: int | None = None,
                block_n: int | None = None) -> int:
    """DRAM bytes of ``C = A @ B``.

    With no block sizes: the compulsory traffic, each matrix once (read A, read B,
    write C); what an ideal kernel with perfect cache reuse moves.

    With block sizes: a kernel whose programs own ``block_m x block_n`` tiles of C and
    find nothing in any cache. Each program reads a ``block_m x K`` strip of A and a
    ``K x block_n`` strip of B, so A is read once per column of tiles, ``ceil(N /
    block_n)`` times, and B ``ceil(M / block_m)`` times. ``block_m = block_n = 1`` is v1.
    """
    s = element_size(dtype)
    if (block_m is None) != (block_n is None):
        raise ValueError("give both block_m and block_n, or neither")
    if block_m is None:
        return (M * K + K * N + M * N) * s
    return (M * K * math.ceil(N / block_n) + K * N * math.ceil(M / block_m) + M * N) * s


def tile_intensity(block_m: int, block_n: int, block_k: int, dtype) -> float:
    """FLOPs per byte a program loads, one K step at a time.

    Each step loads a ``block_m x block_k`` tile of A and a ``block_k x block_n`` tile of
    B and does ``2 block_m block_n block_k`` FLOPs with them: ``2 block_m block_n /
    ((block_m + block_n) s)`` FLOP/byte, whatever ``block_k``. A square tile of side B
    uses each loaded value for B/2 multiply-adds: B/2 FLOP/byte in fp16. Bigger tiles,
    more reuse.
    """
    s = element_size(dtype)
    return 2 * block_m * block_n * block_k / ((block_m * block_k + block_k * block_n) * s)


def sram_bytes(block_m: int, block_n: int, block_k: int, dtype, num_stages: int = 1) -> int:
    """Shared memory one program needs for its A and B tiles: one buffer per stage.

    The model counts the operand buffers only. The compiler may add a staging buffer
    for the output tile or reuse the operand buffers for it; the recorded GPU run
    compares this model with what the compiler reports.
    """
    return max(1, num_stages) * (block_m * block_k + block_k * block_n) * element_size(dtype)


def accumulator_bytes(block_m: int, block_n: int) -> int:
    """Registers holding one program's fp32 accumulator tile."""
    return block_m * block_n * 4

"""Matrix products (lessons 04 and 07): the op whose intensity grows with its size, and the
tile formulas a kernel author checks before choosing a tile: FLOPs per loaded byte,
shared memory per program, accumulator registers."""

from __future__ import annotations

import math

from ..dtypes import dtype_key
from ..dtypes import element_size as element_bytes
from .work import Work, _positive


def matmul(M: int, N: int, K: int, dtype="bf16", block_m: int | None = None,
           block_n: int | None = None) -> Work:
    """``C[M, N] = A[M, K] @ B[K, N]``: ``2 M N K`` FLOPs (K multiply-adds per output).

    With no block sizes, the bytes are the compulsory minimum: A, B read once, C written
    once, ``(MK + KN + MN)`` elements. That is what a kernel approaches when its tiles
    are reused from SRAM and L2; intensity then grows like the matrix size.

    With ``block_m`` and ``block_n``, count what a tiled kernel with ``block_m x
    block_n`` output tiles reads from DRAM if nothing survives in L2: every tile row of
    C re-reads its strip of A once per tile column (A read ``ceil(N / block_n)`` times)
    and B is read ``ceil(M / block_m)`` times. ``block_m = block_n = 1`` is the naive
    kernel that reloads both operands for every output element.
    """
    _positive(M=M, N=N, K=K)
    s = element_bytes(dtype)
    key = dtype_key(dtype)
    if (block_m is None) != (block_n is None):
        raise ValueError("give both block_m and block_n, or neither")
    if block_m is None:
        nbytes = (M * K + K * N + M * N) * s
        counting = "2MNK FLOP; read A and B once, write C once"
        shape = f"M={M} N={N} K={K}"
    else:
        _positive(block_m=block_m, block_n=block_n)
        a_reads = math.ceil(N / block_n)
        b_reads = math.ceil(M / block_m)
        nbytes = (M * K * a_reads + K * N * b_reads + M * N) * s
        counting = (f"2MNK FLOP; {block_m}x{block_n} tiles: A read {a_reads}x, "
                    f"B read {b_reads}x, C written once")
        shape = f"M={M} N={N} K={K}, tiles {block_m}x{block_n}"
    return Work("matmul", shape, key, 2 * M * N * K, nbytes, key, counting)


def tile_intensity(block_m: int, block_n: int, block_k: int, dtype) -> float:
    """FLOPs per byte one matmul program loads, one K step at a time.

    Each step loads a ``block_m x block_k`` tile of A and a ``block_k x block_n`` tile of
    B and does ``2 block_m block_n block_k`` FLOPs with them: ``2 block_m block_n /
    ((block_m + block_n) s)`` FLOP/byte, whatever ``block_k``. A square tile of side B
    uses each loaded value for B/2 multiply-adds: B/2 FLOP/byte in fp16. Bigger tiles,
    more reuse.
    """
    s = element_bytes(dtype)
    return 2 * block_m * block_n * block_k / ((block_m * block_k + block_k * block_n) * s)


def sram_bytes(block_m: int, block_n: int, block_k: int, dtype, num_stages: int = 1,
               staged_c: float = 0) -> int:
    """Shared memory one matmul program needs for its A and B tiles: one buffer per stage,
    and, for a kernel that stores C through the TMA, the staging buffer of that store.

    ``staged_c`` is the share of the ``block_m x block_n`` tile of C staged in shared
    memory before a TMA store: 0 (the default) for a kernel that stores C straight from
    registers, 1 for a whole tile, 1/2 for a tile stored as two halves. Otherwise the
    model counts the operand buffers only; the compiler may add a few bytes of barriers,
    and the recorded GPU run compares this model with what the compiler reports.
    """
    if staged_c not in (0, 0.5, 1):
        raise ValueError(f"staged_c is the share of the C tile staged for a TMA store: 0, "
                         f"0.5 or 1, got {staged_c!r}")
    operands = max(1, num_stages) * (block_m * block_k + block_k * block_n)
    return (operands + int(block_m * block_n * staged_c)) * element_bytes(dtype)


def accumulator_bytes(block_m: int, block_n: int) -> int:
    """Registers holding one matmul program's fp32 accumulator tile."""
    return block_m * block_n * 4

"""Lesson 07's space of settings for :func:`~helpers.kernels.matmul.tuned.matmul_kernel_v6`:
the candidates, what fits a GPU, what is worth timing for a shape, and how shapes are
bucketed so that a model's thousand shapes need a few dozen tunings.

* :data:`CONFIG_SPACE`: tile shapes from 16 rows (one token, a decode step) to
  256 x 128, warps, pipeline stages and split-K: the candidates.
* :func:`prune` (Triton's ``early_config_prune``): before timing anything, drop what
  cannot fit this GPU's shared memory or the registers (:meth:`TileConfig.fits`, with
  the GPU table's limits), tiles far larger than the problem, and split-K where there are
  tiles enough. What is left is timed.
* :func:`shape_key`: each size rounded up to a power of two.

Changing the space means editing :data:`CONFIG_SPACE` here and nothing else: each setting
is a :class:`~helpers.kernels.matmul.config.TileConfig`, which knows its shared memory,
its registers, its ``triton.Config`` and its record's keys.
"""

from __future__ import annotations

import triton

from .config import MAX_ACCUMULATOR_REGISTERS, TileConfig, gpu_in_use  # noqa: F401

# How the records, the saved decisions and the kernel's launch name a setting of v6.
KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")
CONSTEXPRS = KEYS[:5]      # the kernel's own arguments; warps and stages are launch options

# The candidates. Big tiles for big problems (each loaded value reused 128-256 times);
# 16-64 rows for skinny ones, where a 128-row tile would be mostly padding; deep K steps
# and split-K for long, thin reductions. GROUP_M is 8 throughout.
CONFIG_SPACE = (
    [TileConfig(bm, bn, 64, num_warps=w, num_stages=s) for bm, bn, w, s in (
        (128, 256, 8, 3), (128, 256, 8, 4), (256, 128, 8, 3), (256, 128, 8, 4),
        (128, 128, 8, 4), (128, 128, 4, 4),
        (128, 64, 4, 4), (64, 128, 4, 4), (64, 64, 4, 4))]
    + [TileConfig(bm, bn, bk, split_k=sk, num_warps=w, num_stages=s)
       for bm in (16, 32, 64) for bn, bk, w, s in (
           (64, 128, 4, 4), (128, 128, 4, 4), (256, 64, 8, 4)) for sk in (1, 4)]
    + [TileConfig(64, 64, 128, split_k=sk, num_warps=4, num_stages=4) for sk in (2, 8)]
)


# --------------------------------------------------------------------------------------
# What is pruned, how shapes are bucketed. (What fits a GPU: TileConfig.fits.)
# --------------------------------------------------------------------------------------


def useful(config: TileConfig, M: int, N: int, K: int, sms: int = 132) -> tuple[bool, str]:
    """Whether a setting that fits is worth timing for this shape."""
    bm, bn, split = config.block_m, config.block_n, config.split_k
    if bm > max(16, triton.next_power_of_2(M)):
        return False, (f"BLOCK_M {bm} is past M = {M} rounded up to a power of "
                       f"two ({max(16, triton.next_power_of_2(M))}): mostly padding")
    if bn > max(32, triton.next_power_of_2(N)):
        return False, (f"BLOCK_N {bn} is past N = {N} rounded up to a power of "
                       f"two ({max(32, triton.next_power_of_2(N))}): mostly padding")
    if M > 256 and bm < 64:
        return False, f"BLOCK_M {bm} reuses each value of B too few times for M = {M}"
    if split > 1:
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        if tiles >= sms:
            return False, f"{tiles} tiles already fill {sms} SMs: split-K only adds traffic"
        if K < split * config.block_k * 4:
            return False, f"K = {K} is too short to split {split} ways"
    return True, "kept"


def verdict(config: TileConfig, M: int, N: int, K: int, dtype, gpu=None,
            sms: int | None = None) -> tuple[bool, str]:
    """Whether :func:`prune` keeps ``config`` for this shape on ``gpu`` (the GPU in use by
    default; an H100 in CPU mode), and why: it must fit, then be worth timing."""
    here, here_sms = gpu_in_use()
    ok, why = config.fits(here if gpu is None else gpu, dtype)
    return useful(config, M, N, K, here_sms if sms is None else sms) if ok else (ok, why)


def prune(configs, named_args, **kwargs) -> list:
    """Triton's ``early_config_prune``: the candidates worth timing for this call."""
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    dtype = named_args["a_ptr"].dtype
    kept = [c for c in configs if verdict(TileConfig.from_triton(c), M, N, K, dtype)[0]]
    return kept or list(configs[:1])


def bucket(n: int) -> int:
    """The power of two at or above ``n`` (at least 16): the tuner's unit of shape."""
    return max(16, triton.next_power_of_2(n))


def shape_key(M: int, N: int, K: int) -> tuple[int, int, int]:
    """Shapes that share one tuning: each size rounded up to a power of two."""
    return bucket(M), bucket(N), bucket(K)

"""Lesson 07's space of settings for :func:`~helpers.kernels.matmul.tuned.matmul_kernel_v6`:
the candidates, what fits a GPU, what is worth timing for a shape, and how shapes are
bucketed so that a model's thousand shapes need a few dozen tunings.

* :data:`CONFIG_SPACE`: tile shapes from 16 rows (one token, a decode step) to
  256 x 128, warps, pipeline stages and split-K: the candidates.
* :func:`prune` (Triton's ``early_config_prune``): before timing anything, drop what
  cannot fit this GPU's shared memory or the registers, tiles far larger than the
  problem, and split-K where there are tiles enough. What is left is timed.
* :func:`shape_key`: each size rounded up to a power of two.
"""

from __future__ import annotations

import functools

import torch
import triton

from ... import runtime

KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")

# Shared memory a program may use on an H100 or H200 (227 KiB, the opt-in maximum); the
# tuner asks the GPU itself when there is one.
H100_SHARED_MEMORY = 232_448
# fp32 accumulator registers a thread may spend: a thread has 255, and the loads, the
# addresses and the pipeline need the rest.
MAX_ACCUMULATOR_REGISTERS = 128


def _config(bm, bn, bk, split_k, warps, stages, group_m=8) -> dict:
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SPLIT_K=split_k,
                num_warps=warps, num_stages=stages)


# The candidates. Big tiles for big problems (each loaded value reused 128-256 times);
# 16-64 rows for skinny ones, where a 128-row tile would be mostly padding; deep K steps
# and split-K for long, thin reductions.
CONFIG_SPACE = (
    [_config(bm, bn, 64, 1, w, s) for bm, bn, w, s in (
        (128, 256, 8, 3), (128, 256, 8, 4), (256, 128, 8, 3), (256, 128, 8, 4),
        (128, 128, 8, 4), (128, 128, 4, 4),
        (128, 64, 4, 4), (64, 128, 4, 4), (64, 64, 4, 4))]
    + [_config(bm, bn, bk, sk, w, s) for bm in (16, 32, 64) for bn, bk, w, s in (
        (64, 128, 4, 4), (128, 128, 4, 4), (256, 64, 8, 4)) for sk in (1, 4)]
    + [_config(64, 64, 128, sk, 4, 4) for sk in (2, 8)]
)




# --------------------------------------------------------------------------------------
# What fits, what is pruned, how shapes are bucketed.
# --------------------------------------------------------------------------------------


def shared_memory_bytes(config: dict, dtype=torch.float16) -> int:
    """SRAM the software pipeline keeps: ``num_stages`` A and B tiles in flight."""
    size = torch.empty((), dtype=dtype).element_size()
    return config["num_stages"] * (config["BLOCK_M"] + config["BLOCK_N"]) \
        * config["BLOCK_K"] * size


def accumulator_registers(config: dict) -> int:
    """fp32 registers a thread holds for its share of the ``BLOCK_M x BLOCK_N`` tile."""
    return config["BLOCK_M"] * config["BLOCK_N"] // (32 * config["num_warps"])


def fits(config: dict, dtype=torch.float16, shared_memory: int = H100_SHARED_MEMORY,
         max_registers: int = MAX_ACCUMULATOR_REGISTERS) -> tuple[bool, str]:
    """Whether one setting can run at all here, and if not, why."""
    smem = shared_memory_bytes(config, dtype)
    if smem > shared_memory:
        return False, f"needs {smem:,} bytes of shared memory, over the {shared_memory:,} here"
    regs = accumulator_registers(config)
    if regs > max_registers:
        return False, (f"its accumulator needs {regs} registers a thread, over the "
                       f"{max_registers} budgeted")
    return True, "fits"


def useful(config: dict, M: int, N: int, K: int, sms: int = 132) -> tuple[bool, str]:
    """Whether a setting that fits is worth timing for this shape."""
    if config["BLOCK_M"] > max(16, triton.next_power_of_2(M)):
        return False, (f"BLOCK_M {config['BLOCK_M']} is past M = {M} rounded up to a power of "
                       f"two ({max(16, triton.next_power_of_2(M))}): mostly padding")
    if config["BLOCK_N"] > max(32, triton.next_power_of_2(N)):
        return False, (f"BLOCK_N {config['BLOCK_N']} is past N = {N} rounded up to a power of "
                       f"two ({max(32, triton.next_power_of_2(N))}): mostly padding")
    if M > 256 and config["BLOCK_M"] < 64:
        return False, f"BLOCK_M {config['BLOCK_M']} reuses each value of B too few times for M = {M}"
    if config["SPLIT_K"] > 1:
        tiles = triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"])
        if tiles >= sms:
            return False, f"{tiles} tiles already fill {sms} SMs: split-K only adds traffic"
        if K < config["SPLIT_K"] * config["BLOCK_K"] * 4:
            return False, f"K = {K} is too short to split {config['SPLIT_K']} ways"
    return True, "kept"


@functools.lru_cache(maxsize=None)
def _gpu_limits() -> tuple[int, int]:
    props = triton.runtime.driver.active.utils.get_device_properties(
        torch.cuda.current_device())
    return props["max_shared_mem"], props["multiprocessor_count"]


def prune(configs, named_args, **kwargs) -> list:
    """Triton's ``early_config_prune``: the candidates worth timing for this call."""
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    dtype = named_args["a_ptr"].dtype
    shared_memory, sms = _gpu_limits() if runtime.is_gpu() else (H100_SHARED_MEMORY, 132)
    kept = [c for c in configs
            if fits({**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages},
                    dtype, shared_memory)[0]
            and useful({**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages},
                       M, N, K, sms)[0]]
    return kept or list(configs[:1])


def bucket(n: int) -> int:
    """The power of two at or above ``n`` (at least 16): the tuner's unit of shape."""
    return max(16, triton.next_power_of_2(n))


def shape_key(M: int, N: int, K: int) -> tuple[int, int, int]:
    """Shapes that share one tuning: each size rounded up to a power of two."""
    return bucket(M), bucket(N), bucket(K)

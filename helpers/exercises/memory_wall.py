"""Checks for lesson 01 (the memory wall): bytes moved, ridge points, fusion, latency, and
predictions made before a record prints (L2 against HBM, strided access, the kernels of an
unfused chain).

Every expected value is computed here from the napkin math of :mod:`helpers.intensity`,
the hardware table, or numbers the notebook passes in from a measurement record.
"""

from __future__ import annotations

import torch

from .. import hardware, intensity
from ..dtypes import dtype_key, element_size
from ..feedback import Feedback, check_choice, check_number
from ..plots.memory_wall import format_bytes
from .start_here import predicted_number


def check_copy_bytes(answer, n: int, dtype=torch.float16) -> Feedback:
    """Exercise: how many DRAM bytes does copying ``n`` elements of ``dtype`` move?"""
    s = element_size(dtype)
    expected = intensity.copy(n, dtype).nbytes
    mistakes = [(n * s, "you counted the reads but not the writes"),
                (2 * n, "you counted elements, not bytes"),
                (16 * n * s, "you counted bits, not bytes")]
    if s == 2:   # reads alone and elements alone are the same number: say both
        mistakes[:2] = [(2 * n, "you counted the reads but not the writes (or elements, "
                                "not bytes)")]
    return check_number(
        "bytes moved by a copy", answer, expected, rel=0.001, unit="B", mistakes=mistakes,
        hint="every element is read once from DRAM and written once back")


def check_ridge_point(answer, gpu: str = "H100-SXM", dtype: str = "bf16") -> Feedback:
    """Exercise: how many FLOPs per byte must a kernel do to keep ``gpu``'s ``dtype``
    units busy? (peak FLOP/s divided by peak bytes/s)."""
    spec = hardware.lookup(gpu)
    expected = spec.ridge_point(dtype)
    mistakes = [(1 / expected, "you divided bandwidth by compute (that is bytes per FLOP)")]
    if dtype_key(dtype) != "fp32" and "fp32" in spec.peak_tflops:
        mistakes.append((spec.ridge_point("fp32"), "you used the fp32 CUDA-core peak instead "
                         f"of the {dtype_key(dtype)} tensor-core peak"))
    return check_number(
        f"FLOP per byte to keep the {spec.name} busy in {dtype_key(dtype)}", answer,
        expected, rel=0.02, unit="FLOP/B", mistakes=mistakes,
        hint=f"{spec.peak(dtype):g} TFLOP/s and {spec.hbm_bandwidth_gbs:g} GB/s: convert both "
             "to per-second units (10^12 and 10^9) before dividing")


def check_percent_of_peak(answer, measured_gbps: float, peak_gbps: float,
                          of: str = "peak bandwidth") -> Feedback:
    """Exercise: what percentage of a bandwidth (the datasheet's, by default, or ``of``
    another: a measured copy's) did a measured kernel reach?"""
    expected = 100 * measured_gbps / peak_gbps
    return check_number(
        f"percent of {of}", answer, expected, rel=0.01, unit="%",
        mistakes=[(measured_gbps / peak_gbps, "you gave a fraction, not a percentage"),
                  (100 * peak_gbps / measured_gbps, "you divided the reference by the "
                                                    "measurement")],
        hint=f"achieved GB/s divided by {of} ({peak_gbps:,.0f} GB/s), times 100")


def check_fusion_speedup(answer, shape: tuple[int, int], dtype=torch.float32) -> Feedback:
    """Exercise: predict fusion's speed-up for ``gelu(x + bias)`` from the bytes alone.

    Both versions are memory-bound, so time is proportional to bytes moved, and the
    predicted speed-up is unfused bytes / fused bytes.
    """
    unfused, fused = (intensity.bias_gelu(*shape, dtype, version=v).nbytes
                      for v in ("unfused", "fused"))
    return check_number(
        "predicted speed-up of the fused kernel", answer, unfused / fused, rel=0.02, unit="x",
        mistakes=[(1.0, "you compared FLOPs: they are the same, but the bytes are not"),
                  (fused / unfused, "you inverted the ratio (fused over unfused)")],
        hint="count the DRAM bytes of each version: the unfused one writes x + bias to DRAM "
             "and reads it back")


def check_regime(answer, nbytes: float, floor_us: float, peak_gbps: float) -> Feedback:
    """Exercise: is a copy that moves ``nbytes`` latency-bound or bandwidth-bound?

    Latency-bound when moving the bytes at peak bandwidth takes less time than the
    launch floor (the smallest time any launch took in the record).
    """
    transfer_us = nbytes / (peak_gbps * 1e9) * 1e6
    expected = "latency" if transfer_us < floor_us else "bandwidth"
    relation = "less" if transfer_us < floor_us else "more"
    return check_choice(
        f"regime of a copy moving {format_bytes(nbytes)}", answer, expected,
        ("latency", "bandwidth"),
        why=f"At {peak_gbps:,.0f} GB/s the bytes take {transfer_us:.3g} µs, {relation} than "
            f"the {floor_us:.3g} µs launch floor.")



# --------------------------------------------------------------------------------------
# Predictions made before a record prints: a wrong one is told what it overlooked, never
# the recorded value (lesson 00's predicted_number).
# --------------------------------------------------------------------------------------


def check_l2_ratio(answer, l2_gbps: float, hbm_gbps: float) -> Feedback:
    """Prediction: how many times HBM's read bandwidth does L2 deliver (measured, both read
    by the same kernel)? Within a factor of 1.35 either way counts."""
    return predicted_number(
        "L2's read bandwidth over HBM's", answer, l2_gbps / hbm_gbps, rel=None, factor=1.35,
        unit="x",
        high="L2 is on the chip but outside the SMs: every read crosses the chip to one of "
             "the L2 slices that all SMs share, a long way from the cores; only each SM's own "
             "SRAM is that close",
        low="L2 is on the chip: a read it serves never leaves the chip, so it delivers "
            "a multiple of what HBM does (a cache slower than the memory behind it would not "
            "pay)")


def check_strided_slowdown(answer, coalescing: dict, sector: int = 32) -> Feedback:
    """Prediction: how many times longer the copy by strips of columns takes than the copy
    by strips of rows (the ``coalescing`` part of the ``memory_levels`` record)."""
    ms = {r["name"]: r["ms"] for r in coalescing["rows"]}
    rows_ms = ms[coalescing["baseline"]]
    cols_ms = next(v for k, v in ms.items() if k.startswith("copy") and "columns" in k)
    word = element_size(coalescing["dtype"])
    warp = 32
    return predicted_number(
        "time of the copy by columns over the copy by rows", answer, cols_ms / rows_ms,
        rel=0.3, unit="x",
        mistakes=[(1.0, "you compared the bytes the kernels ask for: the same, but memory "
                        f"moves whole {sector}-byte sectors, and by columns each "
                        f"{word}-byte word needs a sector of its own"),
                  (warp, f"you counted the sectors a warp touches by columns ({warp}) against "
                         "one; by rows its 32 words fill several sectors")],
        high=f"the waste has a bound: each {word}-byte word brings at most one {sector}-byte "
             "sector through the chip",
        low=f"by columns each {word}-byte word brings a whole {sector}-byte sector through the "
            "chip: by how many times does that multiply the bytes moved?")


def check_unfused_kernel_us(answer, op: dict) -> Feedback:
    """Prediction: the µs each kernel of the unfused chain takes (one read and one write pass
    over the tensor), against the mean the profiler measured for its kernels (``op``: one
    op of the ``profiles`` record, e.g. ``"elementwise chain unfused"``)."""
    kernels = [k for k in op["kernels"] if k["calls_per_op"] >= 1]
    expected = sum(k["us_per_call"] for k in kernels) / len(kernels)
    n = len(kernels)
    return predicted_number(
        "µs per kernel of the unfused chain", answer, expected, rel=0.15, unit="µs",
        mistakes=[(expected / 2, "you counted one direction: each kernel reads the tensor "
                                 "and writes one of the same size"),
                  (n * expected, f"that is the whole chain: its {n} kernels each make one pass")],
        high="each kernel streams its bytes at about the copy kernel's rate, no slower: "
             "bytes over the copy's GB/s",
        low="count every byte of the pass, the tensor read and the tensor written, and divide "
            "by the copy's GB/s")

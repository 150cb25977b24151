"""Checks for lesson 01 (the memory wall): bytes moved, ridge points, fusion, latency.

Every expected value is computed here from the napkin math of
:mod:`helpers.kernels.memory_wall`, the hardware table, or numbers the notebook
passes in from a measurement record.
"""

from __future__ import annotations

import torch

from .. import hardware
from ..feedback import Feedback, check_choice, check_number
from ..intensity import element_bytes
from ..kernels import memory_wall as mw


def check_copy_bytes(answer, n: int, dtype=torch.float16) -> Feedback:
    """Exercise: how many DRAM bytes does copying ``n`` elements of ``dtype`` move?"""
    s = element_bytes(dtype)
    expected = mw.bytes_moved("copy", (n,), _torch_dtype(dtype))
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
    if hardware.dtype_key(dtype) != "fp32" and "fp32" in spec.peak_tflops:
        mistakes.append((spec.ridge_point("fp32"), "you used the fp32 CUDA-core peak instead "
                         f"of the {hardware.dtype_key(dtype)} tensor-core peak"))
    return check_number(
        f"FLOP per byte to keep the {spec.name} busy in {hardware.dtype_key(dtype)}", answer,
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
    dt = _torch_dtype(dtype)
    unfused = mw.bytes_moved("bias_gelu_unfused", shape, dt)
    fused = mw.bytes_moved("bias_gelu_fused", shape, dt)
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
        f"regime of a copy moving {_fmt_bytes(nbytes)}", answer, expected, ("latency", "bandwidth"),
        why=f"At {peak_gbps:,.0f} GB/s the bytes take {transfer_us:.3g} µs, {relation} than "
            f"the {floor_us:.3g} µs launch floor.")


def _fmt_bytes(b: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.4g} {unit}"
    return f"{b:.0f} B"


def _torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
        hardware.dtype_key(dtype)]

"""The answer key of assignment 05 (residual add + RMSNorm): every graded number.

Instructor's side only: ``./course release`` leaves this module out and ships the values
sealed (:mod:`helpers.grading.answers`). Every value comes from the course's napkin math
(:mod:`helpers.intensity`) and the committed probe record (the copy bandwidth
measured on the course's reference GPU), never from a typed-in number.
"""

from __future__ import annotations

import torch

from ... import hardware, intensity, records
from ...dtypes import element_size

M, N = 4096, 8192
BF16 = torch.bfloat16
TOLERANCE = 0.02                 # relative, for every napkin-math number
S = element_size(BF16)
MN = M * N
EAGER_BYTES = intensity.residual_rmsnorm(M, N, BF16, version="eager").nbytes
FUSED_BYTES = intensity.residual_rmsnorm(M, N, BF16, version="fused").nbytes
PREDICTED_SPEEDUP = EAGER_BYTES / FUSED_BYTES
_EAGER_OPS = intensity.residual_rmsnorm_eager_kernels(M, N, BF16)


def reference_copy_gbps() -> tuple[float, str]:
    """The copy bandwidth of the course's reference GPU, from the committed probe record."""
    rec = records.load("probes")
    return rec.results["copy"]["gbps"], rec.label


def _ms(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9) * 1e3


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [(value of a known mistake, what it means)])}``."""
    values = {}
    conversions = sum(r + w for op, r, w in _EAGER_OPS if ".to(" in op)
    values["1a"] = (EAGER_BYTES, TOLERANCE, [
            (28 * MN, "you count the fp32 copies at 2 bytes per element: after "
                      "h.to(torch.float32) every intermediate is fp32, 4 bytes"),
            (sum(r for _, r, _ in _EAGER_OPS), "you count only what the kernels read: each "
                                               "also writes its output back to DRAM"),
            (sum(w for _, _, w in _EAGER_OPS), "you count only what the kernels write: each "
                                               "also reads its inputs from DRAM"),
            (EAGER_BYTES - conversions, "you skip the two .to() conversions: each is a kernel "
                                        "that reads the whole tensor and writes a copy"),
            (intensity.residual_rmsnorm(M, N, BF16, version="torch").nbytes,
             "you count add + F.rms_norm (PyTorch's fused norm), not the eager version shown"),
            (EAGER_BYTES / 1e9, "you give gigabytes; the answer is in bytes"),
            (8 * EAGER_BYTES, "you count bits, not bytes")])
    values["1b"] = (FUSED_BYTES, TOLERANCE, [
            (3 * MN * S, "you forget to write h: the fused kernel must still store the new "
                         "residual stream, the next block adds to it"),
            (2 * MN * S, "you count x and y only: residual is read and h written as well"),
            (5 * MN * S, "you read h back: in the fused kernel h stays in registers between "
                         "its store and the norm"),
            (4 * MN * 4, "you count 4 bytes per element: the tensors are bf16, 2 bytes"),
            (FUSED_BYTES / 1e9, "you give gigabytes; the answer is in bytes")])
    values["1c"] = (PREDICTED_SPEEDUP, TOLERANCE, [
            (1 / PREDICTED_SPEEDUP, "you divide fused bytes by eager bytes: the speed-up is "
                                    "the eager time over the fused time"),
            (28 / 8, "that is the ratio with the fp32 copies counted at 2 bytes")])
    gbps, label = reference_copy_gbps()
    expected = _ms(FUSED_BYTES, gbps)
    table = hardware.lookup(records.load("probes").gpu).hbm_bandwidth_gbs
    values["1d"] = (expected, TOLERANCE, [
            (_ms(FUSED_BYTES, table), f"you use the datasheet's {table:,.0f} GB/s; the "
                                      f"prediction uses the measured copy bandwidth, "
                                      f"{gbps:,.0f} GB/s"),
            (expected / 1e3, "you give seconds; the answer is in milliseconds"),
            (expected * 1e3, "you give microseconds; the answer is in milliseconds"),
            (_ms(EAGER_BYTES, gbps), "that is the eager version's time; predict the fused "
                                     "kernel's"),
            (FUSED_BYTES / (gbps * 2**30) * 1e3, "you take GB/s as GiB/s; GB/s is 10^9 bytes/s")])
    return values

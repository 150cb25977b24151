"""The answer key of assignment 05 (residual add + LayerNorm): every graded number.

Instructor's side only: ``./course release`` leaves this module out and ships the values
sealed (:mod:`helpers.grading.answers`). The eager version's bytes are what PyTorch really
dispatches for it (:func:`helpers.launches.trace` on meta tensors: every op, its inputs and
outputs), the copy bandwidth is the committed probe record's, never a typed-in number.
"""

from __future__ import annotations

import re
from functools import cache

import torch

from ... import hardware, records
from ...dtypes import element_size
from ...launches import trace

M, N = 4096, 8192
BF16 = torch.bfloat16
TOLERANCE = 0.02                 # relative, for every napkin-math number
S = element_size(BF16)
MN = M * N


# The fused kernel: x, residual, weight and bias read once; h and y written once.
FUSED_BYTES = 4 * MN * S + 2 * N * S


@cache
def dispatched(version: str):
    """What PyTorch dispatches for ``"eager"`` (the notebook's eager version) or
    ``"torch"`` (add + F.layer_norm) at M x N bf16, traced on meta tensors."""
    from . import fusion     # here, not above: fusion reads this key when it is imported

    fn = {"eager": fusion.residual_layernorm_eager, "torch": fusion.residual_layernorm_torch}
    x = torch.empty(M, N, device="meta", dtype=BF16)
    w = torch.empty(N, device="meta", dtype=BF16)
    return trace(fn[version], x, x, w, w)


def eager_bytes() -> int:
    return dispatched("eager").bytes


def _at_two_bytes(tensors: str) -> int:
    """The bytes of a trace's list of tensors ("fp32[4096, 8192], bf16[8192]") were every
    element 2 bytes."""
    return sum(2 * eval("*".join(dims.split(",")) or "1")       # noqa: S307 - our own text
               for dims in re.findall(r"\[([\d, ]*)\]", tensors))


def reference_copy_gbps() -> tuple[float, str]:
    """The copy bandwidth of the course's reference GPU, from the committed probe record."""
    rec = records.load("probes")
    return rec.results["copy"]["gbps"], rec.label


def _ms(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9) * 1e3


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [(value of a known mistake, what it means)])}``."""
    values = {}
    EAGER, EAGER_BYTES = dispatched("eager"), eager_bytes()
    TORCH_BYTES = dispatched("torch").bytes
    PREDICTED_SPEEDUP = EAGER_BYTES / FUSED_BYTES
    conversions = sum(c.read + c.written for c in EAGER if c.op == "aten._to_copy")
    at_two = sum(_at_two_bytes(c.inputs) + _at_two_bytes(c.outputs) for c in EAGER)
    values["1a"] = (EAGER_BYTES, TOLERANCE, [
            (at_two, "you count the fp32 intermediates at 2 bytes per element: after "
                     "h.to(torch.float32) they are fp32, 4 bytes"),
            (sum(c.read for c in EAGER), "you count only what the kernels read: each also "
                                         "writes its output back to DRAM"),
            (sum(c.written for c in EAGER), "you count only what the kernels write: each also "
                                            "reads its inputs from DRAM"),
            (EAGER_BYTES - conversions, "you skip the two .to() conversions: each is a kernel "
                                        "that reads the whole tensor and writes a copy"),
            (TORCH_BYTES, "you count add + F.layer_norm (PyTorch's fused norm), not the eager "
                          "version shown"),
            (EAGER_BYTES / 1e9, "you give gigabytes; the answer is in bytes"),
            (8 * EAGER_BYTES, "you count bits, not bytes")])
    values["1b"] = (FUSED_BYTES, TOLERANCE, [
            (3 * MN * S, "you forget to write h: the fused kernel must still store the new "
                         "residual stream, the next block adds to it"),
            (2 * MN * S, "you count x and y only: residual is read and h written as well"),
            (5 * MN * S, "you read h back: in the fused kernel h stays in registers between "
                         "its store and the norm"),
            (6 * MN * S, "you read the row twice (once for the statistics, once to normalise): "
                         "a row of 8192 fits in registers, so one read is enough"),
            (4 * MN * 4, "you count 4 bytes per element: the tensors are bf16, 2 bytes"),
            (FUSED_BYTES / 1e9, "you give gigabytes; the answer is in bytes")])
    values["1c"] = (PREDICTED_SPEEDUP, TOLERANCE, [
            (1 / PREDICTED_SPEEDUP, "you divide fused bytes by eager bytes: the speed-up is "
                                    "the eager time over the fused time"),
            (at_two / FUSED_BYTES, "that is the ratio with the fp32 intermediates counted at "
                                   "2 bytes"),
            (TORCH_BYTES / FUSED_BYTES, "that is the speed-up over add + F.layer_norm; predict "
                                        "it over the eager version")])
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

"""Checks for lesson 05 (kernel fusion): counting what each version moves.

Every expected value comes from the napkin math of :mod:`helpers.intensity`, never from a
typed-in number.
"""

from __future__ import annotations

import torch

from .. import intensity
from ..dtypes import element_size
from ..feedback import Feedback, check_number


def check_swiglu_bytes(answer, m: int, n: int, dtype=torch.bfloat16) -> Feedback:
    """Exercise: DRAM bytes of eager SwiGLU, ``silu(gate) * up``, on ``m x n`` tensors."""
    s = element_size(dtype)
    mn = m * n
    return check_number(
        "bytes of eager SwiGLU", answer, intensity.swiglu(m, n, dtype, "unfused").nbytes,
        rel=0.01, unit="B", mistakes=[
            (intensity.swiglu(m, n, dtype, "fused").nbytes,
             "you counted the fused kernel (read gate and up, write y), or the reads alone. "
             "Eager SiLU also writes silu(gate) to DRAM and the product reads it back"),
            (4 * mn * s, "you counted silu(gate) once: SiLU writes it to DRAM and the product "
                         "reads it back, so it crosses the bus twice"),
            (5 * mn, "you counted elements, not bytes")],
        hint="two kernels: list what each reads and writes, M x N elements each")


def check_online_softmax_bytes(answer, m: int, n: int, dtype=torch.float16) -> Feedback:
    """Exercise: DRAM bytes of the online (two-pass) softmax on an ``m x n`` input."""
    s = element_size(dtype)
    return check_number(
        "bytes of the online softmax", answer, intensity.softmax(m, n, dtype, "online").nbytes,
        rel=0.01, unit="B", mistakes=[
            (intensity.softmax(m, n, dtype, "fused").nbytes,
             "that is the row-in-registers kernel: the online one reads each row twice"),
            (4 * m * n * s, "the second pass writes y once; it does not write anything else"),
            (3 * m * n, "you counted elements, not bytes")],
        hint="pass 1 reads the row; pass 2 reads it again and writes y")

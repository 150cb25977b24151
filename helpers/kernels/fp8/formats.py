"""The two eight-bit float formats of Hopper's tensor cores, and the scales they need.

An FP8 number has a sign, a few exponent bits and a few mantissa bits:

* **e4m3** (``torch.float8_e4m3fn``): 4 exponent bits, 3 mantissa bits; largest 448,
  smallest normal 2^-6, no infinities. Eight values per power of two: a relative spacing
  of 2^-3 = 12.5% at worst. Used for weights and activations (forward).
* **e5m2** (``torch.float8_e5m2``): 5 exponent bits, 2 mantissa bits; largest 57,344,
  smallest normal 2^-14, with infinities. A wider range and a coarser spacing (25%), for
  gradients, whose magnitudes spread further.

A bf16 tensor's values live anywhere from 1e-38 to 3e38; e4m3 holds 448 and rounds
everything below 2^-9 to 0. So FP8 always comes with a **scale**: store ``q = x / s``
with ``s = amax / 448`` (``amax`` the largest ``|x|`` of the group the scale covers), so
the group's largest value lands on the format's largest, and multiply ``s`` back in after
the product. The group is the design choice (:data:`GRANULARITIES`): one scale per tensor
is cheapest, and one outlier of 100x shrinks every other value of the tensor toward the
zero band; one per row, or per block of 128 (DeepSeek-V3: 1 x 128 for activations,
128 x 128 for weights), confines an outlier to its block.

:func:`quantize_reference` is the spec the kernels of :mod:`~helpers.kernels.fp8.quantize`
are held to: amax per group, scale, divide, clamp to the format's range (saturation: a
value past the range becomes the largest, never inf or NaN), round to nearest. An
all-zero group gets the scale 1 (not 0/448 = 0, whose reciprocal would be inf).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Format:
    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int

    @property
    def max(self) -> float:
        return float(torch.finfo(self.dtype).max)

    @property
    def smallest_normal(self) -> float:
        return float(torch.finfo(self.dtype).smallest_normal)

    @property
    def smallest_subnormal(self) -> float:
        return self.smallest_normal * 2.0 ** -self.mantissa_bits

    @property
    def relative_spacing(self) -> float:
        """The gap between neighbours over their size, at worst (just above a power of 2)."""
        return 2.0 ** -self.mantissa_bits


E4M3 = Format("e4m3", torch.float8_e4m3fn, 4, 3)
E5M2 = Format("e5m2", torch.float8_e5m2, 5, 2)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}

# How many elements share one scale: (rows, columns) of a group; None spans the dimension.
GRANULARITIES = {
    "tensor": (None, None),
    "row": (1, None),          # one scale per row (per token, or per output channel of W)
    "1x128": (1, 128),         # DeepSeek-V3's activations
    "128x128": (128, 128),     # DeepSeek-V3's weights
}


def format_of(fmt) -> Format:
    if isinstance(fmt, Format):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"FP8 format must be one of {list(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def group_shape(granularity: str, shape) -> tuple[int, int]:
    """The ``(rows, columns)`` of one group of a 2-D tensor of ``shape``."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {list(GRANULARITIES)}, got {granularity!r}")
    gm, gk = GRANULARITIES[granularity]
    return (shape[0] if gm is None else gm, shape[1] if gk is None else gk)


def scale_shape(granularity: str, shape) -> tuple[int, int]:
    """The scale tensor's shape: one scale per group, partial groups at the edges included."""
    gm, gk = group_shape(granularity, shape)
    return (-(-shape[0] // gm), -(-shape[1] // gk))


def quantize_reference(x: torch.Tensor, granularity: str, fmt="e4m3"):
    """``(q, scale)``: ``x ≈ q * scale`` group by group, ``q`` in the FP8 format, ``scale``
    (fp32, :func:`scale_shape`) the dequantisation scale ``amax / max``, 1 for a group of
    zeros. In fp32, the kernels' arithmetic: the spec."""
    fmt = format_of(fmt)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, columns), got shape {tuple(x.shape)}")
    gm, gk = group_shape(granularity, x.shape)
    sm, sk = scale_shape(granularity, x.shape)
    pad = torch.zeros(sm * gm, sk * gk, dtype=torch.float32, device=x.device)
    pad[:x.shape[0], :x.shape[1]] = x.float()
    groups = pad.view(sm, gm, sk, gk)
    amax = groups.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / fmt.max, torch.ones_like(amax))
    q = (groups / scale[:, None, :, None]).clamp(-fmt.max, fmt.max)
    q = q.reshape(sm * gm, sk * gk)[:x.shape[0], :x.shape[1]].to(fmt.dtype)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, granularity: str) -> torch.Tensor:
    """``q * scale`` back in float64, each group times its scale."""
    gm, gk = group_shape(granularity, q.shape)
    full = scale.double().repeat_interleave(gm, 0).repeat_interleave(gk, 1)
    return q.double() * full[:q.shape[0], :q.shape[1]]

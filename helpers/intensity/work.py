"""The unit of napkin math: :class:`Work` (FLOPs, DRAM bytes, how they were counted), the
checks every count shares, and a text table of several counts."""

from __future__ import annotations

import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    """What one op costs: FLOPs done and DRAM bytes moved, and how they were counted.

    ``peak_dtype`` names the compute roof that applies. Matrix products run on the
    tensor cores, so their roof is the data type's tensor peak. Elementwise ops,
    reductions and normalisations run on the ordinary fp32 CUDA cores whatever the
    storage type (kernels load bf16, compute in fp32 registers), so their roof is fp32.
    """

    op: str
    shape: str
    dtype: str
    flops: int
    nbytes: int
    peak_dtype: str
    counting: str

    @property
    def intensity(self) -> float:
        """FLOPs per DRAM byte. Zero for a pure copy."""
        if self.nbytes <= 0:
            raise ValueError(f"{self.op} moves no bytes; its intensity is undefined")
        return self.flops / self.nbytes

    def describe(self) -> str:
        return (f"{self.op} [{self.shape}, {self.dtype}]: {self.flops:.4g} FLOP, "
                f"{self.nbytes:.4g} B, {self.intensity:.3g} FLOP/B  ({self.counting})")

    def as_dict(self) -> dict:
        return {"op": self.op, "shape": self.shape, "dtype": self.dtype, "flops": self.flops,
                "bytes": self.nbytes, "intensity": self.intensity,
                "peak_dtype": self.peak_dtype}


def _positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")


def _whole(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")


def _known(version: str, versions: tuple[str, ...]) -> None:
    if version not in versions:
        raise ValueError(f"unknown version {version!r}; known: {', '.join(versions)}")


def table(works) -> str:
    """A fixed-width text table of several :class:`Work` (deterministic, for notebooks)."""
    header = f"{'op':<26}{'shape':<28}{'dtype':<6}{'GFLOP':>12}{'MB':>12}{'FLOP/B':>10}"
    lines = [header, "-" * len(header)]
    for w in works:
        lines.append(f"{w.op:<26}{w.shape:<28}{w.dtype:<6}{w.flops / 1e9:>12.4g}"
                     f"{w.nbytes / 1e6:>12.4g}{w.intensity:>10.3g}")
    return "\n".join(lines)

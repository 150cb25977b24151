"""Napkin math: how many FLOPs an op does and how many bytes it must move.

Every function here returns a :class:`Work`: the floating-point operations an op
performs and the bytes it moves between the GPU's DRAM (HBM) and the chip, counted by
hand the way a kernel author counts them before writing a line of code. Their ratio is
the op's *arithmetic intensity*, in FLOP per byte, and it decides which roof of the
roofline (:mod:`helpers.roofline`) the op runs into.

Counting conventions, used by the whole course:

* **One multiply-add is two FLOPs.** A multiply, an add, a compare (for a max), a
  division and a transcendental (``exp``) each count as one. Real hardware spends more
  on some (``exp`` and division run on slower special-function units), which is one
  reason memory-light ops can fall short of the compute roof.
* **Bytes are DRAM traffic, and only the compulsory part:** each input read once,
  each output written once. Whatever a good kernel keeps in registers, shared memory
  (SRAM) or L2 is free. Re-reads that a *particular* implementation makes (an
  intermediate written to DRAM and read back, a matrix tile re-read for every output
  tile) are counted only where the function says so: that is exactly the difference
  between a naive and a good kernel.
* Scalars (``a`` in ``a * x + y``) live in registers and cost no bytes.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

from . import roofline
from .hardware import GPUSpec, dtype_key

# Bytes per element of each data type the course uses (tf32 is stored as fp32).
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

# FLOPs per element of a row softmax, counted as:
#   max (1 compare) + subtract the max (1) + exp (1) + running sum (1) + divide (1)
SOFTMAX_FLOPS_PER_ELEMENT = 5
# FLOPs per element of a layer norm, counted as:
#   mean (1 add) + variance: subtract, square, add (3) + multiply by 1/std (1)
#   + scale and shift by the weight and bias (2)
LAYER_NORM_FLOPS_PER_ELEMENT = 7


def element_bytes(dtype) -> int:
    """Size of one element of ``dtype`` (``"bf16"``, ``torch.float32``, ...) in bytes."""
    return ELEMENT_BYTES[dtype_key(dtype)]


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


# --------------------------------------------------------------------------------------
# Streaming ops: every element read and written once, a handful of FLOPs on each.
# --------------------------------------------------------------------------------------


def copy(n: int, dtype="fp32") -> Work:
    """``y = x``: read n elements, write n elements, no arithmetic."""
    _positive(n=n)
    s = element_bytes(dtype)
    return Work("copy", f"n={n}", dtype_key(dtype), 0, 2 * n * s, "fp32",
                "read x, write y; 0 FLOP")


def vector_add(n: int, dtype="fp32") -> Work:
    """``c = a + b``: one add per element; read a and b, write c."""
    _positive(n=n)
    s = element_bytes(dtype)
    return Work("vector add", f"n={n}", dtype_key(dtype), n, 3 * n * s, "fp32",
                "1 add per element; read a, read b, write c")


def axpy(n: int, dtype="fp32") -> Work:
    """``y = a * x + y`` (BLAS axpy): a multiply and an add per element.

    Read x and y, write y back; the scalar ``a`` sits in a register.
    """
    _positive(n=n)
    s = element_bytes(dtype)
    return Work("axpy", f"n={n}", dtype_key(dtype), 2 * n, 3 * n * s, "fp32",
                "1 multiply + 1 add per element; read x, read y, write y")


def row_sum(rows: int, cols: int, dtype="fp32") -> Work:
    """Sum each row of a ``rows x cols`` matrix into an fp32 vector.

    One add per element (the first into a zero accumulator); read the matrix once,
    write one fp32 number per row.
    """
    _positive(rows=rows, cols=cols)
    s = element_bytes(dtype)
    return Work("row sum", f"{rows}x{cols}", dtype_key(dtype), rows * cols,
                rows * cols * s + rows * 4, "fp32", "1 add per element; read x, write the row sums")


def softmax(rows: int, cols: int, dtype="fp32") -> Work:
    """Softmax over each row, with the whole row held on chip (one read, one write).

    FLOPs per element: see :data:`SOFTMAX_FLOPS_PER_ELEMENT`.
    """
    _positive(rows=rows, cols=cols)
    s = element_bytes(dtype)
    n = rows * cols
    return Work("softmax", f"{rows}x{cols}", dtype_key(dtype), SOFTMAX_FLOPS_PER_ELEMENT * n,
                2 * n * s, "fp32",
                f"{SOFTMAX_FLOPS_PER_ELEMENT} FLOP per element; read x once, write y once")


def layer_norm(rows: int, cols: int, dtype="fp32") -> Work:
    """Layer norm over each row, with a weight and a bias of length ``cols``.

    Read x, write y, read the weight and bias once (every row shares them, and after
    the first row they come from cache). FLOPs: :data:`LAYER_NORM_FLOPS_PER_ELEMENT`.
    """
    _positive(rows=rows, cols=cols)
    s = element_bytes(dtype)
    n = rows * cols
    return Work("layer norm", f"{rows}x{cols}", dtype_key(dtype),
                LAYER_NORM_FLOPS_PER_ELEMENT * n, 2 * n * s + 2 * cols * s, "fp32",
                f"{LAYER_NORM_FLOPS_PER_ELEMENT} FLOP per element; read x, write y, "
                "read weight and bias once")


# --------------------------------------------------------------------------------------
# Matrix products: the op whose intensity grows with its size.
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Attention: the same FLOPs, two very different byte counts.
# --------------------------------------------------------------------------------------


def _attention_flops(seq: int, head_dim: int) -> int:
    # S = Q K^T: seq x seq outputs, head_dim multiply-adds each -> 2 seq^2 d
    # O = P V:   seq x d outputs, seq multiply-adds each         -> 2 seq^2 d
    # softmax over S: SOFTMAX_FLOPS_PER_ELEMENT per score (the 1/sqrt(d) scale is
    # folded into Q beforehand)
    return 4 * seq * seq * head_dim + SOFTMAX_FLOPS_PER_ELEMENT * seq * seq


def attention_materialised(batch_heads: int, seq: int, head_dim: int, dtype="bf16") -> Work:
    """Attention as three kernels, the score matrix written to DRAM between them.

    Per head: ``S = Q K^T`` reads Q, K and writes S (seq x seq); the softmax reads S and
    writes P (seq x seq); ``O = P V`` reads P, V and writes O. In elements:
    ``(2 seq d + seq^2) + 2 seq^2 + (seq^2 + 2 seq d) = 4 seq d + 4 seq^2``.
    The ``seq^2`` terms dominate at long sequences, and the intensity stops growing.
    """
    _positive(batch_heads=batch_heads, seq=seq, head_dim=head_dim)
    s = element_bytes(dtype)
    key = dtype_key(dtype)
    elements = 4 * seq * head_dim + 4 * seq * seq
    return Work("attention (materialised)", f"BH={batch_heads} seq={seq} d={head_dim}", key,
                batch_heads * _attention_flops(seq, head_dim), batch_heads * elements * s, key,
                "4 seq^2 d + 5 seq^2 FLOP per head; S and P each written and read once")


def attention_tiled(batch_heads: int, seq: int, head_dim: int, dtype="bf16") -> Work:
    """Attention as one fused, tiled kernel (the FlashAttention idea).

    Scores are made tile by tile in SRAM, softmaxed online and multiplied into V at
    once: S and P never reach DRAM. Compulsory traffic per head: read Q, K, V, write O,
    ``4 seq d`` elements. (A real kernel re-reads K and V once per query tile; those
    re-reads mostly hit L2, and the napkin count leaves them out.)
    """
    _positive(batch_heads=batch_heads, seq=seq, head_dim=head_dim)
    s = element_bytes(dtype)
    key = dtype_key(dtype)
    return Work("attention (tiled)", f"BH={batch_heads} seq={seq} d={head_dim}", key,
                batch_heads * _attention_flops(seq, head_dim),
                batch_heads * 4 * seq * head_dim * s, key,
                "4 seq^2 d + 5 seq^2 FLOP per head; read Q, K, V, write O once")


# --------------------------------------------------------------------------------------
# From work to a prediction: which limit binds, and how long it must take at least.
# --------------------------------------------------------------------------------------

BOUNDS = ("memory", "compute", "latency")


@dataclass(frozen=True)
class Prediction:
    """The roofline's lower bound on an op's time on one GPU, split by cause.

    ``memory_ms``: bytes / peak bandwidth. ``compute_ms``: FLOPs / peak FLOP/s of the
    roof that applies. ``launch_ms``: the fixed cost of starting a kernel, measured.
    The op takes at least ``launch + max(memory, compute)``; the *bound* is whichever
    of the three terms is largest.
    """

    work: Work
    gpu: GPUSpec
    peak_dtype: str
    memory_ms: float
    compute_ms: float
    launch_ms: float

    @property
    def time_ms(self) -> float:
        return roofline.predicted_time_ms(self.work.flops, self.work.nbytes, self.gpu,
                                          self.peak_dtype, launch_us=self.launch_ms * 1e3)

    @property
    def bound(self) -> str:
        biggest = max(self.memory_ms, self.compute_ms, self.launch_ms)
        if biggest == self.launch_ms and self.launch_ms > 0:
            return "latency"
        return "memory" if self.memory_ms >= self.compute_ms else "compute"

    @property
    def tflops(self) -> float:
        """The throughput this prediction implies, launch cost included."""
        return self.work.flops / (self.time_ms * 1e-3) / 1e12

    def describe(self) -> str:
        return (f"{self.work.op} on {self.gpu.name} ({self.peak_dtype} roof): "
                f"memory {self.memory_ms:.3g} ms, compute {self.compute_ms:.3g} ms, "
                f"launch {self.launch_ms:.3g} ms -> at least {self.time_ms:.3g} ms, "
                f"{self.bound}-bound")


def predict(work: Work, gpu: GPUSpec, launch_us: float = 0.0,
            peak_dtype: str | None = None) -> Prediction:
    """Predict ``work`` on ``gpu``; ``launch_us`` is a measured launch cost (microseconds)."""
    if launch_us < 0:
        raise ValueError(f"launch_us must be >= 0, got {launch_us}")
    peak_dtype = dtype_key(peak_dtype or work.peak_dtype)
    memory_ms = work.nbytes / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3
    compute_ms = work.flops / (gpu.peak(peak_dtype) * 1e12) * 1e3
    return Prediction(work, gpu, peak_dtype, memory_ms, compute_ms, launch_us * 1e-3)


# --------------------------------------------------------------------------------------
# A catalogue for widgets and tables: each op as a function of one size knob.
# --------------------------------------------------------------------------------------

# Fixed dimensions for the one-knob versions below: 4096-wide rows (a typical hidden
# size) and attention with 32 heads of dimension 128 per batch.
ROW_WIDTH = 4096
ATTENTION_HEADS = 32
HEAD_DIM = 128


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    size_label: str
    make: Callable[[int, str], Work]
    log2_range: tuple[int, int]  # sensible sizes: 2**lo .. 2**hi
    log2_default: int


CATALOGUE: dict[str, CatalogueEntry] = {
    e.name: e for e in (
        CatalogueEntry("vector add", "n (elements)", lambda n, dt: vector_add(n, dt), (10, 30), 28),
        CatalogueEntry("axpy", "n (elements)", lambda n, dt: axpy(n, dt), (10, 30), 28),
        CatalogueEntry("softmax", f"rows (of {ROW_WIDTH})",
                       lambda r, dt: softmax(r, ROW_WIDTH, dt), (0, 18), 15),
        CatalogueEntry("layer norm", f"rows (of {ROW_WIDTH})",
                       lambda r, dt: layer_norm(r, ROW_WIDTH, dt), (0, 18), 15),
        CatalogueEntry("matmul", "M = N = K", lambda n, dt: matmul(n, n, n, dt), (4, 15), 12),
        CatalogueEntry("attention (materialised)", f"seq ({ATTENTION_HEADS} heads, d={HEAD_DIM})",
                       lambda s, dt: attention_materialised(ATTENTION_HEADS, s, HEAD_DIM, dt),
                       (6, 15), 12),
        CatalogueEntry("attention (tiled)", f"seq ({ATTENTION_HEADS} heads, d={HEAD_DIM})",
                       lambda s, dt: attention_tiled(ATTENTION_HEADS, s, HEAD_DIM, dt),
                       (6, 15), 12),
    )
}


def work_for(op: str, size: int, dtype="bf16") -> Work:
    """``CATALOGUE[op]`` at ``size``: e.g. ``work_for("matmul", 4096, "bf16")``."""
    if op not in CATALOGUE:
        raise KeyError(f"no op {op!r}; choose one of {', '.join(CATALOGUE)}")
    return CATALOGUE[op].make(size, dtype)


def table(works) -> str:
    """A fixed-width text table of several :class:`Work` (deterministic, for notebooks)."""
    header = f"{'op':<26}{'shape':<28}{'dtype':<6}{'GFLOP':>12}{'MB':>12}{'FLOP/B':>10}"
    lines = [header, "-" * len(header)]
    for w in works:
        lines.append(f"{w.op:<26}{w.shape:<28}{w.dtype:<6}{w.flops / 1e9:>12.4g}"
                     f"{w.nbytes / 1e6:>12.4g}{w.intensity:>10.3g}")
    return "\n".join(lines)

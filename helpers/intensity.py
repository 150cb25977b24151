"""Napkin math: how many FLOPs an op does and how many bytes it must move.

Every function here returns a :class:`Work`: the floating-point operations an op
performs and the bytes it moves between the GPU's DRAM (HBM) and the chip, counted by
hand the way a kernel author counts them before writing a line of code. Their ratio is
the op's *arithmetic intensity*, in FLOP per byte, and it decides which roof of the
roofline (:mod:`helpers.roofline`) the op runs into; :mod:`helpers.prediction` turns a
:class:`Work` into a lower bound on its time on one GPU.

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

One signature family for every op: ``op(sizes..., dtype, version=...) -> Work``. The
sizes come first in the order the op's docs name them (``n``; ``rows, cols``; ``M, N,
K``), ``dtype`` is a torch dtype or a key such as ``"bf16"`` (:mod:`helpers.dtypes`), and
where implementations move different bytes, ``version`` names the one counted (``"fused"``
by default). Read ``.flops``, ``.nbytes`` and ``.intensity`` off the result. The kernels
of :mod:`helpers.kernels` hold no counts of their own: this module is the one home.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .dtypes import dtype_key
from .dtypes import element_size as element_bytes  # the name the counts below read best with

# FLOPs per element of a row softmax, counted as:
#   max (1 compare) + subtract the max (1) + exp (1) + running sum (1) + divide (1)
SOFTMAX_FLOPS_PER_ELEMENT = 5
# FLOPs per element of a layer norm, counted as:
#   mean (1 add) + variance: subtract, square, add (3) + multiply by 1/std (1)
#   + scale and shift by the weight and bias (2)
LAYER_NORM_FLOPS_PER_ELEMENT = 7
# FLOPs per element of the tanh GELU, computed as t / (1 + exp(-2u)):
#   t*t*t (2) + 0.044715 t^3 (1) + t + ... (1) + times 2 sqrt(2/pi) (1) + exp (1)
#   + 1 + exp (1) + divide (1)
GELU_FLOPS_PER_ELEMENT = 8
# SwiGLU, silu(gate) * up = gate / (1 + exp(-gate)) * up: exp, add, divide, multiply.
SWIGLU_FLOPS_PER_ELEMENT = 4
# Residual add + RMSNorm: the add (1) + square and accumulate (2) + times 1/rms (1)
#   + times the weight (1)
RMSNORM_FLOPS_PER_ELEMENT = 5


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


# --------------------------------------------------------------------------------------
# Streaming ops: every element read and written once, a handful of FLOPs on each.
# --------------------------------------------------------------------------------------


def copy(n: int, dtype="fp32") -> Work:
    """``y = x``: read n elements, write n elements, no arithmetic."""
    _positive(n=n)
    s = element_bytes(dtype)
    return Work("copy", f"n={n}", dtype_key(dtype), 0, 2 * n * s, "fp32",
                "read x, write y; 0 FLOP")


def vector_add(n: int, dtype="fp32", n_inputs: int = 2, fmas_per_element: int = 0) -> Work:
    """``c = a + b``: one add per element; read a and b, write c.

    ``n_inputs`` vectors summed take ``n_inputs - 1`` adds and ``n_inputs`` reads per
    element; ``fmas_per_element`` multiply-adds (two FLOPs each, the datasheets'
    convention) may ride along. In place (``A += B``) changes nothing: A is still read,
    B still read, and the result still written back over A. In-place saves memory
    *capacity* (no third buffer), not memory *traffic*.
    """
    _positive(n=n, n_inputs=n_inputs)
    _whole("fmas_per_element", fmas_per_element)
    s = element_bytes(dtype)
    counting = "1 add per element; read a, read b, write c"
    if (n_inputs, fmas_per_element) != (2, 0):
        counting = (f"{n_inputs - 1} add(s) + {fmas_per_element} FMA per element; "
                    f"read {n_inputs} inputs, write 1 output")
    return Work("vector add", f"n={n}", dtype_key(dtype),
                n * (n_inputs - 1 + 2 * fmas_per_element), (n_inputs + 1) * n * s, "fp32",
                counting)


def scale_shift(n: int, dtype="fp32") -> Work:
    """``y = a * x + b`` (lesson 00's first kernel): a multiply and an add per element."""
    _positive(n=n)
    return Work("scale shift", f"n={n}", dtype_key(dtype), 2 * n, 2 * n * element_bytes(dtype),
                "fp32", "1 multiply + 1 add per element; read x, write y")


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


SOFTMAX_VERSIONS = ("naive", "fused", "online")


def softmax(rows: int, cols: int, dtype="fp32", version: str = "fused") -> Work:
    """Softmax over each row. FLOPs per element: see :data:`SOFTMAX_FLOPS_PER_ELEMENT`.

    ``"fused"``: the whole row held on chip, read once, written once. ``"online"``: rows
    too long for that are walked twice (a running max and sum, then the output): read
    twice, written once. ``"naive"``: five PyTorch ops, five kernels; Triton's tutorial
    counts read ``5MN + 2M``, write ``3MN + 2M`` elements.
    """
    _positive(rows=rows, cols=cols)
    s = element_bytes(dtype)
    n = rows * cols
    _known(version, SOFTMAX_VERSIONS)
    count, how = {"fused": (2 * n, "read x once, write y once"),
                  "online": (3 * n, "read x twice, write y once"),
                  "naive": (8 * n + 4 * rows, "5 kernels: read 5MN + 2M, write 3MN + 2M")}[version]
    op = "softmax" if version == "fused" else f"softmax ({version})"
    return Work(op, f"{rows}x{cols}", dtype_key(dtype), SOFTMAX_FLOPS_PER_ELEMENT * n,
                count * s, "fp32", f"{SOFTMAX_FLOPS_PER_ELEMENT} FLOP per element; {how}")


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


def gelu(n: int, dtype="fp32") -> Work:
    """The tanh GELU of every element: read x, write y; :data:`GELU_FLOPS_PER_ELEMENT` each."""
    _positive(n=n)
    return Work("gelu", f"n={n}", dtype_key(dtype), GELU_FLOPS_PER_ELEMENT * n,
                2 * n * element_bytes(dtype), "fp32",
                f"{GELU_FLOPS_PER_ELEMENT} FLOP per element; read x, write y")


def fma_chain(n: int, iters: int, dtype="fp32") -> Work:
    """A copy that does ``iters`` multiply-adds on every element on the way through.

    The bytes of a copy, ``2 iters`` FLOPs per element: sweeping ``iters`` walks an op
    along the roofline's x axis without changing its traffic.
    """
    _positive(n=n)
    _whole("iters", iters)
    return Work("fma chain", f"n={n}, {iters} FMA", dtype_key(dtype), 2 * iters * n,
                2 * n * element_bytes(dtype), "fp32",
                f"{iters} multiply-adds (2 FLOP each) per element; read x, write y")


def bias_add(rows: int, cols: int, dtype="fp32") -> Work:
    """``x + bias``, the bias (``cols`` values) broadcast down the rows.

    Read x, write y, read the bias once: every row shares it, and after the first rows
    it comes from cache.
    """
    _positive(rows=rows, cols=cols)
    n = rows * cols
    return Work("bias add", f"{rows}x{cols}", dtype_key(dtype), n,
                (2 * n + cols) * element_bytes(dtype), "fp32",
                "1 add per element; read x and the bias, write y")


ELEMENTWISE_VERSIONS = ("unfused", "fused")


def bias_gelu(rows: int, cols: int, dtype="fp32", version: str = "fused") -> Work:
    """``gelu(x + bias)``: the same FLOPs fused or not, half the bytes fused.

    ``"unfused"``: two kernels (PyTorch eager, or lesson 01's ``bias_add`` then ``gelu``):
    the add reads x and the bias and writes t, GELU reads t back and writes y,
    ``4MN + N`` elements. ``"fused"``: t stays in registers, ``2MN + N``.
    """
    _positive(rows=rows, cols=cols)
    _known(version, ELEMENTWISE_VERSIONS)
    n = rows * cols
    elements = 2 * n + cols if version == "fused" else 4 * n + cols
    how = ("read x and the bias, write y" if version == "fused" else
           "2 kernels: t = x + bias written to DRAM and read back")
    return Work(f"bias + gelu ({version})", f"{rows}x{cols}", dtype_key(dtype),
                (GELU_FLOPS_PER_ELEMENT + 1) * n, elements * element_bytes(dtype), "fp32",
                f"{GELU_FLOPS_PER_ELEMENT + 1} FLOP per element; {how}")


def swiglu(rows: int, cols: int, dtype="fp32", version: str = "fused") -> Work:
    """``silu(gate) * up``: ``"unfused"`` (SiLU, then the product) moves ``5MN``
    elements, ``"fused"`` ``3MN`` (read gate and up, write y)."""
    _positive(rows=rows, cols=cols)
    _known(version, ELEMENTWISE_VERSIONS)
    n = rows * cols
    elements = 3 * n if version == "fused" else 5 * n
    how = ("read gate and up, write y" if version == "fused" else
           "2 kernels: silu(gate) written to DRAM and read back")
    return Work(f"swiglu ({version})", f"{rows}x{cols}", dtype_key(dtype),
                SWIGLU_FLOPS_PER_ELEMENT * n, elements * element_bytes(dtype), "fp32",
                f"{SWIGLU_FLOPS_PER_ELEMENT} FLOP per element; {how}")


RMSNORM_VERSIONS = ("eager", "torch", "fused")


def residual_rmsnorm_eager_kernels(rows: int, cols: int, dtype) -> list[tuple[str, int, int]]:
    """``(op, bytes read, bytes written)`` of each kernel of the eager residual + RMSNorm
    (:func:`helpers.kernels.rmsnorm.residual_rmsnorm_eager`).

    The statistics run in fp32, so ``hf`` is an fp32 copy of ``h``: 4 bytes an element.
    For fp32 inputs the two ``.to()`` conversions are no-ops and launch nothing.
    """
    _positive(rows=rows, cols=cols)
    s, f = element_bytes(dtype), 4
    m, n = rows, cols
    mn = m * n
    fp32 = dtype_key(dtype) == "fp32"
    ops = [("h = x + residual", 2 * mn * s, mn * s)]
    if not fp32:
        ops.append(("hf = h.to(float32)", mn * s, mn * f))
    ops += [
        ("hf.pow(2)", mn * f, mn * f),
        (".mean(-1)", mn * f, m * f),
        ("variance + eps", m * f, m * f),
        ("torch.rsqrt", m * f, m * f),
        ("hf * rsqrt", mn * f + m * f, mn * f),
    ]
    if not fp32:
        ops.append(("hf.to(x.dtype)", mn * f, mn * s))
    ops.append(("weight * ...", n * s + mn * s, mn * s))
    return ops


def residual_rmsnorm(rows: int, cols: int, dtype="fp32", version: str = "fused") -> Work:
    """Residual add + RMSNorm, ``h = x + residual``, ``y = rmsnorm(h) * weight``.

    Both h and y are outputs. ``"fused"``: read x and residual, write h and y, read the
    weight once: ``4MN + N`` elements, the least possible. ``"torch"``: the add, then
    PyTorch's fused ``F.rms_norm``, so h is written and read back: ``5MN + N``.
    ``"eager"``: nine kernels with fp32 intermediates, summed from
    :func:`residual_rmsnorm_eager_kernels`.
    """
    _positive(rows=rows, cols=cols)
    _known(version, RMSNORM_VERSIONS)
    s = element_bytes(dtype)
    mn = rows * cols
    if version == "eager":
        nbytes = sum(r + w for _, r, w in residual_rmsnorm_eager_kernels(rows, cols, dtype))
        how = "9 kernels, fp32 intermediates"
    elif version == "torch":
        nbytes = 3 * mn * s + (mn * s + cols * s) + mn * s   # add; then read h + weight, write y
        how = "add, then F.rms_norm: h written and read back"
    else:
        nbytes = 4 * mn * s + cols * s                       # read x, residual; write h, y; weight
        how = "read x and residual, write h and y, read the weight once"
    return Work(f"residual + rmsnorm ({version})", f"{rows}x{cols}", dtype_key(dtype),
                RMSNORM_FLOPS_PER_ELEMENT * mn, nbytes, "fp32",
                f"{RMSNORM_FLOPS_PER_ELEMENT} FLOP per element; {how}")


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


def tile_intensity(block_m: int, block_n: int, block_k: int, dtype) -> float:
    """FLOPs per byte one matmul program loads, one K step at a time.

    Each step loads a ``block_m x block_k`` tile of A and a ``block_k x block_n`` tile of
    B and does ``2 block_m block_n block_k`` FLOPs with them: ``2 block_m block_n /
    ((block_m + block_n) s)`` FLOP/byte, whatever ``block_k``. A square tile of side B
    uses each loaded value for B/2 multiply-adds: B/2 FLOP/byte in fp16. Bigger tiles,
    more reuse.
    """
    s = element_bytes(dtype)
    return 2 * block_m * block_n * block_k / ((block_m * block_k + block_k * block_n) * s)


def sram_bytes(block_m: int, block_n: int, block_k: int, dtype, num_stages: int = 1) -> int:
    """Shared memory one matmul program needs for its A and B tiles: one buffer per stage.

    The model counts the operand buffers only. The compiler may add a staging buffer
    for the output tile or reuse the operand buffers for it; the recorded GPU run
    compares this model with what the compiler reports.
    """
    return max(1, num_stages) * (block_m * block_k + block_k * block_n) * element_bytes(dtype)


def accumulator_bytes(block_m: int, block_n: int) -> int:
    """Registers holding one matmul program's fp32 accumulator tile."""
    return block_m * block_n * 4


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


ATTENTION_VERSIONS, ATTENTION_PASSES = ("naive", "flash"), ("forward", "backward")


def attention(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, dtype="bf16",
              causal=False, version="flash", pass_="forward", kv_heads=None) -> Work:
    """One pass of multi-head attention as FlashAttention's and PyTorch's benchmarks count it,
    one count for all versions: matmul FLOPs only (softmax's ~5 per score, 1-2 % at d = 64..128,
    left out). Forward ``4 B H Nq Nk d``: S = QK^T, O = PV. Backward 2.5 times that, five
    matmuls: S again (P is not kept), dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q.
    ``causal`` halves both, the field's convention (the mask keeps N (N+1)/2 of N^2 pairs).
    Bytes: ``"flash"`` the compulsory traffic (re-reads of tiles left to L2), ``"naive"``
    every kernel's inputs and outputs (listed in the comments)."""
    _positive(batch=batch, heads=heads, seq_q=seq_q, seq_k=seq_k, head_dim=head_dim)
    _known(version, ATTENTION_VERSIONS)
    _known(pass_, ATTENTION_PASSES)
    if heads % (kvh := kv_heads or heads):
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kvh})")
    s, key, fwd = element_bytes(dtype), dtype_key(dtype), pass_ == "forward"
    rows, m, kv = batch * heads * seq_q, seq_q * seq_k, batch * kvh * seq_k * head_dim * s
    n, q, e = rows * seq_k, rows * head_dim * s, kv * heads // kvh  # scores; Q; K for each head
    if version == "flash":  # read Q, K, V, write O, lse (fp32); backward: read Q, K, V, O, dO,
        # lse, write dQ, dK, dV, and write and read delta = rowsum(dO * O) (fp32)
        nbytes = 2 * q + 2 * kv + 4 * rows if fwd else 4 * q + 4 * kv + 12 * rows
    else:
        c = key != "fp32"                                   # .float(), .to(): no-ops in fp32
        # forward: QK^T, * scale, [.float()], softmax, [.to()], PV. backward: P^T dO, dO V^T,
        # [.float()], softmax backward (reads dP and P), [.to()], * scale, dS^T Q, dS K
        per_score = s * (4 + 2 * c) + 4 * (2 + 2 * c) if fwd else s * (6 + 2 * c) + 4 * (3 + 2 * c)
        # causal: masked_fill of S or dS; the forward first makes the mask (2 aranges, <=, ~)
        mask = 2 * n * s + (4 * m + 16 * (seq_q + seq_k) if fwd else m)
        nbytes = (2 if fwd else 4) * (q + e) + n * per_score + causal * mask \
            + (2 * (kv + e) if kvh != heads else 0)  # fewer K, V heads: copied, dK, dV summed
    mm = 2 if fwd else 5                             # S, O; then S again, dV, dP, dQ, dK
    return Work(f"attention {pass_} ({version})", f"B={batch} H={heads}/{kvh} Nq={seq_q} "
                f"Nk={seq_k} d={head_dim}{' causal' if causal else ''}", key,
                mm * 2 * n * head_dim // (2 if causal else 1), nbytes, key,
                f"{mm} matmuls{', halved' if causal else ''}")


def table(works) -> str:
    """A fixed-width text table of several :class:`Work` (deterministic, for notebooks)."""
    header = f"{'op':<26}{'shape':<28}{'dtype':<6}{'GFLOP':>12}{'MB':>12}{'FLOP/B':>10}"
    lines = [header, "-" * len(header)]
    for w in works:
        lines.append(f"{w.op:<26}{w.shape:<28}{w.dtype:<6}{w.flops / 1e9:>12.4g}"
                     f"{w.nbytes / 1e6:>12.4g}{w.intensity:>10.3g}")
    return "\n".join(lines)

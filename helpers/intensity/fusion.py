"""Row ops and fused epilogues (lesson 05): softmax, layer norm, bias + GELU, SwiGLU, residual
+ RMSNorm. ``version`` names what is counted: the fused kernel, or the unfused kernels
that write an intermediate to DRAM and read it back."""

from __future__ import annotations

from ..dtypes import dtype_key
from ..dtypes import element_size as element_bytes
from .elementwise import GELU_FLOPS_PER_ELEMENT
from .work import Work, _known, _positive


# FLOPs per element of a row softmax, counted as:
#   max (1 compare) + subtract the max (1) + exp (1) + running sum (1) + divide (1)
SOFTMAX_FLOPS_PER_ELEMENT = 5


# FLOPs per element of a layer norm, counted as:
#   mean (1 add) + variance: subtract, square, add (3) + multiply by 1/std (1)
#   + scale and shift by the weight and bias (2)
LAYER_NORM_FLOPS_PER_ELEMENT = 7


# SwiGLU, silu(gate) * up = gate / (1 + exp(-gate)) * up: exp, add, divide, multiply.
SWIGLU_FLOPS_PER_ELEMENT = 4


# Residual add + RMSNorm: the add (1) + square and accumulate (2) + times 1/rms (1)
#   + times the weight (1)
RMSNORM_FLOPS_PER_ELEMENT = 5


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

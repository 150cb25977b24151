"""Streaming ops (lessons 01-03): every element read and written once, a handful of FLOPs on
each. Their intensity is a small constant: they sit far left of any ridge point."""

from __future__ import annotations

from ..dtypes import dtype_key
from ..dtypes import element_size as element_bytes  # the name the counts below read best with
from .work import Work, _positive, _whole


# FLOPs per element of the tanh GELU, computed as t / (1 + exp(-2u)):
#   t*t*t (2) + 0.044715 t^3 (1) + t + ... (1) + times 2 sqrt(2/pi) (1) + exp (1)
#   + 1 + exp (1) + divide (1)
GELU_FLOPS_PER_ELEMENT = 8


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

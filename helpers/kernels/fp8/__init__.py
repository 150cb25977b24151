"""Eight-bit floats on Hopper: formats, scales, quantisation and scaled matmuls.

Read top to bottom:

* :mod:`~helpers.kernels.fp8.formats`: e4m3 and e5m2, their range and spacing; the
  scaling granularities (per tensor, per row, 1 x 128, 128 x 128) and the spec of
  quantisation, :func:`quantize_reference`.
* :mod:`~helpers.kernels.fp8.quantize`: the quantisation kernels, :func:`quantize` (and
  :func:`quantize_delayed`, per tensor with a scale chosen from earlier steps).
* :mod:`~helpers.kernels.fp8.matmul`: the scaled FP8 matmul, :func:`scaled_matmul`
  (scales per tensor or per row in the epilogue, per 128-block of K inside the loop, and
  the promotion of the tensor cores' partial sums into fp32), and its float64 spec.
"""

from .formats import (
                      E4M3,
                      E5M2,
                      FORMATS,
                      GRANULARITIES,
                      Format,
                      dequantize,
                      format_of,
                      group_shape,
                      quantize_reference,
                      scale_shape,
)
from .matmul import GRANULARITY_OF, SCALINGS, scaled_matmul, scaled_matmul_reference
from .quantize import quantize, quantize_delayed

__all__ = ["E4M3", "E5M2", "FORMATS", "GRANULARITIES", "Format", "dequantize", "format_of",
           "group_shape", "quantize_reference", "scale_shape", "quantize", "quantize_delayed",
           "GRANULARITY_OF", "SCALINGS", "scaled_matmul", "scaled_matmul_reference"]

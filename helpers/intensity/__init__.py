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
of :mod:`helpers.kernels` hold no counts of their own: this package is the one home, one
module per topic, each importing only :mod:`helpers.dtypes`, so that kernels, exercises,
plots and grading may all use it:

* :mod:`.work`: :class:`Work` and the checks every count shares;
* :mod:`.elementwise`: streaming ops (lessons 01-03);
* :mod:`.fusion`: row ops and fused epilogues (lesson 05);
* :mod:`.matmuls`: matrix products and tile formulas (lessons 04 and 07);
* :mod:`.attention_passes`: attention, forward and backward (lesson 06);
* :mod:`.moe`: a Mixture-of-Experts layer's experts, padding and all-to-all (lesson 08).

Every count is also a name of this package (``intensity.matmul(...)``). The modules of
matrix products and attention are named ``matmuls`` and ``attention_passes``, not after
the functions ``matmul`` and ``attention``, so that a module never hides a count.
"""

from __future__ import annotations

from ..dtypes import element_size as element_bytes  # noqa: F401 (the counts' name for it)
from .work import Work, table  # noqa: F401
from .elementwise import (  # noqa: F401
    GELU_FLOPS_PER_ELEMENT, copy, vector_add, scale_shift, axpy, row_sum, gelu, fma_chain,
    bias_add)
from .fusion import (  # noqa: F401
    SOFTMAX_FLOPS_PER_ELEMENT, LAYER_NORM_FLOPS_PER_ELEMENT, SWIGLU_FLOPS_PER_ELEMENT,
    RMSNORM_FLOPS_PER_ELEMENT, SOFTMAX_VERSIONS, softmax, layer_norm, ELEMENTWISE_VERSIONS,
    bias_gelu, swiglu, RMSNORM_VERSIONS, residual_rmsnorm_eager_kernels, residual_rmsnorm)
from .matmuls import (  # noqa: F401
    matmul, tile_intensity, sram_bytes, accumulator_bytes)
from .attention_passes import (  # noqa: F401
    attention_materialised, attention_tiled, ATTENTION_VERSIONS, attention, ATTENTION_PASSES)
from .moe import (  # noqa: F401
    expert_flops, active_fraction, tiles_per_expert, padding_rows, bytes_sent_per_rank,
    bytes_sent_per_rank_dedup, remote_ranks_per_token, exchange_ms)

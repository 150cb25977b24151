"""How close does a vector add get to the datasheet bandwidth? Measured, next to torch.add.

Two sweeps, both fp16 and fp32, the course's Triton kernel and ``torch.add`` timed one
after the other in this process (same inputs, same preallocated output):

* **sizes**: 2^12 to 2^28 elements. Small vectors are latency-bound (a launch costs a
  few microseconds whatever the size); from tens of MB up the time is bytes / bandwidth.
* **block sizes** at the largest size: how many elements one program handles.

A third sweep times the fused variant, **axpy with a cast** (``z = alpha * x + y``, x fp16,
y and z fp32; :func:`helpers.kernels.vector_add.axpy`), over the same sizes, beside
``torch.add(y, x, alpha=alpha)``: the reference run that assignment 03's predicted time
and its fused kernel's bandwidth are checked against.

Achieved bandwidth counts the bytes the op must move (read A, read B, write C), never
what the hardware may move on top (ECC, refresh, partial cache lines).
"""

from __future__ import annotations

import torch

from .. import bench, hardware, intensity, runtime
from ..dtypes import torch_dtype
from ..kernels import vector_add as va
from . import experiment

SIZES = tuple(2**k for k in range(12, 29, 2))          # 4 Ki ... 256 Mi elements
BLOCK_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192)
DTYPES = ("fp16", "fp32")
BIG = 2**28
AXPY_ALPHA = -0.01          # any value times the same; this one reads as a learning rate
AXPY_DTYPE = "fp16 x, fp32 y"


def time_pair(n: int, dtype: str, block_size: int | None = None, fn=None) -> dict:
    """Time a vector add and ``torch.add`` on the same ``n``-element inputs, one after the other.

    ``fn(a, b) -> c`` is the add to time (a learner's launcher, say); by default the
    course's kernel writing into a preallocated ``c`` with ``block_size`` elements per
    program. Each result is checked against ``a + b`` before anything is timed.
    """
    dt = torch_dtype(dtype)
    a = torch.randn(n, device="cuda", dtype=dt)
    b = torch.randn(n, device="cuda", dtype=dt)
    c = torch.empty_like(a)
    block = block_size or va.DEFAULT_BLOCK_SIZE
    if fn is None:
        def fn(a, b):
            return va.add(a, b, c, block_size=block)

        def reference(a, b):
            return torch.add(a, b, out=c)
    else:
        block = block_size

        def reference(a, b):
            return torch.add(a, b)
    if not torch.equal(fn(a, b), a + b):
        raise AssertionError(f"vector add is wrong at n={n}, {dtype}, block {block}")
    nbytes = intensity.vector_add(n, dt).nbytes
    triton_ms = bench.time_ms(lambda: fn(a, b))
    torch_ms = bench.time_ms(lambda: reference(a, b))
    return {"dtype": dtype, "n": n, "block_size": block, "bytes": nbytes,
            "triton_ms": triton_ms, "torch_ms": torch_ms,
            "triton_gbps": bench.gbps(nbytes, triton_ms), "torch_gbps": bench.gbps(nbytes, torch_ms)}


def sweep(fn, sizes=SIZES, dtypes=DTYPES) -> list[dict]:
    """``time_pair`` over sizes and dtypes for a launcher ``fn(a, b) -> c`` (GPU mode)."""
    runtime.require_gpu("timing a vector add")
    return [time_pair(n, dt, fn=fn) for dt in dtypes for n in sizes]


def axpy_bytes(x: torch.Tensor, y: torch.Tensor) -> int:
    """What axpy must move: read x and y once, write z (y's dtype) once."""
    return x.numel() * x.element_size() + 2 * y.numel() * y.element_size()


def time_axpy(n: int, block_size: int | None = None, fn=None) -> dict:
    """Time the fused axpy (x fp16, y fp32) and ``torch.add(y, x, alpha=...)`` on the same
    ``n``-element inputs, one after the other; ``fn(x, y) -> z`` is the axpy to time (a
    learner's, with alpha ``AXPY_ALPHA``), by default the course's into a preallocated z."""
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = torch.randn(n, device="cuda", dtype=torch.float32)
    z = torch.empty_like(y)
    block = block_size or va.DEFAULT_BLOCK_SIZE
    if fn is None:
        def fn(x, y):
            return va.axpy(x, y, AXPY_ALPHA, z, block_size=block)

        def reference(x, y):
            return torch.add(y, x, alpha=AXPY_ALPHA, out=z)
    else:
        block = block_size

        def reference(x, y):
            return torch.add(y, x, alpha=AXPY_ALPHA)
    want = va.axpy_reference(x, y, AXPY_ALPHA)
    if not torch.allclose(fn(x, y), want, atol=1e-6, rtol=1e-6):
        raise AssertionError(f"axpy is wrong at n={n}, block {block}")
    nbytes = axpy_bytes(x, y)
    triton_ms = bench.time_ms(lambda: fn(x, y))
    torch_ms = bench.time_ms(lambda: reference(x, y))
    return {"dtype": AXPY_DTYPE, "n": n, "block_size": block, "bytes": nbytes,
            "alpha": AXPY_ALPHA, "triton_ms": triton_ms, "torch_ms": torch_ms,
            "triton_gbps": bench.gbps(nbytes, triton_ms), "torch_gbps": bench.gbps(nbytes, torch_ms)}


@experiment("vector_add")
def vector_add(sizes=SIZES, block_sizes=BLOCK_SIZES, dtypes=DTYPES, big: int = BIG) -> dict:
    spec = hardware.current_gpu()
    peak = spec.hbm_bandwidth_gbs if spec else None

    def with_fractions(row: dict) -> dict:
        if peak:
            row["triton_fraction"] = row["triton_gbps"] / peak
            row["torch_fraction"] = row["torch_gbps"] / peak
        return row

    by_size = [with_fractions(time_pair(n, dt)) for dt in dtypes for n in sizes]
    by_block = [with_fractions(time_pair(big, dt, block)) for dt in dtypes for block in block_sizes]
    fused = [with_fractions(time_axpy(n)) for n in sizes]
    torch.cuda.empty_cache()
    out = {
        "sizes": by_size,
        "blocks": by_block,
        # The fused variant (axpy with a cast), same sizes; "dtype" says the mix.
        "axpy": fused,
        "big_n": big,
        "default_block_size": va.DEFAULT_BLOCK_SIZE,
        # The practical ceiling of any streaming kernel on this GPU, for comparison.
        "copy": bench.measure_copy_bandwidth(),
    }
    if spec is not None:
        out["table"] = {"key": spec.key, "name": spec.name, "hbm_bandwidth_gbs": peak,
                        "peak_tflops": dict(spec.peak_tflops)}
    return out

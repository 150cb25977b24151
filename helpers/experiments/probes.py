"""The two ceilings of the GPU in hand: copy bandwidth and matrix-multiply throughput."""

from __future__ import annotations

import torch

from .. import bench, hardware
from . import experiment


@experiment("probes")
def probes() -> dict:
    copy = bench.measure_copy_bandwidth()
    matmuls = [bench.measure_matmul_tflops(8192, dtype)
               for dtype in (torch.bfloat16, torch.float16)]
    spec = hardware.current_gpu()
    out = {"copy": copy, "matmul": matmuls}
    if spec is not None:
        out["table"] = {"key": spec.key, "hbm_bandwidth_gbs": spec.hbm_bandwidth_gbs,
                        "peak_tflops": dict(spec.peak_tflops)}
    return out

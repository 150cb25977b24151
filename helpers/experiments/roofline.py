"""Lesson 02's measurements: common ops placed on the roofline of the GPU in hand.

Each point is a real op timed through PyTorch (cuBLAS for matrix products, PyTorch's own
kernels otherwise, FlashAttention through ``scaled_dot_product_attention``), with its
FLOPs and bytes counted by :mod:`helpers.intensity`. The point's height is napkin FLOPs divided by
measured time, so an op sits exactly on the roof only if it moves no more bytes
than the napkin count and runs at the datasheet's speed.

Three regimes, each with examples:

* memory-bound: vector add, axpy, softmax, layer norm, materialised attention;
* compute-bound: large matrix products, tiled (flash) attention;
* latency-bound: the same ops at sizes so small that launching them costs more
  than the work (``launch_floor_us`` is the smallest time any launch took).

``measured_roof`` holds the ceilings as measured here: a 1 GiB device copy for the
memory slope and an 8192-cubed bf16 matrix product for the flat roof.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import bench, hardware, intensity, prediction, roofline
from . import experiment

STREAM_N = 2**28
TINY_N = 2**12
ROWS, COLS = 2**15, 2**12
MATMUL_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192)
ATTENTION_HEADS, HEAD_DIM = 32, 128
ATTENTION_SEQS = (1024, 4096)


def _point(name: str, work: intensity.Work, ms: float, spec, regime_hint: str) -> dict:
    point = {"name": name, "work": work.as_dict(), "ms": ms,
             "tflops": bench.tflops(work.flops, ms) if work.flops else 0.0,
             "gbps": bench.gbps(work.nbytes, ms), "example_of": regime_hint}
    if spec is not None:
        roof = roofline.attainable_tflops(work.intensity, spec, work.peak_dtype)
        point["roof_tflops"] = roof
        point["fraction_of_roof"] = point["tflops"] / roof
        point["predicted_ms"] = prediction.predict(work, spec).time_ms
    return point


def _streaming_points(spec) -> list[dict]:
    pts = []
    for n, hint in ((STREAM_N, "memory"), (TINY_N, "latency")):
        a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
        ms = bench.time_ms(lambda: torch.add(a, b, out=c))
        pts.append(_point(f"vector add n=2^{n.bit_length() - 1}", intensity.vector_add(n, "fp32"),
                          ms, spec, hint))
        ms = bench.time_ms(lambda: c.add_(a, alpha=0.5))  # axpy: c = 0.5 * a + c, in place
        pts.append(_point(f"axpy n=2^{n.bit_length() - 1}", intensity.axpy(n, "fp32"),
                          ms, spec, hint))
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    ms = bench.time_ms(lambda: torch.softmax(x, dim=-1))
    pts.append(_point(f"softmax {ROWS}x{COLS}", intensity.softmax(ROWS, COLS, "bf16"), ms, spec,
                      "memory"))
    w = torch.randn(COLS, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(COLS, device="cuda", dtype=torch.bfloat16)
    ms = bench.time_ms(lambda: F.layer_norm(x, (COLS,), w, bias))
    pts.append(_point(f"layer norm {ROWS}x{COLS}", intensity.layer_norm(ROWS, COLS, "bf16"), ms,
                      spec, "memory"))
    return pts


def _matmul_points(spec) -> list[dict]:
    pts = []
    for n in MATMUL_SIZES:
        a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        ms = bench.time_ms(lambda: torch.mm(a, b, out=c))
        work = intensity.matmul(n, n, n, "bf16")
        hint = "latency" if n <= 256 else ("compute" if n >= 2048 else "")
        pts.append(_point(f"matmul {n}^3", work, ms, spec, hint))
    return pts


def _attention_points(spec) -> list[dict]:
    pts = []
    for seq in ATTENTION_SEQS:
        shape = (1, ATTENTION_HEADS, seq, HEAD_DIM)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        q = q * HEAD_DIM**-0.5  # fold the 1/sqrt(d) scale into Q, outside the timing

        def materialised():
            s = torch.matmul(q, k.transpose(-1, -2))  # seq x seq scores -> DRAM
            p = torch.softmax(s, dim=-1)              # read S, write P
            return torch.matmul(p, v)                 # read P again

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            tiled = lambda: F.scaled_dot_product_attention(q, k, v, scale=1.0)  # noqa: E731
            err = (tiled().float() - materialised().float()).abs().max().item()
            if err > 5e-2:
                raise AssertionError(f"flash and materialised attention disagree by {err:.3g}")
            ms_tiled = bench.time_ms(tiled)
        ms_mat = bench.time_ms(materialised)
        pts.append(_point(f"attention materialised seq={seq}",
                          intensity.attention_materialised(ATTENTION_HEADS, seq, HEAD_DIM, "bf16"),
                          ms_mat, spec, "memory"))
        pts.append(_point(f"attention tiled (flash) seq={seq}",
                          intensity.attention_tiled(ATTENTION_HEADS, seq, HEAD_DIM, "bf16"),
                          ms_tiled, spec, "compute"))
    return pts


def _measured_roof(matmul_points) -> dict:
    x = torch.randn(STREAM_N, device="cuda")
    y = torch.empty_like(x)
    ms = bench.time_ms(lambda: y.copy_(x))
    best = max(matmul_points, key=lambda p: p["tflops"])
    return {"copy_gbps": bench.gbps(2 * x.numel() * 4, ms), "copy_bytes": 2 * x.numel() * 4,
            "matmul_tflops_bf16": best["tflops"], "matmul_name": best["name"]}


@experiment("roofline")
def roofline_points() -> dict:
    torch.manual_seed(0)
    spec = hardware.current_gpu()
    points = _streaming_points(spec)
    matmuls = _matmul_points(spec)
    points += matmuls
    points += _attention_points(spec)
    result = {
        "points": points,
        "launch_floor_us": min(p["ms"] for p in points) * 1e3,
        "measured_roof": _measured_roof(matmuls),
    }
    if spec is not None:
        result["table"] = {"key": spec.key, "hbm_bandwidth_gbs": spec.hbm_bandwidth_gbs,
                           "peak_tflops": dict(spec.peak_tflops)}
    return result

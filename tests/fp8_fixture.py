"""A made-up ``fp8`` record for the lesson's checks and plots: the shape of
:func:`helpers.experiments.fp8.fp8_experiment`'s results, with invented numbers (never a
measurement; nothing here is written to helpers/records/)."""

from __future__ import annotations

from helpers.records import Record

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
# Invented TFLOP/s per version: FP8 per tensor 1.8x bf16 torch.matmul.
TFLOPS = {"ours, tensor scales": 1260.0, "ours, row scales": 1200.0,
          "ours, block scales": 1150.0, "ours, tensor scales, promoted every 128": 1050.0,
          "ours, pointer kernel, tensor scales": 900.0, "torch._scaled_mm, tensor scales": 1200.0,
          "torch._scaled_mm, row scales": 1150.0, "torch.matmul, bf16": 700.0,
          "course matmul, bf16": 690.0}


def _version(name, tflops, shape):
    M, N, K = shape
    ms = 2 * M * N * K / (tflops * 1e9)
    return {"name": name, "ms": ms, "ms_min": ms, "ms_max": ms, "runs": [ms], "tflops": tflops}


def accuracy_table(worst: dict | None = None) -> list[dict]:
    """Five outlier sizes; at the largest, the errors ``worst`` (default: block best)."""
    worst = worst or {"tensor": 0.3, "row": 0.2, "block": 0.1}
    rows = []
    for s in (1.0, 1e2, 1e3, 1e4, 1e5):
        base = {"tensor": 0.04, "row": 0.04, "block": 0.04} if s < 1e5 else worst
        errors = {"bf16 operands": 0.002, "tensor": base["tensor"], "tensor, promoted":
                  base["tensor"], "row": base["row"], "row, promoted": base["row"],
                  "block": base["block"]}
        rows.append({"outlier_scale": s, "shape": [64, 64, 512], "errors": errors})
    return rows


def record(never=None, tflops=None) -> Record:
    """The made-up record. ``never``: the unpromoted error over the promoted one at the
    largest K, per sign pattern (default: positive signs worse)."""
    never = never or {"mixed": 5.0, "positive": 100.0}
    tflops = {**TFLOPS, **(tflops or {})}
    accumulation = []
    for signs in ("mixed", "positive"):
        for K in (1024, 65536):
            grow = never[signs] if K == 65536 else 1.0
            accumulation.append({"K": K, "signs": signs, "shape": [512, 512, K],
                                 "errors": {"block scales": 1e-6, "never promoted": 1e-6 * grow,
                                            "promoted every 128": 1e-6}})
    speed = [{"shape": list(s), "drawn": False,
              "versions": [_version(n, t, s) for n, t in tflops.items()]} for s in SHAPES]
    speed[1]["versions"][-1] = {"name": "course matmul, bf16", "error": "made-up failure"}
    quantize = {"shape": [8192, 8192], "copy": {"ms": 0.1, "gbps": 2800.0}}
    for g, gbps in (("tensor", 1400.0), ("row", 1500.0), ("1x128", 2500.0), ("128x128", 2400.0)):
        quantize[g] = {"ms": 0.1, "bytes": 3 * 8192 * 8192, "gbps": gbps}
    results = {"config": {"smoke": False, "shapes": SHAPES, "seed": 1, "drawn": [],
                          "promote_every": 128, "outlier_channels": 4,
                          "outlier_scales": [1.0, 1e2, 1e3, 1e4, 1e5], "rounds": 3},
               "device": {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132},
               "accuracy": accuracy_table(), "accumulation": accumulation, "speed": speed,
               "quantize": quantize, "seconds": 1.0}
    provenance = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_key": "H100-SXM", "date": "made up",
                  "torch": "-", "triton": "-"}
    return Record("fp8", provenance, results)

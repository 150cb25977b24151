"""Probe: does a 256-wide tile lift the block-scaled FP8 matmul toward the per-tensor one?

Lesson 09's block-scaled kernel (DeepSeek-V3's 1 x 128 and 128 x 128 scales) reads 0.68x of
the per-tensor kernel on an H200, and neither Triton's warp specialisation nor a Gluon
ping-pong closed the gap (``tests/gpu/fp8_block_pingpong.py``: the FMA a K block needs
was overlapped there, and the time stayed). What the two kernels also differ in is the
tile: block scales allowed only 128 x 128 (B's scale is one number per 128 columns), the
per-tensor kernel runs 128 x 256. A 128 x 128 FP8 tile asks L2 for 32 KiB per 4.2 MFLOP;
at 862 TFLOP/s (the block kernel's H200 figure at 8192^3) that is 6.7 TB/s, about what the
per-tensor kernel's 128 x 256 tiles pull at 1,313 TFLOP/s (48 KiB per 8.4 MFLOP: 7.7 TB/s).
If operand traffic from L2 is the limit, a 128 x 256 block-scaled tile (two B boxes of 128
rows, two accumulators, each half with its own block scale: ``b_box_rows`` in
:mod:`helpers.kernels.fp8.persistent`) can go about 1.33x faster per byte.

Compiled locally for sm_90 (Triton 3.7.1, ptxas -v), 128 x 256 with 8 warps took 255
registers and spilled 164 bytes (3 stages); 16 warps, 128 registers and 144 bytes; the
128 x 128 kernel 170 registers and no spill. Only the GPU can say whether that costs more
than the traffic saves.

    PYTHONPATH=$PWD python3 tests/gpu/fp8_block_wide_probe.py    # $OUT/fp8_block_wide.json
"""
import json
import os

import torch

from helpers import bench
from helpers.kernels import fp8

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 14336, 4096), (8192, 4096, 14336)]
WIDE = {f"block 128x256 w{w} s{s}": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128,
                                     "GROUP_M": 8, "FLATTEN": False, "num_warps": w,
                                     "num_stages": s}
        for w, s in ((8, 3), (8, 4), (16, 3), (16, 4))}

rows = []
for M, N, K in SHAPES:
    x = torch.randn(M, K, device="cuda")
    w = torch.randn(N, K, device="cuda") / K ** 0.5
    (a, a_s), (b, b_s) = fp8.quantize(x, "tensor"), fp8.quantize(w, "tensor")
    (ab, ab_s), (bb, bb_s) = fp8.quantize(x, "1x128"), fp8.quantize(w, "128x128")
    want = fp8.scaled_matmul_reference(ab, bb, ab_s, bb_s, "block").float()
    fns = {"tensor (tuned)": lambda: fp8.scaled_matmul(a, b, a_s, b_s, "tensor"),
           "block (tuned)": lambda: fp8.scaled_matmul(ab, bb, ab_s, bb_s, "block")}
    errors = {}
    for name, setting in WIDE.items():
        try:
            c = fp8.scaled_matmul(ab, bb, ab_s, bb_s, "block", setting=setting,
                                  kernel="persistent")
            errors[name] = float((c.float() - want).abs().max() / want.abs().max())
            fns[name] = (lambda s=setting: fp8.scaled_matmul(ab, bb, ab_s, bb_s, "block",
                                                             setting=s, kernel="persistent"))
        except Exception as e:  # noqa: BLE001 - a setting that does not compile or fit
            errors[name] = f"{type(e).__name__}: {str(e)[:100]}"
    timed = bench.time_rounds(fns, rounds=3)
    tflops = {n: round(bench.tflops(2 * M * N * K, t["ms"]), 1) for n, t in timed.items()}
    print(f"{M}x{N}x{K}", json.dumps(tflops), flush=True)
    print("    relative errors / failures:", errors, flush=True)
    rows.append({"shape": [M, N, K], "tflops": tflops, "errors": errors})
with open(os.path.join(os.environ.get("OUT", "."), "fp8_block_wide.json"), "w") as f:
    json.dump(rows, f, indent=1)

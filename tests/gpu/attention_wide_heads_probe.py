"""Probe: which forward tiles suit heads 192 and 256 wide, inside the tuner's space and out?

The decode record reads d = 192 at 0.75x SDPA's default (cuDNN) and d = 256 at 0.71x /
0.79x (non-causal / causal; 4,096 tokens, batch 4, 16 heads, bf16), under issue 28's
0.80x. The tuner picks from ``tuning.SPACES["forward"]``, a space read off d = 64 and 128.
Here every setting of that space and a few more (smaller key tiles, two stages, 8 warps on
64 rows) run side by side with SDPA's default, in interleaved rounds
(``bench.time_rounds``); a setting that does not compile or fit is reported as such.

    PYTHONPATH=$PWD python3 tests/gpu/attention_wide_heads_probe.py  # $OUT/wide_heads.json
    HEAD_DIMS=192,96 PYTHONPATH=$PWD python3 tests/gpu/attention_wide_heads_probe.py

Read on an H200 (triton 3.6, torch 2.11), TFLOP/s, ours best / SDPA's default (cuDNN):
d = 192, 483.8 / 627.4 non-causal (128 x 64, 8 warps, 3 stages), 423.6 / 550.9 causal;
d = 256, 516.6 / 643.9 (128 x 64, 8 warps, 2 stages, descriptors) and 465.9 / 579.9. The
tuner picked the best setting, or one within 1.5%, in all four; no setting outside its
space came near (128 x 32 with 8 warps next, 9-14% behind), and every wider or deeper
one runs out of shared memory. So the space is not what holds d = 192 at 0.77x and
d = 256 at 0.80x.

The split-head kernel (d = 80, 96, 192) was also tried with each piece of K and V read
through a tensor descriptor of its own (two boxes a tile, each a power of two wide; one
later run): d = 192 462.6 / 407.9 TFLOP/s against the pointers' 459.7 / 404.6, d = 96
410.9 / 354.1 against 424.8 / 367.3, d = 80 365.2 / 323.0 against 396.6 / 342.4. Within
1% at d = 192, slower at 80 and 96: not kept (the commit and its revert are in the
history).
"""
import json
import os

import torch
import torch.nn.functional as F

from helpers import bench, intensity
from helpers.kernels import attention as ak
from helpers.kernels.attention import tuning

EXTRA = ((128, 32, 8, 2), (128, 32, 4, 2), (64, 32, 8, 2), (64, 64, 8, 2), (64, 64, 4, 2),
         (128, 64, 8, 2), (64, 16, 4, 3), (128, 32, 8, 3))
rows = []
for d in (int(x) for x in os.environ.get("HEAD_DIMS", "192,256").split(",")):
    for causal in (False, True):
        g = torch.Generator(device="cuda").manual_seed(d)
        q, k, v = (torch.randn(4, 16, 4096, d, device="cuda", generator=g).bfloat16()
                   for _ in range(3))
        flops = intensity.attention(4, 16, 4096, 4096, d, "bf16", causal=causal).flops
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        runs, failed = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v,
                                                                         is_causal=causal)}, {}
        for setting in tuple(tuning.SPACES["forward"]) + EXTRA:
            tiles = tuning._tiles(setting)
            name = tuning.name_of(tiles)
            if name in runs:
                continue
            try:
                o, _ = ak.flash_attention_forward(q, k, v, causal, **tiles)
                err = float((o.float() - want.float()).abs().max())
                if err > 0.05:
                    failed[name] = f"error {err:.3g}"
                    continue
                runs[name] = (lambda t=tiles: ak.flash_attention_forward(q, k, v, causal, **t))
            except Exception as e:  # noqa: BLE001 - a setting that does not fit: say so
                failed[name] = f"{type(e).__name__}: {str(e)[:80]}"
        ak.flash_attention_forward(q, k, v, causal)          # the tuner's own pick
        chosen = tuning.chosen("forward", q, k, causal)
        timed = bench.time_rounds(runs, rounds=3)
        tflops = {n: round(bench.tflops(flops, t["ms"]), 1) for n, t in timed.items()}
        ranked = sorted(tflops.items(), key=lambda kv: -kv[1])
        row = {"head_dim": d, "causal": causal, "chosen": chosen, "tflops": ranked,
               "failed": failed}
        print(f"d={d} causal={causal} sdpa {tflops['sdpa']} chosen {chosen} "
              f"({tflops.get(chosen)})", flush=True)
        print("   ", ranked[:8], flush=True)
        print("    failed:", failed, flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "wide_heads.json"), "w") as f:
    json.dump(rows, f, indent=1)

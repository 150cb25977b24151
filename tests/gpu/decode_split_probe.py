"""Probe: does the split-KV decode lose its last few percent to a second, partial wave?

``decode_config`` aims at two programs per SM (264 on 132 SMs) and ``split_keys`` rounded
the splits *up* to reach that: at batch 8 with 8 K/V heads (64 pairs), 5 splits, 320
programs, one full wave of 264 and a tail of 56 that stream their keys while most SMs
idle. Rounding down (4 splits, 256 programs, one wave) or splitting finer (many waves, a
small tail) should not pay that. The record read our kernels at 0.96x cuDNN's at batch 8.
``SWEEP=tiles``: the key tile, warps and stages instead, at the default's programs.

For batch 1 and 8, 8k-128k keys, one query, 32 heads on 8 K/V heads, d = 128, bf16: the
kernels' time (torch.profiler, as the record takes it) and a cold-L2 call time
(``do_bench``) of ours with several program targets and tiles, beside SDPA's default.

    PYTHONPATH=$PWD python3 tests/gpu/decode_split_probe.py      # also $OUT/decode_split.json
    SWEEP=tiles BATCHES=8 PYTHONPATH=$PWD python3 tests/gpu/decode_split_probe.py  # tiles

Read on an H200 (triton 3.6, torch 2.11), with the default then rounding up and the
rounded down case passed as ``target_programs``, kernels' us, rounded up / rounded down /
cuDNN: batch 8, 8k keys 70.4 / 66.0 / 65.2, 32k 255.8 / 240.4 / 237.3, 128k 997.4 / 931.2 /
924.9; at batch 1 both rules make the same 256-264 programs (10.6, 36.7, 125.1 us against
cuDNN's 11.0, 36.7, 122.9). One, three or eight programs per SM, 4 stages and 128-key
tiles with 8 warps beat two per SM rounded down by 0.2% at most, anywhere.
``split_keys`` has rounded down since.

The tile sweep (``SWEEP=tiles BATCHES=8``, a later call on an H200), kernels at 8k / 32k /
128k keys against cuDNN's: the default (64 keys, 4 warps, 3 stages) 1.000x / 0.996x /
0.995x; 2 warps 1.001x / 0.995x / 0.998x; 32 keys, 4 stages 0.981x / 0.993x / 0.999x;
128 keys 0.957-0.995x; 8 warps 0.985-0.991x; 2 stages 0.91x. At the HBM roof (4.4-4.5
TB/s of the H200's 4.8 at 32k-128k), every setting that keeps the loads in flight ties.
"""
import json
import os

import torch
import torch.nn.functional as F

from helpers import bench
from helpers.experiments.attention_decode import kernel_us
from helpers.kernels import attention as ak
from helpers.kernels.attention import decode

SMS = torch.cuda.get_device_properties(0).multi_processor_count
results = []
for batch in (int(x) for x in os.environ.get("BATCHES", "1,8").split(",")):
    for keys in (8192, 32768, 131072):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(batch, 32, 1, 128, device="cuda", generator=g).bfloat16()
        k, v = (torch.randn(batch, 8, keys, 128, device="cuda", generator=g).bfloat16()
                for _ in range(2))
        pairs = batch * 8
        base = ak.decode_config(128, q.dtype, q.device)
        cases = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}
        settings = {
            "default (2/SM)": {},
            "1/SM": {"target_programs": pairs * max(1, SMS // pairs)},
            "3/SM": {"target_programs": pairs * max(1, (3 * SMS) // pairs)},
            "8/SM": {"target_programs": 8 * SMS},
            "4 stages": {"num_stages": 4},
            "128 keys w8": {"block_n": 128, "num_warps": 8, "num_stages": 2},
        } if os.environ.get("SWEEP") != "tiles" else {
            "default (2/SM)": {},
            "64 keys w8 s3": {"num_warps": 8},
            "64 keys w4 s2": {"num_stages": 2},
            "128 keys w4 s2": {"block_n": 128, "num_stages": 2},
            "128 keys w4 s3": {"block_n": 128},
            "32 keys w4 s4": {"block_n": 32, "num_stages": 4},
            "64 keys w2 s3": {"num_warps": 2},
        }
        for name, cfg in settings.items():
            cfg = {**base, **cfg}
            cases[name] = (lambda cfg=cfg: ak.flash_decode_forward(q, k, v, "bottom_right",
                                                                     **cfg))
        want = cases["sdpa"]()
        row = {"batch": batch, "keys": keys, "kv_bytes": 2 * k.numel() * 2, "cases": {}}
        for name, fn in cases.items():
            out = fn()
            out = out if name == "sdpa" else out[0]
            err = float((out.float() - want.float()).abs().max())
            us, _ = kernel_us(fn)
            cfg = {**base, **settings.get(name, {})}
            splits = None if name == "sdpa" else decode.split_keys(
                pairs, keys, cfg["block_n"], cfg["target_programs"])[0]
            row["cases"][name] = {"kernel_us": round(us, 1), "splits": splits,
                                  "programs": None if splits is None else splits * pairs,
                                  "err": err}
        timed = bench.time_rounds(cases, rounds=3)
        for name, t in timed.items():
            c = row["cases"][name]
            c["call_us"] = round(t["ms"] * 1e3, 1)
            c["tb_s"] = round(row["kv_bytes"] / (c["kernel_us"] * 1e-6) / 1e12, 2)
        sd = row["cases"]["sdpa"]["kernel_us"]
        print(f"batch {batch} keys {keys}:")
        for name, c in row["cases"].items():
            print(f"  {name:26s} kernels {c['kernel_us']:7.1f} us ({c['tb_s']:.2f} TB/s, "
                  f"{sd / c['kernel_us']:.3f}x sdpa)  call {c['call_us']:7.1f} us  "
                  f"programs {c['programs']}  err {c['err']:.1e}", flush=True)
        results.append(row)
out = os.environ.get("OUT")
if out:
    with open(os.path.join(out, "decode_split.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": results}, f, indent=1)

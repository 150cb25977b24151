"""Probe: the forward on a head two powers of two wide (80 = 64 + 16, 96 = 64 + 32,
192 = 128 + 64), held padded to the next power of two (:mod:`helpers.kernels.attention
.forward`) against split in two pieces that multiply no zeros (:mod:`helpers.kernels
.attention.forward_split`), beside SDPA's default, in one process. The record's shape
(:mod:`helpers.experiments.attention_decode`, head_dims): batch 4, 16 heads, 4,096 tokens,
bf16, causal and not. Each kernel on the table's tiles (the tuner off, so that the pieces are
all that differs), the median of three interleaved do_bench rounds (cold L2).

    PYTHONPATH=$PWD python3 tests/gpu/attention_split_probe.py    # $OUT/attention_split.json
"""
import json
import os
import statistics

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from helpers import intensity
from helpers.kernels import attention as ak
from helpers.kernels.attention import forward as fw
from helpers.kernels.attention import kept, tuning

kept.ENABLED = False    # a kept launch is one kernel's: here each call picks its kernel
tuning.ENABLED = False  # both kernels on the table's tiles: the comparison is the pieces'

BATCH, HEADS, SEQ, ROUNDS = 4, 16, 4096, 3


def ours(split: bool, q, k, v, causal):
    def call():
        fw.SPLIT_HEADS = split
        try:
            return ak.flash_attention_forward(q, k, v, causal)[0]
        finally:
            fw.SPLIT_HEADS = True
    return call


rows = []
for d in (80, 96, 192):
    for causal in (False, True):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(BATCH, HEADS, SEQ, d, device="cuda", generator=g).bfloat16()
                   for _ in range(3))
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                              is_causal=causal)
        fns = {"padded": ours(False, q, k, v, causal), "split": ours(True, q, k, v, causal),
               "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
        errors = {name: float((fn().float() - want).abs().max()) for name, fn in fns.items()}
        times = {name: [] for name in fns}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                times[name].append(do_bench(fn, warmup=25, rep=100))
        flops = intensity.attention(BATCH, HEADS, SEQ, SEQ, d, "bf16", causal=causal).flops
        row = {"d": d, "causal": causal, "error": errors}
        for name, runs in times.items():
            ms = statistics.median(runs)
            row[name] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1)}
        row["split_vs_padded"] = round(row["padded"]["ms"] / row["split"]["ms"], 3)
        row["split_vs_sdpa"] = round(row["sdpa"]["ms"] / row["split"]["ms"], 3)
        row["padded_vs_sdpa"] = round(row["sdpa"]["ms"] / row["padded"]["ms"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "attention_split.json"), "w"),
          indent=1)

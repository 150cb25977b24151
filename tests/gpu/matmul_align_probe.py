"""Probe: would v6 on rows off 16 bytes beat the copy to whole lines if it loaded 8 or 4
bytes a time instead of 2? (Issue 27's unaligned rows: ours 0.47-0.67x padded cuBLAS on an
H200 sample, because the tuned path copies both operands every call.)

v6's heuristics promise ALIGN_A/B/C = 16 bytes or nothing. Here they are replaced, in this
process only, by the largest power of two (up to 16 bytes) that divides the rows' strides,
N and the base addresses, and v6 is autotuned on the operands as given. Timed in
interleaved rounds beside cuBLAS as given, cuBLAS on operands padded once (the record's
baseline) and the course's tuned path as it is.

    PYTHONPATH=$PWD python3 tests/gpu/matmul_align_probe.py     # $OUT/align.json

Run once on an H200 (stop 48): 1.2x to 11.5x slower than the tuned path on 8 of the 10
shapes (1004 x 2666 x 4892: 161.9 us against 78.9; 1681^3: 190.0 against 36.4), 4-7%
faster on the two whose A rows lie on 16 bytes and B's on 8 or 4 (2048 x 4100 x 4096:
127.5 against 136.6), still 0.74-0.78x padded cuBLAS there. So the copy to whole lines
stays; promises for B alone are an untried candidate.
"""
import json
import os

import torch
import triton

from helpers import bench
from helpers.experiments import matmul_shapes as ms
from helpers.kernels.matmul import matmul
from helpers.kernels.matmul import tuned as mt

SHAPES = [(1004, 2666, 4892), (1681, 1681, 1681), (4581, 4581, 4581), (851, 2686, 7296),
          (265, 634, 455), (2804, 174, 386), (5086, 141, 213), (2048, 4100, 4096),
          (2048, 4096, 4100), (2048, 4098, 4096)]


def widest(ptr: int, esize: int, *sizes: int) -> int:
    """Elements a thread may load at once: the largest power of two up to 16 bytes that
    divides every stride or size given and keeps the base address aligned."""
    v = 16 // esize
    while v > 1 and not (all(s % v == 0 for s in sizes) and ptr % (v * esize) == 0):
        v //= 2
    return v


def partial_a(args):
    a = args["a_ptr"]
    return widest(a.data_ptr(), a.element_size(), args["stride_am"]) \
        if args["stride_ak"] == 1 else 1


def partial_b(args):
    b = args["b_ptr"]
    return widest(b.data_ptr(), b.element_size(), args["stride_bk"], args["N"]) \
        if args["stride_bn"] == 1 else 1


def partial_c(args):
    c = args["c_ptr"]
    return widest(c.data_ptr(), c.element_size(), args["stride_cm"], args["N_C"]) \
        if args["stride_cn"] == 1 else 1


def v6_as_given(a, b):
    """v6, autotuned, on a and b as they are (no copy), with the partial promises."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    ws, locks = mt._scratch_for(a, M, N, K, mt.CONFIG_SPACE)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),
                meta["SPLIT_K"])

    mt.matmul_kernel_v6_tuned[grid](a, b, c, ws, locks, M, N, K, N, *a.stride(), *b.stride(),
                                    *c.stride(), *mt.shape_key(M, N, K))
    return c


rows = []
for M, N, K in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    want = a.float() @ b.float()
    scale = want.abs().max().item()
    row = {"shape": [M, N, K], "align": [partial_a({"a_ptr": a, "stride_am": K, "stride_ak": 1}),
                                         partial_b({"b_ptr": b, "stride_bk": N, "N": N,
                                                    "stride_bn": 1})]}
    a_p, b_p = ms.padded_operands(a, b)
    matmul(a, b)                                          # the tuned path, as it is
    row["tuned_choice"] = {k: v for k, v in (mt.last_choice(a, b) or {}).items()
                           if k in ("kernel", "layout", "config")}
    saved = dict(mt.matmul_kernel_v6_fixed.values)
    mt.matmul_kernel_v6_fixed.values.update(ALIGN_A=partial_a, ALIGN_B=partial_b,
                                            ALIGN_C=partial_c)
    keep_on_disk = mt.matmul_kernel_v6_tuned.cache_results
    mt.matmul_kernel_v6_tuned.cache_results = False         # a choice made for 2-byte loads
    try:
        mt.matmul_kernel_v6_tuned.cache.clear()           # tune afresh with the promises
        row["partial_error"] = ((v6_as_given(a, b).float() - want).abs().max() / scale).item()
        fns = {"cublas": lambda: a @ b, "cublas_padded": lambda: a_p @ b_p,
               "tuned": lambda: matmul(a, b), "v6_partial": lambda: v6_as_given(a, b)}
        turns = bench.time_rounds(fns, rounds=3)
    finally:
        mt.matmul_kernel_v6_tuned.cache_results = keep_on_disk
        mt.matmul_kernel_v6_fixed.values.update(saved)
        mt.matmul_kernel_v6_tuned.cache.clear()
    for name, spread in turns.items():
        row[f"{name}_us"] = round(spread["ms"] * 1e3, 1)
    best = min(row["cublas_us"], row["cublas_padded_us"])
    row["tuned_vs_best"] = round(best / row["tuned_us"], 3)
    row["partial_vs_best"] = round(best / row["v6_partial_us"], 3)
    print(json.dumps(row), flush=True)
    rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "align.json"), "w"), indent=1)

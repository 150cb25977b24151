"""Probe: lesson 09's FP8 quantisation kernels before and after 5c00b10 (row scales in one
launch without atomics; the per-tensor amax with one atomic a program), on an 8192 x 8192
bf16 tensor, each call timed two ways: ``do_bench`` on the call (host gaps between its
launches count) and ``do_bench`` on a CUDA graph of it (GPU time only).

    git show 7eb2142:helpers/kernels/fp8/quantize.py > helpers/kernels/fp8/quantize_old.py
    PYTHONPATH=$PWD python3 tests/gpu/fp8_quantize_probe.py

Measured on an H200 (triton 3.6, one run), call / graph, us: row 186.6 / 101.6 before,
77.2 / 77.1 after; tensor 169.7 / 104.4 before, 97.6 / 95.2 after; 1 x 128 (unchanged)
70.1 / 58.5; a copy 67.7 / 68.4. Old and new agree bit for bit. The per-tensor amax with
512, 1,024 (kept), 2,048, 4,096 and 8,192 programs: 106.2, 95.2, 95.9, 96.9, 98.1 us (graph).
"""
import importlib

import torch
from triton.testing import do_bench

new = importlib.import_module("helpers.kernels.fp8.quantize")
old = importlib.import_module("helpers.kernels.fp8.quantize_old")

x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
copy = torch.empty_like(x)
moved = x.numel() * 3                       # bf16 read, fp8 written


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return lambda: g.replay()


def show(name, fn, nbytes=moved):
    call = do_bench(fn, warmup=25, rep=200)
    gpu = do_bench(graphed(fn), warmup=25, rep=200)
    print(f"{name:34s} call {call * 1e3:7.1f} us ({nbytes / call / 1e6:6.0f} GB/s)   "
          f"graph {gpu * 1e3:7.1f} us ({nbytes / gpu / 1e6:6.0f} GB/s)", flush=True)


show("copy", lambda: copy.copy_(x), 4 * x.numel())
for g in ("1x128", "128x128", "row", "tensor"):
    q_old, s_old = old.quantize(x, g)
    q_new, s_new = new.quantize(x, g)
    same = torch.equal(s_old, s_new) and torch.equal(q_old.view(torch.uint8),
                                                     q_new.view(torch.uint8))
    print(g, "old and new agree:", same)
    show(f"{g} old", lambda g=g: old.quantize(x, g))
    show(f"{g} new", lambda g=g: new.quantize(x, g))
for programs in (512, 2048, 4096, 8192):
    new.AMAX_PROGRAMS = programs
    show(f"tensor new, {programs} amax programs", lambda: new.quantize(x, "tensor"))

"""Probe: tiles whose width is not a power of two, built from two that are. Can they fill
the waves of lesson 07's tail shapes, as cuBLAS's do?

Triton's block shapes must be powers of two, and lesson 07 says so when its tail shapes
trail cuBLAS. Nsight Compute on an H200 (``tests/gpu/streamk_l2_probe.py``'s docstring)
showed cuBLAS running 448 x 4632 x 5760 on 128 x 160 tiles: 4 x 29 = 116 tiles, one wave
of 132 SMs 88% full, 39.3 us, where the persistent kernel's 128 x 256 tiles make 76 (58%
full, 58.7 us) and 128 x 128 tiles 148 (two waves, the second 12% full). A tile of
128 x (128 + 32) needs no new hardware: two accumulators side by side, two ``tl.dot`` per
K step on the same A box, two B boxes and two C boxes. Each is a power of two; the tile
is not.

:func:`composite_kernel` is the course's persistent TMA kernel
(:mod:`helpers.kernels.matmul.persistent`) with that change and nothing else (no
transposed operands, no flattened loop, no split epilogue, no copy of B). Timed here,
one setting at a time, on the tail shapes of two drawn records' seeds and of one seed
drawn now (shapes the probe has not seen), beside cuBLAS and this same kernel on plain
128 x 256 and 128 x 128 tiles (BN1 = 0); the records' rows give the course's tuned path
on the first two seeds. Expect at 448 x 4632 x 5760, if each SM keeps its pace at 160
columns: 58.7 us x 0.58 / 0.88, about 39 us.

    PYTHONPATH=$PWD python3 tests/gpu/composite_tile_probe.py    # $OUT/composite.json
"""
import json
import os
import random

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from helpers.experiments import matmul_shapes as ms
from helpers.kernels.matmul.ladder import grouped_tile

SEEDS = (1882377512, 465964975)          # the two H200 records' draws


@triton.jit
def composite_kernel(a_desc, b0_desc, b1_desc, c0_desc, c1_desc, M, N, K,
                     BLOCK_M: tl.constexpr, BN0: tl.constexpr, BN1: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    """C tiles of BLOCK_M x (BN0 + BN1): the left BN0 columns in one accumulator, the
    right BN1 in another (BN1 = 0: one accumulator, the plain kernel)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BN0 + BN1)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        row, col = pid_m * BLOCK_M, pid_n * (BN0 + BN1)
        left = tl.zeros((BLOCK_M, BN0), dtype=tl.float32)
        if BN1 > 0:
            right = tl.zeros((BLOCK_M, BN1), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = a_desc.load([row, k])                   # one A box feeds both products
            left = tl.dot(a, b0_desc.load([k, col]), left)
            if BN1 > 0:
                right = tl.dot(a, b1_desc.load([k, col + BN0]), right)
        c0_desc.store([row, col], left.to(c0_desc.dtype))
        if BN1 > 0:
            c1_desc.store([row, col + BN0], right.to(c1_desc.dtype))


def composite(a, b, bm, bn0, bn1, bk=64, warps=8, stages=3, group_m=8):
    """``a @ b`` (row-major, rows on 16 bytes) on tiles of bm x (bn0 + bn1): ``(c, run)``."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    right = max(bn1, 16)                # a descriptor for the unused half must still exist
    descs = (TensorDescriptor(a, [M, K], [K, 1], [bm, bk]),
             TensorDescriptor(b, [K, N], [N, 1], [bk, bn0]),
             TensorDescriptor(b, [K, N], [N, 1], [bk, right]),
             TensorDescriptor(c, [M, N], [N, 1], [bm, bn0]),
             TensorDescriptor(c, [M, N], [N, 1], [bm, right]))
    sms = torch.cuda.get_device_properties(0).multi_processor_count if a.is_cuda else 4
    grid = (min(sms, triton.cdiv(M, bm) * triton.cdiv(N, bn0 + bn1)),)

    def run():
        composite_kernel[grid](*descs, M, N, K, BLOCK_M=bm, BN0=bn0, BN1=bn1, BLOCK_K=bk,
                               GROUP_M=group_m, NUM_SMS=sms, num_warps=warps,
                               num_stages=stages)
        return c
    return run(), run


# (BLOCK_M, BN0, BN1, warps, stages): the plain widths 128 and 256, and 160, 192 built of two.
SETTINGS = [(128, 256, 0, 8, 3), (128, 128, 0, 8, 4), (128, 128, 32, 8, 4),
            (128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 128, 32, 8, 3),
            (64, 128, 32, 4, 5), (64, 128, 64, 4, 5)]


def tails(seed: int, sms: int) -> list:
    return [s for s in ms.draw(seed, sms) if s.family == "tail"]


def main():
    from triton.testing import do_bench
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fresh = random.SystemRandom().randrange(2**31)
    rows = []
    for seed in (*SEEDS, fresh):
        for s in tails(seed, sms):
            dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[s.dtype])
            a = torch.randn(s.M, s.K, device="cuda", dtype=dtype)
            b = torch.randn(s.K, s.N, device="cuda", dtype=dtype)
            if (s.K * a.element_size()) % 16 or (s.N * a.element_size()) % 16:
                continue                        # the TMA needs rows on 16 bytes
            want = a.float() @ b.float()
            row = {"seed": seed, "shape": [s.M, s.N, s.K], "dtype": s.dtype,
                   "cublas_us": do_bench(lambda: a @ b, warmup=25, rep=200) * 1e3, "us": {}}
            for bm, bn0, bn1, w, st in SETTINGS:
                name = f"{bm}x{bn0}+{bn1} w{w} s{st}"
                try:
                    c, run = composite(a, b, bm, bn0, bn1, warps=w, stages=st)
                    err = float((c.float() - want).abs().max() / want.abs().max())
                    if err > 1e-2:
                        row["us"][name] = f"wrong: {err:.1e}"
                        continue
                    tiles = triton.cdiv(s.M, bm) * triton.cdiv(s.N, bn0 + bn1)
                    row["us"][name] = [do_bench(run, warmup=25, rep=200) * 1e3,
                                       round(tiles / sms, 2)]
                except Exception as e:  # noqa: BLE001 - a setting that does not fit
                    row["us"][name] = f"{type(e).__name__}: {str(e)[:80]}"
            timed = {k: v[0] for k, v in row["us"].items() if isinstance(v, list)}
            plains = [v for k, v in timed.items() if k.endswith(("+0 w8 s3", "+0 w8 s4"))]
            if timed and plains:
                best = min(timed, key=timed.get)
                row["best"], row["best_vs_plain"] = best, min(plains) / timed[best]
                row["best_vs_cublas"] = row["cublas_us"] / timed[best]
                print(f"seed {seed} {s.M}x{s.N}x{s.K} {s.dtype}: cuBLAS "
                      f"{row['cublas_us']:.1f} us, plain best {min(plains):.1f}, best {best} "
                      f"{timed[best]:.1f} ({row['best_vs_cublas']:.2f}x cuBLAS)", flush=True)
            else:
                print(f"seed {seed} {s.M}x{s.N}x{s.K}: {row['us']}", flush=True)
            rows.append(row)
            with open(os.path.join(os.environ.get("OUT", "."), "composite.json"), "w") as f:
                json.dump({"fresh_seed": fresh, "sms": sms, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""A development benchmark, not a course kernel: can a warp-specialised Gluon kernel bring
DeepSeek-V3's block-scaled FP8 matmul (1 x 128 scales of A, 128 x 128 of B) near the
per-tensor kernel's speed on Hopper? Lesson 09's goal is 0.9x; its Triton kernel
(:mod:`helpers.kernels.fp8.persistent`) reads 0.64x on an H100 and 0.68x on an H200.

Why the Triton kernel waits: block k's product must leave the tensor cores before its scales
can be applied (one FMA an element, on the CUDA cores), so each warpgroup alternates
``wgmma -> wait -> FMA`` and the tensor cores idle during the FMA. Triton 3.6's automatic
warp specialisation does not change that on Hopper (``tl.range(warp_specialize=True)``:
no effect at 8 warps, a compiler error at 4, measured on an H200).

The versions here, all persistent, one TMA producer warp and two consumer warpgroups of 64
rows each (a 128 x 128 tile), as DeepGEMM is built:

* ``plain``: each warpgroup ``wgmma -> wait -> FMA`` on its own (815-844 TFLOP/s at 8192^3
  on an H200, no better than Triton's 846-876: the warpgroups run in step).
* ``pingpong``: the two warpgroups take turns at the tensor cores, ordered by two
  mbarriers (CUTLASS's "ping-pong" order, per K block): a warpgroup issues its wgmma only
  after the other has issued its own, so the two products queue back to back and each
  warpgroup's FMA runs while the other's product is on the tensor cores.
* ``pingpong+prefetch``: the same, each block's scales loaded one block ahead.

Measured on an H200 (triton 3.6, one run of this script, TFLOP/s): at 8192^3 the course's
per-tensor kernel 1,313 and block kernel 862; plain 840 (4 stages) / 838 (6), ping-pong
833 / 834, ping-pong+prefetch 820 / 818. At 4096^3: per-tensor 1,370, block 858; plain
954 / 942, ping-pong 934 / 934, ping-pong+prefetch 925 / 928. So the enforced order does
not close the gap either: none reaches 0.9x of per-tensor, and the course keeps its Triton
kernel (which is also far faster on small problems: 160 against 11-35 at 1000 x 784 x 1024).

Run on a Hopper GPU, from the repository root::

    python3 tests/gpu/fp8_block_pingpong.py [--out DIR]

It checks each version against the course's block-scaled kernel and prints TFLOP/s beside
the course's per-tensor and block-scaled kernels, at 8192^3 and 4096^3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

BM, BN, BK = 128, 128, 128     # a tile; each consumer warpgroup holds BM / 2 rows of it


@gluon.jit
def _tile_of(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """Grouped order (lesson 04): GROUP_M rows of tiles walked column by column."""
    width = GROUP_M * num_pid_n
    first_m = (tile // width) * GROUP_M
    rows = gl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % width) % rows, (tile % width) // rows


@gluon.jit
def _producer(p):
    """One warp: every stage's two A halves and its B tile, by the TMA."""
    (a_desc, b_desc, c_desc, as_ptr, bs_ptr, M, N, K, s_am, s_ak, s_bn, s_bk,
     a_bufs, b_bufs, c_bufs, ready, empty, turn, num_pid_m, num_pid_n, GROUP_M, NUM_SMS) = p
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    HM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    k_tiles = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_of(tile, num_pid_m, num_pid_n, GROUP_M)
        for k in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * 2 * HM, k * BK], ready.index(s),
                                            a_bufs.index(2 * s))
            tma.async_copy_global_to_shared(a_desc, [pid_m * 2 * HM + HM, k * BK],
                                            ready.index(s), a_bufs.index(2 * s + 1))
            tma.async_copy_global_to_shared(b_desc, [pid_n * BN, k * BK], ready.index(s),
                                            b_bufs.index(s))
            it += 1


@gluon.jit
def _consumer(p, HALF: gl.constexpr, PINGPONG: gl.constexpr, PREFETCH: gl.constexpr):
    """A warpgroup: rows HALF * 64 ... of each tile; per K block a fresh wgmma, then its
    scales in one FMA an element into the fp32 total (``PREFETCH``: the scales of block
    k + 1 loaded from L2 while block k is multiplied)."""
    (a_desc, b_desc, c_desc, as_ptr, bs_ptr, M, N, K, s_am, s_ak, s_bn, s_bk,
     a_bufs, b_bufs, c_bufs, ready, empty, turn, num_pid_m, num_pid_n, GROUP_M, NUM_SMS) = p
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    HM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 32])
    rows: gl.constexpr = gl.SliceLayout(1, layout)
    zero = gl.zeros([HM, BN], gl.float32, layout)
    c_smem = c_bufs.index(HALF)
    k_tiles = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_of(tile, num_pid_m, num_pid_n, GROUP_M)
        row = pid_m * 2 * HM + HALF * HM
        offs_m = row + gl.arange(0, HM, layout=rows)
        a_scale_ptrs = as_ptr + offs_m * s_am
        b_scale_ptr = bs_ptr + pid_n * s_bn
        acc = gl.zeros([HM, BN], gl.float32, layout)
        if PREFETCH:
            scale = gl.load(a_scale_ptrs, mask=offs_m < M, other=0.0) * gl.load(b_scale_ptr)
        for k in range(k_tiles):
            s = it % STAGES
            if PREFETCH:
                more = k + 1 < k_tiles
                after = gl.load(a_scale_ptrs + (k + 1) * s_ak, mask=(offs_m < M) & more,
                                other=0.0) * gl.load(b_scale_ptr + (k + 1) * s_bk, mask=more,
                                                     other=0.0)
            else:
                scale = gl.load(a_scale_ptrs + k * s_ak, mask=offs_m < M, other=0.0) * \
                    gl.load(b_scale_ptr + k * s_bk)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            if PINGPONG:
                # My turn at the tensor cores: the other warpgroup has issued its product.
                mbarrier.wait(turn.index(HALF), it & 1)
            part = warpgroup_mma(a_bufs.index(2 * s + HALF), b_bufs.index(s).permute((1, 0)),
                                 zero, use_acc=False, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - HALF), count=1)     # its turn next
            part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
            mbarrier.arrive(empty.index(s), count=1)
            acc = acc + part * gl.expand_dims(scale, 1)
            if PREFETCH:
                scale = after
            it += 1
        tma.store_wait(0)
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [row, pid_n * BN], c_smem)
    tma.store_wait(0)


# Triton 3.6's front end compiles both branches of an `if` on a constexpr carried in a
# tuple (and its lowering then fails): each version is a function of its own.
@gluon.jit
def _plain0(p):
    _consumer(p, 0, False, False)


@gluon.jit
def _plain1(p):
    _consumer(p, 1, False, False)


@gluon.jit
def _pingpong0(p):
    _consumer(p, 0, True, False)


@gluon.jit
def _pingpong1(p):
    _consumer(p, 1, True, False)


@gluon.jit
def _pingpong_prefetch0(p):
    _consumer(p, 0, True, True)


@gluon.jit
def _pingpong_prefetch1(p):
    _consumer(p, 1, True, True)


@gluon.jit
def block_fp8_kernel(a_desc, b_desc, c_desc, as_ptr, bs_ptr, M, N, K, s_am, s_ak, s_bn, s_bk,
                     STAGES: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr,
                     VERSION: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                     PRODUCER_REGS: gl.constexpr):
    HM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape,
                                       c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)     # both warpgroups release a stage
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    mbarrier.arrive(turn.index(0), count=1)        # warpgroup 0 goes first
    p = (a_desc, b_desc, c_desc, as_ptr, bs_ptr, M, N, K, s_am, s_ak, s_bn, s_bk,
         a_bufs, b_bufs, c_bufs, ready, empty, turn, gl.cdiv(M, 2 * HM), gl.cdiv(N, BN),
         GROUP_M, NUM_SMS)
    if VERSION == 2:
        gl.warp_specialize([(_pingpong_prefetch0, (p,)), (_pingpong_prefetch1, (p,)),
                            (_producer, (p,))], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    elif VERSION == 1:
        gl.warp_specialize([(_pingpong0, (p,)), (_pingpong1, (p,)), (_producer, (p,))],
                           [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([(_plain0, (p,)), (_plain1, (p,)), (_producer, (p,))],
                           [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


VERSIONS = ("plain", "pingpong", "pingpong+prefetch")


def block_fp8(a, b, a_scale, b_scale, *, version="pingpong", stages=5, regs=(240, 24),
              maxnreg=168, group=8, sms=None, out=None):
    """``(a * a_scale) @ (b * b_scale)^T`` in bf16, block scales as
    :func:`helpers.kernels.fp8.quantize` returns them (1 x 128 for ``a``, 128 x 128 for
    ``b``)."""
    M, K = a.shape
    N = b.shape[0]
    c = torch.empty(M, N, device=a.device, dtype=torch.bfloat16) if out is None else out
    e4m3 = gl.float8e4nv
    layout = gl.NVMMASharedLayout.get_default_for
    ad = TensorDescriptor.from_tensor(a, [BM // 2, BK], layout([BM // 2, BK], e4m3))
    bd = TensorDescriptor.from_tensor(b, [BN, BK], layout([BN, BK], e4m3))
    cd = TensorDescriptor.from_tensor(c, [BM // 2, BN], layout([BM // 2, BN], gl.bfloat16))
    sms = sms or torch.cuda.get_device_properties(a.device).multi_processor_count
    programs = min(sms, triton.cdiv(M, BM) * triton.cdiv(N, BN))
    block_fp8_kernel[(programs,)](
        ad, bd, cd, a_scale, b_scale, M, N, K, *a_scale.stride(), *b_scale.stride(),
        STAGES=stages, GROUP_M=group, NUM_SMS=programs, VERSION=VERSIONS.index(version),
        CONSUMER_REGS=regs[0], PRODUCER_REGS=regs[1], num_warps=4, maxnreg=maxnreg)
    return c


def main(argv=None) -> int:
    from helpers.experiments.fp8 import inputs
    from helpers.kernels import fp8

    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--out", default=os.environ.get("OUT", "."))
    opts = args.parse_args(argv)

    def bench(fn):
        fn()
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")

    rows = []
    for M, N, K in [(8192, 8192, 8192), (4096, 4096, 4096), (1000, 784, 1024)]:
        x, w = inputs(M, N, K, 1.0)
        (a, a_s), (b, b_s) = fp8.quantize(x, "1x128"), fp8.quantize(w, "128x128")
        course = fp8.scaled_matmul(a, b, a_s, b_s, "block")
        exact = fp8.scaled_matmul_reference(a, b, a_s, b_s, "block")
        flops = 2 * M * N * K
        (at, at_s), (bt, bt_s) = fp8.quantize(x, "tensor"), fp8.quantize(w, "tensor")
        versions = {"course, tensor scales": lambda: fp8.scaled_matmul(at, bt, at_s, bt_s),
                    "course, block scales": lambda: fp8.scaled_matmul(a, b, a_s, b_s, "block")}
        for version in VERSIONS:
            for stages in (4, 6):
                versions[f"gluon {version}, {stages} stages"] = (
                    lambda v=version, st=stages: block_fp8(a, b, a_s, b_s, version=v,
                                                           stages=st))
        for name, fn in versions.items():
            row = {"shape": [M, N, K], "name": name}
            try:
                c = fn()
                row["error"] = ((c.double() - exact).norm() / exact.norm()).item()
                row["course_error"] = ((course.double() - exact).norm() / exact.norm()).item()
                row["tflops"] = flops / bench(fn) / 1e9
            except Exception as err:  # noqa: BLE001 - a version that fails is a result
                row["failed"] = repr(err)[-500:]
            rows.append(row)
            print(row, flush=True)
    with open(os.path.join(opts.out, "fp8_block_pingpong.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "triton": triton.__version__,
                   "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

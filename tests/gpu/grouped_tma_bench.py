"""The grouped GEMM on sorted rows, cp.async against the TMA against torch._grouped_mm.

A probe, not a test (pytest does not collect it): at the MoE training layer's 8-expert
shape (T = 4096 tokens, top-2, H = 4096, I = 14336, bf16) the down projection
(``(R, I) @ (E, I, H)``) and the input gradient (``(R, 2I) @ gate_up^T``, a transposed
view), then the 128-expert down projection; the routing uniform at random (seeded). Each
kernel's best setting by do_bench's median (cold L2), its TFLOP/s, and its largest
difference from torch._grouped_mm's output relative to that output's largest entry. Then
the two weight gradients (a reduction over each expert's rows), against a small fixed
setting of the pointer kernel.

    python3 tests/gpu/grouped_tma_bench.py
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import torch  # noqa: E402
import triton  # noqa: E402

from helpers.kernels.moe.grouped import grouped_matmul  # noqa: E402
from helpers.kernels.moe.backward import grouped_weight_grad  # noqa: E402
from helpers.kernels.moe import grouped_tma  # noqa: E402
from helpers.kernels.moe.grouped import grouped_gather_matmul, grouped_swiglu  # noqa: E402
from helpers.kernels.moe.grouped_tma import (  # noqa: E402
    GATHER_TMA_SPACE,
    SWIGLU_TMA_SPACE,
    TMA_SPACE,
    grouped_gather_tma,
    WEIGHT_GRAD_TMA_SPACE,
    grouped_matmul_tma,
    grouped_weight_grad_tma,
)


@contextlib.contextmanager
def cp_async_only():
    """The course's entry points with the TMA chooser off: their tuned cp.async kernels, so
    that the rows labelled cp.async are that kernel and not whatever the chooser picks."""
    saved = grouped_tma.tma_supported, grouped_tma.gather_supported
    grouped_tma.tma_supported = lambda *a, **k: False
    grouped_tma.gather_supported = lambda *a, **k: False
    try:
        yield
    finally:
        grouped_tma.tma_supported, grouped_tma.gather_supported = saved


def pointer(fn):
    def run():
        with cp_async_only():
            return fn()
    return run


def counts_for(tokens: int, top_k: int, experts: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(tokens, experts, generator=g).topk(top_k, dim=1).indices
    return torch.bincount(ids.flatten(), minlength=experts).to(torch.int32)


def case(name, R_counts, K, N, transposed, seed=0):
    E = R_counts.numel()
    R = int(R_counts.sum())
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(R, K, device="cuda", generator=g).to(torch.bfloat16)
    if transposed:
        w = (torch.randn(E, N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
        w = w.transpose(1, 2)
    else:
        w = (torch.randn(E, K, N, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
    counts = R_counts.cuda()
    offs = torch.cumsum(counts, 0).to(torch.int32)
    flops = 2 * R * K * N
    want = torch._grouped_mm(a, w, offs=offs)
    scale = want.float().abs().max().item()

    def report(label, fn):
        out = fn()
        err = (out.float() - want.float()).abs().max().item() / scale
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        print(f"  {label:44} {ms:7.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  err {err:.1e}",
              flush=True)
        return ms

    print(f"{name}: R={R} K={K} N={N} E={E}{' (B a transposed view)' if transposed else ''}",
          flush=True)
    base = report("torch._grouped_mm", lambda: torch._grouped_mm(a, w, offs=offs))
    ptr = report("grouped_matmul (cp.async, tuned)", pointer(lambda: grouped_matmul(a, counts, w)))
    best = None
    for cfg in TMA_SPACE:
        try:
            ms = report(f"TMA {cfg.describe()}"[:44],
                        lambda cfg=cfg: grouped_matmul_tma(a, counts, w, cfg))
        except Exception as err:  # noqa: BLE001 - a setting that does not fit is a result
            print(f"  TMA {cfg.describe()}: {type(err).__name__}: {str(err)[:100]}", flush=True)
            continue
        best = ms if best is None else min(best, ms)
    if best:
        print(f"  best TMA vs _grouped_mm {base / best:.3f}x, vs cp.async {ptr / best:.3f}x; "
              f"cp.async vs _grouped_mm {base / ptr:.3f}x", flush=True)


def wgrad_case(name, R_counts, M, N, seed=0):
    """The weight gradient ``C[e] = A_e^T @ B_e`` (reduction over each expert's rows)."""
    E, R = R_counts.numel(), int(R_counts.sum())
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(R, M, device="cuda", generator=g).to(torch.bfloat16)
    b = (torch.randn(R, N, device="cuda", generator=g) / R ** 0.5).to(torch.bfloat16)
    counts = R_counts.cuda()
    offs = torch.cumsum(counts, 0).to(torch.int32)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long, device="cuda"), offs.long()])
    flops = 2 * R * M * N
    want = grouped_weight_grad(a, b, offsets, E, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32,
                                                  "GROUP_M": 8, "num_warps": 4,
                                                  "num_stages": 3})
    scale = want.float().abs().max().item()
    print(f"{name}: R={R} M={M} N={N} E={E}", flush=True)
    times = {}
    fns = {"torch._grouped_mm (A^T, B, offs)": lambda: torch._grouped_mm(a.t(), b, offs=offs),
           "grouped_weight_grad (cp.async, tuned)":
               pointer(lambda: grouped_weight_grad(a, b, offsets, E)),
           **{f"TMA {c.describe()}"[:44]: (lambda c=c: grouped_weight_grad_tma(a, b, offsets, E, c))
              for c in WEIGHT_GRAD_TMA_SPACE}}
    for label, fn in fns.items():
        try:
            out = fn()
            err = (out.float() - want.float()).abs().max().item() / scale
            times[label] = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        except Exception as e:  # noqa: BLE001 - a refusal is a result
            print(f"  {label}: {type(e).__name__}: {str(e)[:100]}", flush=True)
            continue
        print(f"  {label:44} {times[label]:7.3f} ms {flops / times[label] / 1e9:6.0f} TFLOP/s  "
              f"err {err:.1e}", flush=True)


def gather_case(name, R_counts, T, K, N, swiglu, seed=0):
    """Rows gathered from the tokens: the forward's fused SwiGLU on gate_up (E, K, 2N),
    or the backward's ``dout[rows] @ Wd^T`` (a transposed view)."""
    E, R = R_counts.numel(), int(R_counts.sum())
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)
    rows = torch.randint(0, T, (R,), device="cuda", generator=g, dtype=torch.int32)
    counts = R_counts.cuda()
    if swiglu:
        w = (torch.randn(E, K, 2 * N, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
        gate, up = w[..., :N], w[..., N:]
        pre = torch.empty(R, 2 * N, device="cuda", dtype=torch.bfloat16)
        base = pointer(lambda: grouped_swiglu(x, rows, counts, gate, up, pre=pre))
        space, flops = SWIGLU_TMA_SPACE, 4 * R * K * N
        tma = lambda c: grouped_gather_tma(x, rows, counts, w, c, swiglu=True, pre=pre)  # noqa: E731
    else:
        w = (torch.randn(E, N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
        w = w.transpose(1, 2)
        base = pointer(lambda: grouped_gather_matmul(x, rows, counts, w))
        space, flops = GATHER_TMA_SPACE, 2 * R * K * N
        tma = lambda c: grouped_gather_tma(x, rows, counts, w, c)                  # noqa: E731
    want = base().float()
    scale = want.abs().max().item()
    print(f"{name}: R={R} K={K} N={N} E={E}", flush=True)
    fns = {"cp.async (tuned)": base, **{f"TMA B {c.describe()}"[:44]: (lambda c=c: tma(c))
                                        for c in space}}
    for label, fn in fns.items():
        try:
            err = (fn().float() - want).abs().max().item() / scale
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        except Exception as e:  # noqa: BLE001 - a refusal is a result
            print(f"  {label}: {type(e).__name__}: {str(e)[:100]}", flush=True)
            continue
        print(f"  {label:44} {ms:7.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  err {err:.1e}",
              flush=True)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    few = counts_for(4096, 2, 8, seed=1)
    case("E=8 down projection", few, 14336, 4096, transposed=False)
    case("E=8 input gradient dx", few, 2 * 14336, 4096, transposed=True)
    case("E=128 down projection", counts_for(8192, 8, 128, seed=2), 768, 2048, transposed=False)
    gather_case("E=8 gate and up, fused SwiGLU (forward)", few, 4096, 4096, 14336, swiglu=True)
    gather_case("E=8 dout @ Wd^T (backward)", few, 4096, 4096, 14336, swiglu=False)
    wgrad_case("E=8 gate_up weight gradient", few, 4096, 2 * 14336)
    wgrad_case("E=8 down weight gradient", few, 14336, 4096)


if __name__ == "__main__":
    main()

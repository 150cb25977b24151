"""The tile sweep behind the attention kernels' settings (lesson 06).

:func:`helpers.kernels.attention.forward_config` and ``backward_config`` choose a tile
shape, a warp count and a pipeline depth per head size. This experiment is where those
choices come from: on one GPU, bf16, batch 4, 16 heads, 8192 tokens,

* the forward kernel under every setting of :data:`FORWARD_SETTINGS`, causal or not,
  d = 128 and 64, in TFLOP/s;
* each backward kernel alone (dK/dV, then dQ) under :data:`DKDV_SETTINGS` and
  :data:`DQ_SETTINGS`, causal or not, d = 128, in milliseconds.

A setting the compiler rejects (too much shared memory, say) is recorded with its error.
``./course record attention_tiles`` writes ``helpers/records/attention_tiles__<gpu>.json``;
:func:`best` reads the winners back. About three minutes on an H100, mostly compiling.
"""

from __future__ import annotations

import torch
import triton

from .. import bench, intensity
from ..kernels import attention as ak
from ..kernels.attention import backward as ab
from . import experiment

BATCH, HEADS, SEQ, DTYPE = 4, 16, 8192, torch.bfloat16
# (block_m, block_n, num_warps, num_stages)
FORWARD_SETTINGS = [(bm, bn, w, s) for bm, bn in ((128, 128), (128, 64), (64, 64), (128, 32))
                    for w in (4, 8) for s in (2, 3, 4)]
DKDV_SETTINGS = [(bm, bn, w, s) for bm, bn in ((32, 128), (64, 128), (32, 64), (64, 64))
                 for w in (4, 8) for s in (2, 3)]
DQ_SETTINGS = [(bm, bn, w, s) for bm, bn in ((128, 32), (128, 64), (64, 64), (64, 32))
               for w in (4, 8) for s in (2, 3)]


def _inputs(head_dim: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(BATCH, HEADS, SEQ, head_dim, device="cuda", dtype=DTYPE, generator=g)
            for _ in range(4)]


def _timed(fn) -> dict:
    try:
        return {"ms": bench.time_ms(fn)}
    except Exception as error:          # a setting the compiler or the GPU refuses
        return {"ms": None, "error": f"{type(error).__name__}: {str(error)[:300]}"}


def forward_sweep(head_dim: int, causal: bool) -> list[dict]:
    q, k, v, _ = _inputs(head_dim)
    flops = intensity.attention(BATCH, HEADS, SEQ, SEQ, head_dim, "bf16", causal=causal).flops
    rows = []
    for bm, bn, warps, stages in FORWARD_SETTINGS:
        row = {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages,
               **_timed(lambda: ak.flash_attention_forward(
                   q, k, v, causal, block_m=bm, block_n=bn, num_warps=warps,
                   num_stages=stages))}
        row["tflops"] = bench.tflops(flops, row["ms"]) if row["ms"] else None
        rows.append(row)
    return rows


def backward_sweeps(causal: bool, head_dim: int = 128) -> dict:
    """Each backward kernel alone, on the forward's real ``lse`` and ``delta``."""
    q, k, v, do = _inputs(head_dim)
    o, lse = ak.flash_attention_forward(q, k, v, causal)
    delta, dq, dk, dv = torch.empty_like(lse), *(torch.empty_like(x) for x in (q, k, v))
    strides = (q.stride(0), q.stride(1), q.stride(2))
    ab.attention_bwd_preprocess_kernel[(triton.cdiv(SEQ, 64), BATCH * HEADS)](
        o, do, delta, *strides, HEADS, SEQ, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=64)
    scale = head_dim ** -0.5
    out = {"dkdv": [], "dq": []}
    for bm, bn, warps, stages in DKDV_SETTINGS:
        out["dkdv"].append({"block_m": bm, "block_n": bn, "num_warps": warps,
                            "num_stages": stages, **_timed(
            lambda: ab.attention_bwd_dkdv_kernel[(triton.cdiv(SEQ, bn), BATCH * HEADS)](
                q, k, v, do, lse, delta, dk, dv, scale, *strides, *strides, HEADS, SEQ, SEQ, 0,
                GROUP=1, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=bm, BLOCK_N=bn,
                CAUSAL=causal,
                num_warps=warps, num_stages=stages))})
    for bm, bn, warps, stages in DQ_SETTINGS:
        out["dq"].append({"block_m": bm, "block_n": bn, "num_warps": warps,
                          "num_stages": stages, **_timed(
            lambda: ab.attention_bwd_dq_kernel[(triton.cdiv(SEQ, bm), BATCH * HEADS)](
                q, k, v, do, lse, delta, dq, scale, *strides, *strides, HEADS, SEQ, SEQ, 0,
                GROUP=1, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=bm, BLOCK_N=bn,
                CAUSAL=causal,
                num_warps=warps, num_stages=stages))})
    return out


@experiment("attention_tiles")
def attention_tiles() -> dict:
    return {
        "shape": {"batch": BATCH, "heads": HEADS, "seq": SEQ, "dtype": "bf16"},
        "forward": [{"head_dim": d, "causal": c, "settings": forward_sweep(d, c)}
                    for d in (128, 64) for c in (False, True)],
        "backward": [{"head_dim": 128, "causal": c, **backward_sweeps(c)} for c in (False, True)],
    }


def best(results: dict, part: str, head_dim: int = 128, causal: bool = False,
         kernel: str | None = None, top: int = 3) -> list[dict]:
    """The fastest settings of one sweep in a record's results, fastest first."""
    for sweep in results[part]:
        if sweep["head_dim"] == head_dim and sweep["causal"] == causal:
            rows = sweep[kernel] if kernel else sweep["settings"]
            return sorted((r for r in rows if r["ms"]), key=lambda r: r["ms"])[:top]
    raise KeyError(f"no {part} sweep for d = {head_dim}, causal={causal}")

"""Lesson 06's kernels where models run them beyond the lesson's square case: decoding,
and head dimensions that are not a power of two, against what PyTorch runs there.

Two parts, bf16, in one process, each case checked against float32 math first:

* **decode**: a few new queries (1, and 16 as speculative decoding proposes) against a
  cache of 8k to 128k keys, batch 1 and 8, 32 query heads on 8 K/V heads, d = 128, the
  mask aligned at the bottom right. Ours is ``flash_attention_forward``, which gives a
  short query to the split-KV kernels; PyTorch's is ``scaled_dot_product_attention``
  with ``enable_gqa=True`` and no backend pinned: its default. Each is timed twice: as a
  call (:func:`helpers.bench.time_ms`, host included where the host is slower than the
  GPU) and as kernels alone (``torch.profiler``'s CUDA time). The K/V bytes over the
  kernels' time give the fraction of the GPU's HBM bandwidth.
* **head_dims**: d = 80, 96, 192 and 256 at 4,096 tokens, batch 4, 16 heads, causal or
  not: forward TFLOP/s, ours against SDPA's default.

For every SDPA case the record names the backend SDPA chose, from the kernels it
launched. With one query SDPA takes no mask and runs cuDNN, which splits the keys too:
the two meet at the HBM roof. With 16 queries the bottom-right mask goes in as
``causal_lower_right``, which cuDNN does not take here, and SDPA runs FlashAttention-2's
kernel, one program per head and query block with no split of the keys: 32 programs for
132 SMs at batch 1, 21-33% of HBM on an H100 (2-4x our time). That is the gap a split-KV
kernel closes, not a faster inner loop. ``attention_decode(smoke=True)`` runs a tiny
version in seconds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.profiler import ProfilerActivity, profile

from .. import bench, intensity
from ..kernels import attention as ak
from ..kernels.attention import decode
from . import experiment

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DECODE = {"batches": (1, 8), "keys": (8192, 32768, 131072), "queries": (1, 16)}
HEAD_DIMS = {"head_dims": (80, 96, 192, 256), "seq": 4096, "batch": 4, "heads": 16}
SMOKE = {"batches": (1,), "keys": (1024,), "queries": (1,), "head_dims": (80,), "seq": 256,
         "batch": 1, "heads": 2}
PROFILED_CALLS = 10

# What the course asks (bf16, H100; the performance report judges a record against these):
DECODE_VS_SDPA = 1.0       # one query: >= 1.0x SDPA's default, call against call
DECODE_HBM = (0.80, 32768)  # one query: >= 80% of HBM bandwidth (kernel time) from 32k keys
HEAD_DIMS_VS_SDPA = 0.80   # d = 80, 96, 192, 256 at 4k tokens: >= 0.80x SDPA's default


def backend(kernel_names) -> str:
    """The SDPA backend that launched these kernels."""
    text = " ".join(kernel_names).lower()
    for word, name in (("cudnn", "cuDNN"), ("flash", "flash"), ("fmha", "efficient"),
                       ("efficient", "efficient")):
        if word in text:
            return name
    return "math"


def kernel_us(fn) -> tuple[float, list[str]]:
    """Microseconds of CUDA kernels a call of ``fn`` launches, and their names."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_CALLS):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if "CUDA" in str(e.device_type)]
    return (sum(e.device_time for e in kernels) / PROFILED_CALLS,
            sorted({e.name for e in kernels}))


def _sdpa_mask(queries: int, keys: int):
    """The bottom-right mask as a user passes it to SDPA (None for one query: no mask)."""
    if queries == 1:
        return None
    return causal_lower_right(queries, keys)


def _error(got, q, k, v) -> float:
    """Largest difference from the float64 spec (bottom-right causal), on the first batch
    row (float64 copies of a 128k-key cache for every query head are gigabytes)."""
    want = ak.attention_reference(q[:1], k[:1], v[:1], "bottom_right")[0]
    return float((got[:1].double() - want).abs().max())


def decode_row(batch: int, keys: int, queries: int, peak_gbs: float) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, HEADS, queries, HEAD_DIM, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(batch, KV_HEADS, keys, HEAD_DIM, device="cuda", generator=g).bfloat16()
            for _ in range(2))
    mask = _sdpa_mask(queries, keys)
    ours = lambda: ak.flash_attention_forward(q, k, v, "bottom_right")  # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,  # noqa: E731
                                                  enable_gqa=True)
    try:
        sdpa()
    except (RuntimeError, ValueError, NotImplementedError):
        # No backend takes the bias object with grouped-query heads: the mask as a tensor.
        rows, cols = torch.arange(queries, device="cuda"), torch.arange(keys, device="cuda")
        mask = cols[None, :] <= rows[:, None] + (keys - queries)
    row = {"batch": batch, "keys": keys, "queries": queries,
           "sdpa_mask": "none" if mask is None else type(mask).__name__,
           "kv_bytes": 2 * k.numel() * k.element_size(),
           "error": {"ours": _error(ours()[0], q, k, v), "sdpa": _error(sdpa(), q, k, v)}}
    for name, fn in (("ours", ours), ("sdpa", sdpa)):
        us, names = kernel_us(fn)
        row[name] = {"call_ms": bench.time_ms(fn), "kernel_us": us, "kernels": names,
                     "hbm_fraction": row["kv_bytes"] / (us * 1e-6) / (peak_gbs * 1e9)}
    row["sdpa_backend"] = backend(row["sdpa"]["kernels"])
    # The split kernel's programs in this run (batch x K/V heads x splits, by the setting
    # and rule of the code recorded), for the lesson's table.
    setting = ak.decode_config(HEAD_DIM, q.dtype, q.device)
    splits, _ = decode.split_keys(batch * KV_HEADS, keys, setting["block_n"],
                                  setting["target_programs"])
    row["ours"]["programs"] = batch * KV_HEADS * splits
    return row


def head_dim_row(head_dim: int, causal: bool, cfg: dict) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(cfg["batch"], cfg["heads"], cfg["seq"], head_dim, device="cuda",
                           generator=g).bfloat16() for _ in range(3))
    flops = intensity.attention(cfg["batch"], cfg["heads"], cfg["seq"], cfg["seq"], head_dim,
                                "bf16", causal=causal).flops
    ours = lambda: ak.flash_attention_forward(q, k, v, causal)  # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    row = {"head_dim": head_dim, "causal": causal,
           "error": float((ours()[0].float() - want).abs().max())}
    for name, fn in (("ours", ours), ("sdpa", sdpa)):
        ms = bench.time_ms(fn)
        row[name] = {"ms": ms, "tflops": bench.tflops(flops, ms)}
    row["sdpa_backend"] = backend(kernel_us(sdpa)[1])
    return row


@experiment("attention_decode")
def attention_decode(smoke: bool = False) -> dict:
    from .. import hardware

    cfg = {**DECODE, **HEAD_DIMS, **(SMOKE if smoke else {})}
    spec = hardware.current_gpu()
    peak = spec.hbm_bandwidth_gbs if spec else float("nan")
    listed = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
    return {
        "shape": {"dtype": "bf16", "smoke": smoke,
                  "decode": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                             **{k: listed[k] for k in DECODE}},
                  "head_dims": {k: listed[k] for k in HEAD_DIMS}},
        "decode": [decode_row(b, n, s, peak) for b in cfg["batches"] for n in cfg["keys"]
                   for s in cfg["queries"]],
        "head_dims": [head_dim_row(d, c, cfg) for d in cfg["head_dims"] for c in (False, True)],
    }

"""Lesson 08 beyond one GPU: expert parallelism over every GPU of this machine.

One rank per GPU (:func:`helpers.parallel.launch`, NCCL, NVLink multicast off), each
holding ``E / world`` experts and its own tokens. For each shape (many small experts,
few large ones) and a few token counts per rank, every rank measures, in step with the
others (a barrier before each run; a run lasts until the slowest rank is done, so the
time kept is the largest over the ranks, then the median over runs):

* ``sequential_ms``: :func:`~helpers.kernels.moe.parallel.ep_forward_sequential`, the
  whole layer: route, exchange, experts, exchange back, combine;
* ``overlapped_ms``: :func:`~helpers.kernels.moe.parallel.ep_forward_overlapped` with
  ``chunks`` slices, the all-to-alls running under the experts' GEMMs;
* ``dedup_ms``: :func:`~helpers.kernels.moe.parallel.ep_forward_dedup`, a token sent once
  per destination rank; ``bytes_sent_per_rank_dedup`` the rows that leave the busiest
  sender then, beside the napkin math's ``bytes_sent_per_rank_dedup_uniform``;
* ``chosen_ms``: :func:`~helpers.kernels.moe.parallel.ep_forward`, the layer as a user
  calls it: the version (``chosen``) that its own trial runs found fastest for this key;
  :data:`CHOSEN_VS_SEQUENTIAL` is its target against ``sequential_ms``;
* ``all_to_all_ms``: the token rows' all-to-all alone (same split sizes), and the GB/s it
  achieves on the bytes that leave each rank; ``experts_ms``: the local experts alone on
  the rows received. Overlap can at best hide the exchanges behind the experts:
  ``sequential ~ experts + 2 x all-to-all``, ``overlapped >= max(experts, 2 x all-to-all)``;
* the napkin math (:mod:`helpers.intensity.moe`): bytes each rank sends each way under
  uniform routing, and the least time over NVLink at :data:`LINK_GB_PER_S`.

Before timing, each shape is checked at the first token count: both versions against
the single-GPU :func:`~helpers.kernels.moe.moe_forward` on all ranks' tokens with the full
weights. ``moe_parallel(smoke=True)`` runs tiny sizes in seconds.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import time

import torch
import torch.distributed as dist

from .. import intensity, parallel, runtime
from ..dtypes import dtype_key, torch_dtype
from ..kernels import moe
from ..kernels.moe import parallel as ep
from . import experiment

DTYPE = "bf16"
SHAPES = (moe.MANY_SMALL, moe.FEW_LARGE)
TOKENS = (1024, 4096, 16384)       # per rank
CHUNKS = 4
WARMUP, ITERS = 3, 15
# NVLink 4 on an H100 or H200 SXM: 18 links x 25 GB/s = 450 GB/s out of each GPU (NVIDIA
# H100 datasheet: "NVLink: 900GB/s", both directions together).
LINK_GB_PER_S = 450.0
# The goal: the layer as a user calls it never slower than exchange-then-compute, at
# every size on every world (the chooser may pick the sequential version itself; 0.97
# leaves room for run-to-run noise between two timings of the same code). Not met on two
# H200s at 1,024 tokens a rank: the chooser's agreement on its key costs 0.2-0.3 ms there.
CHOSEN_VS_SEQUENTIAL = 0.97
SMOKE = {"shapes": [("smoke", 8, 2, 256, 512)], "tokens": [64, 256], "warmup": 1, "iters": 3}


def sizes(smoke: bool = False, chunks: int = CHUNKS) -> dict:
    """What one run measures: shapes as ``(name, E, top_k, H, I)``, tokens per rank, runs."""
    cfg = {"dtype": DTYPE, "chunks": chunks, "warmup": WARMUP, "iters": ITERS, "smoke": smoke,
           "choices": list(ep.CHOICES), "choice_runs": 5,
           "tokens": list(TOKENS), "link_gb_per_s": LINK_GB_PER_S,
           "shapes": [(s.name, s.experts, s.top_k, s.hidden, s.width) for s in SHAPES]}
    return {**cfg, **SMOKE} if smoke else cfg


# --------------------------------------------------------------------------------------
# In each rank.
# --------------------------------------------------------------------------------------


def _weights(E, H, I, dtype, device, seed=0) -> moe.MoEWeights:
    """:func:`~helpers.kernels.moe.make_weights`' scaling, drawn on the device (the few
    large experts are 1.4 G numbers; the CPU's generator would take a while): every rank
    draws the same full weights."""
    g = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape, fan_in):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype) / math.sqrt(fan_in)

    return moe.MoEWeights(normal(H, E, fan_in=H), normal(E, H, I, fan_in=H),
                          normal(E, H, I, fan_in=H), normal(E, I, H, fan_in=I))


def _tokens(rank, T, H, dtype, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(1000 + rank)
    return torch.randn(T, H, generator=g, device=device, dtype=dtype)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _slowest(values: list, device) -> list:
    """Each value's largest over the ranks (a collective step ends with its slowest rank)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _run_ms(fn, device) -> float:
    """One run of ``fn`` on this rank, all ranks starting together."""
    _sync(device)
    dist.barrier()
    if device.type == "cuda":
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _rounds_ms(fns: dict, cfg, device) -> dict:
    """Each function's runs, each the slowest rank's time. The functions take turns, one
    run each per round, so that a drift of the clocks or of the link over the
    measurement falls on all of them alike."""
    for _ in range(cfg["warmup"]):
        for fn in fns.values():
            fn()
    runs = {name: [] for name in fns}
    for _ in range(cfg["iters"]):
        for name, fn in fns.items():
            runs[name].append(_run_ms(fn, device))
    return {name: _slowest(times, device) for name, times in runs.items()}


def _middle_half(times: list) -> list:
    """The first and third quartiles of ``times`` (one run: that run twice)."""
    return statistics.quantiles(times, n=4)[::2] if len(times) > 1 else [times[0]] * 2


def _times_ms(fns: dict, cfg, device) -> dict:
    """Each function's median over :func:`_rounds_ms`."""
    return {name: statistics.median(t) for name, t in _rounds_ms(fns, cfg, device).items()}


def _time_ms(fn, cfg, device) -> float:
    """Median over runs of the slowest rank's time; all ranks start each run together."""
    return _times_ms({"fn": fn}, cfg, device)["fn"]


def _check(rank, world, w, shard, top_k, T, dtype, device) -> dict:
    """Both versions against one-GPU moe_forward on every rank's tokens, full weights."""
    H = w.router.shape[0]
    x_all = torch.cat([_tokens(r, T, H, dtype, device) for r in range(world)])
    # The router's logits one rank's tokens at a time, as the ranks compute them: cuBLAS
    # may pick another algorithm for all tokens at once, and a bf16 logit rounded the
    # other way flips a near tie between two experts (on four H200s, E = 8, a few tokens of
    # 16,384 went to another expert: errors of 1.5 in all three versions alike).
    logits = torch.cat([x_all[r * T:(r + 1) * T] @ w.router for r in range(world)])
    weights, ids = moe.route(logits, top_k)
    d = moe.dispatch(ids, w.router.shape[1], check=False)
    want = moe.combine(moe.experts_forward(x_all, d, w), d.position, weights)
    want = want[rank * T:(rank + 1) * T].float()
    x = x_all[rank * T:(rank + 1) * T]
    atol, rtol = moe.TOLERANCES[dtype]
    errs, bad = [], 0.0
    for f in (ep.ep_forward_sequential, ep.ep_forward_overlapped, ep.ep_forward_dedup):
        err = (f(x, shard, top_k).float() - want).abs()
        errs.append(err.max().item() if err.numel() else 0.0)
        bad = max(bad, float(not bool((err <= atol + rtol * want.abs()).all())))
    seq, ovl, dedup, bad = _slowest([*errs, bad], device)
    return {"max_abs_err_sequential": seq, "max_abs_err_overlapped": ovl,
            "max_abs_err_dedup": dedup, "atol": atol, "rtol": rtol, "ok": bad == 0.0}


def _case(rank, world, shard, top_k, T, cfg, dtype, device) -> dict:
    H, I = shard.router.shape[0], shard.gate.shape[2]
    x = _tokens(rank, T, H, dtype, device)
    chunks = cfg["chunks"]
    # The layer as a user calls it: whichever version its own trial runs found fastest
    # here (timed once per key, before the measurement; then a dictionary lookup).
    choices = cfg.get("choices", ep.CHOICES)
    chosen = ep.chosen(x, shard, top_k, choices=choices, runs=cfg["choice_runs"])
    # The knob of the overlapped version: fewer, larger chunks hide less of the exchange
    # but add less host work and padding per chunk.
    all_chunks = sorted({2, chunks, *cfg.get("more_chunks", (8,))})
    versions = {"sequential": lambda: ep.ep_forward_sequential(x, shard, top_k),
                **{c: lambda c=c: ep.ep_forward_overlapped(x, shard, top_k, c)
                   for c in all_chunks},
                "dedup": lambda: ep.ep_forward_dedup(x, shard, top_k),
                "chosen": lambda: ep.ep_forward(x, shard, top_k, choices=choices)}
    rounds = _rounds_ms(versions, cfg, device)
    ms = {name: statistics.median(t) for name, t in rounds.items()}
    # The middle half of each version's runs: two versions whose middle halves overlap
    # are not told apart by this measurement.
    quartiles = {("overlapped:" + str(name) if isinstance(name, int) else name):
                 _middle_half(t) for name, t in rounds.items()}
    seq_ms, ovl_ms, dedup_ms, chosen_ms = (ms[k] for k in ("sequential", chunks, "dedup",
                                                           "chosen"))
    by_chunks = {str(c): ms[c] for c in all_chunks}
    p = ep.plan(x, shard, top_k)
    send, recv = p.send_splits[0], p.recv_splits[0]
    goes = ep.destinations(moe.route(x @ shard.router, top_k)[1], len(shard.gate), world)
    x_recv = torch.empty((sum(recv), H), dtype=dtype, device=device)
    a2a_ms = _time_ms(lambda: dist.all_to_all_single(x_recv, p.send, recv, send), cfg, device)
    experts_ms = _time_ms(lambda: ep.local_forward(x_recv, p.recv_counts[:, 0], shard), cfg,
                          device)
    row_bytes = H * x.element_size()
    # Measured: the bytes that leave the busiest sender, the rows of the busiest receiver.
    away, rows_in, away_dedup = _slowest([(sum(send) - send[rank]) * row_bytes, sum(recv),
                                          int(goes.sum() - goes[:, rank].sum()) * row_bytes],
                                         device)
    mean_in = T * top_k
    expected = intensity.bytes_sent_per_rank(T, top_k, H, world, dtype)
    return {
        "tokens_per_rank": T, "sequential_ms": seq_ms, "overlapped_ms": ovl_ms,
        "speedup": seq_ms / ovl_ms, "overlapped_ms_by_chunks": by_chunks, "all_to_all_ms": a2a_ms,
        "all_to_all_gb_per_s": away / (a2a_ms * 1e-3) / 1e9 if a2a_ms > 0 else None,
        "experts_ms": experts_ms,
        "experts_tflops": intensity.expert_flops(int(rows_in), H, I) / (experts_ms * 1e-3) / 1e12
        if experts_ms > 0 else None,
        "bytes_sent_per_rank": away, "bytes_sent_per_rank_uniform": expected,
        "dedup_ms": dedup_ms, "bytes_sent_per_rank_dedup": away_dedup,
        "chosen": chosen, "chosen_ms": chosen_ms, "chosen_speedup": seq_ms / chosen_ms,
        "quartiles_ms": quartiles,
        "bytes_sent_per_rank_dedup_uniform": intensity.bytes_sent_per_rank_dedup(
            T, top_k, H, world, shard.router.shape[1], dtype),
        "napkin_exchange_ms": intensity.exchange_ms(T, top_k, H, world, dtype,
                                                    cfg["link_gb_per_s"]),
        "rows_received_max": int(rows_in), "rows_received_mean": mean_in,
    }


def bench_ranks(rank: int, world: int, cfg: dict) -> dict | None:
    """One rank's part of the experiment; rank 0 returns the results."""
    device = torch.device(runtime.device(), rank) if runtime.is_gpu() else torch.device("cpu")
    dtype = torch_dtype(cfg["dtype"])
    out = {"cases": [], "checks": []}
    for name, E, top_k, H, I in cfg["shapes"]:
        w = _weights(E, H, I, dtype, device)
        shard = ep.shard_weights(w, rank, world)
        shape = {"shape": name, "experts": E, "top_k": top_k, "hidden": H, "width": I}
        check = _check(rank, world, w, shard, top_k, cfg["tokens"][0], dtype, device)
        out["checks"].append({**shape, "tokens_per_rank": cfg["tokens"][0], **check})
        del w
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for T in cfg["tokens"]:
            out["cases"].append({**shape, **_case(rank, world, shard, top_k, T, cfg, dtype,
                                                   device)})
        del shard
    return out if rank == 0 else None


# --------------------------------------------------------------------------------------
# In the launching process.
# --------------------------------------------------------------------------------------


def _command(*args) -> str | None:
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def link_report() -> dict:
    """What joins the GPUs, as far as a cheap look tells: names, NCCL, ``nvidia-smi topo -m``
    (NV18 between two GPUs: 18 NVLinks)."""
    nccl = torch.cuda.nccl.version() if dist.is_nccl_available() else None
    return {"gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
            "topology": _command("nvidia-smi", "topo", "-m")}


def run(world: int, cfg: dict) -> dict:
    """Launch ``world`` ranks on ``cfg`` and collect rank 0's results, with the sizes."""
    start = time.perf_counter()
    # A rank may wait for another's first compile and autotuning: collectives get 15 minutes.
    results = parallel.launch(bench_ranks, world, cfg, timeout_s=900)[0]
    return {"world": world, "sizes": cfg, "dtype": dtype_key(cfg["dtype"]), **results,
            "seconds": time.perf_counter() - start}


def default_world(gpus: int, experts) -> int:
    """The most GPUs, at most ``gpus``, that split every shape's experts evenly."""
    return max(w for w in range(1, gpus + 1) if all(e % w == 0 for e in experts))


@experiment("moe_parallel")
def moe_parallel(smoke: bool = False, world: int | None = None, chunks: int = CHUNKS,
                 tokens=None) -> dict:
    """Expert parallelism on ``world`` GPUs (default: as many of this machine's as split
    the experts evenly; at least 2). A few minutes on 2 to 8 H100s; seconds with ``smoke``.
    ``tokens`` replaces the token counts per rank."""
    runtime.require_gpu("timing expert parallelism")
    cfg = sizes(smoke, chunks)
    if tokens is not None:
        cfg["tokens"] = list(tokens)
    have = torch.cuda.device_count()
    world = default_world(have, [s[1] for s in cfg["shapes"]]) if world is None else world
    if not 2 <= world <= have:
        raise runtime.NeedsGPUError(
            f"expert parallelism is measured on 2 or more GPUs of one machine; this one has "
            f"{have} and {world} ranks were asked for. Run it where torch.cuda.device_count() "
            ">= 2 (tests/gpu/device.sh record moe_parallel on a multi-GPU machine).")
    return {**run(world, cfg), "link": link_report()}


@experiment("moe_parallel_4gpu")
def moe_parallel_4gpu(smoke: bool = False) -> dict:
    """The same on 4 GPUs, at the two larger token counts: with 4 ranks three quarters of
    every rank's rows travel, against half with 2 (kept apart from the 2-GPU record)."""
    return moe_parallel(smoke, world=4, tokens=None if smoke else TOKENS[1:])

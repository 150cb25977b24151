"""Lesson 06's measurements: naive attention, our FlashAttention kernels and PyTorch's SDPA.

Four parts, all in this one process, on random inputs:

* **memory**: naive attention (separate PyTorch ops, the ``N x N`` scores in DRAM) and our
  fused forward, timed (:func:`helpers.bench.time_ms`: median, cold L2) and their peak
  memory measured (``torch.cuda.max_memory_allocated`` during one call, less what was
  allocated before it: the inputs), from ``N = 512`` until naive attention runs out of
  memory (recorded as such) and the fused kernel on to 32k.
* **checks**: every version (ours, each SDPA backend, naive attention) against a float32
  reference (``scaled_dot_product_attention`` pinned to the math backend) at a small size,
  forward output and the three gradients, before anything is timed.
* **tflops**: our forward and backward next to ``scaled_dot_product_attention`` pinned to
  each backend in turn (FlashAttention-2, memory-efficient, cuDNN), causal or not, d = 64
  and 128, bf16 (fp16 at one size). A backend that refuses a case is recorded as
  unavailable, with its reasons. The backward is timed alone, the same way for every
  version: one forward, then ``torch.autograd.grad(o, (q, k, v), do, retain_graph=True)``.
  Every version is credited with the same FLOPs (:func:`helpers.intensity.attention`).
* **profile**: the CUDA kernels one naive forward launches at ``N = 4096`` (names, time),
  next to the fused kernel's single launch (``torch.profiler``), and the aten ops naive
  attention dispatches with their bytes (:func:`helpers.launches.trace`).

``attention(smoke=True)`` runs every part at tiny sizes, in seconds: a first run on a new
machine. The lesson's tables, targets and figures are drawn by :mod:`helpers.plots.attention`.
"""

from __future__ import annotations

import contextlib
import time
import warnings

import torch
import torch.nn.functional as F

from .. import bench, intensity
from ..dtypes import torch_dtype
from ..kernels import attention as ak
from ..launches import trace
from . import experiment

DTYPE = "bf16"
BATCH, HEADS = 4, 16
MEMORY_HEAD_DIM = 128
NAIVE_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
FLASH_SEQS = NAIVE_SEQS + (32768,)
TFLOPS_SEQS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
FP16_SEQ, FP16_HEAD_DIM = 4096, 128          # the one fp16 size
PROFILE_SEQ = 4096
PROFILE_ROWS = 10                            # kernels kept per profile, longest first
CHECK_SHAPE = (2, 4, 448)                    # batch, heads, seq of the correctness checks
SMOKE = {"batch": 1, "heads": 2, "naive_seqs": (128, 256), "flash_seqs": (128, 256, 512),
         "tflops_seqs": (256, 512), "head_dims": (64,), "fp16_seq": 256, "profile_seq": 256,
         "check_shape": (1, 2, 96)}

OURS = "ours (Triton)"
NAIVE = "naive (PyTorch ops)"
FLASH, CUDNN = "SDPA flash", "SDPA cuDNN"
# Each SDPA backend, pinned with torch.nn.attention.sdpa_kernel, by the name tables print.
SDPA_BACKENDS = {FLASH: "FLASH_ATTENTION", "SDPA efficient": "EFFICIENT_ATTENTION",
                 CUDNN: "CUDNN_ATTENTION"}
VERSIONS = (OURS, *SDPA_BACKENDS)

# The lesson's performance targets (bf16, d = 128, batch 4, 16 heads): the lesson's
# figures (helpers.plots.attention.targets) and the course's performance report
# (helpers.performance) both judge a record against these.
TARGET_DTYPE, TARGET_HEAD_DIM = "bf16", 128
FORWARD_VS_FLASH = (1.0, 2048)        # >= 1.0x SDPA flash from N = 2048, causal or not
FORWARD_TFLOPS = (450.0, 8192)        # >= 450 TFLOP/s, non-causal, at N = 8192
BACKWARD_VS_FLASH = (1.0, 4096)       # >= 1.0x SDPA flash from N = 4096, causal or not
MEMORY_EXPONENT = (1.1, 2048)         # peak memory ~ N^p with p <= 1.1 from N = 2048
PASSES = intensity.ATTENTION_PASSES


def sizes(smoke: bool = False) -> dict:
    """The sizes one run measures: the module's constants, or :data:`SMOKE`'s tiny ones."""
    full = {"dtype": DTYPE, "batch": BATCH, "heads": HEADS, "memory_head_dim": MEMORY_HEAD_DIM,
            "naive_seqs": NAIVE_SEQS, "flash_seqs": FLASH_SEQS, "tflops_seqs": TFLOPS_SEQS,
            "head_dims": HEAD_DIMS, "fp16_seq": FP16_SEQ, "fp16_head_dim": FP16_HEAD_DIM,
            "profile_seq": PROFILE_SEQ, "check_shape": CHECK_SHAPE, "smoke": smoke}
    out = {**full, **SMOKE} if smoke else full
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def cases(cfg: dict) -> list[dict]:
    """The (dtype, d, causal) cases of the TFLOP/s comparison, each with its lengths."""
    out = [{"dtype": cfg["dtype"], "head_dim": d, "causal": c, "seqs": cfg["tflops_seqs"]}
           for d in cfg["head_dims"] for c in (False, True)]
    fp16_d = cfg["fp16_head_dim"] if cfg["fp16_head_dim"] in cfg["head_dims"] \
        else cfg["head_dims"][-1]
    out += [{"dtype": "fp16", "head_dim": fp16_d, "causal": c, "seqs": [cfg["fp16_seq"]]}
            for c in (False, True)]
    return out


def work(batch, heads, seq, head_dim, dtype, causal=False, version="flash",
         pass_="forward") -> dict:
    """The napkin math of one measurement (self-attention: ``seq_q = seq_k = seq``)."""
    w = intensity.attention(batch, heads, seq, seq, head_dim, dtype, causal=causal,
                            version=version, pass_=pass_)
    return {"flops": w.flops, "bytes": w.nbytes}


def kernel_table(events, top: int = PROFILE_ROWS) -> dict:
    """The GPU rows of ``torch.profiler``'s ``key_averages()``, longest first: each kernel's
    name, launches and total CUDA time (microseconds). Host-side rows (the CUDA runtime's
    launch calls, which may carry their kernels' time too) are left out."""
    rows = []
    for e in events:
        if "CPU" in str(getattr(e, "device_type", "")):
            continue
        us = next((getattr(e, a) for a in ("self_device_time_total", "self_cuda_time_total",
                                           "device_time_total", "cuda_time_total")
                   if isinstance(getattr(e, a, None), (int, float))), 0)
        if us > 0:
            rows.append({"name": e.key, "calls": int(e.count), "cuda_us": float(us)})
    rows.sort(key=lambda r: -r["cuda_us"])
    return {"kernels": rows[:top], "kernel_count": len(rows),
            "launches": sum(r["calls"] for r in rows),
            "total_us": sum(r["cuda_us"] for r in rows)}


def _refusal(err: BaseException) -> str:
    """``"unavailable"`` when SDPA refused the case (no kernel of the pinned backend takes
    it), ``"error"`` for anything else."""
    refused = ("No available kernel", "No viable backend")
    return "unavailable" if any(r in str(err) for r in refused) else "error"


def _failure(err: BaseException, caught=()) -> str:
    text = f"{type(err).__name__}: {str(err).strip()}"
    reasons = sorted({str(w.message).strip() for w in caught})
    return (text + ("" if not reasons else " | " + " | ".join(reasons)))[:1500]


# --------------------------------------------------------------------------------------
# The measurements (GPU only).
# --------------------------------------------------------------------------------------


def _randn(shape, dtype, seed: int, grad: bool = False) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, device="cuda", generator=g).to(torch_dtype(dtype)) \
        .requires_grad_(grad)


def _qkv(batch, heads, seq, head_dim, dtype, seed: int, grad: bool = False):
    return tuple(_randn((batch, heads, seq, head_dim), dtype, seed + i, grad) for i in range(3))


def _context(name: str):
    """What pins ``name``'s kernel: the SDPA backend, or nothing for ours and naive."""
    if name not in SDPA_BACKENDS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name])])


def _forward(name: str):
    """``fn(q, k, v, causal) -> o`` that times ``name``'s forward."""
    if name == OURS:
        return lambda q, k, v, c: ak.flash_attention_forward(q, k, v, causal=c)[0]
    if name == NAIVE:
        return lambda q, k, v, c: ak.naive_attention(q, k, v, causal=c)
    return lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)


def _differentiable(name: str):
    """``fn(q, k, v, causal) -> o`` with the autograd graph the backward is timed on."""
    if name == OURS:
        return lambda q, k, v, c: ak.flash_attention(q, k, v, causal=c)
    return _forward(name)


def _peak_extra_bytes(fn) -> int:
    """Bytes allocated at the peak of one call beyond what was live before it (the inputs):
    its temporaries and its output."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return int(peak)


def _memory_row(name: str, seq: int, cfg: dict) -> dict:
    b, h, d, dt = cfg["batch"], cfg["heads"], cfg["memory_head_dim"], cfg["dtype"]
    row = {"name": name, "seq": seq,
           **work(b, h, seq, d, dt, version="naive" if name == NAIVE else "flash")}
    step = "inputs"
    try:
        q, k, v = _qkv(b, h, seq, d, dt, seed=seq)
        row["input_bytes"] = 3 * q.numel() * q.element_size()
        fn = _forward(name)
        step = "peak memory"
        fn(q, k, v, False)          # first call: compile, cuBLAS workspace; not counted below
        row["peak_bytes"] = _peak_extra_bytes(lambda: fn(q, k, v, False))
        step = "timing"
        row["ms"] = bench.time_ms(lambda: fn(q, k, v, False))
    except torch.cuda.OutOfMemoryError as err:
        row.update(oom=True, error=f"{step}: {_failure(err)}"[:600])
    except Exception as err:  # noqa: BLE001 - one failure must not lose the rest
        row["error"] = f"{step}: {_failure(err)}"
    return row


def _memory(cfg: dict) -> dict:
    rows = []
    for name, seqs in ((NAIVE, cfg["naive_seqs"]), (OURS, cfg["flash_seqs"])):
        for seq in seqs:
            rows.append(_memory_row(name, seq, cfg))
            torch.cuda.empty_cache()
    return {"batch": cfg["batch"], "heads": cfg["heads"], "head_dim": cfg["memory_head_dim"],
            "dtype": cfg["dtype"], "causal": False, "rows": rows,
            "device_bytes": torch.cuda.get_device_properties(0).total_memory}


def _errors(got, want, tolerance, scaled: bool) -> tuple[float, bool]:
    """Largest absolute error, and whether every element is within ``atol + rtol |want|``
    (for gradients, ``atol`` is taken relative to the largest gradient)."""
    atol, rtol = tolerance
    got, want = got.detach(), want.detach()
    diff = (got.float() - want).abs()
    if scaled:
        atol = atol * max(want.abs().max().item(), 1e-6)
    ok = bool((diff <= atol + rtol * want.abs()).all()) and bool(torch.isfinite(got).all())
    return diff.max().item(), ok


def _check(case: dict, shape) -> dict:
    """Every version against the float32 math reference at ``shape``: forward, gradients."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, n = shape
    d, dt, c = case["head_dim"], case["dtype"], case["causal"]
    tolerance = ak.TOLERANCES[torch_dtype(dt)]
    q, k, v = _qkv(b, h, n, d, dt, seed=7000 + d, grad=True)
    do = _randn((b, h, n, d), dt, seed=7100)
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.MATH]):
        o_ref = F.scaled_dot_product_attention(*ref_in, is_causal=c)
    g_ref = torch.autograd.grad(o_ref, ref_in, do.float())
    rows = []
    for name in (*VERSIONS, NAIVE):
        row = {"name": name}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with _context(name):
                    o = _forward(name)(q.detach(), k.detach(), v.detach(), c)
                    row["forward_error"], row["forward_ok"] = _errors(o, o_ref, tolerance, False)
                    if name != NAIVE:
                        o = _differentiable(name)(q, k, v, c)
                        grads = torch.autograd.grad(o, (q, k, v), do)
                        errs = [_errors(g, r, tolerance, True) for g, r in zip(grads, g_ref)]
                        row["backward_error"] = max(e for e, _ in errs)
                        row["backward_ok"] = all(ok for _, ok in errs)
            except Exception as err:  # noqa: BLE001 - a backend that refuses is a result
                row[_refusal(err)] = _failure(err, caught)
        rows.append(row)
    return {"dtype": dt, "head_dim": d, "causal": c, "shape": [b, h, n, d],
            "tolerance": list(tolerance), "rows": rows}


def _time_case(case: dict, seq: int, cfg: dict, skip: dict) -> list[dict]:
    """Forward and backward of every version at one length: two comparison entries."""
    b, h, d, dt, c = cfg["batch"], cfg["heads"], case["head_dim"], case["dtype"], case["causal"]
    out = []
    for pass_ in PASSES:
        entry = {"pass": pass_, "dtype": dt, "head_dim": d, "causal": c, "seq": seq,
                 "batch": b, "heads": h, **work(b, h, seq, d, dt, c, pass_=pass_), "rows": []}
        q, k, v = _qkv(b, h, seq, d, dt, seed=seq + d, grad=pass_ == "backward")
        do = _randn((b, h, seq, d), dt, seed=seq + 1)
        for name in VERSIONS:
            row = {"name": name}
            if name in skip:
                row.update(skip[name])
                entry["rows"].append(row)
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with _context(name):
                        if pass_ == "forward":
                            fn = _forward(name)
                            row["ms"] = bench.time_ms(lambda: fn(q, k, v, c))
                        else:
                            o = _differentiable(name)(q, k, v, c)
                            row["ms"] = bench.time_ms(lambda: torch.autograd.grad(
                                o, (q, k, v), do, retain_graph=True))
                            del o
                    row["tflops"] = bench.tflops(entry["flops"], row["ms"])
                    if name == OURS:        # the tuner's settings, where it chose any
                        row["settings"] = _settings(pass_, q, k, c)
                except Exception as err:  # noqa: BLE001 - one failure must not lose the rest
                    row[_refusal(err)] = _failure(err, caught)
            entry["rows"].append(row)
        entry["sdpa_default"] = _guarded(_default_backend, pass_, q, k, v, do, c)
        out.append(entry)
        del q, k, v, do
        torch.cuda.empty_cache()
    return out


def _default_backend(pass_: str, q, k, v, do, causal: bool) -> str:
    """The backend SDPA runs for this pass with none pinned (its default, which the
    issue's targets compare against), named from the kernels it launches."""
    from .attention_decode import backend, kernel_us

    if pass_ == "forward":
        return backend(kernel_us(lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal))[1])
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return backend(kernel_us(lambda: torch.autograd.grad(o, (q, k, v), do,
                                                         retain_graph=True))[1])


def _settings(pass_: str, q, k, causal) -> dict:
    """``{kernel's pass: setting name}`` the tuner chose for these tensors (``None``: the
    table's), for the forward or the backward's two kernels."""
    from ..kernels.attention import tuning

    passes = ("forward",) if pass_ == "forward" else ("dkdv", "dq")
    return {name: tuning.chosen(name, q, k, bool(causal)) for name in passes}


def _tflops(cfg: dict) -> tuple[list[dict], list[dict]]:
    """Each case checked, then timed at each length; a version the check could not run
    is not timed (its rows say why). A case that fails is recorded, the others run."""
    checks, timings = [], []
    for case in cases(cfg):
        try:
            check = _check(case, cfg["check_shape"])
            checks.append(check)
            skip = {r["name"]: {k: f"correctness check: {r[k]}"} for r in check["rows"]
                    for k in ("unavailable", "error") if k in r}
            for seq in case["seqs"]:
                timings += _time_case(case, seq, cfg, skip)
        except Exception as err:  # noqa: BLE001
            checks.append({**{k: case[k] for k in ("dtype", "head_dim", "causal")},
                           "error": _failure(err)})
    return checks, timings


def _profile(cfg: dict) -> dict:
    from torch.profiler import ProfilerActivity, profile

    b, h, d, dt = cfg["batch"], cfg["heads"], cfg["memory_head_dim"], cfg["dtype"]
    seq = cfg["profile_seq"]
    q, k, v = _qkv(b, h, seq, d, dt, seed=9000)
    out = {"batch": b, "heads": h, "seq": seq, "head_dim": d, "dtype": dt, "causal": False}
    for name in (NAIVE, OURS):
        fn = _forward(name)
        try:
            fn(q, k, v, False)                     # compile, pick cuBLAS algorithms
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn(q, k, v, False)
                torch.cuda.synchronize()
            out[name] = kernel_table(prof.key_averages())
            if not out[name]["kernels"]:         # keep the profiler's own words to look at
                out[name]["table"] = str(prof.key_averages().table(row_limit=20))[:6000]
        except Exception as err:  # noqa: BLE001
            out[name] = {"error": _failure(err)}
    try:
        out["naive_trace"] = trace(ak.naive_attention, q, k, v).as_list()
    except Exception as err:  # noqa: BLE001
        out["naive_trace"] = {"error": _failure(err)}
    return out


def _guarded(fn, *args):
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - a part that fails is recorded, the rest runs
        return {"error": _failure(err)}


@experiment("attention")
def attention(smoke: bool = False) -> dict:
    """Every measurement of lesson 06 (a few minutes on an H100; seconds with ``smoke``)."""
    start = time.perf_counter()
    cfg = sizes(smoke)
    props = torch.cuda.get_device_properties(0)
    out = {"config": cfg, "device": {"name": props.name, "memory_bytes": props.total_memory,
                                     "sm_count": props.multi_processor_count}}
    out["memory"] = _guarded(_memory, cfg)
    out["checks"], out["tflops"] = _tflops(cfg)
    out["profile"] = _guarded(_profile, cfg)
    torch.cuda.empty_cache()
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out

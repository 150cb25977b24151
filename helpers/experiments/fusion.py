"""Lesson 05's measurements: unfused PyTorch, ``torch.compile`` and fused Triton, side by side.

Three fusions, each timed in one process against the unfused PyTorch ops it replaces,
against what ``torch.compile`` makes of those same ops, and against PyTorch's own
fused kernel where one exists:

* **row softmax** at ``M = 4096`` rows, ``N = 1024 ... 16384``, fp16 and bf16: the
  five-kernel :func:`~helpers.kernels.softmax.naive_softmax`, ``torch.softmax``,
  ``torch.compile(naive_softmax)`` and the row-in-registers Triton kernel;
* **long rows**: softmax on the same number of elements cut into ever longer rows,
  where the row-in-registers kernel runs out of registers and the online kernel,
  which reads each row twice, takes over;
* **bias + GELU** and **SwiGLU** (elementwise chains) and **residual add + RMSNorm**
  (a normalisation), at transformer-sized activations in bf16.

Each version is first checked against the fp32 reference (its error is recorded), then
timed (:func:`helpers.bench.time_ms`: median, cold L2). Each row of a comparison carries
the bytes *that version* moves by the napkin math, so its GB/s is the bandwidth it
really used. The experiment also records, from the GPU: which aten ops each eager
version dispatches (:func:`trace`), the Triton code Inductor generated for it, the
registers and spills of the row-in-registers softmax, and the copy bandwidth that
is every streaming kernel's ceiling.

The bytes and FLOPs of each version come from :mod:`helpers.intensity`; the tracer and
the Inductor-code reader from :mod:`helpers.launches`; what lesson 05 shows from the
record (tables, targets, figures) is drawn by :mod:`helpers.plots.fusion`.
"""

from __future__ import annotations

import time

import torch
import triton

from .. import bench, intensity
from ..dtypes import torch_dtype
from ..kernels import gelu as gk
from ..kernels import rmsnorm as rk
from ..kernels import softmax as sk
from ..launches import inductor_code, trace
from . import experiment

SOFTMAX_M = 4096
SOFTMAX_NS = (1024, 2048, 4096, 8192, 16384)
SOFTMAX_DTYPES = ("fp16", "bf16")
LONG_ROW_ELEMENTS = 2**26                   # 128 MiB of fp16 per tensor, whatever N is
LONG_ROW_NS = tuple(2**k for k in range(10, 18))
LONG_ROW_DTYPE = "fp16"
GELU_SHAPE = (4096, 16384)                  # tokens x MLP features
RMSNORM_SHAPE = (4096, 8192)                # tokens x hidden size
DTYPE = "bf16"
WARPS = (4, 8, 16, 32)
GELU_CONFIGS = ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16))

# The lesson's performance goals: the lesson's table (helpers.plots.fusion.targets) and the
# course's performance report (helpers.performance) both judge a record against these.
SOFTMAX_VS_TORCH = 1.0      # fused softmax over torch.softmax, geometric mean over the sweep
SOFTMAX_VS_NAIVE = 3.0      # fused softmax over the naive 5-op softmax, the same
RMSNORM_VS_EAGER = 1.5      # fused residual add + RMSNorm over eager PyTorch
RMSNORM_OF_COPY = 0.8       # its GB/s as a fraction of the copy recorded beside it
BIAS_GELU_VS_EAGER = 2.0    # fused bias + GELU over eager PyTorch


# --------------------------------------------------------------------------------------
# The measurements (GPU only).
# --------------------------------------------------------------------------------------


def _randn(shape, dtype, seed: int, scale: float = 1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(shape, device="cuda", generator=g)).to(dtype)


def _error(got, want, tolerance) -> tuple[float, bool]:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    atol, rtol = tolerance
    worst, ok = 0.0, True
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return float("inf"), False
        diff = (g.float() - w.float()).abs()
        worst = max(worst, diff.max().item())
        ok = ok and bool((diff <= atol + rtol * w.float().abs()).all()) \
            and not bool(torch.isnan(g.float()).any())
    return worst, ok


def _versions(title: str, versions: dict, want, tolerance, flops: int, baseline: str) -> dict:
    """Check, then time, each ``name -> (fn, bytes)``; a failure is recorded, not raised."""
    rows = []
    for name, (fn, nbytes) in versions.items():
        row = {"name": name, "bytes": nbytes, "flops": flops}
        try:
            row["max_error"], row["within_tolerance"] = _error(fn(), want, tolerance)
            row["ms"] = bench.time_ms(fn)
        except Exception as err:  # noqa: BLE001 - one broken version must not lose the rest
            row["error"] = f"{type(err).__name__}: {str(err)[:600]}"
        rows.append(row)
    return {"title": title, "baseline": baseline, "rows": rows}


def _setting_row(run, nbytes: int, **setting) -> dict:
    """One row of a sweep over launch settings: ``setting`` with the time of ``run()`` and
    the GB/s of its ``nbytes``, or the error that stopped it (a setting the GPU refuses,
    such as too many warps, must not lose the rest of the sweep)."""
    try:
        run()                                   # compiles, and must run, before it is timed
        ms = bench.time_ms(run)
        return {**setting, "ms": ms, "gbps": bench.gbps(nbytes, ms)}
    except Exception as err:  # noqa: BLE001
        return {**setting, "error": f"{type(err).__name__}: {err}"[:300]}


def _compile(fn):
    """``torch.compile`` with shapes fixed: one specialised kernel per shape, no guards
    that would send later shapes down a generic path."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def _softmax_targets(dtypes) -> list[dict]:
    out = []
    for dt_name in dtypes:
        dt = torch_dtype(dt_name)
        for i, n in enumerate(SOFTMAX_NS):
            m = SOFTMAX_M
            x = _randn((m, n), dt, seed=i, scale=3.0)
            compiled = _compile(sk.naive_softmax)
            naive, fused = (intensity.softmax(m, n, dt, v) for v in ("naive", "fused"))
            cmp = _versions(
                f"softmax {m}x{n} {dt_name}",
                {"naive (5 PyTorch ops)": (lambda: sk.naive_softmax(x), naive.nbytes),
                 "torch.softmax": (lambda: torch.softmax(x, dim=-1), fused.nbytes),
                 "torch.compile(naive)": (lambda: compiled(x), fused.nbytes),
                 "fused Triton": (lambda: sk.softmax_v1(x), fused.nbytes)},
                sk.softmax_reference(x), sk.TOLERANCES[dt], fused.flops,
                baseline="torch.softmax")
            cmp.update(m=m, n=n, dtype=dt_name)
            out.append(cmp)
            del x
    return out


def _compiled_stats(kernel) -> dict:
    out = {}
    for name in ("n_regs", "n_spills"):
        value = getattr(kernel, name, None)
        if isinstance(value, int):
            out[name] = value
    shared = getattr(getattr(kernel, "metadata", None), "shared", None)
    if isinstance(shared, int):
        out["shared_bytes"] = shared
    return out


def _softmax_long_rows() -> list[dict]:
    dt = torch_dtype(LONG_ROW_DTYPE)
    out = []
    for i, n in enumerate(LONG_ROW_NS):
        m = LONG_ROW_ELEMENTS // n
        x = _randn((m, n), dt, seed=100 + i, scale=3.0)
        block = triton.next_power_of_2(n)
        warps = sk.num_warps_for(block)
        naive, fused, online = (intensity.softmax(m, n, dt, v)
                                for v in ("naive", "fused", "online"))
        versions = {
            "naive (5 PyTorch ops)": (lambda: sk.naive_softmax(x), naive.nbytes),
            "torch.softmax": (lambda: torch.softmax(x, dim=-1), fused.nbytes),
            "row in registers (v1)": (lambda: sk.softmax_v1(x), fused.nbytes),
            "online, two passes": (lambda: sk.softmax_online(x), online.nbytes),
        }
        cmp = _versions(f"softmax {m}x{n} {LONG_ROW_DTYPE}", versions, sk.softmax_reference(x),
                        sk.TOLERANCES[dt], fused.flops, baseline="torch.softmax")
        cmp.update(m=m, n=n, dtype=LONG_ROW_DTYPE, block=block, num_warps=warps,
                   compulsory_bytes=fused.nbytes)
        try:  # registers and spills of the compiled row-in-registers kernel
            y = torch.empty_like(x)
            k = sk.softmax_kernel_v1[(m,)](x, y, n, x.stride(0), y.stride(0), BLOCK_SIZE=block,
                                           num_warps=warps)
            cmp["v1_compiled"] = _compiled_stats(k)
        except Exception as err:  # noqa: BLE001
            cmp["v1_compiled"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        out.append(cmp)
        del x
        torch.cuda.empty_cache()
    return out


def _softmax_warps() -> list[dict]:
    dt = torch_dtype("fp16")
    rows = []
    for i, n in enumerate(SOFTMAX_NS):
        x = _randn((SOFTMAX_M, n), dt, seed=200 + i, scale=3.0)
        nbytes = intensity.softmax(SOFTMAX_M, n, dt, "fused").nbytes
        rows += [_setting_row(lambda w=w: sk.softmax_v1(x, num_warps=w), nbytes, n=n,
                              num_warps=w) for w in WARPS]
        del x
    return rows


def _elementwise_chain(title: str, inputs: tuple, eager, fused: dict, reference,
                       count) -> dict:
    """An elementwise chain of two PyTorch kernels at ``GELU_SHAPE`` in ``DTYPE``, beside
    ``torch.compile`` of it and the Triton kernels that fuse it (``fused``: label -> fn).
    ``count(m, n, dtype, version)`` is its napkin math: the eager version moves the
    "unfused" bytes, the fused ones (``torch.compile``'s too) the "fused" bytes."""
    m, n = GELU_SHAPE
    dt = torch_dtype(DTYPE)
    compiled = _compile(eager)
    eager_b, fused_b = (count(m, n, dt, v).nbytes for v in ("unfused", "fused"))
    versions = {"eager PyTorch (2 kernels)": (lambda: eager(*inputs), eager_b),
                "torch.compile(eager)": (lambda: compiled(*inputs), fused_b)}
    versions.update({label: (lambda fn=fn: fn(*inputs), fused_b) for label, fn in fused.items()})
    cmp = _versions(f"{title} {m}x{n} {DTYPE}", versions, reference(*inputs), gk.TOLERANCES[dt],
                    count(m, n, dt).flops, baseline="eager PyTorch (2 kernels)")
    cmp.update(shape=[m, n], dtype=DTYPE)
    return cmp


def _bias_gelu() -> dict:
    m, n = GELU_SHAPE
    dt = torch_dtype(DTYPE)
    x = _randn((m, n), dt, seed=300, scale=2.0)
    bias = _randn((n,), dt, seed=301)
    return _elementwise_chain(
        "bias + GELU", (x, bias), gk.bias_gelu_eager,
        {"fused Triton (v1, flat)": gk.bias_gelu, "fused Triton (v2, 2-D tiles)": gk.bias_gelu_v2},
        gk.bias_gelu_reference, intensity.bias_gelu)


def _gelu_configs() -> list[dict]:
    m, n = GELU_SHAPE
    dt = torch_dtype(DTYPE)
    x = _randn((m, n), dt, seed=302, scale=2.0)
    bias = _randn((n,), dt, seed=303)
    nbytes = intensity.bias_gelu(m, n, dt, "fused").nbytes
    rows = []
    for version, fn in (("v1", gk.bias_gelu), ("v2", gk.bias_gelu_v2)):
        rows += [_setting_row(lambda fn=fn, b=block, w=warps: fn(x, bias, b, w), nbytes,
                              version=version, block_size=block, num_warps=warps)
                 for block, warps in GELU_CONFIGS]
    return rows


def _swiglu() -> dict:
    m, n = GELU_SHAPE
    dt = torch_dtype(DTYPE)
    gate = _randn((m, n), dt, seed=310, scale=2.0)
    up = _randn((m, n), dt, seed=311)
    return _elementwise_chain("SwiGLU", (gate, up), gk.swiglu_eager,
                              {"fused Triton": gk.swiglu}, gk.swiglu_reference, intensity.swiglu)


def _rmsnorm_inputs(seed: int):
    m, n = RMSNORM_SHAPE
    dt = torch_dtype(DTYPE)
    return (_randn((m, n), dt, seed=seed), _randn((m, n), dt, seed=seed + 1),
            _randn((n,), dt, seed=seed + 2))


def _rmsnorm() -> dict:
    m, n = RMSNORM_SHAPE
    dt = torch_dtype(DTYPE)
    x, r, w = _rmsnorm_inputs(400)
    compiled = _compile(rk.residual_rmsnorm_eager)
    b = {v: intensity.residual_rmsnorm(m, n, dt, v).nbytes for v in intensity.RMSNORM_VERSIONS}
    cmp = _versions(
        f"residual add + RMSNorm {m}x{n} {DTYPE}",
        {"eager PyTorch (Llama style)": (lambda: rk.residual_rmsnorm_eager(x, r, w), b["eager"]),
         "add + F.rms_norm": (lambda: rk.residual_rmsnorm_torch(x, r, w), b["torch"]),
         "torch.compile(eager)": (lambda: compiled(x, r, w), b["fused"]),
         "fused Triton": (lambda: rk.residual_rmsnorm(x, r, w), b["fused"])},
        rk.residual_rmsnorm_reference(x, r, w), rk.TOLERANCES[dt],
        intensity.residual_rmsnorm(m, n, dt).flops, baseline="eager PyTorch (Llama style)")
    cmp.update(shape=[m, n], dtype=DTYPE)
    return cmp


def _rmsnorm_warps() -> list[dict]:
    m, n = RMSNORM_SHAPE
    x, r, w = _rmsnorm_inputs(410)
    nbytes = intensity.residual_rmsnorm(m, n, DTYPE, "fused").nbytes
    return [_setting_row(lambda warps=warps: rk.residual_rmsnorm(x, r, w, num_warps=warps),
                         nbytes, num_warps=warps) for warps in WARPS]


def _traces() -> dict:
    m, n = RMSNORM_SHAPE
    x = _randn((SOFTMAX_M, 4096), torch_dtype("fp16"), seed=500)
    a, r, w = _rmsnorm_inputs(510)
    gm, gn = GELU_SHAPE
    g = _randn((gm, gn), torch_dtype(DTYPE), seed=520)
    bias = _randn((gn,), torch_dtype(DTYPE), seed=521)
    return {
        "naive_softmax": {"shape": [SOFTMAX_M, 4096], "dtype": "fp16",
                          "calls": trace(sk.naive_softmax, x).as_list()},
        "bias_gelu_eager": {"shape": [gm, gn], "dtype": DTYPE,
                            "calls": trace(gk.bias_gelu_eager, g, bias).as_list()},
        "swiglu_eager": {"shape": [gm, gn], "dtype": DTYPE,
                         "calls": trace(gk.swiglu_eager, g, g).as_list()},
        "residual_rmsnorm_eager": {"shape": [m, n], "dtype": DTYPE,
                                   "calls": trace(rk.residual_rmsnorm_eager, a, r, w).as_list()},
        "residual_rmsnorm_torch": {"shape": [m, n], "dtype": DTYPE,
                                   "calls": trace(rk.residual_rmsnorm_torch, a, r, w).as_list()},
    }


def _inductor() -> dict:
    out = {}
    x = _randn((SOFTMAX_M, 4096), torch_dtype("fp16"), seed=600)
    a, r, w = _rmsnorm_inputs(610)
    g = _randn(GELU_SHAPE, torch_dtype(DTYPE), seed=620)
    bias = _randn((GELU_SHAPE[1],), torch_dtype(DTYPE), seed=621)
    for name, fn, args in (("bias_gelu_eager", gk.bias_gelu_eager, (g, bias)),
                           ("naive_softmax", sk.naive_softmax, (x,)),
                           ("residual_rmsnorm_eager", rk.residual_rmsnorm_eager, (a, r, w))):
        try:
            out[name] = inductor_code(fn, *args)
        except Exception as err:  # noqa: BLE001
            out[name] = {"error": f"{type(err).__name__}: {str(err)[:600]}"}
    return out


def _device_report() -> dict:
    props = torch.cuda.get_device_properties(0)
    keys = ("multi_processor_count", "regs_per_multiprocessor", "shared_memory_per_multiprocessor",
            "shared_memory_per_block_optin", "L2_cache_size", "max_threads_per_multi_processor")
    return {k: getattr(props, k) for k in keys if hasattr(props, k)}


@experiment("fusion")
def fusion() -> dict:
    """Every measurement of lesson 05 (under a minute on an H100 or H200, compiling included)."""
    start = time.perf_counter()
    torch._dynamo.config.recompile_limit = 64
    out = {"device": _device_report(), "copy": bench.measure_copy_bandwidth()}
    out["softmax"] = _softmax_targets(SOFTMAX_DTYPES)
    out["softmax_long_rows"] = _softmax_long_rows()
    out["softmax_warps"] = _softmax_warps()
    out["bias_gelu"] = _bias_gelu()
    out["gelu_configs"] = _gelu_configs()
    out["swiglu"] = _swiglu()
    out["rmsnorm"] = _rmsnorm()
    out["rmsnorm_warps"] = _rmsnorm_warps()
    out["traces"] = _traces()
    out["inductor"] = _inductor()
    torch.cuda.empty_cache()
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out

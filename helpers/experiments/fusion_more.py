"""Lesson 05's second experiment: three questions the first record left open.

* ``spellings``: does ``torch.compile`` derive the online softmax? Inductor rewrites
  amax(keepdim=True) -> sub -> exp -> sum(keepdim=True) into an online-softmax reduction
  (``torch._inductor.config.online_softmax``, on by default for Triton on a GPU). The
  lesson's :func:`~helpers.kernels.softmax.naive_softmax` writes ``amax(dim=1)`` and then
  ``[:, None]``; :func:`~helpers.kernels.softmax.naive_softmax_keepdim` writes keepdim.
  Both are compiled at M = 4096 and N = 1024 to 16384 (fp16), their generated code is
  read (loops over the row, loads of the input, online-softmax calls) and both are timed
  beside ``torch.softmax`` and the fused Triton kernel.
* ``epilogue``: a large matmul with ``leaky_relu`` after it, as two kernels (cuBLAS or
  Triton, then ``F.leaky_relu``) and as one (the activation in the Triton kernel's
  epilogue, :mod:`helpers.kernels.matmul.epilogue`), at 2048^3 to 8192^3 in fp16, with the
  product alone and the activation pass alone for scale.
* ``profile``: where the five-op softmax's time goes. ``torch.profiler`` times each of its
  kernels on the GPU (the L2 flushed before every call, as ``do_bench`` does), next to the
  bytes each kernel must move (:func:`helpers.launches.trace`), so each kernel's own
  bandwidth shows; the sum of the kernel times and the span from the first kernel's start
  to the last one's end show what launches and gaps add.

Each result is checked against its reference before it is timed; times are medians of
``repeats`` rounds of :func:`helpers.bench.time_ms` taken in turn, with their range.
"""

from __future__ import annotations

import statistics
import time

import torch

from .. import bench, intensity, runtime
from ..dtypes import torch_dtype
from ..kernels.matmul import epilogue as me
from ..kernels.matmul.config import TileConfig
from ..kernels import softmax as sk
from ..launches import parse_inductor_code, trace
from . import experiment

SOFTMAX_M = 4096
SPELLING_NS = (1024, 4096, 16384)
SOURCE_N = 4096                      # the N whose generated code the record keeps whole
SPELLINGS = {
    "torch.compile(naive): amax(dim=1), then [:, None]": sk.naive_softmax,
    "torch.compile(keepdim): amax(dim=1, keepdim=True)": sk.naive_softmax_keepdim,
}
EPILOGUE_NS = (2048, 4096, 8192)
EPILOGUE_DTYPE = "fp16"
# The Triton product's configuration: the faster of these for the plain product, per size,
# then the same one with the epilogue.
EPILOGUE_CONFIGS = tuple(TileConfig(128, 256, 64, num_stages=s, num_warps=8) for s in (3, 4))
PROFILE_NS = (4096, 16384)
PROFILE_CALLS = 10
FLUSH_BYTES = 256 * 2**20            # what do_bench writes to empty the L2 between runs
REPEATS = 3
SMOKE = dict(spelling_ns=(256,), epilogue_ns=(64,), profile_ns=(256,), m=8, repeats=1,
             epilogue_configs=(me.CPU_CONFIG,))


# --------------------------------------------------------------------------------------
# Pure helpers (tested on a CPU).
# --------------------------------------------------------------------------------------


def code_facts(parsed: dict) -> dict:
    """What Inductor's kernels do with a softmax row: from :func:`parse_inductor_code`."""
    src = "\n".join(k["source"] for k in parsed.get("kernels", []))
    return {"kernels": len(parsed.get("kernels", [])),
            "names": [k["name"] for k in parsed.get("kernels", [])],
            "row_loops": src.count("for r0_offset"),
            "input_loads": src.count("tl.load(in_ptr0"),
            "online_softmax": "online_softmax" in src}


def kernel_table(kernels, skip: set[str], calls: int) -> tuple[list[dict], float]:
    """Group profiled kernels ``(name, start_us, duration_us)`` of ``calls`` calls by their
    place in a call.

    Kernels named in ``skip`` (the L2 flush) are dropped; the rest, in start order, split
    into ``calls`` equal calls: the i-th kernel of every call forms row i, with the median
    of its durations and their range; with them, the median span of a call, from its first
    kernel's start to its last one's end. Refuses a sequence that does not repeat.
    """
    ks = sorted((k for k in kernels if k[0] not in skip), key=lambda k: k[1])
    if not ks or len(ks) % calls:
        raise ValueError(f"{len(ks)} kernels do not split into {calls} calls")
    per_call = len(ks) // calls
    calls = [ks[i:i + per_call] for i in range(0, len(ks), per_call)]
    rows = []
    for pos in range(per_call):
        names = {c[pos][0] for c in calls}
        if len(names) != 1:
            raise ValueError(f"kernel {pos + 1} of a call differs between calls: {sorted(names)}")
        durations = [c[pos][2] for c in calls]
        rows.append({"position": pos + 1, "kernel": names.pop(),
                     "us": statistics.median(durations), "us_min": min(durations),
                     "us_max": max(durations)})
    spans = [c[-1][1] + c[-1][2] - c[0][1] for c in calls]
    return rows, statistics.median(spans)


def kernel_name(name: str, width: int = 70) -> str:
    """A CUDA kernel's name without its template arguments: ``void at::...::reduce_kernel<...>``
    becomes ``reduce_kernel``."""
    head = name.split("<", 1)[0].split("(", 1)[0].strip()
    head = head.rsplit(" ", 1)[-1].rsplit("::", 1)[-1] or name
    return head[:width]


# --------------------------------------------------------------------------------------
# The measurements.
# --------------------------------------------------------------------------------------


def _randn(shape, dtype, seed: int, scale: float = 1.0):
    g = torch.Generator(device=runtime.device()).manual_seed(seed)
    return (scale * torch.randn(shape, device=runtime.device(), generator=g)).to(dtype)


def _verify(got, want, tolerance, what: str) -> dict:
    """Compare with the reference: refuse a wrong result (norm-wise relative error of 1 %
    or more, or a NaN), record how close a right one came (worst error, within the
    kernel module's (atol, rtol) or not: PyTorch's own unfused ops round at every step)."""
    g, w = got.float(), want.float()
    rel = ((g - w).norm() / w.norm().clamp_min(1e-30)).item()
    if not rel < 1e-2:
        raise AssertionError(f"{what} is wrong: relative error {rel:.3g}")
    atol, rtol = tolerance
    err = (g - w).abs()
    return {"max_error": err.max().item(),
            "within_tolerance": bool((err <= atol + rtol * w.abs()).all())}


def _check_softmax(got, x, what) -> dict:
    return _verify(got, sk.softmax_reference(x), sk.TOLERANCES[x.dtype], f"{what} at "
                   f"{tuple(x.shape)}")


def _check_epilogue(got, a, b, activation, what) -> dict:
    return _verify(got, me.reference(a, b, activation), me.TOLERANCES[a.dtype],
                   f"{what} at {a.shape[0]}^3")


def _compile_with_code(fn, x):
    from torch._inductor.utils import run_and_get_code  # loads Inductor: only when asked

    compiled = torch.compile(fn, dynamic=False)
    out, codes = run_and_get_code(compiled, x)
    return compiled, out, parse_inductor_code(codes)


def _spellings(m, ns, repeats) -> list[dict]:
    out = []
    for i, n in enumerate(ns):
        x = _randn((m, n), torch.float16, seed=700 + i, scale=3.0)
        versions = {"torch.softmax": lambda: torch.softmax(x, dim=-1),  # noqa: B023
                    "fused Triton": lambda: sk.softmax_v1(x)}           # noqa: B023
        entry = {"m": m, "n": n, "dtype": "fp16", "code": {}}
        torch._dynamo.reset()         # here, not between the spellings: both are timed below
        for name, fn in SPELLINGS.items():
            try:
                compiled, got, parsed = _compile_with_code(fn, x)
            except Exception as err:  # noqa: BLE001 - one failed compile must not lose the rest
                entry["code"][name] = {"error": f"{type(err).__name__}: {str(err)[:600]}"}
                continue
            entry["code"][name] = {**code_facts(parsed), **_check_softmax(got, x, name)}
            if n == SOURCE_N:
                entry["code"][name]["sources"] = [k["source"] for k in parsed["kernels"]]
            versions[name] = lambda c=compiled: c(x)  # noqa: B023
        _check_softmax(versions["fused Triton"](), x, "fused Triton")
        nbytes = intensity.softmax(m, n, torch.float16, "fused").nbytes
        times = bench.time_rounds(versions, repeats)
        entry["rows"] = [{"name": k, **t, "gbps": bench.gbps(nbytes, t["ms"])}
                         for k, t in times.items()]
        entry["compulsory_bytes"] = nbytes
        out.append(entry)
    return out


def _epilogue(ns, configs, repeats) -> list[dict]:
    dt = torch_dtype(EPILOGUE_DTYPE)
    out = []
    for i, n in enumerate(ns):
        a, b = _randn((n, n), dt, seed=800 + i), _randn((n, n), dt, seed=900 + i)
        checks, usable = {}, []
        for cfg in configs:       # every configuration right, with and without the epilogue
            try:
                for act in me.ACTIVATIONS:
                    what = f"{act} {cfg.describe()}"
                    checks[what] = _check_epilogue(
                        me.matmul_act(a, b, act, config=cfg), a, b, act, what)
                usable.append(cfg)
            except AssertionError:
                raise
            except Exception as err:  # noqa: BLE001 - a tile the compiler cannot fit
                checks[cfg.describe()] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        if not usable:
            raise RuntimeError(f"no epilogue configuration compiled at {n}^3: {checks}")
        checks["cuBLAS, then F.leaky_relu"] = _check_epilogue(
            me.unfused(a, b), a, b, "leaky_relu", "cuBLAS then F.leaky_relu")
        c = torch.matmul(a, b)
        tried = bench.time_rounds({cfg: lambda cfg=cfg: me.matmul_act(  # noqa: B023
            a, b, "none", config=cfg) for cfg in usable}, 1)
        cfg = min(tried, key=lambda k: tried[k]["ms"])
        versions = {
            "cuBLAS alone": lambda: torch.matmul(a, b),  # noqa: B023
            "cuBLAS, then F.leaky_relu (2 kernels)": lambda: me.unfused(a, b),  # noqa: B023
            "Triton alone (no activation)":
                lambda: me.matmul_act(a, b, "none", config=cfg),  # noqa: B023
            "Triton, then F.leaky_relu (2 kernels)": lambda: me.unfused(  # noqa: B023
                a, b, lambda x, y: me.matmul_act(x, y, "none", config=cfg)),  # noqa: B023
            "Triton, leaky_relu in the epilogue (1 kernel)":
                lambda: me.matmul_act(a, b, "leaky_relu", config=cfg),  # noqa: B023
            "F.leaky_relu alone (the extra pass over C)":
                lambda: torch.nn.functional.leaky_relu(c, me.NEGATIVE_SLOPE),  # noqa: B023
        }
        times = bench.time_rounds(versions, repeats)
        flops = intensity.matmul(n, n, n).flops
        pass_bytes = 2 * n * n * a.element_size()
        # the product rows get their TFLOP/s, the activation pass (no product) its GB/s
        rate = {k: ({"gbps": bench.gbps(pass_bytes, t["ms"])} if k.startswith("F.leaky_relu")
                    else {"tflops": bench.tflops(flops, t["ms"])}) for k, t in times.items()}
        out.append({"n": n, "dtype": EPILOGUE_DTYPE,
                    "config": cfg.as_dict(me.LAUNCH_KEYS),
                    "pass_bytes": pass_bytes, "checks": checks,
                    "rows": [{"name": k, **t, **rate[k]} for k, t in times.items()]})
    return out


def _profiled_kernels(fn, calls: int, flush=None) -> list[tuple]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if flush is not None:
                flush.zero_()
            fn()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
            if e.device_type == DeviceType.CUDA]


def _profile(m, ns, repeats) -> list[dict]:
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=runtime.device())
    flush_names = {k[0] for k in _profiled_kernels(flush.zero_, 3)}
    out = []
    for i, n in enumerate(ns):
        x = _randn((m, n), torch.float16, seed=1000 + i, scale=3.0)
        calls = trace(sk.naive_softmax, x)
        _check_softmax(calls.result, x, "naive_softmax")
        _check_softmax(sk.softmax_v1(x), x, "fused Triton")
        fn = lambda: sk.naive_softmax(x)  # noqa: E731, B023
        fn()
        rows, span = kernel_table(_profiled_kernels(fn, PROFILE_CALLS, flush), flush_names,
                                  PROFILE_CALLS)
        for i, row in enumerate(rows):
            row["name"] = kernel_name(row["kernel"])
            if len(rows) == len(calls):   # one kernel per aten op: its bytes are known
                nbytes = calls[i].read + calls[i].written
                row.update(op=calls[i].op, bytes=nbytes, gbps=nbytes / row["us"] / 1e3)
        times = bench.time_rounds({"naive": fn, "fused": lambda: sk.softmax_v1(x)},  # noqa: B023
                                  repeats)
        out.append({"m": m, "n": n, "dtype": "fp16", "kernels": rows,
                    "sum_kernel_us": sum(r["us"] for r in rows), "span_us": span,
                    "naive": times["naive"], "fused": times["fused"],
                    "naive_bytes": calls.bytes,
                    "fused_bytes": intensity.softmax(m, n, torch.float16, "fused").nbytes,
                    "flush_kernels": sorted(flush_names)})
    return out


def _check_on_any_device(m, spelling_ns, epilogue_ns, configs) -> None:
    """The checks a CPU can run: the eager spellings and the epilogue kernel, small."""
    for n in spelling_ns:
        x = _randn((m, n), torch.float16, seed=1, scale=3.0)
        for name, fn in SPELLINGS.items():
            _check_softmax(fn(x), x, name + " (eager)")
    for n in epilogue_ns:
        a, b = _randn((n, n), torch.float16, seed=2), _randn((n, n), torch.float16, seed=3)
        for cfg in configs:
            for act in me.ACTIVATIONS:
                _check_epilogue(me.matmul_act(a, b, act, config=cfg), a, b, act,
                                f"{act} {cfg.describe()}")


@experiment("fusion_more")
def fusion_more(spelling_ns=SPELLING_NS, epilogue_ns=EPILOGUE_NS, profile_ns=PROFILE_NS,
                m: int = SOFTMAX_M, epilogue_configs=EPILOGUE_CONFIGS, repeats: int = REPEATS,
                smoke: bool = False) -> dict:
    """Softmax spellings under torch.compile, a fused matmul epilogue, and the five-op
    softmax's kernels under the profiler (about a minute on an H100, compiling included)."""
    if smoke:
        return fusion_more(**SMOKE)
    start = time.perf_counter()
    _check_on_any_device(min(m, 64), spelling_ns[:1], epilogue_ns[:1], epilogue_configs)
    runtime.require_gpu("compiling and timing lesson 05's second experiment")
    torch._dynamo.config.recompile_limit = 64
    from torch._inductor import config as inductor_config

    out = {"repeats": repeats,
           "inductor_online_softmax": getattr(inductor_config, "online_softmax", None)}
    out["spellings"] = _spellings(m, spelling_ns, repeats)
    out["epilogue"] = _epilogue(epilogue_ns, epilogue_configs, repeats)
    out["profile"] = _profile(m, profile_ns, repeats)
    torch.cuda.empty_cache()
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out

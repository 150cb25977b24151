"""The profiler's view of lessons 01 and 05: which kernels a call launches, and what each costs.

``torch.profiler`` records every kernel the GPU ran, with its own device time. This
experiment profiles five calls the lessons compare by their napkin bytes, so a learner can
test the lessons' attributions against the GPU's own account:

* **lesson 05** at its headline shape, ``M = N = 4096`` fp16: the five-op
  :func:`~helpers.kernels.softmax.naive_softmax` (five kernels, five round trips to DRAM),
  ``torch.softmax`` (one PyTorch kernel) and the course's fused Triton
  :func:`~helpers.kernels.softmax.softmax` (one kernel, the row in registers);
* **lesson 01**'s preview of fusion, ``gelu(x + bias)`` on a 16384 x 16384 fp32 activation:
  :func:`~helpers.kernels.memory_wall.bias_gelu_unfused` (two Triton kernels, the sum
  written to DRAM and read back) and :func:`~helpers.kernels.memory_wall.bias_gelu_fused`.

Each call is checked against its reference first (both modes), then warmed up and profiled
``calls`` times (GPU only). Per kernel the record keeps its device time per call, its share
of the op's, what it computes (``op``: its aten op, or the step of a course kernel) and the
bytes it must move by the napkin math: for an aten kernel the sizes of the tensors its op
reads and writes (:func:`helpers.launches.trace`), for the course's own kernels the count
their docstrings give. Bytes over time is the bandwidth that kernel used.
"""

from __future__ import annotations

import time

import torch

from .. import intensity, runtime
from ..dtypes import dtype_key, torch_dtype
from ..kernels import memory_wall as mw
from ..kernels import softmax as sk
from ..launches import trace
from . import experiment
from .memory_wall import FUSION_SHAPE

SOFTMAX_SHAPE = (4096, 4096)          # lesson 05's headline shape (M = N = 4096)
SOFTMAX_DTYPE = "fp16"
CHAIN_DTYPE = "fp32"                  # lesson 01's fusion preview: 16384 x 16384 fp32
WARMUP = 5
CALLS = 20
NAME_CHARS = 80

# A few seconds on a GPU; on a CPU it checks every op in the interpreter at a small shape,
# then stops at the first profile with NeedsGPUError.
SMOKE = dict(softmax_shape=(8, 256), chain_shape=(16, 96), calls=2)


# --------------------------------------------------------------------------------------
# The ops: name -> what it is, the callable, its reference, the napkin bytes per launch.
# --------------------------------------------------------------------------------------


def _launches(fn, x) -> list[tuple[str, int]]:
    """(aten op, bytes it reads and writes) of each op of ``fn(x)``, in launch order (one
    kernel each)."""
    return [(k.op, k.read + k.written) for k in trace(fn, x)]


def _ops(softmax_shape, chain_shape, dev) -> dict:
    g = torch.Generator(device=dev).manual_seed(0)
    sdt, cdt = torch_dtype(SOFTMAX_DTYPE), torch_dtype(CHAIN_DTYPE)
    x = (3 * torch.randn(softmax_shape, device=dev, generator=g)).to(sdt)
    m = torch.randn(chain_shape, device=dev, generator=g).to(cdt)
    bias = torch.randn(chain_shape[1], device=dev, generator=g).to(cdt)
    tmp, out = torch.empty_like(m), torch.empty_like(m)
    rows, cols = chain_shape
    es = m.element_size()
    fused = intensity.softmax(*softmax_shape, sdt, "fused").nbytes
    want_softmax = sk.softmax_reference(x)
    want_chain = mw.bias_gelu_reference(m, bias)
    s_tol, c_tol = sk.TOLERANCES[sdt], (1e-5, 1e-5)
    loose = (2e-3, 2e-2)     # five ops, each rounded to fp16: errors of a few fp16 ulps
    return {
        "softmax naive": dict(
            description="lesson 05: softmax as five PyTorch ops (amax, sub, exp, sum, div)",
            fn=lambda: sk.naive_softmax(x), want=want_softmax, tol=loose, shape=softmax_shape,
            dtype=SOFTMAX_DTYPE, launches=_launches(sk.naive_softmax, x)),
        "softmax torch": dict(
            description="lesson 05: torch.softmax, PyTorch's one softmax kernel",
            fn=lambda: torch.softmax(x, dim=-1), want=want_softmax, tol=s_tol,
            shape=softmax_shape, dtype=SOFTMAX_DTYPE,
            launches=_launches(lambda t: torch.softmax(t, dim=-1), x)),
        "softmax fused": dict(
            description="lesson 05: the course's fused Triton softmax (row in registers)",
            fn=lambda: sk.softmax(x), want=want_softmax, tol=s_tol, shape=softmax_shape,
            dtype=SOFTMAX_DTYPE, launches=[("softmax", fused)]),
        "elementwise chain unfused": dict(
            description="lesson 01: gelu(x + bias) as two Triton kernels (bias_add, gelu)",
            fn=lambda: mw.bias_gelu_unfused(m, bias, tmp=tmp, out=out), want=want_chain,
            tol=c_tol, shape=chain_shape, dtype=CHAIN_DTYPE,
            # bias_add reads x and the bias, writes t; gelu reads t, writes y
            launches=[("x + bias", (2 * rows * cols + cols) * es),
                      ("gelu", 2 * rows * cols * es)]),
        "elementwise chain fused": dict(
            description="lesson 01: gelu(x + bias) as one fused Triton kernel",
            fn=lambda: mw.bias_gelu_fused(m, bias, out=out), want=want_chain, tol=c_tol,
            shape=chain_shape, dtype=CHAIN_DTYPE,
            launches=[("gelu(x + bias)",
                       intensity.bias_gelu(rows, cols, cdt, version="fused").nbytes)]),
    }


def _check(name: str, op: dict) -> None:
    got, want = op["fn"](), op["want"]
    atol, rtol = op["tol"]
    if got.shape != want.shape or got.dtype != want.dtype or not torch.allclose(
            got.float(), want.float(), atol=atol, rtol=rtol):
        err = (got.float() - want.float()).abs().max().item()
        raise AssertionError(f"{name} is wrong: max error {err:.3g} (atol {atol}, rtol {rtol})")


# --------------------------------------------------------------------------------------
# From the profiler's events to the record's rows (pure: tested without a GPU).
# --------------------------------------------------------------------------------------


_NOISE = ("void ", "at::native::", "(anonymous namespace)::", "c10::", "at::")


def short_name(name: str, taken=()) -> str:
    """A kernel's name as the profiler reports it, less the namespaces that every PyTorch
    kernel carries (``at::native::``, ``c10::``), cut to :data:`NAME_CHARS`; a name already
    ``taken`` by another kernel gets a number (two reductions differ only past the cut)."""
    for part in _NOISE:
        name = name.replace(part, "")
    short = name[:NAME_CHARS]
    i = 2
    while short in taken:
        short = f"{name[:NAME_CHARS - 3 - len(str(i))]} [{i}]"
        i += 1
    return short


def kernel_rows(totals: dict[str, tuple[int, float]], order: list[str],
                launches: list[tuple[str, int]], calls: int) -> dict:
    """The record's entry for one op.

    ``totals``: kernel name -> (launches, device µs summed over all ``calls``), as
    ``key_averages()`` gives them; ``order``: the kernel names of every launch in time order;
    ``launches``: what each launch of one call computes (its aten op, or the step of a
    course kernel) and the napkin bytes it moves, in order. The i-th launch of a call is
    ``launches[i]`` when a call launched exactly that many kernels; otherwise what it does
    and its bytes are unknown (``None``).
    """
    total = sum(us for _, us in totals.values()) / calls
    per_call = len(order) // calls if calls else 0
    known = per_call == len(launches) and len(order) == per_call * calls
    moved: dict[str, list[int]] = {}
    does: dict[str, list[str]] = {}
    if known:
        for name, (what, nbytes) in zip(order[:per_call], launches):
            moved.setdefault(name, []).append(nbytes)
            does.setdefault(name, []).append(what)
    rows = []
    for name, (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        us_call = us / count
        b = moved.get(name)
        nbytes = int(sum(b) / len(b)) if b else None
        rows.append({"name": short_name(name, [r["name"] for r in rows]),
                     "op": ", ".join(does[name]) if name in does else None,
                     "calls_per_op": count / calls,
                     "us_per_call": us_call, "share": (us / calls) / total if total else 0.0,
                     "bytes": nbytes,
                     "gbps": nbytes / (us_call * 1e-6) / 1e9 if nbytes and us_call > 0 else None})
    return {"total_us": total, "kernels": rows}


def _device_us(evt) -> float:
    for attr in ("self_device_time_total", "device_time_total", "self_cuda_time_total",
                 "cuda_time_total"):
        value = getattr(evt, attr, None)
        if value:
            return float(value)
    return 0.0


def _profile(fn, calls: int) -> tuple[dict, list[str]]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    totals = {e.key: (e.count, _device_us(e)) for e in prof.key_averages()
              if e.device_type == DeviceType.CUDA and e.count}
    if not totals or sum(us for _, us in totals.values()) <= 0:   # read the kernels instead
        totals = {}
        for e in kernels:
            count, us = totals.get(e.name, (0, 0.0))
            totals[e.name] = (count + 1, us + e.time_range.elapsed_us())
    return totals, [e.name for e in kernels]


@experiment("profiles")
def profiles(softmax_shape=SOFTMAX_SHAPE, chain_shape=FUSION_SHAPE, calls: int = CALLS,
             smoke: bool = False) -> dict:
    """torch.profiler's kernel table of five calls of lessons 01 and 05 (about 10 s)."""
    if smoke:
        return profiles(**SMOKE)
    start = time.perf_counter()
    ops = _ops(tuple(softmax_shape), tuple(chain_shape), runtime.device())
    for name, op in ops.items():
        _check(name, op)

    runtime.require_gpu("profiling kernels")     # everything above ran on a CPU too
    out = {}
    for name, op in ops.items():
        totals, order = _profile(op["fn"], calls)
        out[name] = {"description": op["description"], "shape": list(op["shape"]),
                     "dtype": dtype_key(torch_dtype(op["dtype"])), "calls_profiled": calls,
                     **kernel_rows(totals, order, op["launches"], calls)}
    return {"ops": out, "profiler": {"torch": torch.__version__},
            "seconds": round(time.perf_counter() - start, 1)}

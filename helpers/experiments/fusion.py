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

The module also holds what lesson 05 draws from the record: tables, plots, a summary.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

from .. import bench, hardware
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


def _torch_dtype(name: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


# --------------------------------------------------------------------------------------
# Counting what eager PyTorch launches: every aten op, the bytes it reads and writes.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelCall:
    """One aten op that launches a kernel: what it reads and writes, in bytes."""

    op: str
    read: int
    written: int
    inputs: str
    outputs: str

    def as_dict(self) -> dict:
        return {"op": self.op, "read": self.read, "written": self.written,
                "inputs": self.inputs, "outputs": self.outputs}


class Trace(list):
    """The kernels one call launched, in order (a list of :class:`KernelCall`)."""

    result = None

    @property
    def bytes(self) -> int:
        return sum(k.read + k.written for k in self)

    def table(self) -> str:
        rows = [(f"{i + 1}", k.op, f"{k.read:,}", f"{k.written:,}", f"{k.inputs} -> {k.outputs}")
                for i, k in enumerate(self)]
        head = ("#", "aten op", "bytes read", "bytes written", "tensors")
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
                  for i, h in enumerate(head)]
        fmt = lambda r: "  ".join(v.rjust(w) if i in (2, 3) else v.ljust(w)  # noqa: E731
                                  for i, (v, w) in enumerate(zip(r, widths))).rstrip()
        lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
        lines.append(f"{len(self)} kernels, {self.bytes:,} bytes in all")
        return "\n".join(lines)

    __repr__ = table

    def as_list(self) -> list[dict]:
        return [k.as_dict() for k in self]

    @classmethod
    def from_list(cls, rows: list[dict]) -> "Trace":
        return cls(KernelCall(**r) for r in rows)


def _short(t) -> str:
    from ..hardware import dtype_key

    try:
        name = dtype_key(t.dtype)
    except ValueError:
        name = str(t.dtype).replace("torch.", "")
    return f"{name}{list(t.shape)}"


def _nbytes(t) -> int:
    # A broadcast (expanded) view has more elements than memory; count the memory.
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def trace(fn, *args, **kwargs) -> Trace:
    """Run ``fn(*args, **kwargs)`` and list every aten op it dispatched that does work.

    Each op of eager PyTorch is (at least) one kernel that reads its input tensors
    from DRAM and writes its outputs back, so summing their sizes counts the traffic of
    the unfused version, the way the napkin math does. Views (``x[:, None]``,
    ``.view``) move nothing and are left out. Works in both modes: on the CPU the ops
    are the same, only the kernels behind them differ.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    calls = Trace()

    def tensors(tree):
        return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]

    class _Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            returns = func._schema.returns
            is_view = bool(returns) and returns[0].alias_info is not None \
                and not returns[0].alias_info.is_write
            if not is_view and func.overloadpacket.__name__ not in ("empty", "empty_like",
                                                                   "empty_strided"):
                ins, outs = tensors((args, kwargs)), tensors(out)
                calls.append(KernelCall(
                    op=f"aten.{func.overloadpacket.__name__}",
                    read=sum(_nbytes(t) for t in ins),
                    written=sum(_nbytes(t) for t in outs),
                    inputs=", ".join(_short(t) for t in ins) or "-",
                    outputs=", ".join(_short(t) for t in outs) or "-"))
            return out

    with _Counter():
        calls.result = fn(*args, **kwargs)
    return calls


# --------------------------------------------------------------------------------------
# What torch.compile generates: Inductor's kernels, as source text.
# --------------------------------------------------------------------------------------

_TRITON_KERNEL = re.compile(r"async_compile\.triton\(\s*'(\w+)'\s*,\s*'''(.*?)'''", re.S)
_CPP_KERNEL = re.compile(r"(\w+) = async_compile\.cpp_pybinding\(\s*\[.*?\]\s*,\s*r?'''(.*?)'''",
                         re.S)


def parse_inductor_code(codes: list[str]) -> dict:
    """Pull the kernels out of the Python modules Inductor wrote.

    On a GPU Inductor writes Triton kernels (``async_compile.triton(name, source)``);
    on a CPU it writes C++ with OpenMP and vector intrinsics
    (``async_compile.cpp_pybinding(...)``).
    """
    kernels, backend = [], None
    for code in codes:
        for name, source in _TRITON_KERNEL.findall(code):
            kernels.append({"name": name, "source": source.strip("\n")})
            backend = "triton"
        for name, source in _CPP_KERNEL.findall(code):
            kernels.append({"name": name, "source": source.strip("\n")})
            backend = backend or "cpp"
    out = {"backend": backend, "kernels": kernels}
    if not kernels and codes:
        out["wrapper"] = codes[0][:20000]
    return out


def inductor_code(fn, *args) -> dict:
    """Compile ``fn`` with ``torch.compile`` and return the kernels Inductor generated.

    On a CPU this runs a C++ compiler and takes tens of seconds the first time.
    """
    import torch
    from torch._inductor.utils import run_and_get_code

    _, codes = run_and_get_code(torch.compile(fn, dynamic=False), *args)
    return parse_inductor_code(codes)


# --------------------------------------------------------------------------------------
# The measurements (GPU only).
# --------------------------------------------------------------------------------------


def _randn(shape, dtype, seed: int, scale: float = 1.0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(shape, device="cuda", generator=g)).to(dtype)


def _error(got, want, tolerance) -> tuple[float, bool]:
    import torch

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


def _compile(fn):
    """``torch.compile`` with shapes fixed: one specialised kernel per shape, no guards
    that would send later shapes down a generic path."""
    import torch

    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def _softmax_targets(dtypes) -> list[dict]:
    import torch

    from ..kernels import softmax as sk

    out = []
    for dt_name in dtypes:
        dt = _torch_dtype(dt_name)
        for i, n in enumerate(SOFTMAX_NS):
            m = SOFTMAX_M
            x = _randn((m, n), dt, seed=i, scale=3.0)
            compiled = _compile(sk.naive_softmax)
            cmp = _versions(
                f"softmax {m}x{n} {dt_name}",
                {"naive (5 PyTorch ops)": (lambda: sk.naive_softmax(x),
                                           sk.bytes_moved("naive", m, n, dt)),
                 "torch.softmax": (lambda: torch.softmax(x, dim=-1),
                                   sk.bytes_moved("fused", m, n, dt)),
                 "torch.compile(naive)": (lambda: compiled(x), sk.bytes_moved("fused", m, n, dt)),
                 "fused Triton": (lambda: sk.softmax_v1(x), sk.bytes_moved("fused", m, n, dt))},
                sk.softmax_reference(x), sk.TOLERANCES[dt], sk.flops(m, n),
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
    import torch
    import triton

    from ..kernels import softmax as sk

    dt = _torch_dtype(LONG_ROW_DTYPE)
    out = []
    for i, n in enumerate(LONG_ROW_NS):
        m = LONG_ROW_ELEMENTS // n
        x = _randn((m, n), dt, seed=100 + i, scale=3.0)
        block = triton.next_power_of_2(n)
        warps = sk.num_warps_for(block)
        versions = {
            "naive (5 PyTorch ops)": (lambda: sk.naive_softmax(x),
                                      sk.bytes_moved("naive", m, n, dt)),
            "torch.softmax": (lambda: torch.softmax(x, dim=-1), sk.bytes_moved("fused", m, n, dt)),
            "row in registers (v1)": (lambda: sk.softmax_v1(x), sk.bytes_moved("fused", m, n, dt)),
            "online, two passes": (lambda: sk.softmax_online(x),
                                   sk.bytes_moved("online", m, n, dt)),
        }
        cmp = _versions(f"softmax {m}x{n} {LONG_ROW_DTYPE}", versions, sk.softmax_reference(x),
                        sk.TOLERANCES[dt], sk.flops(m, n), baseline="torch.softmax")
        cmp.update(m=m, n=n, dtype=LONG_ROW_DTYPE, block=block, num_warps=warps,
                   compulsory_bytes=sk.bytes_moved("fused", m, n, dt))
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
    from ..kernels import softmax as sk

    dt = _torch_dtype("fp16")
    rows = []
    for i, n in enumerate(SOFTMAX_NS):
        x = _randn((SOFTMAX_M, n), dt, seed=200 + i, scale=3.0)
        nbytes = sk.bytes_moved("fused", SOFTMAX_M, n, dt)
        for w in WARPS:
            try:
                sk.softmax_v1(x, num_warps=w)
                ms = bench.time_ms(lambda: sk.softmax_v1(x, num_warps=w))
                rows.append({"n": n, "num_warps": w, "ms": ms, "gbps": bench.gbps(nbytes, ms)})
            except Exception as err:  # noqa: BLE001
                rows.append({"n": n, "num_warps": w, "error": f"{type(err).__name__}: {err}"[:300]})
        del x
    return rows


def _bias_gelu() -> dict:
    from ..kernels import gelu as gk

    m, n = GELU_SHAPE
    dt = _torch_dtype(DTYPE)
    x = _randn((m, n), dt, seed=300, scale=2.0)
    bias = _randn((n,), dt, seed=301)
    compiled = _compile(gk.bias_gelu_eager)
    eager_b, fused_b = (gk.bytes_moved(v, m, n, dt) for v in ("bias_gelu_eager", "bias_gelu_fused"))
    cmp = _versions(
        f"bias + GELU {m}x{n} {DTYPE}",
        {"eager PyTorch (2 kernels)": (lambda: gk.bias_gelu_eager(x, bias), eager_b),
         "torch.compile(eager)": (lambda: compiled(x, bias), fused_b),
         "fused Triton (v1, flat)": (lambda: gk.bias_gelu(x, bias), fused_b),
         "fused Triton (v2, 2-D tiles)": (lambda: gk.bias_gelu_v2(x, bias), fused_b)},
        gk.bias_gelu_reference(x, bias), gk.TOLERANCES[dt], gk.flops("bias_gelu", m, n),
        baseline="eager PyTorch (2 kernels)")
    cmp.update(shape=[m, n], dtype=DTYPE)
    return cmp


def _gelu_configs() -> list[dict]:
    from ..kernels import gelu as gk

    m, n = GELU_SHAPE
    dt = _torch_dtype(DTYPE)
    x = _randn((m, n), dt, seed=302, scale=2.0)
    bias = _randn((n,), dt, seed=303)
    nbytes = gk.bytes_moved("bias_gelu_fused", m, n, dt)
    rows = []
    for version, fn in (("v1", gk.bias_gelu), ("v2", gk.bias_gelu_v2)):
        for block, warps in GELU_CONFIGS:
            try:
                fn(x, bias, block, warps)
                ms = bench.time_ms(lambda: fn(x, bias, block, warps))
                rows.append({"version": version, "block_size": block, "num_warps": warps,
                             "ms": ms, "gbps": bench.gbps(nbytes, ms)})
            except Exception as err:  # noqa: BLE001
                rows.append({"version": version, "block_size": block, "num_warps": warps,
                             "error": f"{type(err).__name__}: {err}"[:300]})
    return rows


def _swiglu() -> dict:
    from ..kernels import gelu as gk

    m, n = GELU_SHAPE
    dt = _torch_dtype(DTYPE)
    gate = _randn((m, n), dt, seed=310, scale=2.0)
    up = _randn((m, n), dt, seed=311)
    compiled = _compile(gk.swiglu_eager)
    eager_b, fused_b = (gk.bytes_moved(v, m, n, dt) for v in ("swiglu_eager", "swiglu_fused"))
    cmp = _versions(
        f"SwiGLU {m}x{n} {DTYPE}",
        {"eager PyTorch (2 kernels)": (lambda: gk.swiglu_eager(gate, up), eager_b),
         "torch.compile(eager)": (lambda: compiled(gate, up), fused_b),
         "fused Triton": (lambda: gk.swiglu(gate, up), fused_b)},
        gk.swiglu_reference(gate, up), gk.TOLERANCES[dt], gk.flops("swiglu", m, n),
        baseline="eager PyTorch (2 kernels)")
    cmp.update(shape=[m, n], dtype=DTYPE)
    return cmp


def _rmsnorm_inputs(seed: int):
    m, n = RMSNORM_SHAPE
    dt = _torch_dtype(DTYPE)
    return (_randn((m, n), dt, seed=seed), _randn((m, n), dt, seed=seed + 1),
            _randn((n,), dt, seed=seed + 2))


def _rmsnorm() -> dict:
    from ..kernels import rmsnorm as rk

    m, n = RMSNORM_SHAPE
    dt = _torch_dtype(DTYPE)
    x, r, w = _rmsnorm_inputs(400)
    compiled = _compile(rk.residual_rmsnorm_eager)
    b = {v: rk.bytes_moved(v, m, n, dt) for v in rk.VERSIONS}
    cmp = _versions(
        f"residual add + RMSNorm {m}x{n} {DTYPE}",
        {"eager PyTorch (Llama style)": (lambda: rk.residual_rmsnorm_eager(x, r, w), b["eager"]),
         "add + F.rms_norm": (lambda: rk.residual_rmsnorm_torch(x, r, w), b["torch"]),
         "torch.compile(eager)": (lambda: compiled(x, r, w), b["fused"]),
         "fused Triton": (lambda: rk.residual_rmsnorm(x, r, w), b["fused"])},
        rk.residual_rmsnorm_reference(x, r, w), rk.TOLERANCES[dt], rk.flops(m, n),
        baseline="eager PyTorch (Llama style)")
    cmp.update(shape=[m, n], dtype=DTYPE)
    return cmp


def _rmsnorm_warps() -> list[dict]:
    from ..kernels import rmsnorm as rk

    m, n = RMSNORM_SHAPE
    x, r, w = _rmsnorm_inputs(410)
    nbytes = rk.bytes_moved("fused", m, n, _torch_dtype(DTYPE))
    rows = []
    for warps in WARPS:
        try:
            rk.residual_rmsnorm(x, r, w, num_warps=warps)
            ms = bench.time_ms(lambda: rk.residual_rmsnorm(x, r, w, num_warps=warps))
            rows.append({"num_warps": warps, "ms": ms, "gbps": bench.gbps(nbytes, ms)})
        except Exception as err:  # noqa: BLE001
            rows.append({"num_warps": warps, "error": f"{type(err).__name__}: {err}"[:300]})
    return rows


def _traces() -> dict:
    from ..kernels import gelu as gk
    from ..kernels import rmsnorm as rk
    from ..kernels import softmax as sk

    m, n = RMSNORM_SHAPE
    x = _randn((SOFTMAX_M, 4096), _torch_dtype("fp16"), seed=500)
    a, r, w = _rmsnorm_inputs(510)
    gm, gn = GELU_SHAPE
    g = _randn((gm, gn), _torch_dtype(DTYPE), seed=520)
    bias = _randn((gn,), _torch_dtype(DTYPE), seed=521)
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
    from ..kernels import gelu as gk
    from ..kernels import rmsnorm as rk
    from ..kernels import softmax as sk

    out = {}
    x = _randn((SOFTMAX_M, 4096), _torch_dtype("fp16"), seed=600)
    a, r, w = _rmsnorm_inputs(610)
    g = _randn(GELU_SHAPE, _torch_dtype(DTYPE), seed=620)
    bias = _randn((GELU_SHAPE[1],), _torch_dtype(DTYPE), seed=621)
    for name, fn, args in (("bias_gelu_eager", gk.bias_gelu_eager, (g, bias)),
                           ("naive_softmax", sk.naive_softmax, (x,)),
                           ("residual_rmsnorm_eager", rk.residual_rmsnorm_eager, (a, r, w))):
        try:
            out[name] = inductor_code(fn, *args)
        except Exception as err:  # noqa: BLE001
            out[name] = {"error": f"{type(err).__name__}: {str(err)[:600]}"}
    return out


def _device_report() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    keys = ("multi_processor_count", "regs_per_multiprocessor", "shared_memory_per_multiprocessor",
            "shared_memory_per_block_optin", "L2_cache_size", "max_threads_per_multi_processor")
    return {k: getattr(props, k) for k in keys if hasattr(props, k)}


@experiment("fusion")
def fusion() -> dict:
    """Every measurement of lesson 05 (under a minute on an H100 or H200, compiling included)."""
    import torch

    start = time.perf_counter()
    torch._dynamo.config.recompile_limit = 64
    out = {"device": _device_report(), "copy": hardware.measure_copy_bandwidth()}
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


# --------------------------------------------------------------------------------------
# Reading a record: tables, the targets, plots.
# --------------------------------------------------------------------------------------


def _peak_gbps(rec) -> float | None:
    try:
        return hardware.lookup(rec.gpu).hbm_bandwidth_gbs
    except KeyError:
        return None


def comparison(rec, entry: dict | str) -> bench.Comparison:
    """A recorded comparison (``"bias_gelu"``, ``"swiglu"``, ``"rmsnorm"``, or one entry
    of ``"softmax"``) as a table: time, speed-up, GB/s of each version's own bytes."""
    d = rec.results[entry] if isinstance(entry, str) else entry
    rows = [bench.Measurement(r["name"], r["ms"], r["bytes"], r.get("flops", 0))
            for r in d["rows"] if "ms" in r]
    return bench.Comparison(title=d["title"], rows=rows, baseline=d["baseline"],
                            peak_gbps=_peak_gbps(rec), source=rec.label)


def _ms(entry: dict, name: str) -> float | None:
    for r in entry["rows"]:
        if r["name"] == name:
            return r.get("ms")
    return None


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def softmax_rows(rec) -> list[dict]:
    """One line per (dtype, N) of the softmax targets: times in microseconds and ratios."""
    rows = []
    for e in rec.results["softmax"]:
        naive, torch_, compiled, fused = (_ms(e, k) for k in (
            "naive (5 PyTorch ops)", "torch.softmax", "torch.compile(naive)", "fused Triton"))
        rows.append({"dtype": e["dtype"], "N": e["n"], "naive us": 1e3 * naive,
                     "torch.softmax us": 1e3 * torch_, "compile us": 1e3 * compiled,
                     "fused us": 1e3 * fused,
                     "fused GB/s": bench.gbps(_row(e, "fused Triton")["bytes"], fused),
                     "vs torch": torch_ / fused, "vs naive": naive / fused,
                     "vs compile": compiled / fused})
    return rows


def _row(entry: dict, name: str) -> dict:
    return next(r for r in entry["rows"] if r["name"] == name)


def format_rows(rows: list[dict]) -> str:
    """A list of dicts as an aligned text table (numbers to 3 significant figures)."""
    cols = list(rows[0])
    cell = lambda v: (f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}") if isinstance(v, float) \
        else str(v)  # noqa: E731
    cells = [[cell(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


def targets(rec) -> list[dict]:
    """Lesson 05's performance targets, each with the measured value and a verdict."""
    res = rec.results
    soft = softmax_rows(rec)
    copy_gbps = res["copy"]["gbps"]
    rms, gel = res["rmsnorm"], res["bias_gelu"]
    rms_fused = _ms(rms, "fused Triton")
    rms_gbps = bench.gbps(_row(rms, "fused Triton")["bytes"], rms_fused)
    gelu_fused = _ms(gel, "fused Triton (v1, flat)")
    out = [
        ("fused softmax vs torch.softmax (geomean, M=4096, N=1024..16384)",
         geomean(r["vs torch"] for r in soft), 1.0, "x"),
        ("fused softmax vs naive softmax (geomean)",
         geomean(r["vs naive"] for r in soft), 3.0, "x"),
        ("fused residual + RMSNorm vs eager PyTorch",
         _ms(rms, "eager PyTorch (Llama style)") / rms_fused, 1.5, "x"),
        ("fused residual + RMSNorm, fraction of copy bandwidth", rms_gbps / copy_gbps, 0.8, ""),
        ("fused bias + GELU vs eager PyTorch",
         _ms(gel, "eager PyTorch (2 kernels)") / gelu_fused, 2.0, "x"),
        ("torch.compile bias + GELU vs eager PyTorch (reported)",
         _ms(gel, "eager PyTorch (2 kernels)") / _ms(gel, "torch.compile(eager)"), None, "x"),
    ]
    return [{"target": name, "measured": value, "goal": goal, "unit": unit,
             "met": None if goal is None else value >= goal} for name, value, goal, unit in out]


def format_targets(rows: list[dict]) -> str:
    lines = []
    for t in rows:
        goal = "" if t["goal"] is None else f"goal >= {t['goal']:g}{t['unit']}"
        mark = {True: "met", False: "NOT met", None: ""}[t["met"]]
        lines.append(f"{t['target']:<66} {t['measured']:6.2f}{t['unit']:<2} {goal:<13} {mark}")
    return "\n".join(lines)


def plot_softmax(rec, ax=None):
    """Speed-up over ``torch.softmax`` against row length, per version and dtype."""
    import matplotlib.pyplot as plt

    from ..plots import finish

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    rows = softmax_rows(rec)
    styles = {"fp16": "-", "bf16": "--"}
    for j, (key, label) in enumerate((("fused us", "fused Triton"),
                                      ("compile us", "torch.compile(naive)"),
                                      ("naive us", "naive (5 PyTorch ops)"))):
        for dt in sorted({r["dtype"] for r in rows}):
            sel = [r for r in rows if r["dtype"] == dt]
            ax.plot([r["N"] for r in sel], [r["torch.softmax us"] / r[key] for r in sel],
                    styles.get(dt, "-"), marker="o", color=f"C{j}", label=f"{label}, {dt}")
    ax.axhline(1.0, color="0.3", lw=1, ls=":", label="torch.softmax")
    ax.set_xscale("log", base=2)
    return finish(ax, title=f"Row softmax, M = {SOFTMAX_M} rows: speed-up over torch.softmax",
                  xlabel="row length N (elements)", ylabel="speed-up over torch.softmax (x)",
                  source=rec.label)


def plot_long_rows(rec, ax=None):
    """Effective bandwidth (the 2MN compulsory bytes over the time) against row length."""
    import matplotlib.pyplot as plt

    from ..plots import finish

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    entries = rec.results["softmax_long_rows"]
    names = [r["name"] for r in entries[0]["rows"]]
    for j, name in enumerate(names):
        pts = [(e["n"], bench.gbps(e["compulsory_bytes"], _row(e, name)["ms"]))
               for e in entries if "ms" in _row(e, name)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{j}", label=name)
    copy = rec.results["copy"]["gbps"]
    ax.axhline(copy, color="0.3", lw=1, ls=":", label=f"copy: {copy:,.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, copy * 1.15)
    e0 = entries[0]
    return finish(ax, title=f"Softmax on {LONG_ROW_ELEMENTS // 2**20} Mi {e0['dtype']} elements, "
                  "cut into rows of N", xlabel="row length N (elements)",
                  ylabel="effective bandwidth, 2MN bytes / time (GB/s)", source=rec.label)


def roofline_points(rec) -> list:
    """Each op's unfused and fused versions as roofline points: same FLOPs, fewer bytes."""
    from ..roofline import Point

    res = rec.results
    soft = next((e for e in res["softmax"] if e["n"] == 4096 and e["dtype"] == "fp16"),
                res["softmax"][len(res["softmax"]) // 2])
    picks = [(soft, "naive (5 PyTorch ops)", "softmax, naive"),
             (soft, "fused Triton", "softmax, fused"),
             (res["bias_gelu"], "eager PyTorch (2 kernels)", "bias+GELU, eager"),
             (res["bias_gelu"], "fused Triton (v1, flat)", "bias+GELU, fused"),
             (res["rmsnorm"], "eager PyTorch (Llama style)", "residual+RMSNorm, eager"),
             (res["rmsnorm"], "fused Triton", "residual+RMSNorm, fused")]
    points = []
    for entry, name, label in picks:
        r = _row(entry, name)
        points.append(Point(label, r["flops"] / r["bytes"], bench.tflops(r["flops"], r["ms"]),
                            rec.label))
    return points


def plot_roofline(rec, ax=None):
    """The fp32 (CUDA-core) roofline of the recorded GPU, each op's unfused version (open
    circle) joined by an arrow to its fused version (square)."""
    from .. import roofline

    gpu = hardware.lookup(rec.gpu)
    ax = roofline.plot(gpu, dtypes=("fp32",), points=(), ax=ax, xlim=(1 / 64, 64),
                       source=rec.label,
                       title=f"Fusion moves each op right and up ({gpu.name}, fp32 CUDA cores)")
    points = roofline_points(rec)
    for j, (before, after) in enumerate(zip(points[::2], points[1::2])):
        colour = f"C{j + 3}"
        for p, marker, face in ((before, "o", "none"), (after, "s", colour)):
            ax.plot([p.intensity], [p.tflops], marker, mfc=face, color=colour, ms=7,
                    label=f"{p.label}: {p.tflops:.3g} TFLOP/s at {p.intensity:.3g} FLOP/B")
        ax.annotate("", xy=(after.intensity, after.tflops),
                    xytext=(before.intensity, before.tflops),
                    arrowprops={"arrowstyle": "->", "color": colour, "lw": 1.2})
    ax.legend(fontsize=7, loc="lower right")
    return ax

"""Checks for lesson 05 (kernel fusion): counting what each version moves, and predicting.

Every expected value comes from the napkin math of :mod:`helpers.intensity` or from a
record, never from a typed-in number. The end of the lesson asks when a kernel pays for
itself and what a new shape costs a compiled function:

* :func:`amdahl`: the end-to-end speed-up when one part of the time gets faster, and
  :func:`hottest_kernel` (a ``fusion_more`` profile) or :func:`hottest_profiled` (an op of
  the ``profiles`` record), which read that part and its ceiling from a recorded profile;
  :func:`check_hottest_speedup` checks a prediction of it before either prints.
* :class:`CompileCounter`: a ``torch.compile`` backend that runs each graph eagerly (no code
  is generated, so it is quick on any machine) and keeps the shapes of every graph it was
  given, with the sizes Dynamo made symbolic shown as ``s0``, ``s1``, ...
"""

from __future__ import annotations

import torch

from .. import intensity
from ..dtypes import element_size
from ..feedback import Feedback, check_choice, check_number


def check_swiglu_bytes(answer, m: int, n: int, dtype=torch.bfloat16) -> Feedback:
    """Exercise: DRAM bytes of eager SwiGLU, ``silu(gate) * up``, on ``m x n`` tensors."""
    s = element_size(dtype)
    mn = m * n
    return check_number(
        "bytes of eager SwiGLU", answer, intensity.swiglu(m, n, dtype, "unfused").nbytes,
        rel=0.01, unit="B", mistakes=[
            (intensity.swiglu(m, n, dtype, "fused").nbytes,
             "you counted the fused kernel (read gate and up, write y), or the reads alone. "
             "Eager SiLU also writes silu(gate) to DRAM and the product reads it back"),
            (4 * mn * s, "you counted silu(gate) once: SiLU writes it to DRAM and the product "
                         "reads it back, so it crosses the bus twice"),
            (5 * mn, "you counted elements, not bytes")],
        hint="two kernels: list what each reads and writes, M x N elements each")


def check_online_softmax_bytes(answer, m: int, n: int, dtype=torch.float16) -> Feedback:
    """Exercise: DRAM bytes of the online (two-pass) softmax on an ``m x n`` input."""
    s = element_size(dtype)
    return check_number(
        "bytes of the online softmax", answer, intensity.softmax(m, n, dtype, "online").nbytes,
        rel=0.01, unit="B", mistakes=[
            (intensity.softmax(m, n, dtype, "fused").nbytes,
             "that is the row-in-registers kernel: the online one reads each row twice"),
            (4 * m * n * s, "the second pass writes y once; it does not write anything else"),
            (3 * m * n, "you counted elements, not bytes")],
        hint="pass 1 reads the row; pass 2 reads it again and writes y")


# --------------------------------------------------------------------------------------
# Predictions read from a record.
# --------------------------------------------------------------------------------------

VS_BYTES = ("less", "about", "more")   # than the bytes predict; "about" is within 10 %


def softmax_vs_bytes(rec, dtype: str = "fp16", n: int = 4096) -> dict:
    """The five-op softmax's time over the fused kernel's in record ``rec`` at ``n``
    columns, beside the ratio of their bytes (what the bytes alone predict)."""
    e = next((e for e in rec.results["softmax"] if e["dtype"] == dtype and e["n"] == n), None)
    if e is None:
        raise KeyError(f"the record has no {dtype} softmax with N = {n}")
    naive, fused = (next(r for r in e["rows"] if r["name"] == k)
                    for k in ("naive (5 PyTorch ops)", "fused Triton"))
    measured, predicted = naive["ms"] / fused["ms"], naive["bytes"] / fused["bytes"]
    verdict = "about" if abs(measured / predicted - 1) <= 0.1 else (
        "more" if measured > predicted else "less")
    return {"measured": measured, "predicted": predicted, "verdict": verdict, "m": e["m"]}


def check_softmax_vs_bytes(answer, rec, dtype: str = "fp16", n: int = 4096) -> Feedback:
    """Prediction: does the fused softmax beat the five-op one by less than, about (within
    10 %) or more than the ratio of their bytes? One of :data:`VS_BYTES`."""
    s = softmax_vs_bytes(rec, dtype, n)
    why = (f"In the run of the record ({rec.gpu}, {s['m']} x {n} {dtype}): {s['measured']:.2f}x "
           f"measured, {s['predicted']:.2f}x from the bytes.")
    return check_choice(f"fused against five-op softmax at N = {n}", answer, s["verdict"],
                        VS_BYTES, why)


# --------------------------------------------------------------------------------------
# When a kernel pays: Amdahl's law on a recorded profile.
# --------------------------------------------------------------------------------------
def amdahl(p: float, k: float) -> float:
    """Amdahl's law: the whole runs ``1 / ((1 - p) + p / k)`` times faster when a part
    that takes the fraction ``p`` of its time runs ``k`` times faster."""
    if not 0 <= p <= 1:
        raise ValueError(f"p is a fraction of the time, between 0 and 1; got {p}")
    if k <= 0:
        raise ValueError(f"k is a speed-up, greater than 0; got {k}")
    return 1 / ((1 - p) + p / k)


def hottest_kernel(entry: dict, copy_gbps: float) -> dict:
    """The kernel that takes longest in one profiled call (an entry of the ``fusion_more``
    record's ``"profile"``): its op, its share ``p`` of the kernels' time, and the most a
    faster kernel for it could gain, ``k``: its time over the time its bytes take at the
    measured copy bandwidth. Only kernels whose bytes the record knows are considered."""
    known = [k for k in entry["kernels"] if "bytes" in k]
    if not known:
        raise ValueError("this profile gives no kernel's bytes (its kernels did not match the "
                         "aten ops one to one)")
    k = max(known, key=lambda x: x["us"])
    floor_us = k["bytes"] / copy_gbps / 1e3
    return {"op": k.get("op", k["name"]), "us": k["us"], "total_us": entry["sum_kernel_us"],
            "p": k["us"] / entry["sum_kernel_us"], "floor_us": floor_us, "k": k["us"] / floor_us}



def hottest_profiled(op: dict, copy_gbps: float) -> dict:
    """The same for one op of the ``profiles`` record, whose kernel rows are one per kernel
    name and aten op (``sub`` and ``div`` launch the same kernel but are two rows; lesson 05's
    family table, :func:`helpers.plots.fusion.kernel_families`, groups them): the row with the
    largest share ``p`` of the op's device time, what it computes (``computes``, its aten op
    where the record says), and ``k``, its time per launch over the time its bytes take at
    ``copy_gbps``. Only rows whose bytes the record knows are considered."""
    known = [k for k in op["kernels"] if k.get("bytes")]
    if not known:
        raise ValueError("this profile gives no kernel's bytes (its launches did not match the "
                         "napkin math's one to one)")
    k = max(known, key=lambda x: x["share"])
    floor_us = k["bytes"] / copy_gbps / 1e3
    return {"op": k["name"], "computes": k.get("op", ""), "launches": k["calls_per_op"],
            "us": k["us_per_call"] * k["calls_per_op"], "total_us": op["total_us"],
            "p": k["share"], "floor_us": floor_us * k["calls_per_op"],
            "k": k["us_per_call"] / floor_us}


def check_end_to_end(answer, p: float, k: float) -> Feedback:
    """Prediction: the whole call's speed-up when a part taking ``p`` of it gets ``k`` times
    faster."""
    return check_number(
        "the end-to-end speed-up", answer, amdahl(p, k), rel=0.05, unit="x", mistakes=[
            (k, "the op alone got faster: the other kernels take as long as before"),
            (1 / (1 - p), "the op took no time at all: that is the limit as k grows"),
            ((1 - p) + p / k, "you gave the new time as a fraction of the old: the speed-up is "
                              "its inverse"),
            (amdahl(p, 1 / k), ("you took k as the kernel's rate over the copy's; k is its "
                                "time over its bytes' time at the copy rate, more than 1"))],
        hint="the other kernels keep their time (1 - p); the op's p shrinks to p / k")


def check_hottest_speedup(answer, op: dict, copy_gbps: float) -> Feedback:
    """Prediction, made before p and k print: the whole call's speed-up when the costliest
    launch of ``op`` (an op of the ``profiles`` record, read by :func:`hottest_profiled`)
    runs at ``copy_gbps``. The learner reads p and k from the profile's table."""
    hot = hottest_profiled(op, copy_gbps)
    return check_end_to_end(answer, hot["p"], hot["k"])


# --------------------------------------------------------------------------------------
# Counting what torch.compile compiles.
# --------------------------------------------------------------------------------------


def _shape(value, names: dict) -> str:
    dims = []
    for d in getattr(value, "shape", ()):
        if isinstance(d, int):
            dims.append(str(d))
        else:                                  # a SymInt: Dynamo's names (s27, s77) vary,
            key = str(d)                       # so number the symbols in order of appearance
            dims.append(names.setdefault(key, f"s{len(names)}") if key.isidentifier() else key)
    return "[" + ", ".join(dims) + "]"


class CompileCounter:
    """A ``torch.compile`` backend: ``torch.compile(fn, backend=CompileCounter())``.

    Dynamo calls a backend once per graph it compiles; this one writes down the tensor
    inputs' shapes and runs the graph as it is (like ``backend="eager"``).
    """

    def __init__(self):
        self.graphs: list[dict[str, str]] = []

    def __call__(self, gm, example_inputs):
        names: dict[str, str] = {}
        shapes = {}
        for node in gm.graph.nodes:
            value = node.meta.get("example_value")
            if node.op == "placeholder" and hasattr(value, "shape"):
                shapes[node.name.removeprefix("l_").rstrip("_")] = _shape(value, names)
        self.graphs.append(shapes)
        return gm.forward

    @property
    def count(self) -> int:
        return len(self.graphs)

    def __str__(self) -> str:
        lines = [f"{self.count} compilation{'s' * (self.count != 1)}:"]
        for i, shapes in enumerate(self.graphs, 1):
            lines.append(f"  {i}. " + ", ".join(f"{k} {v}" for k, v in shapes.items()))
        return "\n".join(lines)


def check_compilations(answer, count: int, calls: int = 3) -> Feedback:
    """Prediction: how many times ``torch.compile`` compiles a function called on ``calls``
    different shapes (``count``, as a :class:`CompileCounter` saw it)."""
    mistakes = [(calls, "every new shape compiled again: that is dynamic=False"),
                (1, "one graph served every shape: that is dynamic=True")]
    return check_number(f"compilations for {calls} shapes", answer, count, rel=0.0,
                        unit="compilations",
                        mistakes=[(v, d) for v, d in mistakes if v != count],
                        hint="the first call compiles for its shape; what does the second "
                             "teach Dynamo?")


def compile_and_call(fn, device, dynamic=None, widths=(64, 96, 128), rows: int = 4):
    """Compile ``fn(x, bias)`` afresh with a :class:`CompileCounter` backend and call it on
    ``rows`` x ``n`` inputs for each ``n`` of ``widths``; the counter, which saw each graph."""
    import torch._dynamo

    torch._dynamo.reset()                       # forget every graph compiled so far
    counter = CompileCounter()
    compiled = torch.compile(fn, backend=counter, dynamic=dynamic)
    for n in widths:
        x = torch.randn(rows, n, device=device)
        compiled(x, torch.randn(n, device=device))
    return counter

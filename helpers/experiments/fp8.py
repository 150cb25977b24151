"""Lesson 09's measurements: FP8 against bf16, in accuracy and in speed.

* **accuracy** (any mode: the interpreter computes the same products exactly, a GPU with
  its tensor cores): activations with a few channels far larger than the rest (the
  outliers of real LLM activations), weights of one scale; each scaling of
  :func:`helpers.kernels.fp8.scaled_matmul` (per tensor, per row, DeepSeek-V3's blocks;
  per tensor with and without promotion), and bf16 for reference: the relative error
  ``||C - C64|| / ||C64||`` against the float64 product of the *unquantised* inputs.
  :func:`accuracy` is the function; :func:`accuracy_table` sweeps the outliers' size.
* **speed** (GPU): the same scalings at square and LLM shapes beside what a practitioner
  runs, ``torch._scaled_mm`` (per tensor, and row-wise scales), and bf16 ``torch.matmul``
  and the course's own bf16 matmul (:func:`helpers.kernels.matmul.matmul`): medians of
  rounds taken in turn, TFLOP/s.
* **accumulation** (any mode): the error of the tensor cores' sum alone. Each version
  against the float64 product of its *own dequantised operands*, so the rounding of the
  inputs to FP8 is out of the picture and what is left is how the sum over K was kept:
  never promoted, promoted every 128 values of K, or block scales (promoted by
  construction), as K grows, on operands of mixed signs and on all-positive ones.
  In the interpreter every sum is exact (fp32), so only a GPU's record shows the effect.
* **quantize** (GPU): :func:`helpers.kernels.fp8.quantize` per granularity on a bf16
  activation, in GB/s of the bytes it must move (read bf16, write fp8 and the scales),
  beside a device copy of the same tensor.

``fp8_experiment(smoke=True)`` runs tiny sizes.
"""

from __future__ import annotations

import time

import torch

from .. import bench, runtime
from ..kernels import fp8
from ..kernels.matmul import matmul as course_matmul
from . import experiment
from .attention import _failure

SCALINGS = ("tensor", "row", "block")
# The lesson's goals (issue-set; the report and the record tests read them from here).
TENSOR_VS_SCALED_MM = 0.95   # per-tensor scales, every shape: x torch._scaled_mm
VS_BF16 = 1.6                # per-tensor scales, every shape: x the course's bf16 matmul
BLOCK_VS_TENSOR = (0.9, (8192, 8192, 8192))   # block scales: x our per-tensor, at this shape
QUANTIZE_OF_COPY = (0.8, "1x128")             # the quantisation kernel: of copy bandwidth
PROMOTE = 128   # K values per promotion in the "promoted" rows: DeepSeek-V3's interval
OUTLIER_CHANNELS = 4
OUTLIER_SCALES = (1.0, 1e2, 1e3, 1e4, 1e5)
# (M, N, K): squares and LLM projections (a 4,096-wide model's MLP up and down, 8k tokens).
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 14336, 4096), (8192, 4096, 14336)]
DRAWN = 2                        # shapes drawn afresh at each record (seed in the record)
SMOKE_SHAPES = [(256, 256, 512)]
ACCUMULATION_KS = {"gpu": (1024, 4096, 16384, 65536), "cpu": (256, 1024)}
ACCUMULATION_MN = {"gpu": (512, 512), "cpu": (16, 16)}
SIGNS = ("mixed", "positive")
ACCURACY_SIZE = {"gpu": (2048, 2048, 4096), "cpu": (32, 32, 384)}
ROUNDS = 3


def inputs(M: int, N: int, K: int, outlier_scale: float, seed: int = 0, device=None):
    """``(x, w)``: ``x`` (M, K) normal with :data:`OUTLIER_CHANNELS` columns times
    ``outlier_scale``, ``w`` (N, K) normal over sqrt(K), both fp32. The weights of the
    outlier channels are divided by the same factor, so that every channel adds about as
    much to the product: otherwise the outliers' share of ``C`` hides what happens to the
    rest (and a layer whose output were only its outlier channels would not need them)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g) / K ** 0.5
    outliers = torch.randperm(K, generator=g)[:OUTLIER_CHANNELS]
    x[:, outliers] *= outlier_scale
    w[:, outliers] /= outlier_scale
    device = device or runtime.device()
    return x.to(device), w.to(device)


def _relative_error(c, want) -> float:
    return ((c.double() - want).norm() / want.norm()).item()


def accuracy(x: torch.Tensor, w: torch.Tensor) -> dict:
    """Each version's relative error against ``x @ w.T`` in float64."""
    want = x.double() @ w.double().T
    out = {}
    # bf16 operands, an exact product: what rounding the inputs to bf16 alone costs.
    out["bf16 operands"] = _relative_error(
        x.to(torch.bfloat16).double() @ w.to(torch.bfloat16).double().T, want)
    for scaling in SCALINGS:
        ga, gb = fp8.GRANULARITY_OF[scaling]
        a, a_s = fp8.quantize(x, ga)
        b, b_s = fp8.quantize(w, gb)
        runs = {scaling: 0} if scaling == "block" else {scaling: 0,
                                                        f"{scaling}, promoted": PROMOTE}
        for name, every in runs.items():
            c = fp8.scaled_matmul(a, b, a_s, b_s, scaling, out_dtype=torch.float32,
                                  promote_every=every)
            out[name] = _relative_error(c, want)
    return out


def accuracy_table(smoke: bool = False) -> list[dict]:
    """:func:`accuracy` for each outlier size, at the mode's size."""
    M, N, K = ACCURACY_SIZE["cpu" if smoke or runtime.is_cpu() else "gpu"]
    return [{"outlier_scale": s, "shape": [M, N, K], "errors": accuracy(*inputs(M, N, K, s))}
            for s in OUTLIER_SCALES]


def accumulation_table(smoke: bool = False) -> list[dict]:
    """The tensor cores' sum alone: each version against the float64 product of its own
    dequantised operands, as K grows, operands of mixed signs or all positive."""
    mode = "cpu" if smoke or runtime.is_cpu() else "gpu"
    (M, N), rows = ACCUMULATION_MN[mode], []
    for signs in SIGNS:
        for K in ACCUMULATION_KS[mode]:
            x, w = inputs(M, N, K, 1.0, seed=K)
            if signs == "positive":
                x, w = x.abs(), w.abs()
            errors = {}
            for name, scaling, every in (("never promoted", "tensor", 0),
                                         (f"promoted every {PROMOTE}", "tensor", PROMOTE),
                                         ("block scales", "block", 0)):
                ga, gb = fp8.GRANULARITY_OF[scaling]
                (a, a_s), (b, b_s) = fp8.quantize(x, ga), fp8.quantize(w, gb)
                c = fp8.scaled_matmul(a, b, a_s, b_s, scaling, out_dtype=torch.float32,
                                      promote_every=every)
                errors[name] = _relative_error(
                    c, fp8.scaled_matmul_reference(a, b, a_s, b_s, scaling))
            rows.append({"K": K, "signs": signs, "shape": [M, N, K], "errors": errors})
    return rows


def drawn_shapes(seed: int, count: int = DRAWN) -> list[tuple[int, int, int]]:
    """Shapes no one chose: M anywhere in 4,096-8,192, N a multiple of 8 and K of 16 (what
    the TMA needs of C's and the operands' rows; the rest runs on the pointer kernel)."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo, hi, step):
        return step * int(torch.randint(lo // step, hi // step + 1, (1,), generator=g))

    return [(draw(4096, 8192, 1), draw(4096, 8192, 8), draw(4096, 8192, 16))
            for _ in range(count)]


PADDED = "torch._scaled_mm, tensor scales, operands padded to 16"


def _padded(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``t`` (rows, cols) in zeros of a whole number of 16 rows and 16 columns."""
    out = torch.zeros((-(-rows // 16) * 16, -(-cols // 16) * 16), device=t.device, dtype=t.dtype)
    out[:rows, :cols] = t
    return out


def _versions(M, N, K) -> dict:
    x, w = inputs(M, N, K, 1.0)
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    q = {s: (fp8.quantize(x, fp8.GRANULARITY_OF[s][0]), fp8.quantize(w, fp8.GRANULARITY_OF[s][1]))
         for s in SCALINGS}
    fns = {}
    for s in SCALINGS:
        (a, a_s), (b, b_s) = q[s]
        fns[f"ours, {s} scales"] = lambda a=a, b=b, a_s=a_s, b_s=b_s, s=s: fp8.scaled_matmul(
            a, b, a_s, b_s, s)
    (a, a_s), (b, b_s) = q["tensor"]
    fns[f"ours, tensor scales, promoted every {PROMOTE}"] = lambda: fp8.scaled_matmul(
        a, b, a_s, b_s, "tensor", promote_every=PROMOTE)
    fns["ours, pointer kernel, tensor scales"] = lambda: fp8.scaled_matmul(
        a, b, a_s, b_s, "tensor", kernel="pointer")
    if hasattr(torch, "_scaled_mm"):
        fns["torch._scaled_mm, tensor scales"] = lambda: torch._scaled_mm(
            a, b.T, a_s.view(()), b_s.view(()), out_dtype=torch.bfloat16)
        (ar, ar_s), (br, br_s) = q["row"]
        fns["torch._scaled_mm, row scales"] = lambda: torch._scaled_mm(
            ar, br.T, ar_s, br_s.T.contiguous(), out_dtype=torch.bfloat16)
    if hasattr(torch, "_scaled_mm") and (N % 16 or K % 16):
        # cuBLAS's FP8 needs K and N in multiples of 16: what a careful user runs instead,
        # the weights padded once ahead of time and the activations' K padded with zeros.
        ap, bp = _padded(a, M, K), _padded(b, N, K)
        fns[PADDED] = lambda: torch._scaled_mm(ap, bp.T, a_s.view(()), b_s.view(()),
                                               out_dtype=torch.bfloat16)[:, :N]
    fns["torch.matmul, bf16"] = lambda: xb @ wb.T
    wt = wb.T.contiguous()
    fns["course matmul, bf16"] = lambda: course_matmul(xb, wt)
    return fns


def _speed(shapes, drawn=()) -> list[dict]:
    rows = []
    for M, N, K in list(shapes) + list(drawn):
        fns, runs, errors = _versions(M, N, K), {}, {}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                if name in errors:
                    continue
                try:
                    fn()
                    runs.setdefault(name, []).append(bench.time_ms(fn))
                except Exception as err:  # noqa: BLE001 - a refusal is a result
                    errors[name] = _failure(err)
        versions = [{"name": n, "error": e} for n, e in errors.items()]
        for name, times in runs.items():
            if name not in errors:
                spread = bench.spread(times)
                versions.append({"name": name, **spread,
                                 "tflops": bench.tflops(2 * M * N * K, spread["ms"])})
        rows.append({"shape": [M, N, K], "drawn": (M, N, K) in drawn, "versions": versions})
        torch.cuda.empty_cache()
    return rows


def _quantize_speed(M: int, K: int) -> dict:
    """Each granularity's quantisation of an (M, K) bf16 tensor beside a copy of it: ``ms``
    is the GPU's time (a CUDA graph of the call: the kernels alone), ``call_ms`` the call's
    as Python makes it, host work between its launches included."""
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    copy = torch.empty_like(x)
    out = {"shape": [M, K], "copy": {"ms": bench.time_graph_ms(lambda: copy.copy_(x))}}
    out["copy"]["gbps"] = bench.gbps(2 * x.numel() * 2, out["copy"]["ms"])
    for g in fp8.GRANULARITIES:
        try:
            ms = bench.time_graph_ms(lambda g=g: fp8.quantize(x, g))
            scales = torch.Size(fp8.scale_shape(g, (M, K))).numel()
            nbytes = x.numel() * 2 + x.numel() + scales * 4
            out[g] = {"ms": ms, "bytes": nbytes, "gbps": bench.gbps(nbytes, ms),
                      "call_ms": bench.time_ms(lambda g=g: fp8.quantize(x, g))}
        except Exception as err:  # noqa: BLE001
            out[g] = {"error": _failure(err)}
    try:        # per tensor with a delayed scale (here this tensor's own): one read, one write
        scale = (x.float().abs().amax() / fp8.E4M3.max).reshape(1)
        ms = bench.time_graph_ms(lambda: fp8.quantize_delayed(x, scale))
        nbytes = x.numel() * 2 + x.numel() + 4
        out["delayed"] = {"ms": ms, "bytes": nbytes, "gbps": bench.gbps(nbytes, ms),
                          "call_ms": bench.time_ms(lambda: fp8.quantize_delayed(x, scale))}
    except Exception as err:  # noqa: BLE001
        out["delayed"] = {"error": _failure(err)}
    return out


@experiment("fp8")
def fp8_experiment(smoke: bool = False) -> dict:
    """Accuracy, matmul speed and quantisation bandwidth (minutes on an H100)."""
    runtime.require_gpu("timing the FP8 kernels")
    start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    shapes = SMOKE_SHAPES if smoke else SHAPES
    seed = int(torch.randint(0, 2**31 - 1, (1,)))      # fresh each record, kept in it
    drawn = [] if smoke else drawn_shapes(seed)
    out = {"config": {"smoke": smoke, "shapes": shapes, "seed": seed, "drawn": drawn,
                      "promote_every": PROMOTE,
                      "outlier_channels": OUTLIER_CHANNELS,
                      "outlier_scales": list(OUTLIER_SCALES), "rounds": ROUNDS},
           "device": {"name": props.name, "sm_count": props.multi_processor_count},
           "accuracy": accuracy_table(smoke), "accumulation": accumulation_table(smoke),
           "speed": _speed(shapes, drawn),
           "quantize": _quantize_speed(*((256, 512) if smoke else (8192, 8192)))}
    # The persistent kernel's tuner: the setting it chose for each key (size class, scaling,
    # promotion), for reading a row that runs slower than its neighbours.
    tuner = fp8.persistent.fp8_matmul_persistent_tuned
    out["tuned"] = {str(k): {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
                    for k, c in tuner.cache.items()}
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out

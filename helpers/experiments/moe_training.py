"""Lesson 08's trainable layer on a GPU: forward and backward of the whole MoE layer (router,
dispatch, experts, combine) against what a practitioner trains with, autograd through
``torch._grouped_mm``, at the lesson's two shapes, bf16.

* **ours**: :func:`helpers.kernels.moe.experts_train` (its backward
  :mod:`helpers.kernels.moe.backward`), the router and dispatch as the layer runs them.
* **torch._grouped_mm**: the same router and dispatch, then the experts as model code
  writes them with ``torch._grouped_mm`` (gate and up in one call, SwiGLU, down) and the
  combine as an ``index_add_`` of the weighted rows; autograd does the backward. Both
  weight layouts ``torch._grouped_mm`` takes (row-major, and column-major as
  ``nn.Linear`` weights come), each run or recorded as refused.

Per shape and token count, the layer inside a network (``x`` requires grad, so both
versions run all six GEMMs: two forward, four backward): the forward alone (with autograd
recording, as in training) and forward + backward, medians of rounds taken in turn, TFLOP/s on the experts' FLOPs
(three times the forward's for forward + backward). A check first, at a small token
count: every gradient of both versions against an fp32 per-expert loop on the same
routing, as a fraction of the gradient's largest entry. Then ``torch.profiler``'s kernel
table of one forward + backward of each, at the token count the targets hold at.
``moe_training(smoke=True)`` runs it at tiny sizes.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .. import bench, runtime
from ..dtypes import torch_dtype
from ..intensity import expert_flops
from ..kernels import moe
from ..kernels.moe import grouped_tma
from . import experiment
from .attention import _failure, kernel_table
from .moe import (
    GMM_LAYOUTS,
    SHAPES,
    SMOKE_SHAPES,
    TARGET_TOKENS,
    _profile_one,
    _randn,
    _weights,
    gmm_weights,
)

DTYPE = "bf16"
TOKENS = {"many_small": (2048, 8192), "few_large": (1024, 4096)}
SMOKE_TOKENS = {"many_small": (64, 256), "few_large": (64, 256)}
CHECK_TOKENS = 512
OURS = "ours (Triton, experts_train)"
GMM = {layout: f"torch._grouped_mm autograd ({layout} W)" for layout in GMM_LAYOUTS}
# The targets: forward + backward against the faster torch._grouped_mm layout, at the
# token count lesson 08's forward targets hold at (experiments.moe.TARGET_TOKENS).
VS_GROUPED_MM = {"many_small": 1.0, "few_large": 0.95}


class Params:
    """One version's parameters, with gradients: router ``(H, E)``, ``gate_up``
    ``(E, H, 2I)`` and ``down`` ``(E, I, H)``, in a weight layout."""

    def __init__(self, w: moe.MoEWeights, layout: str = "row-major"):
        gate_up, down = gmm_weights(w, layout)     # lesson 08's layouts; refuses others
        # Copies (strides kept), so that no two versions share a tensor or its gradient.
        self.router, self.gate_up, self.down = (t.detach().clone() for t in (w.router, gate_up,
                                                                            down))
        for t in self.all():
            t.requires_grad_()

    def all(self):
        return (self.router, self.gate_up, self.down)

    def zero(self):
        for t in self.all():
            t.grad = None


def _routed(x, p: Params, top_k: int):
    weights, ids = moe.route(x @ p.router, top_k)
    return weights, moe.dispatch(ids, p.router.shape[1], check=False)


def ours(x, p: Params, top_k: int):
    weights, d = _routed(x, p, top_k)
    return moe.experts_train(x, weights, p.gate_up, p.down, d)


def grouped_mm_layer(x, p: Params, top_k: int):
    """The layer with ``torch._grouped_mm`` experts and an ``index_add_`` combine."""
    weights, d = _routed(x, p, top_k)
    I = p.down.shape[1]
    offs = d.offsets[1:].to(torch.int32)
    gu = torch._grouped_mm(x[d.rows.long()], p.gate_up, offs=offs)
    y = torch._grouped_mm(F.silu(gu[:, :I]) * gu[:, I:], p.down, offs=offs)
    scale = weights.reshape(-1)[d.order]
    out = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
    return out.index_add_(0, d.rows.long(), y.float() * scale[:, None]).to(x.dtype)


def loop_layer(x, router, gate_up, down, ids):
    """The check's reference: fp32, one PyTorch SwiGLU per expert, on routing ``ids``."""
    x32, router, gate_up, down = (t.float() for t in (x, router, gate_up, down))
    probs = torch.softmax(x32 @ router, dim=-1)
    w = probs.gather(1, ids)
    w = w / w.sum(-1, keepdim=True)
    I, out = down.shape[1], torch.zeros_like(x32)
    for e in range(down.shape[0]):
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        if token.numel():
            xe = x32[token]
            y = (F.silu(xe @ gate_up[e, :, :I]) * (xe @ gate_up[e, :, I:])) @ down[e]
            out = out.index_add(0, token, y * w[token, slot, None])
    return out


def _versions(w) -> dict:
    out = {OURS: (ours, Params(w))}
    for layout, name in GMM.items():
        if not hasattr(torch, "_grouped_mm"):
            out[name] = f"torch {torch.__version__} has no torch._grouped_mm"
            continue
        try:
            out[name] = (grouped_mm_layer, Params(w, layout))
        except Exception as err:  # noqa: BLE001 - a refusal is a result
            out[name] = _failure(err)
    return out


def _check(s, versions, dtype) -> dict:
    """Every gradient against the fp32 loop, as a fraction of its largest entry."""
    x = _randn((CHECK_TOKENS, s.hidden), dtype, seed=900)
    dout = _randn((CHECK_TOKENS, s.hidden), dtype, seed=901)
    out = {"tokens": CHECK_TOKENS}
    ids = None
    for name, v in versions.items():
        if isinstance(v, str):
            continue
        fn, p = v
        try:
            p.zero()
            xg = x.detach().clone().requires_grad_()
            if ids is None:
                ids = moe.route(x @ p.router, s.top_k)[1]
            fn(xg, p, s.top_k).backward(dout)
            ref = [t.detach().float().requires_grad_() for t in (x, *p.all())]
            loop_layer(*ref, ids).backward(dout.float())
            errs = {}
            for what, mine, theirs in zip(("x", "router", "gate_up", "down"), (xg, *p.all()),
                                          ref):
                scale = theirs.grad.abs().max().item() or 1.0
                errs[what] = (mine.grad.float() - theirs.grad).abs().max().item() / scale
            out[name] = {"relative_errors": errs, "ok": all(e < 5e-2 for e in errs.values())}
            p.zero()
        except Exception as err:  # noqa: BLE001 - one failure must not lose the rest
            out[name] = {"error": _failure(err)}
    return out


ROUNDS = 3


def _timings(s, versions, tokens, dtype) -> dict:
    x = _randn((tokens, s.hidden), dtype, seed=910).requires_grad_()
    dout = _randn((tokens, s.hidden), dtype, seed=911)
    flops = expert_flops(tokens * s.top_k, s.hidden, s.width)
    fns, rows = {}, {}
    for name, v in versions.items():
        if isinstance(v, str):
            rows[name] = {"name": name, "unavailable": v}
            continue
        fn, p = v

        def forward(fn=fn, p=p):
            p.zero()
            return fn(x, p, s.top_k)

        def step(fn=fn, p=p):
            p.zero()
            x.grad = None
            fn(x, p, s.top_k).backward(dout)

        fns[(name, "forward")], fns[(name, "step")] = forward, step
    runs = {k: [] for k in fns}
    failed = {}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            if k[0] in failed:
                continue
            try:
                f()
                runs[k].append(bench.time_ms(f))
            except Exception as err:  # noqa: BLE001
                failed[k[0]] = _failure(err)
    for name, v in versions.items():
        if name in rows:
            continue
        if name in failed:
            rows[name] = {"name": name, "error": failed[name]}
            continue
        fwd, step = bench.spread(runs[(name, "forward")]), bench.spread(runs[(name, "step")])
        rows[name] = {"name": name, "forward": fwd, "step": step,
                      "forward_tflops": bench.tflops(flops, fwd["ms"]),
                      "step_tflops": bench.tflops(3 * flops, step["ms"]),
                      "backward_ms": step["ms"] - fwd["ms"]}
        versions[name][1].zero()
    return {"tokens": tokens, "flops_forward": flops, "versions": list(rows.values())}


def _profile(s, versions, tokens, dtype, repeats: int = 3) -> dict:
    x = _randn((tokens, s.hidden), dtype, seed=920).requires_grad_()
    dout = _randn((tokens, s.hidden), dtype, seed=921)
    out = {"tokens": tokens, "repeats": repeats}
    for name, v in versions.items():
        if isinstance(v, str):
            continue
        fn, p = v

        def step(fn=fn, p=p):
            p.zero()
            x.grad = None
            fn(x, p, s.top_k).backward(dout)
        try:
            table = kernel_table(_profile_one(step, repeats), top=16)
            for r in table["kernels"]:
                r["calls"], r["cuda_us"] = r["calls"] / repeats, r["cuda_us"] / repeats
            table["launches"] /= repeats
            table["total_us"] /= repeats
            out[name] = table
        except Exception as err:  # noqa: BLE001
            out[name] = {"error": _failure(err)}
        p.zero()
    return out


# --------------------------------------------------------------------------------------
# Reading a record's timing entry (the lesson's table and the performance report).
# --------------------------------------------------------------------------------------


def version(entry: dict, name: str) -> dict | None:
    """Version ``name`` of a timing entry, if it ran."""
    v = next((v for v in entry["versions"] if v["name"] == name), None)
    return v if v is not None and "step" in v else None


def fastest_baseline(entry: dict) -> dict | None:
    """The faster ``torch._grouped_mm`` weight layout's entry, if either ran."""
    runs = [v for v in (version(entry, n) for n in GMM.values()) if v]
    return min(runs, key=lambda v: v["step"]["ms"]) if runs else None


def speedup(entry: dict) -> float | None:
    """How many times faster our forward + backward runs than the baseline's."""
    ours, base = version(entry, OURS), fastest_baseline(entry)
    return None if ours is None or base is None else base["step"]["ms"] / ours["step"]["ms"]


@experiment("moe_training")
def moe_training_experiment(smoke: bool = False) -> dict:
    """Forward and forward + backward of the layer, ours against torch._grouped_mm's
    autograd (a few minutes on an H100, tuning included; seconds with ``smoke``)."""
    start = time.perf_counter()
    dtype = torch_dtype(DTYPE)
    shapes, tokens = (SMOKE_SHAPES, SMOKE_TOKENS) if smoke else (SHAPES, TOKENS)
    out = {"config": {"dtype": DTYPE, "smoke": smoke, "check_tokens": CHECK_TOKENS,
                      "x_requires_grad": True,
                      "shapes": {k: {"name": s.name, "experts": s.experts, "top_k": s.top_k,
                                     "hidden": s.hidden, "width": s.width,
                                     "tokens": list(tokens[k])} for k, s in shapes.items()},
                      "target_tokens": {k: max(tokens[k]) if smoke else TARGET_TOKENS[k]
                                        for k in shapes}},
           "checks": {}, "timings": [], "profile": {}}
    if runtime.is_gpu():
        props = torch.cuda.get_device_properties(0)
        out["device"] = {"name": props.name, "sm_count": props.multi_processor_count}
    for key, s in shapes.items():
        w = _weights(s, dtype, seed=800)
        versions = _versions(w)
        out["checks"][key] = _check(s, versions, dtype)
        for t in tokens[key]:
            out["timings"].append({"shape": key, **_timings(s, versions, t, dtype)})
        out["profile"][key] = _profile(s, versions, out["config"]["target_tokens"][key], dtype)
        del versions, w
        if runtime.is_gpu():
            torch.cuda.empty_cache()
    # Which grouped GEMM ran each sorted-row product (TMA or cp.async), as timed per shape.
    out["grouped_matmul_plans"] = grouped_tma.chosen_plans()
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out

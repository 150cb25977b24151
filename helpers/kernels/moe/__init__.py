"""Mixture-of-Experts, lesson 08: route each token to ``top_k`` of ``E`` experts.

An MoE layer replaces one large feed-forward block by ``E`` smaller ones (the experts)
and a router that sends each token to ``top_k`` of them, so a token pays for ``top_k``
experts' FLOPs while the layer holds ``E`` experts' weights. Each expert is a SwiGLU
block: ``down(silu(x @ w_gate) * (x @ w_up))`` with ``w_gate, w_up: (H, I)`` and
``w_down: (I, H)``. Read top to bottom:

* :func:`moe_reference`: the spec. Every expert on every token in float64, then each
  token keeps its chosen experts' outputs, weighted. No sorting, no kernels.
* :func:`route`: the router. Softmax over the experts' logits in fp32, the ``top_k``
  largest, renormalised to sum to 1 (Mixtral's convention). It lives in
  :mod:`~helpers.kernels.moe.routing` with the routings the lesson studies it with (a
  random router's logits, the same skewed toward a few experts, a routing's balance).
* :func:`dispatch`: the token copies (``T x top_k`` of them) sorted by expert, stably:
  the permutation, the tokens each sorted row reads, the rows per expert and their
  offsets, and where each copy landed (``position``), for the way back. With a
  ``capacity``, an expert keeps its first ``capacity`` copies and the rest are dropped.
* :func:`padding_rows` (the napkin math's, :mod:`helpers.intensity.moe`, as is
  :func:`expert_flops`): rows a grouped GEMM computes and throws away, for a tile height.
* :func:`experts_loop` / :func:`moe_loop`: the baselines. One PyTorch matmul per expert,
  the way most model code first writes it.
* :func:`experts_forward` / :func:`moe_forward`: the same with the grouped GEMM kernels
  of :mod:`helpers.kernels.moe.grouped`: two launches for all experts, then the combine.
* :class:`MoELayer` / :func:`experts_train`: the layer that trains
  (:mod:`~helpers.kernels.moe.training`), its backward four grouped GEMMs, two of them the
  per-expert weight gradients (:mod:`~helpers.kernels.moe.backward`).

Shapes: ``x`` is ``(T, H)`` tokens, ``w_router`` ``(H, E)``, ``w_gate`` and ``w_up``
``(E, H, I)``, ``w_down`` ``(E, I, H)``. Weights may be any strided view (a transposed
copy for ``torch._grouped_mm``, say); activations are row-major.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ... import runtime
from ...dtypes import FLOAT_DTYPES
from ...intensity.moe import expert_flops, padding_rows
from ..checks import check_tensor
from .grouped import combine, expert_of_tile, grouped_gemm_kernel, grouped_matmul, grouped_swiglu
from .routing import route, router_logits, skewed_route
from .training import MoELayer, experts_train, split_gate_up

__all__ = [
    "Shape", "FEW_LARGE", "MANY_SMALL", "MoEWeights", "make_weights", "moe_reference",
    "route", "Dispatch", "dispatch", "capacity", "padding_rows", "experts_loop", "moe_loop",
    "experts_forward", "moe_forward", "grouped_swiglu", "grouped_matmul", "combine",
    "expert_of_tile", "grouped_gemm_kernel", "expert_flops", "TOLERANCES", "router_logits",
    "skewed_route", "MoELayer", "experts_train", "split_gate_up",
]

# (atol, rtol) of the layer's output against the float64 reference, for weights from
# :func:`make_weights` (outputs of order 1). fp32 runs through TF32 tensor cores on a GPU.
TOLERANCES = {
    torch.float32: (1e-2, 1e-2),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (6e-2, 6e-2),
}


@dataclass(frozen=True)
class Shape:
    """An MoE layer's sizes: experts, experts per token, hidden size, expert width."""

    name: str
    experts: int
    top_k: int
    hidden: int
    width: int


# Mixtral 8x7B's layer: few large experts.
FEW_LARGE = Shape("few large experts", experts=8, top_k=2, hidden=4096, width=14336)
# Qwen3-30B-A3B's layer: many small experts.
MANY_SMALL = Shape("many small experts", experts=128, top_k=8, hidden=2048, width=768)


@dataclass
class MoEWeights:
    router: torch.Tensor    # (H, E)
    gate: torch.Tensor      # (E, H, I)
    up: torch.Tensor        # (E, H, I)
    down: torch.Tensor      # (E, I, H)

    @property
    def experts(self) -> int:
        return self.gate.shape[0]

    def to(self, dtype=None, device=None) -> "MoEWeights":
        return MoEWeights(*(w.to(device=device, dtype=dtype)
                            for w in (self.router, self.gate, self.up, self.down)))


def make_weights(experts: int, hidden: int, width: int, *, dtype=torch.float32,
                 device=None, seed: int = 0) -> MoEWeights:
    """Random weights scaled so activations stay of order 1 through the layer."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape, fan_in):
        return torch.randn(*shape, generator=g) / math.sqrt(fan_in)

    w = MoEWeights(normal(hidden, experts, fan_in=hidden),
                   normal(experts, hidden, width, fan_in=hidden),
                   normal(experts, hidden, width, fan_in=hidden),
                   normal(experts, width, hidden, fan_in=width))
    return w.to(dtype=dtype, device=device or runtime.device())


# --------------------------------------------------------------------------------------
# The spec.
# --------------------------------------------------------------------------------------


def _swiglu(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate) * (x @ up)) @ down


def moe_reference(x: torch.Tensor, w: MoEWeights, top_k: int) -> torch.Tensor:
    """The layer in float64, every expert on every token (``E`` times the FLOPs): small sizes."""
    x64 = x.double()
    weights, ids = route(x64 @ w.router.double(), top_k)
    every = torch.stack([_swiglu(x64, w.gate[e].double(), w.up[e].double(), w.down[e].double())
                         for e in range(w.experts)])                       # (E, T, H)
    tokens = torch.arange(x.shape[0], device=x.device)[:, None]
    return (weights.double()[..., None] * every[ids, tokens]).sum(dim=1)


# --------------------------------------------------------------------------------------
# Dispatch (the router, :func:`route`, is in routing.py).
# --------------------------------------------------------------------------------------


@dataclass
class Dispatch:
    """Token copies sorted by expert (sorted row ``r`` = copy ``order[r]``).

    A copy is ``(token, slot)``, flattened as ``token * top_k + slot``.
    """

    order: torch.Tensor      # (R,) int64: the copy at each sorted row
    rows: torch.Tensor       # (R,) int32: the token each sorted row reads (order // top_k)
    counts: torch.Tensor     # (E,) int32: sorted rows per expert
    offsets: torch.Tensor    # (E + 1,) int64: expert e's rows are offsets[e]:offsets[e + 1]
    position: torch.Tensor   # (T, top_k) int64: the sorted row of each copy, -1 if dropped

    @property
    def dropped(self) -> int:
        return int((self.position < 0).sum())


def capacity(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Rows an expert may take: ``factor`` times its fair share ``tokens * top_k / E``."""
    return math.ceil(factor * tokens * top_k / experts)


def dispatch(ids: torch.Tensor, experts: int, capacity: int | None = None, *,
             check: bool = True) -> Dispatch:
    """Sort the copies of ``ids`` (``(T, top_k)`` expert numbers) by expert, stably.

    Stable: within an expert, copies keep token order, so with a ``capacity`` the
    earliest tokens are kept and the latest dropped, whatever their choice (Switch's
    rule for top-1; GShard's top-2 ranks every first choice before any second).
    Everything stays on the device: no step waits for the GPU, except the range check
    of the ids, which ``check=False`` skips (for ids that come from :func:`route`). The
    counts come from a ``scatter_add_``, not ``torch.bincount``, which on CUDA reads the
    largest id back to the host to size its output: a wait for the GPU.
    """
    if ids.dim() != 2:
        raise ValueError(f"ids must be (tokens, top_k), got shape {tuple(ids.shape)}")
    if check and ids.numel():
        low, high = (int(v) for v in torch.aminmax(ids))   # one wait for the GPU
        if low < 0 or high >= experts:
            raise ValueError(f"expert ids must lie in [0, {experts}); got {low} to {high}")
    T, top_k = ids.shape
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.long, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    offsets = torch.zeros(experts + 1, dtype=torch.long, device=ids.device)
    offsets[1:] = torch.cumsum(counts, dim=0)
    if capacity is not None:
        rank = torch.arange(order.numel(), device=ids.device) - offsets[flat[order]]
        order = order[rank < capacity]
        counts = counts.clamp(max=capacity)
        offsets[1:] = torch.cumsum(counts, dim=0)
    position = torch.full((T * top_k,), -1, dtype=torch.long, device=ids.device)
    position[order] = torch.arange(order.numel(), device=ids.device)
    return Dispatch(order, (order // top_k).to(torch.int32), counts.to(torch.int32), offsets,
                    position.view(T, top_k))


# --------------------------------------------------------------------------------------
# The baselines: one matmul per expert.
# --------------------------------------------------------------------------------------


def experts_loop(x_sorted: torch.Tensor, offsets, w: MoEWeights) -> torch.Tensor:
    """The experts on tokens already sorted by expert, one PyTorch SwiGLU per expert."""
    bounds = [int(o) for o in offsets]                   # one host read, then E launches
    y = torch.empty_like(x_sorted)
    for e in range(w.experts):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            y[lo:hi] = _swiglu(x_sorted[lo:hi], w.gate[e], w.up[e], w.down[e])
    return y


def moe_loop(x: torch.Tensor, w: MoEWeights, top_k: int) -> torch.Tensor:
    """The whole layer as model code often writes it: find each expert's tokens, run it,
    add its weighted output back (``index_add_``)."""
    weights, ids = route(x @ w.router, top_k)
    out = torch.zeros_like(x, dtype=torch.float32)
    for e in range(w.experts):
        token, slot = torch.nonzero(ids == e, as_tuple=True)   # a host sync per expert
        if token.numel():
            y = _swiglu(x[token], w.gate[e], w.up[e], w.down[e])
            out.index_add_(0, token, y.float() * weights[token, slot, None])
    return out.to(x.dtype)


# --------------------------------------------------------------------------------------
# The grouped version.
# --------------------------------------------------------------------------------------


def _check(x, w: MoEWeights) -> None:
    check_tensor(x, "x", dtypes=FLOAT_DTYPES, ndim=2)
    for name in ("router", "gate", "up", "down"):
        check_tensor(getattr(w, name), f"weights.{name}", dtypes=(x.dtype,),
                     ndim=2 if name == "router" else 3, contiguous=False)
    runtime.check_dot_dtype(x.dtype)
    E, H, I = w.gate.shape
    want = {"router": (H, E), "up": (E, H, I), "down": (E, I, H)}
    for name, shape in want.items():
        if tuple(getattr(w, name).shape) != shape:
            raise ValueError(f"weights.{name} has shape {tuple(getattr(w, name).shape)}; with "
                             f"gate (E, H, I) = {(E, H, I)} it must be {shape}")
    if w.gate.stride() != w.up.stride():
        raise ValueError(f"weights.gate and weights.up must share one layout (strides "
                         f"{w.gate.stride()} and {w.up.stride()}): the kernel walks both with "
                         "the same strides. Make both .contiguous(), or transpose both alike.")
    if x.shape[1] != H:
        raise ValueError(f"x has {x.shape[1]} features but the experts take H = {H}")


def experts_forward(x: torch.Tensor, d: Dispatch, w: MoEWeights, configs=(None, None)):
    """The experts for every sorted row of ``d``: gathered SwiGLU, then the down
    projection, two grouped launches. Returns ``(R, H)`` sorted rows."""
    _check(x, w)
    h = grouped_swiglu(x, d.rows, d.counts, w.gate, w.up, configs[0])
    return grouped_matmul(h, d.counts, w.down, configs[1])


def moe_forward(x: torch.Tensor, w: MoEWeights, top_k: int,
                capacity_factor: float | None = None, configs=(None, None)) -> torch.Tensor:
    """The layer: route (PyTorch), dispatch (PyTorch sort), grouped experts and combine
    (Triton). ``capacity_factor`` caps each expert's rows; dropped copies add nothing."""
    _check(x, w)
    weights, ids = route(x @ w.router, top_k)
    cap = None if capacity_factor is None else capacity(x.shape[0], top_k, w.experts,
                                                        capacity_factor)
    d = dispatch(ids, w.experts, cap, check=False)      # route's ids are in range
    y = experts_forward(x, d, w, configs)
    return combine(y, d.position, weights)


"""A trainable MoE layer: the forward's kernels and :mod:`~helpers.kernels.moe.backward`'s,
joined by ``torch.autograd``.

:func:`experts_train` is the experts and the combine as one autograd Function: its
forward runs the grouped SwiGLU (keeping ``[g | u]``, the two projections before the
activation), the grouped down projection and the combine; its backward runs the three
steps of :mod:`~helpers.kernels.moe.backward`. The router stays in PyTorch
(:func:`~helpers.kernels.moe.route`: a matmul, a softmax and a top-k, whose backward
autograd knows), and the routing weights enter :func:`experts_train` as an input, so their
gradient flows back through the softmax to the router and to ``x``.

What the backward keeps from the forward: ``x``, the weights, ``h`` (``R x I``, the down
projection's input, needed for its weight gradient) and ``[g | u]`` (``R x 2I``); not
``y`` (``R x H``): the routing weights' gradient is read off the first backward GEMM.

:class:`MoELayer` is the ``nn.Module``: a router ``(H, E)``, ``gate_up`` ``(E, H, 2I)``
(gate and up side by side, one tensor, so that their backward GEMMs are one launch each),
``down`` ``(E, I, H)``.
"""

from __future__ import annotations

import math

import torch

from ...dtypes import FLOAT_DTYPES
from ..checks import check_tensor
from .backward import gather_rows, grouped_weight_grad, swiglu_backward
from .grouped import combine, grouped_matmul, grouped_swiglu
from .routing import route


def split_gate_up(gate_up: torch.Tensor):
    """``(gate, up)``: the two halves of ``gate_up`` (``E x H x 2I``) as views, no copy."""
    I = gate_up.shape[2] // 2
    return gate_up[..., :I], gate_up[..., I:]


class _Experts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights, gate_up, down, d):
        gate, up = split_gate_up(gate_up)
        R, I = d.rows.numel(), down.shape[1]
        pre = torch.empty((R, 2 * I), device=x.device, dtype=x.dtype)
        h = grouped_swiglu(x, d.rows, d.counts, gate, up, pre=pre)
        y = grouped_matmul(h, d.counts, down)
        ctx.save_for_backward(x, weights, gate_up, down, h, pre)
        ctx.dispatch = d
        return combine(y, d.position, weights.contiguous())

    @staticmethod
    def backward(ctx, dout):
        x, weights, gate_up, down, h, pre = ctx.saved_tensors
        d = ctx.dispatch
        dout = dout.contiguous()
        E = down.shape[0]
        # Each sorted row's routing weight: copy order[r] is (token, slot) flattened.
        scale = weights.reshape(-1)[d.order].float().contiguous()
        dpre, ds = swiglu_backward(dout, d.rows, d.counts, down, pre, scale)
        # Only the gradients autograd asks for: a layer fed by the embedding (or frozen
        # experts) skips the GEMM behind each one it does not need.
        need_x, need_weights, need_gate_up, need_down = ctx.needs_input_grad[:4]
        dx = d_weights = d_gate_up = d_down = None
        if need_weights:
            d_weights = torch.zeros(weights.numel(), device=x.device, dtype=torch.float32)
            d_weights[d.order] = ds                         # dropped copies keep 0
            d_weights = d_weights.view_as(weights).to(weights.dtype)
        if need_down:
            d_down = grouped_weight_grad(h, gather_rows(dout, d.rows, scale), d.offsets, E)
        if need_gate_up:
            d_gate_up = grouped_weight_grad(gather_rows(x, d.rows), dpre, d.offsets, E)
        if need_x:
            dx_rows = grouped_matmul(dpre, d.counts, gate_up.transpose(1, 2))     # (R, H)
            ones = torch.ones(d.position.shape, device=x.device, dtype=torch.float32)
            dx = combine(dx_rows, d.position, ones)         # each token sums its copies
        return dx, d_weights, d_gate_up, d_down, None


def _check(x, weights, gate_up, down, d) -> None:
    check_tensor(x, "x", dtypes=FLOAT_DTYPES, ndim=2)
    for name, t in (("gate_up", gate_up), ("down", down)):
        check_tensor(t, name, dtypes=(x.dtype,), ndim=3, contiguous=False)
    E, H, I2 = gate_up.shape
    if I2 % 2 or tuple(down.shape) != (E, I2 // 2, H):
        raise ValueError(f"gate_up (E, H, 2I) = {tuple(gate_up.shape)} and down must be "
                         f"(E, I, H) = {(E, I2 // 2, H)}; down is {tuple(down.shape)}")
    if x.shape[1] != H:
        raise ValueError(f"x has {x.shape[1]} features but the experts take H = {H}")
    if tuple(weights.shape) != tuple(d.position.shape):
        raise ValueError(f"weights {tuple(weights.shape)} must be (tokens, top_k) like the "
                         f"dispatch's position {tuple(d.position.shape)}")


def experts_train(x, weights, gate_up, down, d):
    """``out[t] = sum_j weights[t, j] * SwiGLU_e(x[t])`` over token ``t``'s kept copies,
    differentiable in ``x``, ``weights``, ``gate_up`` and ``down`` (``d`` is the
    :func:`~helpers.kernels.moe.dispatch` of the routing)."""
    _check(x, weights, gate_up, down, d)
    return _Experts.apply(x.contiguous(), weights, gate_up, down, d)


class MoELayer(torch.nn.Module):
    """A trainable MoE layer of ``experts`` SwiGLU experts, ``top_k`` a token.

    ``forward(x)`` returns ``(T, H)``; the router's ``(weights, ids)`` of the last call
    are kept in ``self.last_routing`` (for load-balancing losses).
    """

    def __init__(self, experts: int, top_k: int, hidden: int, width: int, *,
                 capacity_factor: float | None = None, dtype=torch.float32, device=None):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.router = torch.nn.Parameter(torch.randn(hidden, experts, **kw) / math.sqrt(hidden))
        self.gate_up = torch.nn.Parameter(torch.randn(experts, hidden, 2 * width, **kw)
                                          / math.sqrt(hidden))
        self.down = torch.nn.Parameter(torch.randn(experts, width, hidden, **kw)
                                       / math.sqrt(width))
        self.last_routing = None

    def forward(self, x):
        from . import capacity, dispatch  # the package's face imports this module
        weights, ids = route(x @ self.router, self.top_k)
        self.last_routing = (weights, ids)
        E = self.router.shape[1]
        cap = None if self.capacity_factor is None else \
            capacity(x.shape[0], self.top_k, E, self.capacity_factor)
        d = dispatch(ids, E, cap, check=False)
        return experts_train(x, weights, self.gate_up, self.down, d)

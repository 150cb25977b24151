"""Mixture-of-Experts (lesson 08): what a token pays for, what the tiles waste, what travels.

An MoE layer of ``E`` experts sends each token to ``top_k`` of them; each expert is a
SwiGLU block (``H -> I`` twice, ``I -> H`` once). Four counts a kernel author makes before
writing the layer:

* :func:`expert_flops`: the experts' FLOPs for some token copies (``rows``);
* :func:`active_fraction`: the share of the experts' weights and FLOPs one token uses;
* :func:`tiles_per_expert`, :func:`padding_rows`: a grouped GEMM cuts each expert's rows
  into ``block_m``-row tiles of its own, so each expert's last tile is partly padding;
* :func:`bytes_sent_per_rank`, :func:`exchange_ms`: expert parallelism moves each copy to
  the GPU (rank) that holds its expert, and its output back.

Counts of rows take Python ints or anything ``int`` accepts without rounding (a tensor of
counts from :func:`helpers.kernels.moe.dispatch`, NumPy integers).
"""

from __future__ import annotations

import math
import operator

from ..dtypes import element_size as element_bytes
from .work import _positive


def expert_flops(rows: int, hidden: int, width: int) -> int:
    """FLOPs of the experts for ``rows`` token copies: gate and up (``H -> I`` each) and down
    (``I -> H``), each ``rows x H x I`` multiply-adds, 2 FLOPs apiece: ``6 rows H I``.
    (The SwiGLU between them, a few FLOPs per element of ``I``, is left out.)"""
    _positive(hidden=hidden, width=width)
    return 6 * _count("rows", rows) * hidden * width


def active_fraction(experts: int, top_k: int) -> float:
    """The share of the experts' weights (and FLOPs) one token uses: ``top_k / E``."""
    _positive(experts=experts, top_k=top_k)
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) cannot exceed the number of experts ({experts})")
    return top_k / experts


def _count(name: str, value) -> int:
    """``value`` as a whole number >= 0, refusing fractions rather than rounding them."""
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a whole number of rows, got {value!r}") from None
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def tiles_per_expert(counts, block_m: int) -> list[int]:
    """Row tiles of ``block_m`` rows each expert needs: its rows rounded up to whole tiles
    (an expert with no rows owns no tile)."""
    _positive(block_m=block_m)
    return [-(-_count(f"counts[{e}]", c) // block_m) for e, c in enumerate(counts)]


def padding_rows(counts, block_m: int) -> int:
    """Rows a grouped GEMM computes and throws away: each expert's rows rounded up to whole
    ``block_m``-row tiles, less the real rows. About half a tile per expert with rows."""
    counts = [_count(f"counts[{e}]", c) for e, c in enumerate(counts)]
    return sum(t * block_m for t in tiles_per_expert(counts, block_m)) - sum(counts)


def bytes_sent_per_rank(tokens: int, top_k: int, hidden: int, world: int, dtype) -> float:
    """Bytes one rank sends to the others in **each** direction, under uniform routing.

    Its ``tokens * top_k`` copies each carry ``hidden`` elements; a copy's expert lives on
    this rank with probability ``1/world``, so ``(world - 1)/world`` of them leave. (A
    token whose two experts share a rank is sent twice here; deduplicating senders such
    as DeepEP send it once.) The outputs come back the same size.
    """
    if _count("world", world) < 1:
        raise ValueError(f"the world size must be at least 1 rank, got {world!r}")
    _positive(top_k=top_k, hidden=hidden)
    tokens = _count("tokens", tokens)
    return tokens * top_k * (world - 1) / world * hidden * element_bytes(dtype)


def remote_ranks_per_token(top_k: int, experts: int, world: int) -> float:
    """Other ranks a token reaches when its ``top_k`` experts are drawn at random from
    ``experts`` split evenly over ``world`` ranks: each of the ``world - 1`` others is
    reached unless all ``top_k`` experts miss its ``experts / world``."""
    _positive(top_k=top_k, experts=experts)
    if _count("world", world) < 1 or experts % world or top_k > experts:
        raise ValueError(f"need 1 <= world dividing experts and top_k <= experts; got "
                         f"world={world!r}, experts={experts}, top_k={top_k}")
    miss = math.comb(experts - experts // world, top_k) / math.comb(experts, top_k)
    return (world - 1) * (1 - miss)


def bytes_sent_per_rank_dedup(tokens: int, top_k: int, hidden: int, world: int,
                              experts: int, dtype) -> float:
    """:func:`bytes_sent_per_rank` when a token goes once to each rank holding any of its
    experts (DeepEP's dispatch), under uniform routing. The ids and weights beside each
    row (``2 top_k`` numbers) are left out: a few hundredths of a row of thousands."""
    _positive(hidden=hidden)
    tokens = _count("tokens", tokens)
    return tokens * remote_ranks_per_token(top_k, experts, world) * hidden * element_bytes(dtype)


def exchange_ms(tokens: int, top_k: int, hidden: int, world: int, dtype,
                link_gb_per_s: float) -> float:
    """Least time of one all-to-all (one direction) over a link of ``link_gb_per_s`` GB/s
    (10^9 bytes a second out of each GPU; an H100 SXM's NVLink gives 450 each way)."""
    if not link_gb_per_s > 0:
        raise ValueError(f"the link bandwidth must be positive GB/s, got {link_gb_per_s!r}")
    return bytes_sent_per_rank(tokens, top_k, hidden, world, dtype) / (link_gb_per_s * 1e9) * 1e3

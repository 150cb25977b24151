"""Expert parallelism, lesson 08 beyond one GPU: each rank holds some of the experts.

At 128 experts of a 30B-parameter model, or 8 experts of 14336 columns each, the
experts' weights outgrow what one GPU should hold next to its activations. Expert
parallelism (GShard, Switch) splits the **experts** over ``world`` GPUs, the *ranks*:
rank ``r`` holds experts ``r * E/world`` to ``(r + 1) * E/world - 1`` (``e // (E/world) ==
r``) and the router, and its own batch of ``T`` tokens. A token's copies must travel to
the ranks that hold their experts, and the experts' outputs must travel back. Read top
to bottom:

* :func:`shard_weights`, :func:`check_expert_parallel`: a rank's part of the weights
  (the router whole, ``E/world`` experts) and the checks that say what is wrong.
* The napkin math (:func:`helpers.intensity.bytes_sent_per_rank`,
  :func:`helpers.intensity.exchange_ms`): under uniform routing a copy stays home with
  probability ``1/world``; the rest cross the link, once there and once back.
* :func:`header` (route, count, exchange the counts: the one host sync), :func:`plan`
  (dispatch, split sizes) and :func:`local_forward` (the local experts on the rows
  received): the pieces the versions share.
* :func:`ep_forward_sequential`: the layer in six steps. Route and dispatch locally (the
  single-GPU :func:`~helpers.kernels.moe.route` and
  :func:`~helpers.kernels.moe.dispatch`); count copies per destination rank; exchange
  the counts (``all_to_all_single`` of a few integers); exchange the token rows
  (``all_to_all_single`` with split sizes: rank ``r``'s ``i``-th block goes to rank
  ``i``); run the local experts on the rows received (the grouped GEMMs of
  :mod:`helpers.kernels.moe.grouped`); send the results back by the reverse
  all-to-all; combine with the routing weights. While the rows travel, the GPU waits.
* :func:`ep_forward_overlapped`: the same work cut into ``chunks`` slices of the
  tokens, pipelined: chunk ``i + 1``'s rows travel while chunk ``i``'s experts compute.
  ``async_op=True`` returns a work handle at once; on NCCL the transfer runs on
  NCCL's own CUDA stream, ``work.wait()`` makes the compute stream wait for it (the CPU
  does not wait); on gloo (CPU) a background thread sends. One code path for both.

Both give what the single-process :func:`~helpers.kernels.moe.moe_forward` gives on all
ranks' tokens concatenated, with the full weights (no capacity: no copy is dropped).
Start the ranks with :func:`helpers.parallel.launch`; a rank's function calls these.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ... import runtime
from ...dtypes import FLOAT_DTYPES
from ..checks import check_tensor
from . import MoEWeights, Dispatch, dispatch, route
from .grouped import combine, grouped_matmul, grouped_swiglu

__all__ = [
    "local_experts", "shard_weights", "check_expert_parallel", "GRAIN", "Header", "header",
    "Plan", "plan", "local_forward",
    "ep_forward_sequential", "ep_forward_overlapped", "ep_forward_dedup", "destinations",
    "ep_forward", "CHOICES", "chosen",
]


# --------------------------------------------------------------------------------------
# Who holds what, and the checks.
# --------------------------------------------------------------------------------------


def local_experts(experts: int, world: int, rank: int) -> range:
    """The experts rank ``rank`` holds: ``E/world`` consecutive ones."""
    _check_split(experts, world)
    per = experts // world
    return range(rank * per, (rank + 1) * per)


def shard_weights(w: MoEWeights, rank: int, world: int) -> MoEWeights:
    """Rank ``rank``'s part of the full weights: the whole router ``(H, E)``, every rank
    routes its own tokens, and its ``E/world`` experts, copied (so the full weights can go)."""
    mine = local_experts(w.router.shape[1], world, rank)
    return MoEWeights(w.router, *(t[mine.start:mine.stop].clone() for t in (w.gate, w.up,
                                                                            w.down)))


def _check_split(experts: int, world: int) -> None:
    if world < 1:
        raise ValueError(f"the world size must be at least 1 rank, got {world}")
    if experts % world:
        raise ValueError(f"{experts} experts cannot be split evenly over {world} ranks: each "
                         f"rank holds E / world experts. Use a world size that divides {experts}.")


def check_expert_parallel(x: torch.Tensor, w: MoEWeights, top_k: int, world: int) -> int:
    """Check one rank's inputs: ``x`` ``(T, H)``, the router ``(H, E)``, its experts
    ``(E/world, H, I)`` and ``(E/world, I, H)``. Returns ``E/world``."""
    check_tensor(x, "x", dtypes=FLOAT_DTYPES, ndim=2)
    for name in ("router", "gate", "up", "down"):
        check_tensor(getattr(w, name), f"weights.{name}", dtypes=(x.dtype,),
                     ndim=2 if name == "router" else 3, contiguous=False)
    runtime.check_dot_dtype(x.dtype)
    H, E = w.router.shape
    _check_split(E, world)
    per = E // world
    if w.gate.shape[0] != per:
        hint = (" These are the full weights: pass shard_weights(w, rank, world)."
                if w.gate.shape[0] == E else "")
        raise ValueError(f"weights.gate holds {w.gate.shape[0]} experts; with the router's "
                         f"E = {E} over {world} ranks each rank holds {per}.{hint}")
    I = w.gate.shape[2]
    want = {"gate": (per, H, I), "up": (per, H, I), "down": (per, I, H)}
    for name, shape in want.items():
        if tuple(getattr(w, name).shape) != shape:
            raise ValueError(f"weights.{name} has shape {tuple(getattr(w, name).shape)}; with "
                             f"the router (H, E) = {(H, E)} and width I = {I} it must be {shape}")
    if x.shape[1] != H:
        raise ValueError(f"x has {x.shape[1]} features but the router takes H = {H}")
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be between 1 and the number of experts ({E}), got {top_k}")
    return per


def _world(group) -> int:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised in this process: start the "
                           "ranks with helpers.parallel.launch(fn, world) (or torchrun) and call "
                           "the expert-parallel layer from fn.")
    return dist.get_world_size(group)


# --------------------------------------------------------------------------------------
# The plan: who sends how many rows to whom, for each chunk of the tokens.
# --------------------------------------------------------------------------------------


# The counts travel per ``GRAIN``-th of the tokens: a pipeline of 1, 2, 4 or 8 chunks
# sums them (chunk ``t * C // T`` of a token is its grain ``t * 8 // T`` divided by 8/C).
GRAIN = 8


@dataclass
class Header:
    """What a rank learns before any row travels, from one ``all_to_all_single`` of a
    few integers per rank: enough for every version, so the layer can choose one after it.

    Each rank sends rank ``i`` one block: the copies it sends there per grain of its
    tokens and local expert, the tokens it sends there once (:func:`ep_forward_dedup`),
    and its token count (so all ranks agree on the chooser's key without another
    collective)."""

    weights: torch.Tensor     # (T, top_k) routing weights
    ids: torch.Tensor         # (T, top_k) expert ids
    grain: int
    received: torch.Tensor    # (world, grain, E/world) on x's device: copies from each rank
    sent_host: torch.Tensor   # (grain, world): copies this rank sends to each rank
    received_host: torch.Tensor  # (world, grain): copies it receives from each rank
    pairs_sent: list          # [rank]: tokens sent once to each rank
    pairs_received: list      # [rank]: tokens received once from each rank
    most_tokens: int          # the most tokens any rank holds


def header(x: torch.Tensor, w: MoEWeights, top_k: int, group=None,
           grain: int = GRAIN) -> Header:
    """Route, count and exchange the counts: the layer's one host sync."""
    if isinstance(grain, bool) or not isinstance(grain, int) or grain < 1:
        raise ValueError(f"chunks must be a positive whole number, got {grain!r}")
    world = _world(group)
    per = check_expert_parallel(x, w, top_k, world)
    E, T = w.router.shape[1], x.shape[0]
    weights, ids = route(x @ w.router, top_k)
    grain_of = torch.arange(T, device=x.device) * grain // max(T, 1)    # grain of each token
    flat = (ids + E * grain_of[:, None]).reshape(-1)
    # scatter_add_, not bincount: on CUDA bincount reads the largest id back to the host.
    copies = torch.zeros(grain * E, dtype=torch.long, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    pairs = destinations(ids, per, world).sum(dim=0)                     # (world,)
    block = torch.cat([copies.view(grain, world, per).transpose(0, 1).reshape(world, -1),
                       pairs[:, None], torch.full_like(pairs[:, None], T)], dim=1)
    got = torch.empty_like(block)
    dist.all_to_all_single(got, block, group=group)      # row i goes to rank i
    host = torch.stack([block, got]).cpu()               # the one host sync
    counts = host[:, :, :grain * per].reshape(2, world, grain, per).sum(dim=3)
    return Header(weights, ids, grain, got[:, :grain * per].view(world, grain, per),
                  counts[0].T, counts[1], host[0, :, -2].tolist(), host[1, :, -2].tolist(),
                  int(host[1, :, -1].max()))


@dataclass
class Plan:
    """One rank's side of the exchange, the tokens cut into ``chunks`` slices."""

    weights: torch.Tensor   # (T, top_k) routing weights
    d: Dispatch             # copies sorted by (chunk, destination rank, expert)
    send: torch.Tensor      # (R, H): the rows to send, in that order
    send_splits: list       # [chunk][rank]: rows this rank sends to each rank
    recv_splits: list       # [chunk][rank]: rows it receives from each rank
    recv_counts: torch.Tensor  # (world, chunks, E/world) on x's device: rows received
                               # from each rank for each chunk and local expert
    chunk_rows: list        # chunk c's copies are sorted rows chunk_rows[c]:chunk_rows[c+1]

    def send_rows(self, c: int) -> torch.Tensor:
        return self.send[self.chunk_rows[c]:self.chunk_rows[c + 1]]


def plan(x: torch.Tensor, w: MoEWeights, top_k: int, chunks: int = 1, group=None,
         head: Header | None = None) -> Plan:
    """Everything before the rows travel: the :func:`header` (given, or exchanged here)
    and the dispatch.

    Chunk ``c`` is a contiguous slice of the tokens. Sorting the copies by ``(chunk,
    expert)`` sorts them by destination rank too, since a rank's experts are
    consecutive: each chunk's rows for rank ``i`` are one block, as
    ``all_to_all_single`` wants.
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be a positive whole number, got {chunks!r}")
    if head is None:
        head = header(x, w, top_k, group, grain=chunks)
    if head.grain % chunks:
        raise ValueError(f"a header counted in {head.grain} grains cannot plan {chunks} chunks")
    E, T = w.router.shape[1], x.shape[0]
    world, per = head.received.shape[0], head.received.shape[2]
    chunk = torch.arange(T, device=x.device) * chunks // max(T, 1)   # chunk of each token
    d = dispatch(head.ids + E * chunk[:, None], chunks * E, check=False)  # one sort
    merge = head.grain // chunks                                     # grains per chunk
    send_splits = head.sent_host.reshape(chunks, merge, world).sum(dim=1).tolist()
    recv_splits = head.received_host.reshape(world, chunks, merge).sum(dim=2).T.tolist()
    received = head.received.view(world, chunks, merge, per).sum(dim=2)
    chunk_rows = [0]
    for c in range(chunks):
        chunk_rows.append(chunk_rows[-1] + sum(send_splits[c]))
    return Plan(head.weights, d, x.index_select(0, d.rows), send_splits, recv_splits,
                received, chunk_rows)


def local_forward(x_recv: torch.Tensor, counts: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """The local experts on received rows, returned in the order they came.

    ``counts`` is ``(world, E/world)``: the rows came as one block per sending rank, each
    sorted by local expert. A stable sort by local expert regroups them; the grouped
    SwiGLU gathers through that order (``rows``), so the sorted copy is never written;
    the down projection's output is put back in arrival order. No host sync.
    """
    world, per = counts.shape
    y = torch.empty((x_recv.shape[0], w.down.shape[2]), dtype=x_recv.dtype,
                    device=x_recv.device)
    if x_recv.shape[0] == 0:
        return y
    expert = torch.arange(per, device=x_recv.device).repeat(world)
    local_ids = torch.repeat_interleave(expert, counts.flatten().long(),
                                        output_size=x_recv.shape[0])
    order = torch.argsort(local_ids, stable=True)
    per_expert = counts.sum(dim=0, dtype=torch.int32)
    h = grouped_swiglu(x_recv, order.to(torch.int32), per_expert, w.gate, w.up)
    y[order] = grouped_matmul(h, per_expert, w.down)
    return y


def _exchange(out, inp, out_splits, in_splits, group, async_op):
    return dist.all_to_all_single(out, inp, out_splits, in_splits, group=group,
                                  async_op=async_op)


def _rows(n: int, like: torch.Tensor) -> torch.Tensor:
    """``n`` rows shaped, typed and placed like ``like``'s."""
    return torch.empty((n, like.shape[1]), dtype=like.dtype, device=like.device)


# --------------------------------------------------------------------------------------
# The layer: exchange, compute, exchange back.
# --------------------------------------------------------------------------------------


def ep_forward_sequential(x: torch.Tensor, w: MoEWeights, top_k: int, group=None,
                          head: Header | None = None) -> torch.Tensor:
    """This rank's ``(T, H)`` outputs. ``w`` is its shard (:func:`shard_weights`); ``head``
    a :func:`header` already exchanged for these tokens (else it is exchanged here)."""
    p = plan(x, w, top_k, chunks=1, group=group, head=head)
    send_splits, recv_splits = p.send_splits[0], p.recv_splits[0]
    # There: block i of p.send goes to rank i; from rank j come recv_splits[j] rows.
    x_recv = _rows(sum(recv_splits), x)
    _exchange(x_recv, p.send, recv_splits, send_splits, group, async_op=False)
    y_recv = local_forward(x_recv, p.recv_counts[:, 0], w)
    # And back: the reverse all-to-all, every split swapped.
    y_back = _rows(p.send.shape[0], x)
    _exchange(y_back, y_recv, send_splits, recv_splits, group, async_op=False)
    return combine(y_back, p.d.position, p.weights)


def ep_forward_overlapped(x: torch.Tensor, w: MoEWeights, top_k: int, chunks: int = 4,
                          group=None, head: Header | None = None) -> torch.Tensor:
    """:func:`ep_forward_sequential`, pipelined over ``chunks`` slices of the tokens.

    The timeline (the all-to-alls queue on one communication stream, the experts on
    the compute stream)::

        comm:     send 0 | send 1 | back 0, send 2 | back 1, send 3 | back 2 | back 3
        compute:         | exp. 0 | exp. 1         | exp. 2         | exp. 3

    Every rank must pass the same ``chunks`` (a rank with few tokens sends empty chunks):
    each chunk is a collective all ranks take part in.
    """
    p = plan(x, w, top_k, chunks=chunks, group=group, head=head)
    y_back = _rows(p.send.shape[0], x)
    kept, back = [], []      # tensors in flight stay referenced until their work is done

    def send(c):
        x_recv = _rows(sum(p.recv_splits[c]), x)
        kept.append(x_recv)
        return x_recv, _exchange(x_recv, p.send_rows(c), p.recv_splits[c], p.send_splits[c],
                                 group, async_op=True)

    in_flight = send(0)
    for c in range(chunks):
        x_recv, work = in_flight
        if c + 1 < chunks:
            in_flight = send(c + 1)          # chunk c + 1 travels while chunk c computes
        work.wait()                          # on NCCL: the compute stream waits, not the CPU
        y_recv = local_forward(x_recv, p.recv_counts[:, c], w)
        kept.append(y_recv)
        out = y_back[p.chunk_rows[c]:p.chunk_rows[c + 1]]
        back.append(_exchange(out, y_recv, p.send_splits[c], p.recv_splits[c], group,
                              async_op=True))
    for work in back:
        work.wait()
    return combine(y_back, p.d.position, p.weights)


# --------------------------------------------------------------------------------------
# Once per destination rank: the token travels once, its copies fan out on arrival.
# --------------------------------------------------------------------------------------


def _fan_out(x_recv, local_ids, local_weights, w: MoEWeights) -> torch.Tensor:
    """The local experts on received tokens, each with up to ``top_k`` local experts
    (``local_ids``, -1 where a slot went elsewhere): one weighted sum per token.

    The empty slots are routed to a pretend expert ``E/world`` that sorts last, so the
    real copies are a prefix of the sorted order: the grouped GEMMs run on that prefix
    and the combine reads -1 (nothing) for the rest.
    """
    per = w.gate.shape[0]
    d = dispatch(torch.where(local_ids < 0, per, local_ids), per + 1, check=False)
    real = int(d.offsets[per])                     # a host read: the rows to compute
    h = grouped_swiglu(x_recv, d.rows[:real], d.counts[:per], w.gate, w.up)
    y = grouped_matmul(h, d.counts[:per], w.down)
    position = torch.where(d.position < real, d.position, -1)
    return combine(y, position, local_weights)


def destinations(ids: torch.Tensor, per: int, world: int) -> torch.Tensor:
    """``(T, world)`` booleans: whether token ``t`` has an expert on rank ``r``."""
    goes = torch.zeros((ids.shape[0], world), dtype=torch.bool, device=ids.device)
    return goes.scatter_(1, ids // per, True)


def ep_forward_dedup(x: torch.Tensor, w: MoEWeights, top_k: int, group=None,
                     head: Header | None = None) -> torch.Tensor:
    """This rank's ``(T, H)`` outputs, each token sent once to each rank holding any of its
    experts (with its local experts' ids and weights beside it), one partial sum back.

    A *pair* is (token, destination rank); pairs go out grouped by rank, tokens in order.
    Three all-to-alls there (the :func:`header`'s counts, then rows and the ``2 top_k``
    numbers of each pair) and one back; the partial sums of a token are added in rank
    order (no atomics).
    """
    if head is None:
        head = header(x, w, top_k, group, grain=1)
    world = _world(group)
    per = check_expert_parallel(x, w, top_k, world)
    T = x.shape[0]
    weights, ids = head.weights, head.ids
    dest = ids // per                                                  # (T, top_k)
    goes = destinations(ids, per, world)
    pair_rank, pair_token = goes.T.nonzero(as_tuple=True)             # rank-major
    send_splits, recv_splits = head.pairs_sent, head.pairs_received
    # Each pair's copies on its rank: local expert ids (-1 elsewhere) and routing weights.
    mine = dest[pair_token] == pair_rank[:, None]
    meta = torch.cat([torch.where(mine, ids[pair_token] - pair_rank[:, None] * per, -1).float(),
                      torch.where(mine, weights[pair_token].float(), 0.0)], dim=1)
    x_recv, meta_recv = _rows(sum(recv_splits), x), _rows(sum(recv_splits), meta)
    _exchange(x_recv, x.index_select(0, pair_token), recv_splits, send_splits, group, False)
    _exchange(meta_recv, meta, recv_splits, send_splits, group, False)
    partial = _fan_out(x_recv, meta_recv[:, :top_k].long(),
                       meta_recv[:, top_k:].contiguous(), w)
    back = _rows(pair_token.numel(), x)
    _exchange(back, partial, send_splits, recv_splits, group, False)
    # Token t's partial sums: pair rows position[t, r], -1 where t did not go to rank r.
    position = torch.full((T, world), -1, dtype=torch.long, device=x.device)
    position[pair_token, pair_rank] = torch.arange(pair_token.numel(), device=x.device)
    return combine(back, position, torch.ones((T, world), device=x.device))


# --------------------------------------------------------------------------------------
# Which version pays, chosen by measurement.
# --------------------------------------------------------------------------------------

# The candidates: no overlap, pipelines of 2, 4 and 8 chunks, and a token sent once per
# rank. Overlap hides exchanges behind the experts but costs a host-side launch sequence
# and a partly filled grouped GEMM per chunk: on four H100s it lost at 4,096 tokens a rank
# (0.67x sequential with 128 experts) and won at 16,384 (1.10x). No rule of thumb says
# where the crossing lies on a given machine, so the layer times each candidate once.
CHOICES = ("sequential", "overlapped:2", "overlapped:4", "overlapped:8", "dedup")
_CHOSEN: dict = {}          # key -> the candidate every rank agreed on


def _candidate(name: str):
    if name == "sequential":
        return ep_forward_sequential
    if name == "dedup":
        return ep_forward_dedup
    chunks = int(name.split(":")[1])
    return lambda x, w, top_k, group=None, head=None: ep_forward_overlapped(
        x, w, top_k, chunks, group, head)


def _trials_ms(fns: dict, device, group, runs: int) -> dict:
    """Each function's median time over ``runs``, the slowest rank's (a collective layer
    ends with its slowest rank). The functions take turns, one run each per round, every
    rank starting each run together, so that a drift of the clocks or the link over the
    trials falls on all of them alike."""
    for fn in fns.values():
        fn()                                      # warm: compiles, tunes, NCCL buffers
    times = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier(group=group)
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[name].append((time.perf_counter() - start) * 1e3)
    medians = torch.tensor([statistics.median(t) for t in times.values()],
                           dtype=torch.float64, device=device)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(fns, medians.tolist()))


# Another version replaces the sequential one only where its trials beat it by more than
# this: two versions closer than that trade places from one trial to the next (on four
# H200s, 8 experts, 4,096 tokens a rank, three trial runs each picked the once-per-rank
# version, which then ran 3-4 % behind the sequential one in the moe_parallel record).
CLEAR_WIN = 0.03


def _pick(times: dict) -> str:
    fastest = min(times, key=times.get)
    if "sequential" in times and times[fastest] > times["sequential"] * (1 - CLEAR_WIN):
        return "sequential"
    return fastest


def _key(head: Header, w: MoEWeights, top_k: int, group, x: torch.Tensor) -> tuple:
    """What the choice depends on, the same on every rank: the most tokens any rank holds
    (rounded up to a power of two; every rank's count came in the :func:`header`, so
    ranks with different token counts agree without another collective), the shapes,
    ``top_k``, the world and the dtype."""
    tokens = 1 << max(head.most_tokens - 1, 0).bit_length()
    return (tokens, tuple(w.gate.shape), w.router.shape[1], top_k, _world(group),
            str(x.dtype), x.device.type)


def chosen(x: torch.Tensor, w: MoEWeights, top_k: int, group=None,
           choices=CHOICES, runs: int = 5, head: Header | None = None) -> str:
    """The candidate of ``choices`` that :func:`ep_forward` runs for this key, timing each
    one (a warm-up, then the median of ``runs``, the candidates in turns) the first time a
    key is seen: every rank times every candidate in the same order, and all take the one
    whose slowest rank was fastest, unless that one beats the sequential version by less
    than :data:`CLEAR_WIN`."""
    unknown = set(choices) - set(CHOICES)
    if not choices or unknown:
        raise ValueError(f"choices must be some of {CHOICES}; got {tuple(choices)}")
    if head is None:
        head = header(x, w, top_k, group)
    key = (_key(head, w, top_k, group, x), tuple(choices))
    if key not in _CHOSEN:
        trials = {name: (lambda n=name: _candidate(n)(x, w, top_k, group=group))
                  for name in choices}
        _CHOSEN[key] = _pick(_trials_ms(trials, x.device, group, runs))
    return _CHOSEN[key]


def ep_forward(x: torch.Tensor, w: MoEWeights, top_k: int, group=None,
               choices=CHOICES, runs: int = 5) -> torch.Tensor:
    """This rank's ``(T, H)`` outputs by whichever version measured fastest here (see
    :func:`chosen`); every version gives the same result. A collective: every rank calls
    it, with the same ``choices``. The :func:`header` is exchanged once and serves both
    the choice and the version chosen."""
    head = header(x, w, top_k, group)
    name = chosen(x, w, top_k, group, choices, runs, head=head)
    return _candidate(name)(x, w, top_k, group=group, head=head)

"""Attention's tile settings chosen by measurement on the GPU in use, as lesson 07 tunes.

:func:`~helpers.kernels.attention.forward_config` and ``backward_config`` are one table,
read off a sweep at 8,192 tokens on an H100. A table is right where it was read and off
elsewhere. On an H200 (bf16, d = 64, 512 to 16,384 tokens, causal and not;
``tests/gpu/attention_fwd_probe.py``) the best of ten forward settings beat the table's by
up to 3%, and the winner moved with the length and the mask (64 x 64 tiles with 4 warps at
4k causal, 128 x 64 with 8 warps at 1k non-causal, the table elsewhere). At 2,048 tokens,
d = 64, causal (``tests/test_attention_tuning.py``, compiled) the tuner's picks beat the
table by 10% (forward, dQ) and 16% (dK/dV). So on a GPU each pass is tuned per
**key**: the head's width (:func:`~helpers.kernels.attention.block_d`, or the forward's
split head's own, :func:`~helpers.kernels.attention.forward.held`), the length bucket
of the queries and of the keys (:func:`length_bucket`), causal or not, and the dtype.

On a key's first call the tuner times every candidate of the pass's space that fits the
GPU's shared memory (:func:`candidates`; the table's setting is always one of them) on the
call's own tensors, in interleaved rounds as lesson 07 times whole plans
(:func:`helpers.kernels.matmul.plan.time_plans`), times the fastest few again for longer
(:data:`FINALISTS`: some settings run slower timed at length than in short rounds, as a
record and a training run time them), and keeps the fastest of those: in memory for the
process, and on disk in Triton's cache (:class:`helpers.kernels.matmul.plan.Decisions`,
keyed also by the GPU, Triton's version and the kernel's source), so a new process reads
the choice instead of timing again. The backward's two kernels are tuned apart, each
alone: dK/dV and dQ do not share a setting.

Tuning costs seconds, once a key: each candidate compiles, then runs a few dozen times.
A problem too small to repay that (:data:`MIN_WORK`), the interpreter (CPU mode) and
:data:`ENABLED` off all take the table.
"""

from __future__ import annotations

import hashlib
import inspect

import torch
import triton

from ... import runtime
from ..matmul.plan import Decisions, time_plans
from ..matmul.precompile import side_by_side

# Tune on a GPU (off: the table, as before the tuner; tests switch it per case).
ENABLED = True
# Least batch x heads x queries x keys x head width worth tuning: 2^32 is 4 x 16 heads of
# 1,024 tokens at d = 64, whose forward takes about 50 us; below it the table is kept.
MIN_WORK = 2 ** 32
# Lengths share a bucket up to the next power of two, from 128 to 16,384 (longer
# sequences run hundreds of tiles a program, and their best setting stops moving).
SHORTEST, LONGEST = 128, 16384

# Candidate settings per pass: (block_m, block_n, num_warps, num_stages[, "tma"]). The
# forward and dQ keep a Q tile resident and walk key tiles (block_m a multiple of block_n);
# dK/dV keeps a K/V tile resident and walks query tiles (block_n a multiple of block_m).
# "tma": the tiles a pass walks through tensor descriptors (forward.tma_ok says where):
# the forward's and dQ's K and V, dK/dV's Q and dO. On an H200 (bf16, 4 x 16 heads x 8,192
# tokens, tests/gpu/attention_ws_probe.py), the forward's 128 x 64 tiles with 4 warps and
# 2 stages read that way ran d = 128 at 524 TFLOP/s non-causal and 487 causal, against 492
# and 446 for the tuned pointer kernel; at d = 64 the pointer kernel stayed ahead (425
# against 408).
SPACES = {
    "forward": ((128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4),
                (128, 64, 4, 3), (64, 64, 4, 3), (64, 32, 4, 3), (64, 32, 4, 2),
                (128, 64, 4, 2, "tma"), (128, 64, 4, 3, "tma"), (128, 64, 8, 3, "tma"),
                (128, 128, 8, 3, "tma"), (64, 64, 4, 3, "tma"), (128, 64, 8, 2, "tma")),
    "dkdv": ((64, 64, 4, 2), (32, 64, 4, 2), (64, 128, 8, 2), (32, 128, 8, 2), (32, 64, 4, 1),
             (64, 64, 4, 2, "tma"), (32, 64, 4, 2, "tma"), (64, 128, 8, 2, "tma"),
             (64, 64, 4, 3, "tma")),
    "dq": ((128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 8, 2), (64, 32, 4, 3),
           (64, 32, 4, 2), (128, 64, 8, 3, "tma"), (128, 64, 8, 2, "tma"),
           (64, 64, 4, 2, "tma"), (128, 64, 4, 2, "tma")),
}
RESIDENT = {"forward": "block_m", "dkdv": "block_n", "dq": "block_m"}
# The fastest few of the first timing are timed again, SUSTAINED_MS a round each, and the
# fastest of those is kept. On an H200 (bf16, 4 x 16 heads x 4,096 tokens, d = 128, not
# causal; tests/gpu/attention_tuner_probe.py), 40 ms rounds put pointer tiles (64 x 64, 4
# warps, 503 TFLOP/s) ahead of descriptor tiles (128 x 64, 4 warps, 490); 300 ms rounds
# read 463 against 498, and the record, timed at length, read the pointer tiles' 452. Why is
# not established: the SM clock read 1,965 MHz after the long rounds, as after the short.
FINALISTS, SUSTAINED_MS = 3, 200
SHARED_FALLBACK = 232448    # bytes of shared memory a block may opt into on an H100

DECISIONS = Decisions(salt="course-attention-settings-2", file="attention_settings.json")
_KEPT: dict = {}          # key (and each call's shapes) -> settings: this process's choices
_CHOSEN: dict = {}        # (pass, shapes, mask, dtype) -> the setting's name, for records


def length_bucket(n: int) -> int:
    """``n`` up to a power of two, within ``SHORTEST .. LONGEST``."""
    return min(max(triton.next_power_of_2(n), SHORTEST), LONGEST)


def key(pass_name: str, q, k, causal: bool, held: int | None = None) -> tuple:
    """What a setting is chosen for: the pass, the head's width (the power of two the
    kernel holds it in, or ``held``: a split head's own width), the length buckets of the
    queries and the keys, causal or not, and the dtype."""
    width = held or triton.next_power_of_2(q.shape[-1])
    return (pass_name, width, length_bucket(q.shape[2]), length_bucket(k.shape[2]),
            bool(causal), str(q.dtype).replace("torch.", ""))


def worth_tuning(q, k) -> bool:
    """Whether to tune: compiled kernels (GPU mode), the tuner on, and a problem big enough
    that a tuned setting repays its timing."""
    batch, heads, seq_q, head_dim = q.shape
    return (ENABLED and runtime.is_gpu()
            and batch * heads * seq_q * k.shape[2] * head_dim >= MIN_WORK)


def _tiles(setting) -> dict:
    block_m, block_n, num_warps, num_stages, *tma = setting
    tiles = dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    return {**tiles, "tma": True} if tma else tiles


def shared_bytes(pass_name: str, tiles: dict, width: int, element_size: int) -> int:
    """Shared memory a setting asks for, roughly: its resident tile, and the tiles it walks
    (two tensors each: K and V, or Q and dO) buffered once per pipeline stage past the first.
    Triton's own count differs by a few KiB; a setting over the GPU's limit that this lets
    through fails to launch, and the tuner skips it."""
    resident = tiles[RESIDENT[pass_name]]
    walked = tiles["block_n"] if RESIDENT[pass_name] == "block_m" else tiles["block_m"]
    buffers = max(tiles["num_stages"] - 1, 1)
    return element_size * width * (resident + 2 * buffers * walked)


def candidates(pass_name: str, table: dict, width: int, element_size: int,
               shared_limit: int, tma: bool = False) -> list[dict]:
    """The table's setting first, then each setting of the pass's space that fits (those
    that read through tensor descriptors only where the call's tensors allow, ``tma``)."""
    out = [dict(table)]
    for setting in SPACES[pass_name]:
        tiles = _tiles(setting)
        if tiles.get("tma") and not tma:
            continue
        resident, walked = (tiles["block_m"], tiles["block_n"]) \
            if RESIDENT[pass_name] == "block_m" else (tiles["block_n"], tiles["block_m"])
        if resident % walked or tiles in out:
            continue
        if shared_bytes(pass_name, tiles, width, element_size) <= shared_limit:
            out.append(tiles)
    return out


def name_of(tiles: dict) -> str:
    name = "{block_m}x{block_n} w{num_warps} s{num_stages}".format(**tiles)
    return name + " tma" if tiles.get("tma") else name


def source_key(kernel) -> str:
    """The kernel's source as Triton keys its cache (with the functions it calls), or, in
    the interpreter, a hash of its own source."""
    if hasattr(kernel, "cache_key"):
        return kernel.cache_key
    return hashlib.sha256(inspect.getsource(getattr(kernel, "fn", kernel)).encode()).hexdigest()


def choose(pass_name: str, q, k, causal: bool, table: dict, run, kernel,
           held: int | None = None, tma: bool = False) -> dict:
    """The setting for this call: the process's or the disk's choice for its key, else the
    fastest candidate timed now with ``run(tiles)`` (one launch; a candidate whose launch
    raises, out of shared memory say, is dropped; ``run(tiles, compile_only=True)``
    compiles without launching). ``kernel``: the JIT function, which keys the process's
    choices and, by its source (``cache_key``), the disk's. ``held``: the columns of a
    head the kernel holds, where not a power of two (a split head: keyed, and its
    candidates' shared memory counted, at that width). ``tma``: the call's tensors can be
    read through tensor descriptors, so the space's settings that do are candidates too
    (a key is tuned with them or without them: the process's and the disk's choices
    are kept apart)."""
    if not worth_tuning(q, k):
        return table
    # A call seen before: its shapes, mask, dtype, GPU and kernel, looked up as they come
    # (the key below costs microseconds of Python, which a short sequence's call cannot
    # spare).
    call = (pass_name, q.shape, k.shape, bool(causal), q.dtype, q.device, kernel, tma)
    if call in _KEPT:
        return _KEPT[call]
    this = (*key(pass_name, q, k, causal, held), tma, q.device, kernel)
    if this in _KEPT:
        _KEPT[call] = _KEPT[this]
        _CHOSEN[_shapes(pass_name, q, k, causal)] = name_of(_KEPT[this])
        return _KEPT[this]
    props = torch.cuda.get_device_properties(q.device)
    disk_key = DECISIONS.key_of(this[:-2], props.name, (props.major, props.minor),
                                triton.__version__, source_key(kernel), SPACES[pass_name])
    kept = DECISIONS.get(disk_key)
    if kept is None:
        limit = getattr(props, "shared_memory_per_block_optin", 0) or SHARED_FALLBACK
        kept = _timed(pass_name, table, run, this[1], q.element_size(), limit, tma)
        DECISIONS.put(disk_key, kept)
    _KEPT[this] = _KEPT[call] = kept["tiles"]
    _CHOSEN[_shapes(pass_name, q, k, causal)] = name_of(kept["tiles"])
    return kept["tiles"]


def _shapes(pass_name: str, q, k, causal: bool) -> tuple:
    return pass_name, tuple(q.shape), tuple(k.shape), bool(causal), q.dtype


def chosen(pass_name: str, q, k, causal: bool) -> str | None:
    """The name of the setting this process chose for ``pass_name`` on tensors of ``q``'s
    and ``k``'s shapes, this mask and dtype (a record prints it beside its timing); None
    where none was chosen (the table's setting ran: too small to tune, or CPU mode)."""
    return _CHOSEN.get(_shapes(pass_name, q, k, causal))


def _timed(pass_name: str, table: dict, run, width: int, element_size: int,
           limit: int, tma: bool = False) -> dict:
    """Every candidate that launches, timed in turn: ``{"tiles": the fastest, "ms": each
    one's median}``. The candidates compile side by side first, in worker threads
    (:func:`helpers.kernels.matmul.precompile.side_by_side`, as lesson 07's tuner does)."""
    found = candidates(pass_name, table, width, element_size, limit, tma)
    if runtime.is_gpu():
        side_by_side([lambda tiles=tiles: run(tiles, compile_only=True) for tiles in found])
    runs, settings = {}, {}
    for tiles in found:
        try:
            run(tiles)                      # compiles it; too much shared memory raises
        except Exception:                   # noqa: BLE001 - see below
            # Out of shared memory, or a setting this GPU's compiler refuses: not a
            # candidate. The table's own setting is what the call ran before the tuner:
            # its failure is the call's, and is raised as such.
            if tiles is found[0]:
                raise
            continue
        name = name_of(tiles)
        runs[name], settings[name] = (lambda tiles=tiles: run(tiles)), tiles
    times = time_plans(runs)
    # The few fastest again, each for longer, as a record or a training run times them:
    # some settings lose ground there (tests/gpu/attention_tuner_probe.py).
    finalists = sorted(times, key=times.get)[:FINALISTS]
    sustained = time_plans({name: runs[name] for name in finalists}, rep=SUSTAINED_MS) \
        if len(finalists) > 1 else {finalists[0]: times[finalists[0]]}
    return {"tiles": settings[min(sustained, key=sustained.get)], "ms": times,
            "sustained_ms": sustained}

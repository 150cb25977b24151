"""Lesson 07: stream-K, so that a tile count just past a whole number of waves does not
cost a whole extra wave.

The persistent kernel (:mod:`~helpers.kernels.matmul.persistent`) deals out whole output
tiles: tile ``t`` goes to program ``t % NUM_SMS``. With 132 SMs and 140 tiles, 8 programs
get a second tile and 124 sit idle while those 8 run it: the product takes two waves'
time for 1.06 waves of work (*wave quantisation*). Smaller tiles make more, thinner
waves but read the operands more times over.

Stream-K (Osama, Merrill et al., 2023) deals out K steps instead of tiles. The last tiles
(:func:`stream_k_tiles`: the remainder, plus one whole wave when there is one to share
it with) are cut into their ``cdiv(K, BLOCK_K)`` steps each, and the steps of all of them,
laid end to end, are split evenly between all the programs: each program gets the same
number of steps, give or take one, whatever the tile count. A tile whose steps fall to
several programs is finished by one of them, its *owner* (the one holding its last step):
the others leave their fp32 partial sums in a workspace and raise a flag, the owner adds
them and writes the tile.

Two details keep that cheap:

* **Backwards.** Each program walks its steps from last to first. A program's last piece
  (the start of some tile) is one it hands over; its first piece (the end of some tile)
  is one it owns. Walking backwards, every program hands over first and owns last, so an
  owner rarely waits: its helpers finished their share before it started its own.
* **All programs resident.** An owner spins on its helpers' flags, which is only safe if
  every program is on an SM at once: one program per SM, as in the persistent kernel.
  (Triton's interpreter runs programs one after another, lowest first: the helpers of a
  tile have lower ids than its owner, so they finish before it waits.)

The tiles before the stream-K ones are dealt out whole, as in the persistent kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import runtime
from .config import TileConfig, gpu_in_use
from .ladder import grouped_tile
from .persistent import (KEYS, NEITHER, PERSISTENT_SPACE, _checked, boxes, descriptors,
                         setting, sm_count, stored, transposed)
from .tma_launch import direct

# The tuner's second stream-K candidate, beside the persistent kernel's own setting: its
# widest tile (128 x 256, two warp groups), which a part-empty last wave may have kept the
# persistent kernel from. Measured on an H100 (fp16, 1672 x 2528 x 5504: 2 waves + 16
# tiles of 128 x 128): 87 us against 105 us on the persistent kernel's own, narrower tile.
WIDE = PERSISTENT_SPACE[0]
# The stream-K setting where the persistent kernel cannot run at all (C's rows off 16
# bytes, so no tuned setting of its own): its 128 x 128 tile with 8 warps.
NARROW = TileConfig(128, 128, 64, num_warps=8, num_stages=4, options=NEITHER)


def stream_k_tiles(tiles: int, sms: int) -> int:
    """How many of the last tiles are shared out by K steps: none when the tiles fill whole
    waves; otherwise the remainder, plus one whole wave when there is one (each program then
    gets between one and two tiles' worth of steps, enough to hide its hand-over)."""
    rest = tiles % sms
    if rest == 0:
        return 0
    return rest + sms if tiles > sms else tiles


@triton.jit
def _steps(a_desc, b_desc, row, col, k_first, k_stop, acc,
           BLOCK_K: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr):
    """``acc`` plus the tile's K steps ``k_first .. k_stop - 1`` (boxes read as stored)."""
    for k in range(k_first, k_stop):
        if A_T:
            a = a_desc.load([k * BLOCK_K, row]).T
        else:
            a = a_desc.load([row, k * BLOCK_K])
        if B_T:
            b = b_desc.load([col, k * BLOCK_K]).T
        else:
            b = b_desc.load([k * BLOCK_K, col])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _async_proxy_fence():
    """``fence.proxy.async.global``: what this thread's generic loads and stores (and the
    acquire before it) have seen, the TMA unit (the *async proxy*) sees too. Without it a TMA
    load issued after the acquire may read the workspace as it was before the helper wrote."""
    tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _add_handed_over(acc, ws_desc, flags_ptr, pid, tile_start, total,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SMS: tl.constexpr,
                     FENCE: tl.constexpr):
    """``acc`` plus the partial sums of this tile that the programs before ``pid`` left.

    Each partial comes through the TMA unit (``ws_desc``, :func:`workspace`) into shared
    memory, and from there straight into the accumulator's own register layout. Loaded with
    ``tl.load`` instead (the kernel's first version), a partial arrived in a row-major
    register layout; the accumulator was moved into that layout to be added, and C's tile
    stored from it. On an H200 (3048 x 688 x 6144 fp16, 128 x 128 tiles, the clocks of
    ``tests/gpu/streamk_timeline_probe.py``) an owner then spent 4.5 us on one partial: 0.8
    waiting on the acquire of a flag already raised, 2.2 loading and adding, 1.5 storing C.

    Measured whole (``tests/gpu/streamk_tail_probe.py``: nine tail shapes, fp16, medians
    of three interleaved rounds, cold L2, one H200 call per version): this version took
    0-3 us less than the first (4432 x 904 x 4352 at 128 x 256: 78.3 us against 75.4;
    1888 x 3456 x 1536: 46.2 against 43.3; 1624 x 2600 x 2304: 46.2 against 44.6), and
    as long elsewhere. Two other boxes were tried and not kept. Rows of 128 or 256 fp32
    values land in shared memory unswizzled, so the rows a warp reads at once start in one
    bank; cut into 128-byte pieces (a third dimension, which the unit swizzles) they took
    the same time within 1 us on all nine shapes. Boxes 32 columns wide, one after
    another, took longer (65.5 us at 3048 x 688 x 6144 against 59.1): each is a trip to L2
    and back before the next is asked for. What is left is not the layout: from the end of
    its K steps to C's store, a 128 x 256 owner still takes about 4 us for one partial
    (4096^3), 0.45 of them the acquire.

    A wide tile's partials are read half a tile at a time: a whole 128 x 256 fp32 tile
    beside the accumulator is 256 registers a thread (of 8 warps), more than the 255 there
    are, and 128 KiB of shared memory."""
    HALVES: tl.constexpr = BLOCK_M * BLOCK_N > 128 * 128
    W: tl.constexpr = BLOCK_N // 2 if HALVES else BLOCK_N
    if HALVES:      # columns [0, W) and [W, 2W), as the persistent kernel's split epilogue
        left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, W)), (0, 2, 1)))
    else:
        left, right = acc, acc
    p = pid - 1
    while (p >= 0) & ((p + 1) * total // NUM_SMS > tile_start):
        if (p + 1) * total // NUM_SMS > p * total // NUM_SMS:      # it has steps
            # Wait for its flag and reset it. Acquire: its stores, released with the flag,
            # are visible here from now on.
            while tl.atomic_cas(flags_ptr + p, 1, 0, sem="acquire", scope="gpu") != 1:
                pass
            if FENCE:
                _async_proxy_fence()
            left += ws_desc.load([p * BLOCK_M, 0])
            if HALVES:
                right += ws_desc.load([p * BLOCK_M, W])
        p -= 1
    if HALVES:
        acc = tl.reshape(tl.permute(tl.join(left, right), (0, 2, 1)), (BLOCK_M, BLOCK_N))
    else:
        acc = left
    return acc


@triton.jit
def _masked_store(c, row, col, values, M, N, stride_cm, ROWS: tl.constexpr,
                  COLS: tl.constexpr):
    rows = row + tl.arange(0, ROWS)
    cols = col + tl.arange(0, COLS)
    tl.store(c + rows[:, None] * stride_cm + cols[None, :], values,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _store_in_halves(c, row, col, values, M, N, stride_cm, ROWS: tl.constexpr,
                     COLS: tl.constexpr):
    H: tl.constexpr = COLS // 2
    left, right = tl.split(tl.permute(tl.reshape(values, (ROWS, 2, H)), (0, 2, 1)))
    _masked_store(c, row, col, left, M, N, stride_cm, ROWS, H)
    _masked_store(c, row, col + H, right, M, N, stride_cm, ROWS, H)


@triton.jit
def _store_tile(c, row, col, acc, M, N, stride_cm, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, C_DESC: tl.constexpr):
    """Tile (row, col) of C: through C's descriptor, or, where C's rows do not start on the
    16-byte boundaries a descriptor needs (N = 2,686 in fp16: 5,372 bytes a row), as a
    masked store from the registers, a few bytes a thread. C is written once, so that costs
    little beside the tile's K steps; the operands, read again for every tile, are what the
    descriptors are for (a plan copies them onto whole lines first). The store goes in
    pieces of at most 64 columns: an address for each of a thread's 64 values of a
    128 x 128 tile, all at once, took 255 registers and spilled, and so did halves of a
    128 x 256 tile (ptxas, sm_90a). (Offsets in 32 bits: a product past 2^31 elements is
    refused before it gets here.)"""
    if C_DESC:
        c.store([row, col], acc.to(c.dtype))
    else:
        W: tl.constexpr = BLOCK_N // 2
        out = acc.to(c.dtype.element_ty)
        left, right = tl.split(tl.permute(tl.reshape(out, (BLOCK_M, 2, W)), (0, 2, 1)))
        if BLOCK_N > 128:       # in quarters: halves of 128 x 256 still spilled
            _store_in_halves(c, row, col, left, M, N, stride_cm, BLOCK_M, W)
            _store_in_halves(c, row, col + W, right, M, N, stride_cm, BLOCK_M, W)
        else:
            _masked_store(c, row, col, left, M, N, stride_cm, BLOCK_M, W)
            _masked_store(c, row, col + W, right, M, N, stride_cm, BLOCK_M, W)


@triton.jit
def matmul_kernel_streamk(a_desc, b_desc, ws_desc, c_out, ws_ptr, flags_ptr, M, N, K,
                          SK_TILES, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                          NUM_SMS: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                          C_DESC: tl.constexpr, FENCE: tl.constexpr):
    # c_out: C's descriptor (C_DESC), or its address where its rows are off 16 bytes.
    # ws_ptr and ws_desc: the partial sums' workspace, written by address and read through
    # the TMA unit (_add_handed_over). FENCE: the proxy fence that needs (compiled only).
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)
    whole = num_pid_m * num_pid_n - SK_TILES
    # 1. The whole tiles, one program per SM, every NUM_SMS-th tile.
    for tile in tl.range(pid, whole, NUM_SMS):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _steps(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, steps, acc,
                     BLOCK_K, A_T, B_T)
        _store_tile(c_out, pid_m * BLOCK_M, pid_n * BLOCK_N, acc, M, N, stride_cm,
                    BLOCK_M, BLOCK_N, C_DESC)
    # 2. The last SK_TILES tiles' steps, laid end to end, split evenly: this program's
    # share is [first, stop), walked backwards one tile's piece at a time.
    total = SK_TILES * steps
    first = pid * total // NUM_SMS
    stop = (pid + 1) * total // NUM_SMS
    box = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    end = stop
    while end > first:
        t = (end - 1) // steps                       # the stream-K tile this piece is of
        k_stop = end - t * steps
        k_first = tl.maximum(first - t * steps, 0)
        pid_m, pid_n = grouped_tile(whole + t, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _steps(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_first, k_stop, acc,
                     BLOCK_K, A_T, B_T)
        if k_stop < steps:
            # A helper: leave the partial sum and raise the flag. The barrier makes every
            # thread's store happen before the flag; the atomic releases them to the owner.
            tl.store(ws_ptr + pid * BLOCK_M * BLOCK_N + box, acc)
            tl.debug_barrier()
            tl.atomic_xchg(flags_ptr + pid, 1, sem="release", scope="gpu")
        else:
            # The owner: add the pieces of the programs before it that hold earlier steps
            # of this tile (each holds one piece, the last of its share), then write C.
            acc = _add_handed_over(acc, ws_desc, flags_ptr, pid, t * steps, total,
                                   BLOCK_M, BLOCK_N, NUM_SMS, FENCE)
            _store_tile(c_out, pid_m * BLOCK_M, pid_n * BLOCK_N, acc, M, N, stride_cm,
                        BLOCK_M, BLOCK_N, C_DESC)
        end = t * steps + k_first


def fitted(config, dtype=torch.float16) -> TileConfig:
    """``config`` (a setting of the persistent kernel) as this kernel runs it: the whole C
    tile staged for its store (no split epilogue), a plain tile loop, and one pipeline stage
    fewer at a time while that does not fit the shared memory here (128 x 256 x 64 with four
    stages fits the persistent kernel only because it stores C in halves). ValueError when
    no number of stages fits."""
    config = setting(config).with_options(FLATTEN=False, SPLIT_EPILOGUE=False)
    gpu, _ = gpu_in_use()
    while not config.fits(gpu, dtype, staged_c=1)[0]:
        if config.num_stages <= 2:
            raise ValueError(f"{config.describe()} does not fit with its C tile staged: "
                             f"{config.fits(gpu, dtype, staged_c=1)[1]}")
        config = TileConfig.of({**config.as_dict(KEYS), "num_stages": config.num_stages - 1})
    return config


class _Scratch:
    """The partial-sum workspace and flags, per device, kept between calls (flags end at 0)."""

    def __init__(self):
        self.kept: dict = {}

    def get(self, device, floats: int, programs: int):
        ws, flags = self.kept.get(device, (None, None))
        if ws is None or ws.numel() < floats or flags.numel() < programs:
            ws = torch.empty(max(floats, 1), device=device, dtype=torch.float32)
            flags = torch.zeros(max(programs, 1), device=device, dtype=torch.int32)
            self.kept[device] = (ws, flags)
        return ws, flags


_SCRATCH = _Scratch()


def c_rows_aligned(N: int, dtype) -> bool:
    """Whether rows of N elements start on the 16-byte boundaries a descriptor of C needs
    (else the kernel stores C from the registers: :func:`_store_tile`)."""
    return (N * dtype.itemsize) % 16 == 0


def _with_c_as_address(launch):
    """The direct launch (``launch(tensors, args)``, descriptors of ``tensors``) of a kernel
    whose C is an address, not a descriptor: C, the fourth tensor (after A, B and the
    workspace), goes first among the other arguments."""
    return lambda tensors, args: launch(tensors[:3], (tensors[3], *args))


def workspace_box(config: TileConfig) -> list:
    """The box in which an owner reads a partial tile: half of it for a wide tile
    (:func:`_add_handed_over`), else all of it."""
    wide = config.block_m * config.block_n > 128 * 128
    return [config.block_m, config.block_n // 2 if wide else config.block_n]


def workspace(ws: torch.Tensor, config: TileConfig, programs: int) -> torch.Tensor:
    """The partial sums' workspace as the TMA unit reads it: ``BLOCK_M`` rows of ``BLOCK_N``
    fp32 values a program (rows of 4 ``BLOCK_N`` bytes: whole 16-byte units, as a
    descriptor needs)."""
    n = programs * config.block_m * config.block_n
    return ws[:n].view(programs * config.block_m, config.block_n)


def launch(a: torch.Tensor, b: torch.Tensor, config, sms: int | None = None):
    """``a @ b`` on the stream-K kernel with ``config`` (a setting of the persistent kernel;
    its switches are not used): ``(c, run, config)``, where ``run(a, b)`` repeats it for a
    pair of the same shape and layout through the compiled kernel. ``sms``: the programs
    (one per SM unless given: the tests ask for a few, so that pieces are shared out in the
    interpreter too). The caller checks :func:`~helpers.kernels.matmul.persistent.usable`
    with ``c_rows=False``: C's rows may be off 16 bytes here."""
    runtime.check_dot_dtype(a.dtype)        # bf16 tl.dot is wrong in the interpreter
    config = fitted(config, a.dtype)
    M, K = a.shape
    N = b.shape[1]
    sms = sms or sm_count(a.device)
    tiles = triton.cdiv(M, config.block_m) * triton.cdiv(N, config.block_n)
    sk_tiles = stream_k_tiles(tiles, sms)
    ws, flags = _SCRATCH.get(a.device, sms * config.block_m * config.block_n, sms)
    slabs = workspace(ws, config, sms)
    ws_desc = TensorDescriptor(slabs, list(slabs.shape), list(slabs.stride()),
                               workspace_box(config))
    a_t, b_t = transposed(a), transposed(b)
    c_desc = c_rows_aligned(N, a.dtype)
    constants = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                     GROUP_M=config.group_m, NUM_SMS=sms, A_T=a_t, B_T=b_t, C_DESC=c_desc,
                     FENCE=runtime.is_gpu())
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    grid = (sms, 1, 1)
    tail = (ws, flags, M, N, K, sk_tiles, N)            # N: C's row stride (it is new)

    def operands(a, b, c):
        """The kernel's first four arguments: the descriptors of A, B and the workspace,
        and C's, or C's address where its rows cannot have a descriptor."""
        a_desc, b_desc, *c_desc_or_none = descriptors(a, b, c if c_desc else None, config)
        return (a_desc, b_desc, ws_desc, *(c_desc_or_none or (c,)))

    out = torch.empty((M, N), device=a.device, dtype=a.dtype)
    compiled = matmul_kernel_streamk[grid](*operands(a, b, out), *tail, **constants, **options)
    # Later calls: the compiled kernel with the descriptors' encodings kept
    # (matmul_tma_launch), where this Triton allows it and it gives what the JIT gave.
    args, device, dtype = tail + tuple(constants.values()), out.device, out.dtype
    box_a, box_b, box_c = boxes(config, a_t, b_t)
    fast = None if compiled is None else direct(
        compiled, grid, [box_a, box_b, workspace_box(config)] + ([box_c] if c_desc else []))
    if fast is not None and not c_desc:
        fast = _with_c_as_address(fast)
    fast = None if fast is None else _checked(fast, (stored(a), stored(b), slabs), out, args)

    def run(a, b):
        c = torch.empty((M, N), device=device, dtype=dtype)
        if fast is not None:
            fast((a.t() if a_t else a, b.t() if b_t else b, slabs, c), args)
        else:
            matmul_kernel_streamk[grid](*operands(a, b, c), *tail, **constants, **options)
        return c

    run.keeps_encodings = fast is not None
    return out, run, config


__all__ = ["NARROW", "WIDE", "c_rows_aligned", "fitted", "launch", "matmul_kernel_streamk",
           "stream_k_tiles"]

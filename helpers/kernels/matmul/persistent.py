"""Lesson 07, what settings alone cannot fix: a persistent matmul fed by the TMA.

:func:`~helpers.kernels.matmul.tuned.matmul_kernel_v6` launches one program per output
tile and loads its tiles with ``cp.async``: every thread computes addresses and copies
16 bytes at a time. Two costs stay whatever the settings:

* **Per-tile start-up and tail.** A program fills its software pipeline, runs K / BLOCK_K
  steps, then stores its tile while nothing else runs on that SM. At K = 1000 a 128 x 256
  tile has only 16 steps, so the fill and the store are a large share of its time.
  A *persistent* kernel launches one program per SM; each walks a list of tiles
  (``tile_id``, ``tile_id + NUM_SMS``, ...), and with ``FLATTEN`` Triton pipelines the
  tile loop and the K loop as one: the next tile's loads are in flight while this tile
  is stored.
* **Address arithmetic and alignment.** Hopper's Tensor Memory Accelerator (TMA) copies
  a whole 2-D box from global to shared memory from one descriptor (base, shape,
  strides, box size): no per-thread addresses, and rows or columns past the edge come
  back as zeros, so no masks either. The descriptors are built on the host
  (:func:`descriptors`) and passed as kernel arguments: built on the GPU, they cost every
  program time before its first load, which at small sizes is a large share of the whole.
  On the host, building and encoding three descriptors at every call cost more than the
  GPU's whole product at 1000^3, so the launch keeps each tensor's encoding and encodes
  only a tensor it has not seen (:mod:`~helpers.kernels.matmul.tma_launch`, with the
  measurements): an encoding depends on nothing but the address, shape, strides, dtype and
  box.
* **The store.** With ``SPLIT_EPILOGUE`` the C tile is stored as two halves, which halves
  the shared memory the store stages and can leave room for one more pipeline stage.

Measured on an H100 80GB HBM3 (fp16, triton 3.6, one setting, 128 x 256 x 64 tiles, the
descriptors then built on the GPU): at
4000 x 3000 x 1000 the one-tile-per-program kernel took 76 us, this one 61 us, cuBLAS 47
us; with B's rows padded to whole 128-byte lines (a 6000-byte row starts mid-line, so
every row of every box touches one line more) this one took 47 us. :func:`pads_b` decides
when that copy pays.

The TMA needs compute capability 9.0 (Hopper) or newer, 16-byte aligned rows and a
contiguous last dimension; a transposed view (nn.Linear's ``W.T``) qualifies through the
matrix underneath (:func:`stored`): :func:`usable` says whether a call qualifies. The rows
of A and B can be made to qualify: the tuned path also builds plans on copies of them in
aligned rows (:mod:`~helpers.kernels.matmul.plan`), so a shape whose operands the TMA
refuses as given may still run here on the copies. The rows of C cannot: C is written where
the caller reads it, so where N values are not a whole number of 16 bytes (N = 777 in
fp16) only v6 runs. :mod:`~helpers.kernels.matmul.tuned` times this kernel beside v6, each
as a whole plan, and keeps the faster.

**Tuning it.** Each candidate reads boxes of its own size, so the tuner gives the
descriptors each setting's boxes in a ``pre_hook`` (:func:`_set_boxes`, as in Triton's
tutorial 09). As soon as one setting of a tuner carries a ``pre_hook``, Triton skips its
autotuning disk cache (``cache_results``) for the whole tuner ("We can't serialize
prehooks", ``Autotuner.check_disk_cache`` in ``triton/runtime/autotuner.py``), so this
tuner's timings live in memory only; a new process finds the tuned path's decision on disk
instead (:class:`~helpers.kernels.matmul.plan.Decisions`) and times nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import runtime
from .config import TileConfig, gpu_in_use
from .ladder import grouped_tile
from . import precompile
from .pack import packer
from .tma_launch import direct

# How the saved decisions and the records name a setting of this kernel: no GROUP_M (the
# launch passes GROUP_M on its own) and no SPLIT_K; its two switches are TileConfig options.
KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "FLATTEN", "SPLIT_EPILOGUE", "num_warps",
        "num_stages")
SWITCHES = ("FLATTEN", "SPLIT_EPILOGUE")
# A box's rows, for the padding rule: B is re-read once per BLOCK_M rows of A.
ROWS_PER_READ_OF_B = 128
# Pad B when it is read this many times or more (16 reads of B pay for one copy of it).
READS_OF_B_TO_PAD = 16
CACHE_LINE = 128


NEITHER = {"FLATTEN": False, "SPLIT_EPILOGUE": False}
FLAT, SPLIT = {**NEITHER, "FLATTEN": True}, {**NEITHER, "SPLIT_EPILOGUE": True}
BOTH = {"FLATTEN": True, "SPLIT_EPILOGUE": True}

# The candidates: the large tiles of v6's space, with and without the flattened tile loop
# and the split epilogue (the C tile stored as two halves: half the shared memory for the
# store, which leaves room for one more pipeline stage).
PERSISTENT_SPACE = [
    TileConfig(128, 256, 64, num_warps=8, num_stages=3, options=BOTH),
    TileConfig(128, 256, 64, num_warps=8, num_stages=3, options=NEITHER),
    TileConfig(128, 256, 64, num_warps=8, num_stages=4, options=SPLIT),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4, options=FLAT),
    TileConfig(128, 128, 64, num_warps=4, num_stages=4, options=NEITHER),
    TileConfig(128, 128, 64, num_warps=4, num_stages=4, options=FLAT),
    TileConfig(128, 128, 128, num_warps=8, num_stages=3, options=NEITHER),
    TileConfig(128, 64, 64, num_warps=4, num_stages=5, options=NEITHER),
    TileConfig(64, 128, 64, num_warps=4, num_stages=5, options=NEITHER),
]


def setting(config) -> TileConfig:
    """``config`` as a setting of this kernel: a TileConfig (or a saved decision's dict)
    with both switches set (off unless given) and no split of K."""
    config = TileConfig.of(config)
    unknown = set(dict(config.options)) - set(SWITCHES)
    if config.split_k != 1 or unknown:
        raise ValueError(f"the persistent kernel does not split K and has only the switches "
                         f"{SWITCHES}; got {config.describe()} with {sorted(unknown) or 'none'}")
    return config.with_options(**{**NEITHER, **dict(config.options)})


@triton.jit
def matmul_kernel_persistent(a_desc, b_desc, c_desc, M, N, K, stride_bk,
                             M_BUCKET, N_BUCKET, K_BUCKET, DTYPE: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                             NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr,
                             SPLIT_EPILOGUE: tl.constexpr, A_T: tl.constexpr = False,
                             B_T: tl.constexpr = False):
    # One descriptor per matrix, built on the host (:func:`descriptors`): the TMA unit
    # reads boxes of BLOCK_M x BLOCK_K of A and BLOCK_K x BLOCK_N of B, zero-filling past
    # M, N and K. `stride_bk` and DTYPE are not used here: they are part of the tuner's
    # key (B's row length; the dtype, which a descriptor does not show the tuner).
    # A_T / B_T: the operand is a transposed view (column-major) and its descriptor
    # describes the row-major matrix underneath: X (K x M) for A = X.T, W (N x K) for
    # B = W.T, nn.Linear's `x @ W.T`. A box is read as stored and used transposed: the
    # tensor cores read either order from shared memory, so no copy and no shuffle.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # This program's tiles: its id, then every NUM_SMS-th one (one program per SM).
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        row, col = pid_m * BLOCK_M, pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            if A_T:
                a = a_desc.load([k, row]).T
            else:
                a = a_desc.load([row, k])
            if B_T:
                b = b_desc.load([col, k]).T
            else:
                b = b_desc.load([k, col])
            acc = tl.dot(a, b, acc)
        out = acc.to(c_desc.dtype)
        if SPLIT_EPILOGUE:   # two BLOCK_M x BLOCK_N/2 halves: a smaller staging buffer
            left, right = tl.split(tl.permute(tl.reshape(out, (BLOCK_M, 2, BLOCK_N // 2)),
                                              (0, 2, 1)))
            c_desc.store([row, col], left)
            c_desc.store([row, col + BLOCK_N // 2], right)
        else:
            c_desc.store([row, col], out)   # rows and columns past M and N are dropped


def _boxes(bm: int, bn: int, bk: int, split_epilogue: bool, a_t: bool = False,
           b_t: bool = False) -> tuple[list, list, list]:
    return ([bk, bm] if a_t else [bm, bk]), ([bn, bk] if b_t else [bk, bn]), \
        [bm, bn // 2 if split_epilogue else bn]


def transposed(t: torch.Tensor) -> bool:
    """Whether ``t`` is a transposed view: column-major, its columns the stride-1 axis.
    (A matrix strided both ways is neither: only the pointer kernel takes it.)"""
    return t.stride(1) != 1 and t.stride(0) == 1


def stored(t: torch.Tensor) -> torch.Tensor:
    """The row-major matrix a descriptor describes: ``t`` itself, or ``t.T`` for a
    transposed view (nn.Linear's weight, for ``x @ W.T``)."""
    return t.t() if transposed(t) else t


def boxes(config: TileConfig, a_t: bool = False, b_t: bool = False) -> tuple[list, list, list]:
    """The box shapes of A, B and C that a setting reads and writes, as stored: a
    transposed operand's box is read the other way round."""
    return _boxes(config.block_m, config.block_n, config.block_k,
                  config.option("SPLIT_EPILOGUE"), a_t, b_t)


def descriptors(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None,
                config: TileConfig) -> tuple:
    """Host-side TMA descriptors of A, B and C (A and B alone for ``c=None``) for
    ``config``'s boxes; of the row-major matrix underneath where an operand is a transposed
    view (:func:`stored`).

    A descriptor is 128 bytes (base address, shape, strides, box, swizzle) that the
    launcher encodes on the host and passes as a kernel argument. Built on the GPU instead
    (``tl.make_tensor_descriptor``), every program writes its descriptors to global memory
    and fences them before its first load: measured on an H100 80GB HBM3 (1000^3 fp16, one
    setting: 128 x 128 x 64 tiles, 4 warps, 4 stages, triton 3.6), 12.9 us of GPU time
    against 10.2 us with host-side ones; cuBLAS took 8.8 us. The host pays instead: building
    and encoding three descriptors took about 17 us a call on that machine (bf16), so
    :func:`launch`'s ``run`` keeps their encodings between calls (:mod:`matmul_tma_launch`).
    """
    box_a, box_b, box_c = boxes(config, transposed(a), transposed(b))
    which = ((stored(a), box_a), (stored(b), box_b)) + (() if c is None else ((c, box_c),))
    return tuple(TensorDescriptor(x, list(x.shape), [x.stride(0), 1], box) for x, box in which)


def _set_boxes(nargs: dict) -> None:
    """The tuner's ``pre_hook``: before it launches a setting, give the descriptors that
    setting's boxes (one set of descriptors serves every candidate)."""
    shape = _boxes(nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"], nargs["SPLIT_EPILOGUE"],
                   nargs["A_T"], nargs["B_T"])
    for name, box in zip(("a_desc", "b_desc", "c_desc"), shape):
        nargs[name].block_shape = box


# --------------------------------------------------------------------------------------
# What can run: the GPU, the operands' layout, shared memory.
# --------------------------------------------------------------------------------------


def staged_c(config: TileConfig) -> float:
    """The share of the C tile the TMA store stages in shared memory: all of it, or one
    half at a time with the split epilogue (:meth:`TileConfig.shared_memory_bytes`)."""
    return 0.5 if config.option("SPLIT_EPILOGUE") else 1


def fits(config: TileConfig, gpu, dtype=torch.float16) -> tuple[bool, str]:
    """Whether a setting fits ``gpu`` here: the pipeline's A and B boxes plus the staging
    buffer of the C tile's store (:meth:`TileConfig.fits`)."""
    return config.fits(gpu, dtype, staged_c=staged_c(config))


def _tma_rows(t: torch.Tensor) -> bool:
    """Rows (of the matrix underneath, for a transposed view) contiguous and starting on
    16-byte boundaries: what a descriptor needs."""
    x = stored(t)
    return (x.stride(-1) == 1 and (x.stride(0) * x.element_size()) % 16 == 0
            and x.data_ptr() % 16 == 0)


def usable(a: torch.Tensor, b: torch.Tensor, c_rows: bool = True) -> tuple[bool, str]:
    """Whether ``a @ b`` can run on this kernel here, and if not, why. ``c_rows=False``:
    C's rows need not be 16-byte aligned (the stream-K kernel stores them without TMA)."""
    if a.dtype not in (torch.float16, torch.bfloat16):
        return False, f"{a.dtype}: this kernel is written for fp16 and bf16"
    if runtime.is_gpu() and torch.cuda.get_device_capability(a.device)[0] < 9:
        return False, "the TMA needs compute capability 9.0 (Hopper) or newer"
    for name, t in (("A", a), ("B", b)):
        if not _tma_rows(t):
            what = "columns (it is a transposed view)" if transposed(t) else "rows"
            return False, f"{name}'s {what} are not contiguous and 16-byte aligned"
    if c_rows and (b.shape[1] * b.element_size()) % 16:
        return False, "C's rows (N elements) would not be 16-byte aligned"
    return True, "usable"


def pads_b(M: int, b: torch.Tensor) -> bool:
    """Copy B into rows padded to whole 128-byte lines before the product?

    A row that starts mid-line makes every row of every box of B touch one line more.
    B is read once per ``ROWS_PER_READ_OF_B`` rows of A; copying it costs about two
    reads. Pad when B's rows are misaligned and it is read ``READS_OF_B_TO_PAD`` times
    or more.
    """
    misaligned = (stored(b).stride(0) * b.element_size()) % CACHE_LINE != 0
    return misaligned and triton.cdiv(M, ROWS_PER_READ_OF_B) >= READS_OF_B_TO_PAD


def line_padder(b: torch.Tensor):
    """``copy(b)``: ``b`` copied into rows that start on 128-byte boundaries (a strided
    view) in a buffer built once. A transposed view is copied as the transpose of such a
    copy of the matrix underneath, so it keeps the layout the kernel was built for."""
    x = stored(b)
    copy = packer(None, 0, x, x.shape[1], CACHE_LINE)
    if x is b:
        return lambda b: copy(None, b)[1]
    return lambda b: copy(None, b.t())[1].t()


def padded_to_lines(b: torch.Tensor) -> torch.Tensor:
    """``b`` copied into rows that start on 128-byte boundaries (a strided view)."""
    return line_padder(b)(b)


def sm_count(device) -> int:
    if runtime.is_gpu():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4   # the interpreter: a few programs, each walking several tiles


def grid_for(M: int, N: int, sms: int):
    """One program per SM, or per tile when there are fewer tiles than SMs."""
    def grid(meta):
        return (min(sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)
    return grid


# --------------------------------------------------------------------------------------
# Tuning and launching.
# --------------------------------------------------------------------------------------

CPU_CONFIG = TileConfig(32, 32, 32, num_warps=4, num_stages=1, options=NEITHER)  # interpreter
GROUP_M = 8        # the program order of the tuned settings (each TileConfig's group_m)
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K")   # besides the switches and GROUP_M


def _bucket(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def prune(configs, named_args, **kwargs) -> list:
    """Triton's ``early_config_prune``: settings that fit shared memory and the shape."""
    M, N = named_args["M"], named_args["N"]
    dtype = named_args["a_desc"].base.dtype
    gpu, _ = gpu_in_use()
    kept = []
    for c in configs:
        config = TileConfig.from_triton(c)
        if not fits(config, gpu, dtype)[0]:
            continue
        if config.block_m > max(64, 2 * M) or config.block_n > max(64, 2 * N):
            continue                            # a box mostly past the edge
        kept.append(c)
    return kept or list(configs[-1:])


# Each candidate reads boxes of its own size, so the descriptors get them from a pre_hook,
# as in Triton's tutorial 09. Triton's result cache on disk (cache_results) is skipped for
# a whole tuner as soon as one of its settings carries a pre_hook (Autotuner.
# check_disk_cache), so this tuner keeps its choice in memory only; a new process finds the
# plan's decision on disk instead (matmul_plan.Decisions).
matmul_kernel_persistent_tuned = triton.autotune(
    configs=[c.triton_config(CONSTEXPRS, pre_hook=_set_boxes) for c in PERSISTENT_SPACE],
    # as v6: B's rows too; and each operand's layout (a transposed view is another problem)
    key=["M_BUCKET", "N_BUCKET", "K_BUCKET", "stride_bk", "DTYPE", "A_T", "B_T"],
    prune_configs_by={"early_config_prune": prune},
)(matmul_kernel_persistent)


_TUNED_MS: dict = {}


def tuned_ms(tuner, args: tuple, kwargs: dict | None = None) -> float:
    """The median time of the setting ``tuner`` chose for these arguments' key.

    Read from the tuner's timings right after it tuned, and remembered: a key it already
    knew brings no timings of its own. Infinite when unknown, so that a comparison keeps
    the other kernel.
    """
    given = {**dict(zip(tuner.arg_names, args)), **(kwargs or {})}   # the tuner's own key
    key = tuple([given[k] for k in tuner.keys if k in given]
                + [str(v.dtype) for v in given.values() if hasattr(v, "dtype")])
    if (id(tuner), key) not in _TUNED_MS:
        # Tuned outside this path (a launch under CUDA-graph capture): the tuner's timings
        # may belong to another key, so this one's time is unknown.
        timing = (getattr(tuner, "configs_timings", None) or {}).get(tuner.cache.get(key))
        if timing is None:
            return float("inf")
        _TUNED_MS[id(tuner), key] = timing[0] if isinstance(timing, (list, tuple)) else timing
    return _TUNED_MS[id(tuner), key]


def launch(a: torch.Tensor, b: torch.Tensor, config: TileConfig | None = None):
    """``a @ b`` on the persistent kernel: returns ``(c, run, config, ms)``. ``run(a, b)``
    repeats the product for another pair of the same shape and layout without the
    autotuner or the JIT (the compiled kernel is called directly); ``ms`` is the tuned
    setting's time (``None`` when a config was given).

    ``config=None`` on a GPU: autotuned per bucketed shape. In CPU mode: :data:`CPU_CONFIG`
    unless given (a :class:`TileConfig`, read by :func:`setting`). ``config`` in the result
    is a TileConfig with both switches. The caller checks :func:`usable` first.
    """
    runtime.check_dot_dtype(a.dtype)        # bf16 tl.dot is wrong in the interpreter
    config = None if config is None else setting(config)
    M, K = a.shape
    N = b.shape[1]
    # The copy of B, built once for this shape and kept by `run` (matmul_pack).
    copy = line_padder(b) if pads_b(M, b) else (lambda b: b)
    b_run = copy(b)
    a_t, b_t = transposed(a), transposed(b_run)      # the Linear layout: b_t
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    sms = sm_count(a.device)
    grid = grid_for(M, N, sms)
    tail = (M, N, K, b_run.stride(0), _bucket(M), _bucket(N), _bucket(K), str(a.dtype))
    if config is None and runtime.is_cpu():
        config = CPU_CONFIG
    if config is None:
        # Any boxes will do here: the tuner's pre_hook gives each candidate its own.
        kernel, extra, first = matmul_kernel_persistent_tuned, {}, PERSISTENT_SPACE[0]
    else:
        kernel, first, extra = matmul_kernel_persistent, config, config.as_dict(KEYS)
    group_m = GROUP_M if config is None else config.group_m
    layout = {"A_T": a_t, "B_T": b_t}
    if config is None and runtime.is_gpu():     # the candidates compiled side by side first
        precompile.tuner_candidates(kernel, (*descriptors(a, b_run, c, first), *tail),
                                    dict(GROUP_M=group_m, NUM_SMS=sms, **layout))
    compiled = kernel[grid](*descriptors(a, b_run, c, first), *tail, GROUP_M=group_m,
                            NUM_SMS=sms, **layout, **extra)
    ms = None if config else tuned_ms(kernel, (*descriptors(a, b_run, c, first), *tail), layout)
    chosen = config or setting(kernel.best_config)
    constants = (chosen.block_m, chosen.block_n, chosen.block_k, chosen.group_m, sms,
                 chosen.option("FLATTEN"), chosen.option("SPLIT_EPILOGUE"), a_t, b_t)
    programs = (*grid({"BLOCK_M": chosen.block_m, "BLOCK_N": chosen.block_n}), 1, 1)
    # The descriptors' encodings kept between calls (matmul_tma_launch), where this
    # Triton allows it and the first such launch gives exactly what the usual one gave.
    fast = None if compiled is None else _checked(
        direct(compiled, programs, list(boxes(chosen, a_t, b_t))),
        (stored(a), stored(b_run)), c, tail + constants)
    # What every later call reads, worked out once: a back-to-back loop of small products
    # runs at the pace of this function's Python (matmul_tma_launch).
    args, device, dtype = tail + constants, c.device, c.dtype

    def run(a, b):
        b = copy(b)
        out = torch.empty((M, N), device=device, dtype=dtype)
        if compiled is None:                  # the interpreter compiles nothing
            kernel[grid](*descriptors(a, b, out, chosen), *tail, GROUP_M=chosen.group_m,
                         NUM_SMS=sms, **layout, **chosen.as_dict(KEYS))
        elif fast is not None:
            fast((a.t() if a_t else a, b.t() if b_t else b, out), args)
        else:
            compiled[programs](*descriptors(a, b, out, chosen), *tail, *constants)
        return out

    run.keeps_encodings = fast is not None

    return c, run, chosen, ms


def _checked(fast, operands: tuple, first: torch.Tensor, args: tuple):
    """``fast`` if its launch gives exactly ``first`` (the usual launch's product), else
    ``None``: the same binary, so any difference means the arguments went astray."""
    if fast is None:
        return None
    again = torch.empty_like(first)
    try:
        fast((*operands, again), args)
        same = torch.equal(again, first)
    except Exception:
        same = False
    return fast if same else None

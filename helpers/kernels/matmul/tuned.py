"""Lesson 07's matmul: one kernel, a space of settings, and a tuner that picks per shape.

Lesson 04's grouped kernel (``matmul_kernel_v3``) with one configuration is a big-square
kernel: its 128 x 128 tiles leave most SMs idle when ``M`` is 16, and a long ``K`` with a
small ``M x N`` gives it a handful of tiles for 132 SMs. Nothing in the kernel is wrong
for those shapes; its *settings* are. This module keeps the kernel and widens the
settings:

* :func:`matmul_kernel_v6` is v3 plus **split-K**: ``SPLIT_K > 1`` slices the K loop over a
  second grid axis, fp32 partial tiles go to a workspace and the last slice to finish sums
  them: more programs for few output tiles, at the price of the partials' traffic.
* :data:`CONFIG_SPACE`, :func:`prune`, :func:`shape_key` (in :mod:`matmul_space`): the
  candidate settings (each a :class:`~helpers.kernels.matmul.config.TileConfig`), what
  fits and is worth timing, shapes bucketed to powers of two.
* :mod:`matmul_plan`: what a call does around the kernel (operands copied into rows of
  whole 128-byte lines or not), timing whole plans, and keeping the winner on disk.
* :mod:`~helpers.kernels.matmul.persistent` and :mod:`~helpers.kernels.matmul.streamk`:
  many tiles (one program per SM, fed by the TMA) and a part-empty last wave (K steps
  shared out), each timed against v6 as a whole plan.
* :func:`matmul_tuned`: ``@triton.autotune`` over the pruned space on a GPU, the
  candidates compiled side by side first (:mod:`~helpers.kernels.matmul.precompile`). In
  CPU mode the autotuner cannot run (it needs a driver to time with): one small fixed
  setting, or the one passed in; :func:`try_space` runs any list of candidates once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ...dtypes import FLOAT_DTYPES
from ..checks import check_32bit_offsets, check_tensor
from ..launch import lean
from . import persistent, precompile, streamk
from . import plan as plans
from .config import TileConfig
from .space import (CONFIG_SPACE, CONSTEXPRS, KEYS,  # noqa: F401 (re-exported)
                    MAX_ACCUMULATOR_REGISTERS, bucket, prune, shape_key, useful, verdict)
from .ladder import grouped_tile
from .plan import runner_up

# --------------------------------------------------------------------------------------
# The kernels.
# --------------------------------------------------------------------------------------


@triton.jit
def matmul_kernel_v6(a_ptr, b_ptr, c_ptr, ws_ptr, locks_ptr, M, N, K, N_C,
                     stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     M_BUCKET, N_BUCKET, K_BUCKET,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
                     ALIGN_A: tl.constexpr, ALIGN_B: tl.constexpr, ALIGN_C: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N),
                                GROUP_M)
    # Split-K: slice `pid_k` of the K axis, a whole number of BLOCK_K steps.
    pid_k = tl.program_id(axis=1)
    steps = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    k_start = pid_k * steps * BLOCK_K
    k_stop = tl.minimum(k_start + steps * BLOCK_K, K)
    k_full = k_start + (k_stop - k_start) // BLOCK_K * BLOCK_K   # the whole steps
    # Rows past M and columns past N wrap around (% M) instead of being masked: they load
    # real, harmless values, the loads stay unmasked, and the store below drops them.
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    # Alignment the launcher vouches for (ALIGN elements = 16 bytes): rows of A and B that
    # start on 16-byte boundaries, and runs of ALIGN_B columns that never straddle the
    # wrap, let each thread load 16 bytes at once instead of one element. Triton can only
    # see this for sizes divisible by 16, so K = 1000 would otherwise load 2 bytes a time.
    # (x // ALIGN) * ALIGN is x itself when the launcher vouches that ALIGN divides x, and
    # a product with a constant is something the compiler can see is divisible by it.
    if ALIGN_A > 1:
        stride_am = (stride_am // ALIGN_A) * ALIGN_A
    if ALIGN_B > 1:
        stride_bk = (stride_bk // ALIGN_B) * ALIGN_B
        cols = tl.max_contiguous(tl.multiple_of(cols, ALIGN_B), ALIGN_B)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + (k_start + ks)[None, :] * stride_ak
    b_ptrs = b_ptr + (k_start + ks)[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_full, BLOCK_K):      # whole steps: no mask at all
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if k_full < k_stop:                              # the K tail, once, masked
        a = tl.load(a_ptrs, mask=ks[None, :] < k_stop - k_full, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < k_stop - k_full, other=0.0)
        acc = tl.dot(a, b, acc)
    # C has N_C columns: N itself, or fewer when the launcher padded B's rows (its extra
    # columns only feed columns of C past N_C, which the mask drops). ALIGN_C as ALIGN_B.
    out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_bound = N_C
    if ALIGN_C > 1:                 # 16-byte stores, not 2-byte ones
        stride_cm = (stride_cm // ALIGN_C) * ALIGN_C
        n_bound = (N_C // ALIGN_C) * ALIGN_C
    mask = (out_rows[:, None] < M) & (out_cols[None, :] < n_bound)
    c_ptrs = c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        # Each slice leaves its fp32 partial tile in the workspace (one M x N slab per
        # slice) and counts itself in the tile's counter. The slice that arrives last
        # adds the slabs in order 0, 1, ... (the same sum every run), writes C once, and
        # resets the counter for the next call. The counter's atomic orders the stores:
        # what a slice wrote before counting is visible to the one that counts last.
        tile = out_rows[:, None] * n_bound + out_cols[None, :]
        tl.store(ws_ptr + pid_k * M * N + tile, acc, mask=mask)
        lock = locks_ptr + pid_m * tl.cdiv(N, BLOCK_N) + pid_n
        if tl.atomic_add(lock, 1) == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(ws_ptr + s * M * N + tile, mask=mask, other=0.0,
                                 cache_modifier=".cg")   # from L2: not a stale L1 line
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock, 0)


def _vector(t) -> int:
    """Elements in 16 bytes of ``t``'s dtype: one vectorised load."""
    return 16 // t.element_size()


def align_a(args) -> int:
    """ALIGN_A: rows of a row-major A start on 16-byte boundaries (else 1: no promise)."""
    a, v = args["a_ptr"], _vector(args["a_ptr"])
    ok = args["stride_ak"] == 1 and args["stride_am"] % v == 0 and a.data_ptr() % 16 == 0
    return v if ok else 1


def align_b(args) -> int:
    """ALIGN_B: as :func:`align_a` for B's rows, and N a multiple of the vector too."""
    b, v = args["b_ptr"], _vector(args["b_ptr"])
    ok = args["stride_bn"] == 1 and args["stride_bk"] % v == 0 and args["N"] % v == 0 \
        and b.data_ptr() % 16 == 0
    return v if ok else 1


def align_c(args) -> int:
    """ALIGN_C: C's rows start on 16-byte boundaries and N_C is a multiple of the vector."""
    c, v = args["c_ptr"], _vector(args["c_ptr"])
    ok = args["stride_cn"] == 1 and args["stride_cm"] % v == 0 and args["N_C"] % v == 0 \
        and c.data_ptr() % 16 == 0
    return v if ok else 1


_ALIGNMENT = {"ALIGN_A": align_a, "ALIGN_B": align_b, "ALIGN_C": align_c}
# One setting, chosen by the caller (CPU mode, the sweeps, lesson 04's fixed setting).
matmul_kernel_v6_fixed = triton.heuristics(_ALIGNMENT)(matmul_kernel_v6)


# --------------------------------------------------------------------------------------
# The autotuned kernel and the launcher.
# --------------------------------------------------------------------------------------


def triton_configs(space=CONFIG_SPACE) -> list:
    return [c.triton_config(CONSTEXPRS) for c in space]


# Keyed on the bucketed shape and the layouts (a transposed B is another problem); the
# autotuner adds the dtypes itself. cache_results keeps the timings on disk (under
# TRITON_CACHE_DIR), so a new process skips the search for a shape it has seen.
matmul_kernel_v6_tuned = triton.autotune(
    configs=triton_configs(), key=["M_BUCKET", "N_BUCKET", "K_BUCKET", "stride_ak", "stride_bk"],
    prune_configs_by={"early_config_prune": prune}, cache_results=True)(matmul_kernel_v6_fixed)


class _Scratch:
    """The split-K workspace and tile counters, kept between calls (counters end at 0)."""

    def __init__(self):
        self.ws, self.locks = {}, {}

    def get(self, device, floats: int, tiles: int):
        ws, locks = self.ws.get(device), self.locks.get(device)
        if ws is None or ws.numel() < floats:
            ws = self.ws[device] = torch.empty(max(floats, 1), device=device,
                                               dtype=torch.float32)
        if locks is None or locks.numel() < tiles:
            locks = self.locks[device] = torch.zeros(max(tiles, 1), device=device,
                                                     dtype=torch.int32)
        return ws, locks


_SCRATCH = _Scratch()
CPU_CONFIG = TileConfig(32, 32, 32, num_warps=4, num_stages=1)   # interpreter: no pipeline


def _scratch_for(a, M, N, K, space):
    """Workspace and counters big enough for every split-K setting that may run."""
    splits = [c for c in space if c.split_k > 1]
    if not splits:
        return _SCRATCH.get(a.device, 1, 1)
    most = max(c.split_k for c in splits)
    tiles = max(triton.cdiv(M, c.block_m) * triton.cdiv(N, c.block_n) for c in splits)
    return _SCRATCH.get(a.device, most * M * N, tiles)


def matmul_tuned(a: torch.Tensor, b: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """``a @ b`` by :func:`matmul_kernel_v6` or the persistent TMA kernel: autotuned per
    bucketed shape on a GPU, or v6 with ``config`` (a dict of :data:`KEYS`). In CPU mode,
    v6 with :data:`CPU_CONFIG` unless given.

    On a GPU the first call of a shape builds candidate *plans*: v6 and (where the TMA
    applies) the persistent kernel, each autotuned, on the operands as given and, when
    their rows do not start on 128-byte lines, on copies that do (:mod:`matmul_plan`);
    v6 also with the tuner's runner-up setting (:func:`runner_up`), and, where the persistent
    kernel's tiles leave the last wave part-empty, the stream-K kernel with that setting and
    with the 128 x 256 and 128 x 128 tiles (:mod:`~helpers.kernels.matmul.streamk`). It
    times each whole plan, keeps the fastest and writes the decision to disk. Later
    calls of the same shape and layout launch the kept plan's compiled kernel directly,
    skipping the autotuner's and the JIT's Python work: at small sizes that host time,
    not the GPU, sets the speed (the ``launch_overhead`` part of the autotuning record).
    """
    key = _plan_key(a, b, config)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan(a, b)
    return _first_call(a, b, config, key)


def _plan_key(a, b, config) -> tuple:
    # ``config``: a TileConfig (which reads as the dict of KEYS that matmul_tuned's
    # docstring names), a record's dict, or None. As a TileConfig it is checked and hashable.
    # get_device(): the device's index (-1 on the CPU), read faster than a torch.device.
    return (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.get_device(),
            b.get_device(), a.data_ptr() % 16, b.data_ptr() % 16,
            None if config is None else _v6_setting(config))


def _v6_setting(config) -> TileConfig:
    """``config`` as a setting of v6, which takes no kernel options (those are another
    kernel's: the persistent one's FLATTEN, say)."""
    config = TileConfig.of(config)
    if config.options:
        raise ValueError(f"v6 takes no kernel options, got {dict(config.options)}: that "
                         "setting belongs to another kernel")
    return config


def _check(a, b) -> None:
    for name, t in (("a", a), ("b", b)):
        check_tensor(t, name, dtypes=FLOAT_DTYPES, ndim=2, contiguous=False)
    if a.dtype != b.dtype or a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply {tuple(a.shape)} {a.dtype} by {tuple(b.shape)} "
                         f"{b.dtype}: A is M x K, B is K x N, one dtype")
    runtime.check_dot_dtype(a.dtype)
    check_32bit_offsets(a, "a")
    check_32bit_offsets(b, "b")
    check_32bit_offsets(torch.empty((a.shape[0], b.shape[1]), device="meta"), "the product C")


def _first_call(a, b, config, key) -> torch.Tensor:
    _check(a, b)
    config = key[-1]                    # the setting as _plan_key read it
    M, K = a.shape
    N = b.shape[1]
    if M * N == 0 or K == 0:
        return torch.zeros((M, N), device=a.device, dtype=a.dtype)
    if config is None and runtime.is_cpu():
        config = CPU_CONFIG
    lean = LEAN_LAUNCH and runtime.is_gpu() and not torch.cuda.is_current_stream_capturing()
    if config is not None or not lean:
        # One setting (or a launch under CUDA-graph capture, which may tune nothing new).
        c, run, _ = _v6_plan(a, b, config, plans.VECTOR, lean)
        if lean:
            _PLANS[key] = run
        return c
    decision_key = plans.DECISIONS.key(a, b, _kernel_keys()) if plans.USE_DECISIONS else None
    decision = plans.DECISIONS.get(decision_key) if decision_key else None
    built = None
    if decision is not None:            # decided in an earlier process: build that plan only
        # Same binary as the process that decided (the key holds the kernels' sources and
        # Triton's version), whose direct launch was checked there: no second check.
        try:
            built = _build(a, b, decision["kernel"], decision["config"],
                           decision["row_bytes"], verify=False)
        except (KeyError, TypeError, ValueError):   # a file of another layout: decide again
            built = None
    if built is not None:
        c, run, _ = built
        _CHOICES[key], _PLANS[key] = {**decision, "from_disk": True}, run
        return c
    candidates = {}
    layouts = [plans.VECTOR]
    if not (plans.on_rows_of(a, plans.LINE) and plans.on_rows_of(b, plans.LINE)):
        layouts.append(plans.LINE)
    for row_bytes in layouts:
        for kernel in ("v6", "persistent"):
            known = set(matmul_kernel_v6_tuned.cache)
            built = _build(a, b, kernel, None, row_bytes)
            if built is None:
                if kernel == "persistent" and not streamk.c_rows_aligned(N, a.dtype):
                    # C's rows off 16 bytes rule out the persistent kernel: stream-K stores them
                    candidates.update(_streamk_plans(a, b, row_bytes, streamk.NARROW))
                continue
            candidates[kernel, row_bytes] = built
            second = runner_up(matmul_kernel_v6_tuned, known) if kernel == "v6" else None
            if second is not None:
                candidates["v6 runner-up", row_bytes] = _build(a, b, "v6", second, row_bytes)
            if kernel == "persistent":      # stream-K where some tile leaves a wave tail
                candidates.update(_streamk_plans(a, b, row_bytes, built[2], tails_only=True))
    times = plans.time_plans({name: run for name, (_, run, _) in candidates.items()}, a, b)
    (name, row_bytes), ms = min(times.items(), key=lambda item: item[1])
    c, run, chosen = candidates[name, row_bytes]
    keys = persistent.KEYS if name.split()[0] in ("persistent", "streamk") else KEYS
    decision = {"kernel": name.split()[0], "config": chosen.as_dict(keys), "row_bytes": row_bytes,
                "layout": "whole lines" if row_bytes == plans.LINE else "as given",
                "candidates_ms": {f"{k} {'whole lines' if r == plans.LINE else 'as given'}": t
                                  for (k, r), t in times.items()}}
    if decision_key:
        plans.DECISIONS.put(decision_key, decision)
    _CHOICES[key], _PLANS[key] = decision, run
    return c


def _kernel_keys() -> tuple[str, ...]:
    """What a stored decision depends on besides the shape: the kernels' sources and the
    spaces their tuners search."""
    return (matmul_kernel_v6.cache_key, persistent.matmul_kernel_persistent.cache_key,
            streamk.matmul_kernel_streamk.cache_key, *_space_keys())


def _space_keys() -> tuple[str, str]:
    """Both spaces as the records spell them (dicts of each kernel's KEYS), so that the
    decisions saved before the settings became TileConfigs are found again."""
    return (repr([c.as_dict(KEYS) for c in CONFIG_SPACE]),
            repr([c.as_dict(persistent.KEYS) for c in persistent.PERSISTENT_SPACE]))


def _build(a, b, kernel, config, row_bytes, verify=True):
    """One candidate plan: ``(c, run, config)``, or ``None`` where the kernel cannot run.
    ``config``: a TileConfig, a saved decision's dict, or ``None`` (autotuned)."""
    if kernel == "v6":
        return _v6_plan(a, b, config, row_bytes, True, verify)
    c_rows = kernel == "persistent"     # stream-K stores C's rows without TMA where it must
    if c_rows and (b.shape[1] * b.element_size()) % plans.VECTOR:
        return None                     # C's rows would not be 16-byte aligned
    pad_a, pad_b, _ = plans.needs_padding(a, b, row_bytes)
    prepare = plans.operand_packer(a, b, pad_a, pad_b, b.shape[1], row_bytes)
    a_run, b_run = prepare(a, b)
    if not persistent.usable(a_run, b_run, c_rows)[0]:
        return None
    if kernel == "streamk":
        c, launched, chosen = streamk.launch(a_run, b_run, config)
    else:
        c, launched, chosen, _ = persistent.launch(a_run, b_run, config)
    if not (pad_a or pad_b):            # nothing to copy: one Python call fewer a product
        return c, launched, chosen
    return c, (lambda a, b: launched(*prepare(a, b))), chosen


def _streamk_plans(a, b, row_bytes, setting, tails_only=False) -> dict:
    """Stream-K plans (:mod:`~helpers.kernels.matmul.streamk`) with ``setting`` and with the
    128 x 256 and 128 x 128 tiles, each tile once: neither wins everywhere. On an H200
    (``tests/gpu/streamk_tail_probe.py``, fp16) 128 x 256 was faster at 4432 x 904 x 4352
    (75.4 us against 85.7), 128 x 128 at 5968 x 328 x 6656 (69.0 against 92.4; the
    persistent kernel took 81.8 with 128 x 256) and at 488 x 4432 x 4864. ``tails_only``:
    tiles that leave a wave tail (:func:`_wave_tail`), whatever the persistent tuner picked
    (one H200 record lost stream-K at 3048 x 688 x 6144 so: 0.89x cuBLAS fell to 0.69x)."""
    found, tiles = {}, set()
    for name, config in (("streamk", setting), ("streamk wide", streamk.WIDE),
                         ("streamk narrow", streamk.NARROW)):
        config = TileConfig.of(config)
        tile = tuple(config.as_dict(CONSTEXPRS[:3]).values())
        if tile in tiles or (tails_only and not _wave_tail(a, b, config)):
            continue
        tiles.add(tile)
        try:
            built = _build(a, b, "streamk", config, row_bytes)
        except ValueError:              # its C tile does not fit beside two stages
            continue
        if built is not None:
            found[name, row_bytes] = built
    return found


def _wave_tail(a, b, config: TileConfig) -> bool:
    """Whether ``config``'s tiles leave a wave part-empty here (:func:`streamk.stream_k_tiles`)."""
    tiles = triton.cdiv(a.shape[0], config.block_m) * triton.cdiv(b.shape[1], config.block_n)
    return streamk.stream_k_tiles(tiles, persistent.sm_count(a.device)) > 0


def _v6_plan(a, b, config, row_bytes, keep, verify=True):
    """v6 on ``a @ b``, A and B copied into rows that start every ``row_bytes`` where they
    do not: ``(c, run, config)``. ``config=None``: autotuned. ``run(a, b)`` repeats it for
    a pair of the same shape and layout (the compiled kernel called directly when
    ``keep`` and the direct launch gives what the first did; else through the JIT)."""
    M, K = a.shape
    N = b.shape[1]
    pad_a, pad_b, n_padded = plans.needs_padding(a, b, row_bytes)

    prepare = plans.operand_packer(a, b, pad_a, pad_b, n_padded, row_bytes)
    a_run, b_run = prepare(a, b)
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if config is not None:
        config = _v6_setting(config)
        space, kernel = [config], matmul_kernel_v6_fixed
    else:
        args = {"M": M, "N": n_padded, "K": K, "a_ptr": a_run}
        space = [TileConfig.from_triton(x) for x in prune(matmul_kernel_v6_tuned.configs, args)]
        kernel = matmul_kernel_v6_tuned
    ws, locks = _scratch_for(a_run, M, n_padded, K, space)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(n_padded, meta["BLOCK_N"]),
                meta["SPLIT_K"])

    extra = {} if config is None else config.as_dict(KEYS)
    tail = (ws, locks, M, n_padded, K, N, *a_run.stride(), *b_run.stride(), *c.stride(),
            *shape_key(M, N, K))
    if config is None and runtime.is_gpu():     # the candidates compiled side by side first
        precompile.tuner_candidates(kernel, (a_run, b_run, c, *tail), {})
    compiled = kernel[grid](a_run, b_run, c, *tail, **extra)
    chosen = config if config is not None else TileConfig.from_triton(kernel.best_config)
    run = _direct(compiled, prepare, a_run, b_run, c, tail, chosen, verify) if keep else None
    if run is None:
        def run(a, b):
            out = torch.empty((M, N), device=a.device, dtype=a.dtype)
            kernel[grid](*prepare(a, b), out, *tail, **extra)
            return out
    return c, run, chosen


# Launch a shape's compiled kernel directly after its first call (GPU mode).
LEAN_LAUNCH = True
_PLANS: dict = {}
_CHOICES: dict = {}      # plan key -> the decision: kernel, setting, layout, candidates' ms


def last_choice(a: torch.Tensor, b: torch.Tensor) -> dict | None:
    """Which kernel, setting and layout the GPU path chose for this pair's shape and
    layout (and each candidate plan's time, when this process timed them)."""
    return _CHOICES.get(_plan_key(a, b, None))


def _direct(compiled, prepare, a, b, c, tail, config, verify=True):
    """The compiled kernel called directly, without the autotuner, the JIT or Triton's
    per-call Python (:func:`~helpers.kernels.launch.lean`): ``run(a, b)``,
    or ``None`` unless it gives exactly what the first launch gave (it runs the same
    binary; another Triton's launcher may take other arguments). ``verify=False`` skips
    that check, for a binary already checked so."""
    chosen = config.as_dict(CONSTEXPRS)
    shape = {"a_ptr": a, "b_ptr": b, "c_ptr": c, "N": tail[3], "N_C": tail[5],
             "stride_am": tail[6], "stride_ak": tail[7], "stride_bk": tail[8],
             "stride_bn": tail[9], "stride_cm": tail[10], "stride_cn": tail[11]}
    full_tail = (*tail, *chosen.values(), align_a(shape), align_b(shape), align_c(shape))
    grid = (triton.cdiv(c.shape[0], chosen["BLOCK_M"]) * triton.cdiv(tail[3], chosen["BLOCK_N"]),
            chosen["SPLIT_K"], 1)
    try:                        # the compiled launcher, called without Triton's Python
        go = lean(compiled, grid, c.get_device())
    except (AttributeError, TypeError, ValueError):     # not a compiled kernel we know
        return None
    if verify:                  # the direct launch must give exactly the first launch's C
        again = torch.full_like(c, float("nan"))     # NaN equals nothing: a launch that
                                                     # wrote nothing cannot pass
        try:
            go(a, b, again, *full_tail)
        except Exception:
            return None
        if not torch.equal(again, c):
            return None
    shape, device, dtype = c.shape, c.device, c.dtype

    def run(a, b):
        out = torch.empty(shape, device=device, dtype=dtype)
        go(*prepare(a, b), out, *full_tail)
        return out

    return run


def chosen_config(M: int, N: int, K: int, dtype=torch.float16, a_strides=None,
                  b_strides=None) -> TileConfig | None:
    """The setting the tuner picked for this shape's bucket (``None``: not tuned yet)."""
    a_strides = a_strides or (K, 1)
    b_strides = b_strides or (N, 1)
    for key, config in matmul_kernel_v6_tuned.cache.items():
        if tuple(key[:5]) == (*shape_key(M, N, K), a_strides[1], b_strides[0]) \
                and str(dtype) in map(str, key[5:]):
            return TileConfig.from_triton(config)
    return None


def try_space(a: torch.Tensor, b: torch.Tensor, space=CONFIG_SPACE) -> list[dict]:
    """Run every setting of ``space`` once on ``a @ b``; report each one's worst error.

    The tuner's search without the stopwatch: it works in CPU mode (the interpreter),
    where "which is fastest?" has no answer and the recorded GPU sweep gives it.
    """
    want = (a.float() @ b.float())
    rows = []
    for config in map(TileConfig.of, space):
        got = matmul_tuned(a, b, config=config).float()
        rows.append({**config.as_dict(KEYS), "max_abs_error": (got - want).abs().max().item()})
    return rows

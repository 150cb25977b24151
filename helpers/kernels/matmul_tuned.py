"""Lesson 07's matmul: one kernel, a space of settings, and a tuner that picks per shape.

Lesson 04's grouped kernel (``matmul_kernel_v3``) with one configuration is a big-square
kernel: its 128 x 128 tiles leave most SMs idle when ``M`` is 16, and a long ``K`` with a
small ``M x N`` gives it a handful of tiles for 132 SMs. Nothing in the kernel is wrong
for those shapes; its *settings* are. This module keeps the kernel and widens the
settings:

* :func:`matmul_kernel_v6` is v3 plus **split-K**: with ``SPLIT_K > 1`` a second grid axis
  cuts the K loop into slices, each program writes an fp32 partial tile to a workspace,
  and the last slice of each tile to finish sums them and writes C. More programs for shapes with
  few output tiles, at the price of ``SPLIT_K`` partial tiles written and read back.
* :data:`CONFIG_SPACE`: tile shapes from 16 rows (one token, a decode step) to
  256 x 128, warps, pipeline stages and split-K: the candidates.
* :func:`prune` (Triton's ``early_config_prune``): before timing anything, drop what
  cannot fit this GPU's shared memory or the registers, tiles far larger than the
  problem, and split-K where there are tiles enough. What is left is timed.
* :func:`shape_key`: shapes are bucketed to powers of two, so that a model's thousand
  slightly different shapes need a few dozen tunings, not a thousand.
* :func:`matmul_tuned`: ``@triton.autotune`` over the pruned space on a GPU. In CPU mode
  the autotuner cannot run (it needs a driver to time with): one small fixed setting,
  or the one passed in; :func:`try_space` runs any list of candidates once, to check
  them, which is the tuner's search without the stopwatch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import runtime
from ..dtypes import FLOAT_DTYPES
from .checks import check_tensor
from . import matmul_persistent as persistent
from .matmul_ladder import grouped_tile

KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")

# Shared memory a program may use on an H100 or H200 (227 KiB, the opt-in maximum); the
# tuner asks the GPU itself when there is one.
H100_SHARED_MEMORY = 232_448
# fp32 accumulator registers a thread may spend: a thread has 255, and the loads, the
# addresses and the pipeline need the rest.
MAX_ACCUMULATOR_REGISTERS = 128


def _config(bm, bn, bk, split_k, warps, stages, group_m=8) -> dict:
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SPLIT_K=split_k,
                num_warps=warps, num_stages=stages)


# The candidates. Big tiles for big problems (each loaded value reused 128-256 times);
# 16-64 rows for skinny ones, where a 128-row tile would be mostly padding; deep K steps
# and split-K for long, thin reductions.
CONFIG_SPACE = (
    [_config(bm, bn, 64, 1, w, s) for bm, bn, w, s in (
        (128, 256, 8, 3), (128, 256, 8, 4), (256, 128, 8, 3), (256, 128, 8, 4),
        (128, 128, 8, 4), (128, 128, 4, 4),
        (128, 64, 4, 4), (64, 128, 4, 4), (64, 64, 4, 4))]
    + [_config(bm, bn, bk, sk, w, s) for bm in (16, 32, 64) for bn, bk, w, s in (
        (64, 128, 4, 4), (128, 128, 4, 4), (256, 64, 8, 4)) for sk in (1, 4)]
    + [_config(64, 64, 128, sk, 4, 4) for sk in (2, 8)]
)


# --------------------------------------------------------------------------------------
# The kernels.
# --------------------------------------------------------------------------------------


@triton.jit
def matmul_kernel_v6(a_ptr, b_ptr, c_ptr, ws_ptr, locks_ptr, M, N, K,
                     stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     M_BUCKET, N_BUCKET, K_BUCKET,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
                     ALIGN_A: tl.constexpr, ALIGN_B: tl.constexpr):
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
    out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_bound = N
    if ALIGN_B > 1:                 # C's rows are N long too: 16-byte stores, not 2-byte ones
        stride_cm = (stride_cm // ALIGN_B) * ALIGN_B
        n_bound = (N // ALIGN_B) * ALIGN_B
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


_ALIGNMENT = {"ALIGN_A": align_a, "ALIGN_B": align_b}
# One setting, chosen by the caller (CPU mode, the sweeps, lesson 04's fixed setting).
matmul_kernel_v6_fixed = triton.heuristics(_ALIGNMENT)(matmul_kernel_v6)


# --------------------------------------------------------------------------------------
# What fits, what is pruned, how shapes are bucketed.
# --------------------------------------------------------------------------------------


def shared_memory_bytes(config: dict, dtype=torch.float16) -> int:
    """SRAM the software pipeline keeps: ``num_stages`` A and B tiles in flight."""
    size = torch.empty((), dtype=dtype).element_size()
    return config["num_stages"] * (config["BLOCK_M"] + config["BLOCK_N"]) \
        * config["BLOCK_K"] * size


def accumulator_registers(config: dict) -> int:
    """fp32 registers a thread holds for its share of the ``BLOCK_M x BLOCK_N`` tile."""
    return config["BLOCK_M"] * config["BLOCK_N"] // (32 * config["num_warps"])


def fits(config: dict, dtype=torch.float16, shared_memory: int = H100_SHARED_MEMORY,
         max_registers: int = MAX_ACCUMULATOR_REGISTERS) -> tuple[bool, str]:
    """Whether one setting can run at all here, and if not, why."""
    smem = shared_memory_bytes(config, dtype)
    if smem > shared_memory:
        return False, f"needs {smem:,} bytes of shared memory, over the {shared_memory:,} here"
    regs = accumulator_registers(config)
    if regs > max_registers:
        return False, (f"its accumulator needs {regs} registers a thread, over the "
                       f"{max_registers} budgeted")
    return True, "fits"


def useful(config: dict, M: int, N: int, K: int, sms: int = 132) -> tuple[bool, str]:
    """Whether a setting that fits is worth timing for this shape."""
    if config["BLOCK_M"] > max(16, triton.next_power_of_2(M)):
        return False, f"BLOCK_M {config['BLOCK_M']} is more than twice M = {M}: mostly padding"
    if config["BLOCK_N"] > max(32, triton.next_power_of_2(N)):
        return False, f"BLOCK_N {config['BLOCK_N']} is more than twice N = {N}: mostly padding"
    if M > 256 and config["BLOCK_M"] < 64:
        return False, f"BLOCK_M {config['BLOCK_M']} reuses each value of B too few times for M = {M}"
    if config["SPLIT_K"] > 1:
        tiles = triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"])
        if tiles >= sms:
            return False, f"{tiles} tiles already fill {sms} SMs: split-K only adds traffic"
        if K < config["SPLIT_K"] * config["BLOCK_K"] * 4:
            return False, f"K = {K} is too short to split {config['SPLIT_K']} ways"
    return True, "kept"


@functools.lru_cache(maxsize=None)
def _gpu_limits() -> tuple[int, int]:
    props = triton.runtime.driver.active.utils.get_device_properties(
        torch.cuda.current_device())
    return props["max_shared_mem"], props["multiprocessor_count"]


def prune(configs, named_args, **kwargs) -> list:
    """Triton's ``early_config_prune``: the candidates worth timing for this call."""
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    dtype = named_args["a_ptr"].dtype
    shared_memory, sms = _gpu_limits() if runtime.is_gpu() else (H100_SHARED_MEMORY, 132)
    kept = [c for c in configs
            if fits({**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages},
                    dtype, shared_memory)[0]
            and useful({**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages},
                       M, N, K, sms)[0]]
    return kept or list(configs[:1])


def bucket(n: int) -> int:
    """The power of two at or above ``n`` (at least 16): the tuner's unit of shape."""
    return max(16, triton.next_power_of_2(n))


def shape_key(M: int, N: int, K: int) -> tuple[int, int, int]:
    """Shapes that share one tuning: each size rounded up to a power of two."""
    return bucket(M), bucket(N), bucket(K)


# --------------------------------------------------------------------------------------
# The autotuned kernel and the launcher.
# --------------------------------------------------------------------------------------


def triton_configs(space=CONFIG_SPACE) -> list:
    return [triton.Config({k: c[k] for k in KEYS[:5]}, num_warps=c["num_warps"],
                          num_stages=c["num_stages"]) for c in space]


# Keyed on the bucketed shape and the layouts (a transposed B is another problem); the
# autotuner adds the dtypes itself. cache_results keeps the timings on disk (under
# TRITON_CACHE_DIR), so a new process skips the search for a shape it has seen.
matmul_kernel_v6_tuned = triton.autotune(
    configs=triton_configs(), key=["M_BUCKET", "N_BUCKET", "K_BUCKET", "stride_ak", "stride_bk"],
    prune_configs_by={"early_config_prune": prune}, cache_results=True)(matmul_kernel_v6_fixed)


def config_of(config) -> dict:
    """A ``triton.Config`` (the tuner's choice) as the plain dict of :data:`CONFIG_SPACE`."""
    return {**{k: config.kwargs[k] for k in KEYS[:5]}, "num_warps": config.num_warps,
            "num_stages": config.num_stages}


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
CPU_CONFIG = _config(32, 32, 32, 1, 4, 1)     # interpreter: small tiles, no pipeline


def _scratch_for(a, M, N, K, space):
    """Workspace and counters big enough for every split-K setting that may run."""
    splits = [c for c in space if c["SPLIT_K"] > 1]
    if not splits:
        return _SCRATCH.get(a.device, 1, 1)
    most = max(c["SPLIT_K"] for c in splits)
    tiles = max(triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"]) for c in splits)
    return _SCRATCH.get(a.device, most * M * N, tiles)


def matmul_tuned(a: torch.Tensor, b: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """``a @ b`` by :func:`matmul_kernel_v6`: autotuned per bucketed shape on a GPU, or with
    ``config`` (a dict of :data:`KEYS`). In CPU mode, :data:`CPU_CONFIG` unless given.

    On a GPU the first call of a shape goes through the autotuner (search, compile,
    launch) and keeps a *plan*: the compiled kernel, its grid and its settings. Later
    calls of the same shape and layout launch the compiled kernel directly, skipping
    the autotuner's and the JIT's Python work: at small sizes that host time, not the
    GPU, sets the speed (the ``launch_overhead`` part of the autotuning record).
    """
    key = _plan_key(a, b, config)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan(a, b)
    return _first_call(a, b, config, key)


def _plan_key(a, b, config) -> tuple:
    return (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.device, b.device,
            a.data_ptr() % 16, b.data_ptr() % 16,
            None if config is None else tuple(sorted(config.items())))


def _padded(x: torch.Tensor, cols: int) -> torch.Tensor:
    """``x`` copied into rows of ``cols`` elements rounded up to 16 bytes: a row-major
    matrix whose rows all start on 16-byte boundaries (extra columns left unset)."""
    vector = 16 // x.element_size()
    width = triton.cdiv(cols, vector) * vector
    out = torch.empty((x.shape[0], width), device=x.device, dtype=x.dtype)
    out[:, :x.shape[1]] = x
    return out[:, :cols]


def _needs_padding(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, int]:
    """Whether to copy A into aligned rows, and the column count to run B and C with.

    A row-major matrix whose rows do not start on 16-byte boundaries (K = 1999 in fp16),
    or a B whose N is no multiple of 8 fp16 elements, defeats the kernel's 16-byte loads:
    every element is then loaded on its own, several times slower than the copy costs.
    """
    vector = 16 // a.element_size()
    pad_a = a.stride(1) == 1 and a.shape[0] > 1 and bool(a.stride(0) % vector
                                                         or a.data_ptr() % 16)
    N = b.shape[1]
    pad_b = b.stride(1) == 1 and bool(b.stride(0) % vector or b.data_ptr() % 16 or N % vector)
    return pad_a, (triton.cdiv(N, vector) * vector if pad_b else N)


def _first_call(a, b, config, key) -> torch.Tensor:
    for name, t in (("a", a), ("b", b)):
        check_tensor(t, name, dtypes=FLOAT_DTYPES, ndim=2, contiguous=False)
    if a.dtype != b.dtype or a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply {tuple(a.shape)} {a.dtype} by {tuple(b.shape)} "
                         f"{b.dtype}: A is M x K, B is K x N, one dtype")
    runtime.check_dot_dtype(a.dtype)
    M, K = a.shape
    N = b.shape[1]
    if M * N == 0 or K == 0:
        return torch.zeros((M, N), device=a.device, dtype=a.dtype)
    given = (a, b)
    pad_a, n_padded = _needs_padding(a, b)
    a = _padded(a, K) if pad_a else a
    b = _padded(b, n_padded) if n_padded != N else b
    c = torch.empty((M, n_padded), device=a.device, dtype=a.dtype)
    if config is None and runtime.is_cpu():
        config = CPU_CONFIG
    if config is not None:
        missing = set(KEYS) - set(config)
        if missing:
            raise ValueError(f"config lacks {sorted(missing)}; it needs all of {KEYS}")
        space, kernel = [config], matmul_kernel_v6_fixed
    else:
        args = {"M": M, "N": n_padded, "K": K, "a_ptr": a}
        space = [config_of(x) for x in prune(matmul_kernel_v6_tuned.configs, args)]
        kernel = matmul_kernel_v6_tuned
    ws, locks = _scratch_for(a, M, n_padded, K, space)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(n_padded, meta["BLOCK_N"]),
                meta["SPLIT_K"])

    extra = {} if config is None else {k: config[k] for k in KEYS}
    tail = (ws, locks, M, n_padded, K, *a.stride(), *b.stride(), *c.stride(),
            *shape_key(M, N, K))
    compiled = kernel[grid](a, b, c, *tail, **extra)
    result = c if n_padded == N else c[:, :N].contiguous()
    if not runtime.is_gpu() or torch.cuda.is_current_stream_capturing():
        return result
    if config is None and persistent.usable(*given)[0]:
        # Two kernels, each tuned on its own: keep the one whose best setting timed faster.
        v6_ms = persistent.tuned_ms(kernel, (a, b, c, *tail))
        c_tma, run, chosen, tma_ms = persistent.launch(*given)
        if tma_ms < v6_ms:
            _CHOICES[key] = {"kernel": "persistent", "config": chosen}
            if LEAN_LAUNCH:
                _PLANS[key] = run
            return c_tma
    if config is None:
        _CHOICES[key] = {"kernel": "v6", "config": config_of(kernel.best_config)}
    if LEAN_LAUNCH:
        _keep_plan(key, compiled, a, b, c, tail, config or config_of(kernel.best_config),
                   pad_a, N)
    return result


# Launch a shape's compiled kernel directly after its first call (GPU mode).
LEAN_LAUNCH = True
_PLANS: dict = {}
_CHOICES: dict = {}      # plan key -> {"kernel": "v6" or "persistent", "config": ...}


def last_choice(a: torch.Tensor, b: torch.Tensor) -> dict | None:
    """Which kernel and setting the GPU path chose for this pair's shape and layout."""
    return _CHOICES.get(_plan_key(a, b, None))


def _keep_plan(key, compiled, a, b, c, tail, config, pad_a, n_valid) -> None:
    """Remember how this shape launches, after checking that the direct launch gives
    exactly what the first launch gave (it runs the same binary)."""
    chosen = {k: config[k] for k in KEYS[:5]}
    shape = {"a_ptr": a, "b_ptr": b, "N": tail[3], "stride_am": tail[5], "stride_ak": tail[6],
             "stride_bk": tail[7], "stride_bn": tail[8]}
    full_tail = (*tail, *chosen.values(), align_a(shape), align_b(shape))
    grid = (triton.cdiv(c.shape[0], chosen["BLOCK_M"]) * triton.cdiv(c.shape[1], chosen["BLOCK_N"]),
            chosen["SPLIT_K"], 1)
    n_padded = c.shape[1]
    again = torch.empty_like(c)
    try:
        compiled[grid](a, b, again, *full_tail)
        same = torch.equal(again[:, :n_valid], c[:, :n_valid])   # padding columns: junk
    except Exception:                   # another Triton's launcher takes other arguments
        same = False
    if not same:
        return

    def run(a, b):
        if pad_a:
            a = _padded(a, a.shape[1])
        if n_padded != n_valid:
            b = _padded(b, n_padded)
        out = torch.empty((a.shape[0], n_padded), device=a.device, dtype=a.dtype)
        compiled[grid](a, b, out, *full_tail)
        return out if n_padded == n_valid else out[:, :n_valid].contiguous()

    _PLANS[key] = run


def chosen_config(M: int, N: int, K: int, dtype=torch.float16, a_strides=None,
                  b_strides=None) -> dict | None:
    """The setting the tuner picked for this shape's bucket (``None``: not tuned yet)."""
    a_strides = a_strides or (K, 1)
    b_strides = b_strides or (N, 1)
    for key, config in matmul_kernel_v6_tuned.cache.items():
        if tuple(key[:5]) == (*shape_key(M, N, K), a_strides[1], b_strides[0]) \
                and str(dtype) in map(str, key[5:]):
            return config_of(config)
    return None


def try_space(a: torch.Tensor, b: torch.Tensor, space=CONFIG_SPACE) -> list[dict]:
    """Run every setting of ``space`` once on ``a @ b``; report each one's worst error.

    The tuner's search without the stopwatch: it works in CPU mode (the interpreter),
    where "which is fastest?" has no answer and the recorded GPU sweep gives it.
    """
    want = (a.float() @ b.float())
    rows = []
    for config in space:
        got = matmul_tuned(a, b, config=config).float()
        rows.append({**config, "max_abs_error": (got - want).abs().max().item()})
    return rows

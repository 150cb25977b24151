"""The scaled FP8 matmul at Hopper speed: persistent, fed by the TMA, tuned per shape.

The same product as :func:`~helpers.kernels.fp8.matmul.fp8_matmul_kernel` (read that one
first: the scalings and the promotion are explained there), built the way lesson 07's
fastest bf16 kernel is (:mod:`helpers.kernels.matmul.persistent`): one program per SM
walking its list of output tiles, every A and B tile copied from global to shared memory
by the Tensor Memory Accelerator from a descriptor built on the host, no per-thread
addresses and no masks (the TMA fills rows past the edge with zeros, and drops them on
the store).

Why it matters more in FP8 than in bf16: a tile of FP8 is half the bytes, so the tensor
cores finish a K step in half the time and the loads must keep up with twice the rate.
Every cycle an SM spends computing addresses, waiting for a tile's first loads, or storing
its C tile while nothing else runs, is a larger share of a shorter step.

**Layout.** Hopper's FP8 tensor-core instructions (``wgmma`` with e4m3/e5m2) take both
operands K-major from shared memory. ``A`` (M, K) and ``B`` (N, K), the ``nn.Linear``
layout, are both K-major as stored: B's box is read as stored, ``[BLOCK_N, BLOCK_K]``,
and used transposed (``.T`` is a view of shared memory, no copy).

**Block scales.** DeepSeek-V3's 1 x 128 scales of ``A`` are read per K block, one per row
of the tile: from an ``(M, K/128)`` scale tensor kept row-major that is ``BLOCK_M``
loads 4 bytes each, every one in another 32-byte sector. :func:`quantize` therefore keeps
them column-major (a transposed view, as DeepGEMM does): the tile's ``BLOCK_M`` scales of
one K block sit side by side.

**Promotion** is Triton's own here: ``tl.dot(..., max_num_imprecise_acc=P)`` tells the
compiler to add the tensor cores' partial sum into the fp32 accumulator every ``P``
values of K (on Hopper its default for FP8 is 2^30: never). ``PROMOTE = 0`` keeps that
default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import runtime
from ..matmul.ladder import grouped_tile
from ..matmul.tma_launch import direct

BLOCK_K = 128   # FP8: 128 bytes of a row, one 128-byte swizzle line and one block scale


@triton.jit
def fp8_matmul_persistent_kernel(a_desc, b_desc, c_desc, as_ptr, bs_ptr, M, N, K,
                                 stride_asm, stride_ask, stride_bsn, stride_bsk,
                                 M_BUCKET, N_BUCKET, K_BUCKET,
                                 SCALING: tl.constexpr, PROMOTE: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                                 NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr):
    # M_BUCKET, N_BUCKET, K_BUCKET: the tuner's key only (a setting per size class).
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        row, col = pid_m * BLOCK_M, pid_n * BLOCK_N
        offs_m = row + tl.arange(0, BLOCK_M)
        offs_n = col + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_tiles):
            a = a_desc.load([row, k * BLOCK_K])
            b = b_desc.load([col, k * BLOCK_K]).T
            if SCALING == 2:
                # This K block alone out of the tensor cores, times its scales, into fp32.
                # A tile's columns lie in one 128-wide block of B: its scale is one number,
                # folded into A's so that the update is a single FMA an element (a product
                # and a sum on the CUDA cores per element per K block: the time the tensor
                # cores wait, since this block's product must finish before it is scaled).
                tl.static_assert(BLOCK_K % BLOCK_N == 0, "block scaling: BLOCK_N divides 128")
                s = tl.load(as_ptr + offs_m * stride_asm + k * stride_ask, mask=offs_m < M,
                            other=0.0) * tl.load(bs_ptr + (col // BLOCK_K) * stride_bsn
                                                 + k * stride_bsk)
                acc = tl.fma(tl.dot(a, b), s[:, None], acc)
            elif PROMOTE > 0:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=PROMOTE)
            else:
                acc = tl.dot(a, b, acc)
        if SCALING == 0:
            acc = acc * (tl.load(as_ptr) * tl.load(bs_ptr))
        elif SCALING == 1:
            a_s = tl.load(as_ptr + offs_m * stride_asm, mask=offs_m < M, other=0.0)
            b_s = tl.load(bs_ptr + offs_n * stride_bsn, mask=offs_n < N, other=0.0)
            acc = acc * a_s[:, None] * b_s[None, :]
        c_desc.store([row, col], acc.to(c_desc.dtype))


def _config(bm, bn, warps, stages, flatten=False):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": BLOCK_K, "GROUP_M": 8,
                          "FLATTEN": flatten}, num_warps=warps, num_stages=stages,
                         pre_hook=_set_boxes)


def _set_boxes(nargs: dict) -> None:
    """The tuner's ``pre_hook``: each candidate's own box sizes on the descriptors."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk]
    nargs["c_desc"].block_shape = [bm, bn]


# Wide tiles first: an FP8 K step is short, and a 128 x 256 tile does twice the tensor-core
# work per byte of A loaded that a 128 x 128 one does. Small tiles for small or skinny shapes.
# 128 x 128 at 16 warps is four warpgroups of 64 x 64: with block scales, one warpgroup's
# FMA can run while the others' products are on the tensor cores (103 registers, no spill,
# compiled for sm_90; 256 x 128 spills at 8 and at 16 warps).
SPACE = [
    _config(128, 256, 8, 3), _config(128, 256, 8, 3, flatten=True),
    _config(256, 128, 8, 3), _config(128, 128, 8, 4), _config(128, 128, 16, 4),
    _config(128, 128, 4, 4),
    _config(128, 128, 8, 5), _config(128, 128, 8, 5, flatten=True), _config(64, 128, 4, 5),
    _config(64, 64, 4, 6),
]
CPU_SETTING = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": BLOCK_K, "GROUP_M": 2,
               "FLATTEN": False, "num_warps": 4, "num_stages": 1}


def shared_memory_bytes(config: triton.Config, out_bytes: int = 2) -> int:
    """The pipeline's A and B boxes (one byte a value) plus the C tile the TMA store stages."""
    k = config.kwargs
    bm, bn = k["BLOCK_M"], k["BLOCK_N"]
    return config.num_stages * (bm + bn) * k["BLOCK_K"] + bm * bn * out_bytes


def prune(configs, named_args, **kwargs) -> list:
    """Triton's ``early_config_prune``: settings whose shared memory fits this GPU, whose
    tiles are not mostly past the edge of the shape, and (block scales) whose tile columns
    lie in one block of B. (A 256-wide tile of block scales, B read in two boxes of 128
    rows into two accumulators, was built and timed on an H200: 716-736 TFLOP/s against
    805-845 for 128 x 128 at 4096^3-8192^3 and two LLM shapes; it needs 255 registers at
    8 warps and spills. Block scales keep tiles of at most 128 columns.)"""
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    out_bytes = named_args["c_desc"].base.element_size()
    M, N = named_args["M"], named_args["N"]
    block = {**named_args, **kwargs}.get("SCALING") == 2
    kept = [c for c in configs
            if shared_memory_bytes(c, out_bytes) <= limit
            and not (block and BLOCK_K % c.kwargs["BLOCK_N"])
            and c.kwargs["BLOCK_M"] <= max(64, 2 * M) and c.kwargs["BLOCK_N"] <= max(64, 2 * N)]
    return kept or list(configs[-1:])


fp8_matmul_persistent_tuned = triton.autotune(
    configs=SPACE, key=["M_BUCKET", "N_BUCKET", "K_BUCKET", "SCALING", "PROMOTE"],
    prune_configs_by={"early_config_prune": prune})(fp8_matmul_persistent_kernel)


def usable(a: torch.Tensor, b: torch.Tensor, out_dtype) -> tuple[bool, str]:
    """Whether this kernel can take ``a``, ``b`` and an ``out_dtype`` C, and if not, why."""
    if runtime.is_gpu() and torch.cuda.get_device_capability(a.device)[0] < 9:
        return False, "the TMA needs compute capability 9.0 (Hopper) or newer"
    for name, t in (("a", a), ("b", b)):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False, f"{name}'s rows are not contiguous and 16-byte aligned"
    if (b.shape[0] * torch.empty((), dtype=out_dtype).element_size()) % 16:
        return False, "C's rows (N values) would not be 16-byte aligned"
    return True, "usable"


def _bucket(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


# Launch plans, by everything a call's compiled kernel depends on (see launch).
_PLANS: dict = {}
MAX_PLANS = 256


def _plan_key(a, b, c, a_scale, b_scale, scaling, promote, setting) -> tuple:
    return (tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), a.dtype, b.dtype, c.dtype,
            tuple(a_scale.shape), a_scale.stride(), tuple(b_scale.shape), b_scale.stride(),
            scaling, promote, a.device, tuple(sorted(setting.items())) if setting else None)


def launch(a, b, c, a_scale, b_scale, scaling: int, promote: int, setting=None) -> None:
    """``c = scaled a @ b^T`` on the persistent kernel: tuned per size class on a GPU,
    ``setting`` (or :data:`CPU_SETTING` in the interpreter) otherwise.

    On a GPU the first call of a shape and layout keeps a *plan*: the compiled kernel of the
    chosen setting, launched directly after that (no autotuner, no JIT dispatch), with the
    descriptors' encodings kept per tensor (:mod:`helpers.kernels.matmul.tma_launch`). At
    4096^3 the GPU needs about 0.1 ms; the usual launch path (the tuner's key and pre_hook,
    three descriptors built and encoded) cost the host about as much, and a timed loop then
    measured the host, by up to 2x, from run to run (an H100's record, before the plan).
    """
    key = _plan_key(a, b, c, a_scale, b_scale, scaling, promote, setting)
    plan = _PLANS.get(key)
    if plan is not None:
        plan(a, b, c, a_scale, b_scale)
        return
    M, K = a.shape
    N = b.shape[0]
    if setting is None and runtime.is_cpu():
        setting = CPU_SETTING
    box = setting or SPACE[0].kwargs          # the tuner's pre_hook sets each one's own
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count \
        if runtime.is_gpu() else 4

    def grid(meta):
        return (min(sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)

    def descriptors(a, b, c, box):
        return (TensorDescriptor(a, [M, K], [a.stride(0), 1], [box["BLOCK_M"], BLOCK_K]),
                TensorDescriptor(b, [N, K], [b.stride(0), 1], [box["BLOCK_N"], BLOCK_K]),
                TensorDescriptor(c, [M, N], [c.stride(0), 1], [box["BLOCK_M"], box["BLOCK_N"]]))

    kernel = fp8_matmul_persistent_kernel if setting else fp8_matmul_persistent_tuned
    args = (M, N, K, *a_scale.stride(), *b_scale.stride(), _bucket(M), _bucket(N), _bucket(K))
    compiled = kernel[grid](*descriptors(a, b, c, box), a_scale, b_scale, *args,
                            SCALING=scaling, PROMOTE=promote, NUM_SMS=sms, **(setting or {}))
    if not runtime.is_gpu() or compiled is None:
        return
    chosen = setting or {**kernel.best_config.kwargs, "num_warps": kernel.best_config.num_warps,
                         "num_stages": kernel.best_config.num_stages}
    constants = (scaling, promote, chosen["BLOCK_M"], chosen["BLOCK_N"], chosen["BLOCK_K"],
                 chosen["GROUP_M"], sms, chosen["FLATTEN"])
    programs = (*grid(chosen), 1, 1)
    boxes = [[chosen["BLOCK_M"], BLOCK_K], [chosen["BLOCK_N"], BLOCK_K],
             [chosen["BLOCK_M"], chosen["BLOCK_N"]]]
    fast = _checked(direct(compiled, programs, boxes), (a, b), c,
                    lambda a_s, b_s: (a_s, b_s, *args, *constants), (a_scale, b_scale))

    def plan(a, b, c, a_scale, b_scale):
        if fast is not None:
            fast((a, b, c), (a_scale, b_scale, *args, *constants))
        else:
            compiled[programs](*descriptors(a, b, c, chosen), a_scale, b_scale, *args,
                               *constants)

    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan


def _checked(fast, operands: tuple, first: torch.Tensor, args_of, scales: tuple):
    """``fast`` if its launch gives exactly ``first`` (the usual launch's product), else
    ``None``: the same binary, so any difference means the arguments went astray."""
    if fast is None:
        return None
    again = torch.empty_like(first)
    try:
        fast((*operands, again), args_of(*scales))
        same = torch.equal(again, first)
    except Exception:
        same = False
    return fast if same else None

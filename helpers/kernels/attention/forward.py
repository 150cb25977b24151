"""The FlashAttention-2 forward pass as one Triton kernel.

One program owns one block of ``BLOCK_M`` query rows of one head. Its Q tile is loaded
once and stays in registers; the K and V tiles of the head stream past it, ``BLOCK_N``
keys at a time, through shared memory (SRAM). Each K tile gives a ``BLOCK_M x BLOCK_N``
block of scores, which becomes probabilities and is multiplied into the output at once:
scores and probabilities never travel to HBM. What does travel: Q, K and V are read,
the output O and one log-sum-exp per row (for the backward pass) are written. For one
head of ``N`` rows, ``N / BLOCK_M`` programs read K and V each, against naive attention's
``N x N`` scores written and read back several times.

The online softmax keeps three things per query row, all fp32 in registers: the running
maximum ``m``, the running sum ``l`` and the unnormalised output ``acc``. When a K tile
raises the maximum, ``l`` and ``acc`` are scaled by ``2^(m_old - m_new)`` before the tile's
terms are added. The scores are kept in base 2 (``sm_scale * log2(e)`` folded into one
multiply), so the exponentials are ``exp2``, one hardware instruction (``MUFU.EX2``)
where ``exp`` would need an extra multiply.

Causal attention (query ``i`` sees keys ``j <= i + diag``: ``diag`` is 0 aligned at the top
left, ``seq_k - seq_q`` at the bottom right) splits each program's keys in three:

* the K tiles entirely left of the diagonal band are fully visible: no mask at all;
* the tiles of the diagonal band (``BLOCK_M`` keys from the first row's last visible one)
  are masked element by element;
* the tiles right of the band are fully hidden and never loaded: half of all the work
  of a long causal sequence is skipped.

The last, partial tile of a sequence that is not a multiple of ``BLOCK_N`` is masked
too; every full tile before it runs the unmasked loop.

On Hopper the Q, K and V tiles can come through the tensor memory accelerator instead of
pointers, and the O tile go back through it (``TMA``: rank-4 descriptors made on the GPU,
rows past the sequence arriving as zeros and never written), where :func:`tma_ok` says the
unit can read the tensors; the tuner times settings of both kinds
(``tests/gpu/attention_ws_probe.py`` has the measurements that led here).

A head dimension that is not a power of two (112, 224) is held ``BLOCK_D`` wide, the
next power of two (``tl.arange`` needs one): the columns past ``HEAD_DIM`` load as zeros,
add nothing to ``Q K^T`` and are never stored. A head that two powers of two make up
(80 = 64 + 16, 96, 192) goes to :mod:`.forward_split` instead, which multiplies no zeros.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime import _allocation

from ... import runtime
from ..launch import lean
from . import forward_split

LOG2_E = tl.constexpr(1.4426950408889634)   # exp(x) = exp2(x * log2(e))
LN_2 = tl.constexpr(0.6931471805599453)     # the saved lse goes back to natural log


@triton.jit
def load_rows(ptrs, rows, n_rows, in_head, MASK_ROWS: tl.constexpr, WHOLE_HEAD: tl.constexpr):
    """A tile of rows of one head (Q, K, V or dO): with ``MASK_ROWS``, rows from ``n_rows``
    on load as zeros; unless ``WHOLE_HEAD``, so do the columns past the head (``in_head``
    false), when the head is held wider than it is."""
    if MASK_ROWS:
        x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & in_head, other=0.0)
    elif WHOLE_HEAD:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=in_head, other=0.0)
    return x


@triton.jit
def heads_descriptor(X, batch, heads, seq, stride_b, stride_h, stride_row,
                     HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """A tensor descriptor of a (batch, heads, seq, HEAD_DIM) tensor whose rows are
    contiguous, read ``BLOCK_ROWS`` rows of one head at a time: made on the GPU, per
    program (its 128 bytes go to global scratch memory first)."""
    return tl.make_tensor_descriptor(X, [batch, heads, seq, HEAD_DIM],
                                     [stride_b, stride_h, stride_row, 1],
                                     [1, 1, BLOCK_ROWS, HEAD_DIM])


@triton.jit
def key_value_sources(K, V, k_head, v_head, heads, seq_k, stride_kb, stride_kh, stride_kn,
                      stride_vb, stride_vh, stride_vn, GROUP: tl.constexpr,
                      HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """What a program that walks K and V tiles reads them from: its head's start, or with
    ``TMA`` descriptors of K and V whole, for Hopper's tensor memory accelerator. One
    instruction then asks the unit for a whole tile, which lands in shared memory while
    the warps compute, instead of every thread computing addresses and issuing loads."""
    k_src, v_src = k_head, v_head
    if TMA:
        batch = tl.num_programs(1) // heads
        k_src = heads_descriptor(K, batch, heads // GROUP, seq_k, stride_kb, stride_kh,
                                 stride_kn, HEAD_DIM, BLOCK_N)
        v_src = heads_descriptor(V, batch, heads // GROUP, seq_k, stride_vb, stride_vh,
                                 stride_vn, HEAD_DIM, BLOCK_N)
    return k_src, v_src


@triton.jit
def tile_rows(src, b, h, start, stride_row, n_rows, in_head,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr,
              MASKED: tl.constexpr, TMA: tl.constexpr):
    """The tile of rows ``start ..`` of head ``h`` of batch ``b`` (K, V, Q or dO): from a
    tensor descriptor of the whole tensor (``TMA``), whose rows past the sequence arrive as
    zeros, or through pointers from the head's start ``src``."""
    if TMA:
        x = src.load([b, h, start, 0]).reshape(BLOCK_ROWS, HEAD_DIM)
    else:
        rows = start + tl.arange(0, BLOCK_ROWS)
        dims = tl.arange(0, BLOCK_D)
        x = load_rows(src + rows[:, None] * stride_row + dims[None, :], rows, n_rows, in_head,
                      MASKED, BLOCK_D == HEAD_DIM)
    return x


@triton.jit
def _visit_key_tiles(acc, l_i, m_i, q, k_src, v_src, b, h_kv, stride_kn, stride_vn,
                     rows, start, stop, seq_k, diag, qk_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr):
    """The inner loop: the K/V tiles of keys ``start .. stop`` past one resident Q tile."""
    in_head = tl.arange(0, BLOCK_D)[None, :] < HEAD_DIM
    for start_n in range(start, stop, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tile_rows(k_src, b, h_kv, start_n, stride_kn, seq_k, in_head,
                      HEAD_DIM, BLOCK_D, BLOCK_N, MASKED, TMA)
        # >>> assignment: scores, masks, the online-softmax update, P @ V
        # BLOCK_M x BLOCK_N scores on the tensor cores, accumulated in fp32.
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            visible = cols[None, :] < seq_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + diag)
            s = tl.where(visible, s, float("-inf"))
        # The online softmax in log2 units: a larger maximum rescales what was summed
        # before. The scale multiplies each row's maximum once, and each score inside one
        # fused multiply-add, s * c - m (the CUDA cores' work per score is the softmax's
        # cost). The first tile visited holds key 0, which every row that sees any key
        # sees, so m_new is finite there; a row that sees none stays -inf (NaN in its own
        # sums only).
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        rescale = tl.math.exp2(m_i - m_new)
        l_i = l_i * rescale + tl.sum(p, 1)
        v = tile_rows(v_src, b, h_kv, start_n, stride_vn, seq_k, in_head,
                      HEAD_DIM, BLOCK_D, BLOCK_N, MASKED, TMA)
        # P goes to the tensor cores in the inputs' dtype; the sum stays fp32.
        acc = acc * rescale[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        # <<< assignment
    return acc, l_i, m_i


@triton.jit
def attention_fwd_kernel(Q, K, V, O, LSE, sm_scale,
                         stride_qb, stride_qh, stride_qm,
                         stride_kb, stride_kh, stride_kn,
                         stride_vb, stride_vh, stride_vn,
                         stride_ob, stride_oh, stride_om,
                         heads, seq_q, seq_k, diag,
                         GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, TMA: tl.constexpr = False):
    pid_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    b = (batch_head // heads).to(tl.int64)
    h = (batch_head % heads).to(tl.int64)
    h_kv = h // GROUP                      # grouped-query attention: GROUP heads share K, V
    q_head = Q + b * stride_qb + h * stride_qh
    k_head = K + b * stride_kb + h_kv * stride_kh
    v_head = V + b * stride_vb + h_kv * stride_vh

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    b32, h32, h_kv32 = b.to(tl.int32), h.to(tl.int32), h_kv.to(tl.int32)  # descriptors'
    q_src = q_head
    if TMA:
        q_src = heads_descriptor(Q, tl.num_programs(1) // heads, heads, seq_q, stride_qb,
                                 stride_qh, stride_qm, HEAD_DIM, BLOCK_M)
    # The Q tile: read once from HBM, resident for the whole loop.
    q = tile_rows(q_src, b32, h32, pid_m * BLOCK_M, stride_qm, seq_q,
                  dims[None, :] < HEAD_DIM, HEAD_DIM, BLOCK_D, BLOCK_M, True, TMA)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * LOG2_E

    k_src, v_src = key_value_sources(K, V, k_head, v_head, heads, seq_k, stride_kb, stride_kh,
                                     stride_kn, stride_vb, stride_vh, stride_vn, GROUP,
                                     HEAD_DIM, BLOCK_N, TMA)
    # >>> assignment: which key tiles run unmasked, which masked, which are skipped
    full_tiles_end = (seq_k // BLOCK_N) * BLOCK_N              # keys in whole K tiles
    if CAUSAL:
        # The diagonal band starts at the first row's last visible key (in whole tiles);
        # every row sees the keys before it, and the tiles past the band are skipped.
        band = tl.maximum(pid_m * BLOCK_M + diag, 0) // BLOCK_N * BLOCK_N
        unmasked_end = tl.minimum(band, full_tiles_end)
        stop = tl.minimum(tl.maximum(pid_m * BLOCK_M + BLOCK_M + diag, 0), seq_k)
    else:
        unmasked_end = full_tiles_end
        stop = seq_k
    # <<< assignment
    acc, l_i, m_i = _visit_key_tiles(acc, l_i, m_i, q, k_src, v_src, b32, h_kv32, stride_kn,
                                     stride_vn, rows, 0, unmasked_end, seq_k, diag, qk_scale,
                                     HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL, TMA)
    acc, l_i, m_i = _visit_key_tiles(acc, l_i, m_i, q, k_src, v_src, b32, h_kv32, stride_kn,
                                     stride_vn, rows, unmasked_end, stop, seq_k, diag, qk_scale,
                                     HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL, TMA)

    # >>> assignment: normalise, and the log-sum-exp the backward needs
    # Normalise once at the end, and save lse = m + log(l) (natural log) for the backward.
    # A row that saw no key (m still -inf): output 0 and lse +inf, so P = exp(S - lse) = 0.
    saw_keys = m_i > float("-inf")
    o = tl.where(saw_keys[:, None], acc / l_i[:, None], 0.0)
    lse = tl.where(saw_keys, (m_i + tl.math.log2(l_i)) * LN_2, float("inf"))
    # <<< assignment
    tl.store(LSE + batch_head.to(tl.int64) * seq_q + rows, lse, mask=rows < seq_q)
    o = o.to(O.dtype.element_ty)
    if TMA:     # the unit writes the tile, and drops the rows past the sequence
        o_desc = heads_descriptor(O, tl.num_programs(1) // heads, heads, seq_q, stride_ob,
                                  stride_oh, stride_om, HEAD_DIM, BLOCK_M)
        o_desc.store([b32, h32, pid_m * BLOCK_M, 0], o.reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        o_head = O + b * stride_ob + h * stride_oh
        tl.store(o_head + rows[:, None] * stride_om + dims[None, :], o,
                 mask=(rows[:, None] < seq_q) & (dims[None, :] < HEAD_DIM))


def _grid(q, block_m: int) -> tuple:
    batch, heads, seq_q, _ = q.shape
    return (triton.cdiv(seq_q, block_m), batch * heads, 1)


# A head two powers of two wide (80 = 64 + 16, 192 = 128 + 64) goes to the kernel of
# :mod:`.forward_split`, which multiplies no padding; off, every head is held padded here.
SPLIT_HEADS = True


def kernel_for(head_dim: int):
    """The forward kernel that takes a head ``head_dim`` wide: this module's, or for a
    head :func:`.forward_split.pieces` splits, :mod:`.forward_split`'s."""
    return forward_split.attention_fwd_split_kernel if _split(head_dim) else attention_fwd_kernel


def _split(head_dim: int) -> bool:
    return bool(SPLIT_HEADS and forward_split.pieces(head_dim))


def held(head_dim: int) -> int:
    """The columns of a head :func:`kernel_for`'s kernel holds: ``head_dim`` split, or the
    next power of two."""
    return head_dim if _split(head_dim) else triton.next_power_of_2(head_dim)


def tma_ok(q, *streamed) -> bool:
    """Whether the tiles of ``streamed`` (the forward's Q, K and V, the backward's Q and dO
    or K and V) can come through tensor descriptors: a head held whole (``q``'s: a power of two,
    16 to 256 wide, not split), 2-byte elements, each tensor on a 16-byte boundary with
    every stride but the last a non-zero multiple of 16 bytes (the TMA unit's rules),
    compiled on a GPU that has the unit (Hopper, compute capability 9, or later) or in the
    interpreter, which emulates it."""
    d = q.shape[-1]
    if _split(d) or d & (d - 1) or not 16 <= d <= 256 or q.element_size() != 2:
        return False
    for t in streamed:
        if t.data_ptr() % 16 or any(s <= 0 or s * t.element_size() % 16 for s in t.stride()[:3]):
            return False
    return not runtime.is_gpu() or _has_tma(q.get_device())


def use_descriptors(asked, q, *streamed) -> bool:
    """A launch's ``TMA``: asked for (a setting's ``tma``) and :func:`tma_ok`. On a GPU, an
    allocator is then set for the descriptors' scratch memory where none is."""
    use = bool(asked) and tma_ok(q, *streamed)
    if use and runtime.is_gpu():
        allocator_for_descriptors()
    return use


@functools.cache
def _has_tma(device: int) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # Global memory a program writes its descriptors to before it uses them.
    return torch.empty(size, dtype=torch.int8, device="cuda")


def allocator_for_descriptors() -> None:
    """Descriptors made on the GPU need global scratch memory, which Triton asks of the
    allocator ``triton.set_allocator`` set in this thread (a context variable). Where none
    is set, the course's: one set by the caller is left as it is."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _arguments(q, k, v, o, diagonal: int | None, block_m: int, block_n: int, tma: bool):
    """The kernel's arguments after the five tensors and the scale: ``(ints, constexprs)``,
    the constexprs in the order of :func:`kernel_for`'s signature. ``tma``: the setting asks
    for tensor descriptors, which the kernel takes where :func:`tma_ok` says it can."""
    heads, seq_q, head_dim = q.shape[1], q.shape[2], q.shape[3]
    ints = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
            heads, seq_q, k.shape[2], diagonal or 0)
    constexprs = dict(GROUP=heads // k.shape[1], HEAD_DIM=head_dim)
    if _split(head_dim):
        constexprs.update(forward_split.constexprs(head_dim), BLOCK_M=block_m,
                          BLOCK_N=block_n, CAUSAL=diagonal is not None)
    else:
        constexprs.update(BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=block_m,
                          BLOCK_N=block_n, CAUSAL=diagonal is not None,
                          TMA=use_descriptors(tma, q, q, k, v, o))
    return ints, constexprs


def launch(q, k, v, o, lse, diagonal: int | None, sm_scale: float, *, block_m: int,
           block_n: int, num_warps: int, num_stages: int, tma: bool = False,
           compile_only: bool = False):
    """Fill ``o`` and ``lse`` for checked 4-D tensors (the last dimension contiguous).
    ``diagonal``: query ``i`` sees keys ``j <= i + diagonal``; None, every key.
    ``tma``: K and V tiles through tensor descriptors where :func:`tma_ok`, else pointers.
    ``compile_only``: compile this setting and launch nothing (a tuner's head start).
    Returns what Triton's launch returns: the compiled kernel, on a GPU."""
    ints, constexprs = _arguments(q, k, v, o, diagonal, block_m, block_n, tma)
    return launcher(kernel_for(q.shape[3]), _grid(q, block_m), compile_only)(
        q, k, v, o, lse, sm_scale, *ints, **constexprs, num_warps=num_warps,
        num_stages=num_stages)


def kept_call(compiled, q, k, v, o, lse, diagonal: int | None, sm_scale: float, *,
              block_m: int, block_n: int, num_warps: int, num_stages: int, tma: bool = False):
    """After :func:`launch` returned ``compiled`` for the caller's ``q``, ``k``, ``v`` (3-D or
    4-D) and filled ``o`` and ``lse``: ``call(q, k, v) -> (o, lse)`` for later tensors of the
    same signature (:mod:`~helpers.kernels.attention.kept`), the outputs allocated and the
    compiled kernel launched directly (:func:`~helpers.kernels.launch.lean`). ``None`` in
    the interpreter, or where that direct launch does not give ``o`` and ``lse`` again."""
    if not hasattr(compiled, "run"):                # the interpreter's: nothing compiled
        return None
    q4, k4, v4 = (x.unsqueeze(1) for x in (q, k, v)) if q.dim() == 3 else (q, k, v)
    ints, constexprs = _arguments(q4, k4, v4, o, diagonal, block_m, block_n, tma)
    tail = (*ints, *constexprs.values())
    descriptors = constexprs.get("TMA", False)
    try:
        go = lean(compiled, _grid(q4, block_m), q4.get_device())
        # Filled with NaN, which equals nothing: a launch that wrote nothing cannot pass.
        o_again, lse_again = (torch.full_like(x, float("nan")) for x in (o, lse))
        go(q, k, v, o_again, lse_again, sm_scale, *tail)
        if not (torch.equal(o_again, o) and torch.equal(lse_again, lse)):
            return None
    except Exception:   # noqa: BLE001 - another Triton's launcher: the usual path serves
        return None
    # o as the caller gets it: q's shape, contiguous (a 3-D q's o is the 4-D one's memory).
    o_shape, lse_shape, dtype, device = q.shape, q.shape[:-1], o.dtype, o.device

    def call(q, k, v):
        o = torch.empty(o_shape, dtype=dtype, device=device)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=device)
        if descriptors:         # this thread may not have the allocator the first call set
            allocator_for_descriptors()
        go(q, k, v, o, lse, sm_scale, *tail)
        return o, lse

    return call


def launcher(kernel, grid, compile_only: bool = False):
    """``kernel[grid]``, or with ``compile_only`` its ``warmup`` on that grid: the same
    arguments compile the same kernel and launch nothing."""
    return functools.partial(kernel.warmup, grid=grid) if compile_only else kernel[grid]

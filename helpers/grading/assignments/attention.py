"""Assignment 06, FlashAttention for sliding windows and soft-capped scores: its graded parts
and ``check_*`` calls.

The course's kernel (:mod:`helpers.kernels.attention`) has neither a sliding window (Mistral's,
Gemma 2's local layers: query i sees keys i - W + 1 .. i) nor a score soft-cap (Gemma 2's
``softcap * tanh(s / softcap)``); the learner's kernel has both. Its reference is
:func:`variant_reference`, float64; the GPU parts time the course's kernel beside the
notebook's: no expected value is typed in. Part 1 lives in :mod:`.attention_merge`; its reference merge answers it, so it is the
instructor's (:mod:`.keys_attention`), sealed in a student release.

Parts (33 points; 27 in CPU mode, 6 on a GPU):

=====  ==========================================================  ======
1      ``merge_states``: large scores, masked keys, fully masked rows    3
2a     ``attention_forward`` launches its kernel; O right, no mask,      4
       soft-capped or not
2b     ... causal, with and without sliding windows                      4
2c     lse = m + log(l), natural log, fp32, wherever O is right          2
2d     no program loads a K/V tile that none of its queries sees         2
       (above the diagonal, or left of the window)
2e     the kernel never reads or writes outside its tensors              2
2f     the running sums stay fp32 (past fp16's 65504)                    2
3a     a window of 512 at 4096 tokens: faster than the course's full    3
       causal kernel by the goal of :mod:`.attention_speed` (GPU)
3b     within 20 % of the course's kernel, causal and not (GPU)          3
4a-4c  the backward pass of the variant (:mod:`.attention_backward`)     8
=====  ==========================================================  ======
"""

from __future__ import annotations

import contextlib
import math

import torch

from ... import bounds, runtime
from ...feedback import Feedback, not_implemented, target
from ...kernels import attention as ak
from .. import harness
from ..gpu import gpu_lock
from ..registry import Assignment, Part, answer, check_function
from . import attention_backward as backward
from .attention_merge import collect_merge, judge_merge
from .attention_speed import collect_timings, course_speed, window_speed

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
DTYPE_OF = {harness.dtype_name(d): d for d in (FP16, BF16, FP32)}
# Graded tolerances: twice the kernel tests' (a learner's kernel may round in its own order).
TOL = {d: (2 * a, 2 * r) for d, (a, r) in ak.TOLERANCES.items()}
LSE_TOL = (5e-3, 1e-3)                # fp32 whatever the inputs
LARGE, ACCUMULATION = "large scores", "V in the thousands"
NEGATIVE = "every score far below zero"   # a running maximum that starts at 0 underflows
INF = math.inf


# --- Part 2: the forward kernel, on awkward lengths, causal and not, watched. --------------------


def variant_reference(q, k, v, causal=False, window=None, softcap=None):
    """O and lse in float64: the scores q k^T / sqrt(d), soft-capped if ``softcap`` (``softcap *
    tanh(s / softcap)``), query i seeing keys j <= i if ``causal`` and j > i - ``window``."""
    n = q.shape[-2]
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    keep = (j <= i if causal else torch.ones(n, n, dtype=torch.bool)) & \
        (j > i - window if window else True)
    s = s.masked_fill(~keep, -INF)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v.double(), lse


def _blocks(constexprs) -> tuple[int, int]:
    c = {k.upper(): v for k, v in (constexprs or {}).items() if isinstance(v, int) and v > 1}
    return c.get("BLOCK_M", 32), c.get("BLOCK_N", c.get("BLOCK_M", 32))


class FlashForward(harness.KernelTask):
    function = "attention_forward"
    call = "attention_forward(q, k, v, causal)"
    outputs = ("O",)              # lse is recorded beside it and judged alone (part 2c)
    tensors = "q, k, v, O and lse"
    inputs_named = ("q", "k", "v")
    mask_hint = "Mask rows and keys past seq_len on every load and store of Q, K, V, O and lse"

    case = staticmethod(backward.variant_case)

    def first(self):
        return self.case(7, 16, FP32, False)

    def cases(self, blocks):
        bm, bn = _blocks(blocks)
        long = 2 * max(bm, bn) + 3           # several tiles, the last one partial
        out = []
        for causal in (False, True):
            out += [self.case(n, 16, FP32, causal) for n in (1, 7, bn + 1, 2 * bn, long)]
            out += [self.case(n, 32, FP16, causal, heads=3) for n in (7, long)]
            out += [self.case(bn + 1, 64, FP16, causal, heads=1),
                    self.case(bn + 3, 16, FP16, causal, NEGATIVE, heads=1),
                    self.case(long, 16, FP16, causal, LARGE)]
        # Windows of one tile and a few keys, and of half a tile with soft-capped scores; a
        # long soft-capped row without a mask.
        out += [self.case(long, 16, FP32, True, window=bn + 5),
                self.case(long, 32, FP16, True, heads=3, window=max(bm, bn) // 2 + 1,
                          softcap=5.0),
                self.case(long, 16, FP32, False, softcap=5.0)]
        return out + [self.case(4 * max(bm, bn), 16, FP16, False, ACCUMULATION, heads=1)]

    def compiled_cases(self, blocks):
        out = [self.case(n, d, dt, c, heads=h, compiled=True) for c in (False, True)
               for n, d, dt, h in ((1000, 128, BF16, 4), (517, 64, FP16, 3), (300, 32, FP32, 2))]
        out += [self.case(1000, 64, BF16, True, heads=4, compiled=True, window=256,
                          softcap=30.0),
                self.case(517, 64, FP16, False, heads=3, compiled=True, softcap=20.0)]
        return out + [self.case(777, 64, FP16, True, LARGE, compiled=True),
                      self.case(1024, 64, FP16, False, ACCUMULATION, 1, compiled=True)]

    def inputs(self, case, device):
        p, g = case.params, harness.generator(case.seed)
        q, k, v = (torch.randn(p["heads"], p["n"], p["d"], generator=g) for _ in range(3))
        if p["kind"] == LARGE:                  # scores in the hundreds: exp overflows
            q, k = 8 * q, 8 * k
        elif p["kind"] == NEGATIVE:             # q . k about -64 d: scores near -256 (fp16
            #                                     inputs: a compiled fp32 dot rounds to tf32)
            q, k = 8 + 0.5 * q, -(8 + 0.5 * k)
        elif p["kind"] == ACCUMULATION:         # every score 0 (p = 1), V 1000-2000
            q, v = 0 * q, 1000 + 1000 * torch.rand(v.shape, generator=g)
        return tuple(t.to(DTYPE_OF[p["dtype"]]).to(device) for t in (q, k, v))

    def reference(self, case, inputs):
        return (_reference(case, inputs)[0].to(inputs[0].dtype),)

    def compare(self, case, got, want, inputs, blocks):
        o, (atol, rtol) = got[0], TOL[got[0].dtype]
        bad = harness.close_hint(o, _reference(case, inputs)[0], atol, rtol)
        if bad is None:
            return None
        if case.params["kind"] == ACCUMULATION and not torch.isfinite(o.float()).all():
            return ("O holds inf: acc, the sum of p * v, passes 65504, the largest fp16, on "
                    "these inputs. Keep m, l and acc in fp32 (tl.zeros(..., dtype=tl.float32)) "
                    "and convert only at the store")
        return (f"{bad[0]} of {o.numel()} elements of O are off, the first at {list(bad[1])} "
                f"(tolerance {atol:g} + {rtol:g} x |expected|). "
                + _hint(case, o, inputs, _blocks(blocks)))

    def unpack(self, result):
        if isinstance(result, (tuple, list)) and len(result) == 2:
            return (result[0],)
        return f"{self.function} returned {type(result).__name__}; expected the pair (O, lse)"

    loops = True      # over the key blocks: the interpreter limit of any loop

    def summary(self, cases):
        lengths = sorted({c.params["n"] for c in cases})
        return (f"lengths {', '.join(map(str, lengths))}, d = 16 to 64, fp32 and fp16, "
                "windows and soft-capped scores, scores in the hundreds and rows whose scores "
                "all sit far below zero")


TASK = FlashForward()


def _reference(case, inputs):
    p = case.params
    return variant_reference(*inputs, causal=p["causal"], window=p.get("window"),
                             softcap=p.get("softcap"))


def _softmax_o(s, v, keep):
    """O of scores ``s`` (float64) where ``keep``; a row that keeps nothing gives 0."""
    s = s.masked_fill(~keep, -INF)
    p = torch.exp(s - s.amax(-1, keepdim=True).clamp_min(-1e300))    # -inf: shift by ~0
    return p @ v.double() / p.sum(-1, keepdim=True).clamp_min(1e-300)


def _hint(case, o, inputs, blocks) -> str:
    """What a wrong O's pattern says about the kernel."""
    (q, k, v), (bm, bn), n, causal = inputs, blocks, case.params["n"], case.params["causal"]
    if not torch.isfinite(o.float()).all():
        if case.params["kind"] == NEGATIVE:
            return ("O holds NaN on rows whose scores are all far below zero: exp(s - m) "
                    "underflows to 0 for every key unless m is the row's running maximum from "
                    "the first key on, and l stays 0. Subtract the running maximum, and start "
                    "it at -inf: the first tile sets it")
        if case.params["kind"] == LARGE:
            return ("O holds inf or NaN on large scores: exp overflows. Subtract the running "
                    "maximum before exp (p = exp(s - m_new)) and rescale by exp(m_old - m_new)")
        if case.params.get("window"):
            return ("O holds NaN or inf on a window: a tile a row visits can hide every key "
                    "from it (left of its window), and a row that has seen no key yet has "
                    "m = -inf, so exp(s - m) is exp(-inf - (-inf)), NaN: shift by 0 while the "
                    "maximum is still -inf, as part 1's empty state does")
        if causal and not torch.isfinite(o[:, 0].float()).all():
            return ("row 0 is not finite: it sees only key 0, so the causal mask must keep "
                    "j <= i, the diagonal included")
        return ("O holds NaN or inf: a row that has seen only -inf gives exp(-inf - (-inf)), "
                "or some rows were never stored")
    raw = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    cap, window = case.params.get("softcap"), case.params.get("window")
    s = cap * torch.tanh(raw / cap) if cap else raw
    i, j, v = torch.arange(n)[:, None], torch.arange(n)[None, :], v.double()
    near = (j > i - window) if window else torch.ones(n, n, dtype=torch.bool)   # the window
    keep, pad = (j <= i if causal else j < n) & near, -n % bn
    # The padding keys of the last tile (zeros) counted with score 0:
    padded = _softmax_o(torch.cat([s.masked_fill(~keep, -INF), s.new_zeros(*s.shape[:-1], pad)],
                                  -1), torch.cat([v, v.new_zeros(v.shape[0], pad, v.shape[2])], 1),
                        torch.tensor(True))
    # l and acc never rescaled when a later tile raised the maximum:
    kept, m = s.masked_fill(~keep, -INF), torch.full(s.shape[:-1], -INF, dtype=s.dtype)
    l, acc = torch.zeros_like(m), torch.zeros(*s.shape[:-1], v.shape[-1], dtype=s.dtype)
    for j0 in range(0, n, bn):
        m = torch.maximum(m, kept[..., j0:j0 + bn].amax(-1))
        p = torch.exp(kept[..., j0:j0 + bn] - m[..., None])
        l, acc = l + p.sum(-1), acc + p @ v[:, j0:j0 + bn]
    def like(want, rows=slice(None)):
        return o[:, rows].numel() > 0 and \
            harness.close_hint(o[:, rows], want[:, rows], *TOL[o.dtype]) is None
    if cap and like(_softmax_o(raw, v, keep)):
        return ("the scores are not soft-capped: each scaled score s becomes "
                "softcap * tanh(s / softcap) before the mask and the softmax")
    log2e = 1 / math.log(2)
    if cap and like(_softmax_o(cap * torch.tanh(raw * log2e / cap) / log2e, v, keep)):
        return ("the cap is applied to the scores in log2 units: cap the scores q k^T / sqrt(d) "
                "themselves, then convert them for exp2")
    if window and like(_softmax_o(s, v, j <= i)):
        return (f"the sliding window is missing: query i sees the {window} keys i - {window} + 1 "
                "to i only")
    if window and like(_softmax_o(s, v, (j <= i) & (j >= i - window))):
        return ("the window holds one key too many: query i sees W keys, its own included "
                "(j > i - W)")
    if window and like(_softmax_o(s, v, (j <= i) & (j > i - window + 1))):
        return "the window holds one key too few: query i sees W keys, its own included"
    if causal and like(_softmax_o(s, v, (j < i) & near), slice(1, None)):
        return "the diagonal is masked out: query i must see key i (j <= i, not j < i)"
    if causal and like(_softmax_o(s, v, (j < n) & near)):
        return "the causal mask is missing: query i may see keys j <= i only"
    if causal and like(_softmax_o(s, v, keep | near & (j < (i // bm * bm + bn).clamp(
            max=n // bn * bn)))):
        return ("queries see keys past the diagonal inside the tile where the diagonal starts: "
                "every tile the diagonal crosses needs the mask j <= i; only the tiles left of "
                "it may go without")
    if pad and like(padded):
        return (f"the padded keys of the last, partial tile (cols >= seq_len, {n} here) count "
                "in the softmax: set their scores to -inf")
    if n > bn and like(acc / l[..., None]):
        return ("rows whose maximum grows after the first tile come out wrong: when a tile "
                "raises the running maximum, rescale l and acc by exp(m_old - m_new)")
    return ("compare O row by row with the softmax of the (capped) scores q k^T / sqrt(d) over "
            "the keys each query sees, times v")


@contextlib.contextmanager
def _reads():
    """Per load of an interpreted kernel: (launch, program, tensor, first, last element)."""
    log, original = [], bounds._mark_read
    builder = bounds._interpreter().interpreter_builder
    def mark(launch, addresses):
        original(launch, addresses)
        for name, start, end, size, *_ in launch.ranges if addresses.size else ():
            sel = addresses[(addresses >= start) & (addresses < end)]
            if sel.size:
                log.append((launch, builder.grid_idx, name, int(sel.min() - start) // size,
                            int(sel.max() - start) // size))
    bounds._mark_read = mark
    try:
        yield log
    finally:
        bounds._mark_read = original


def _tiles(log, qkv, n: int, d: int, window=None) -> dict:
    """Per program: the query rows it loaded, and any K/V load wholly past the last of them
    (above the diagonal) or, with a ``window``, wholly before the first one's window."""
    ptrs, seen = [t.untyped_storage().data_ptr() for t in qkv], {}
    for launch, program, name, first, last in log:
        t = launch.tensors.get(name)
        ptr = t.untyped_storage().data_ptr() if t is not None else None
        if ptr in ptrs:
            seen.setdefault((id(launch), program), ([], []))[min(ptrs.index(ptr), 1)].append(
                (first // d % n, last // d % n))
    above, left, skipped = [], [], 0
    for (_, program), (qs, kvs) in seen.items():
        if qs and kvs:
            q_first, q_last = min(a for a, _ in qs), max(b for _, b in qs)
            kv_first, kv_last = min(a for a, _ in kvs), max(b for _, b in kvs)
            past = [a for a, _ in kvs if a > q_last]
            above += [[list(program), q_last, min(past)]] if past else []
            before = [b for _, b in kvs if window and b <= q_first - window]
            left += [[list(program), q_first, max(before)]] if before else []
            skipped += kv_last < n - 1 or bool(window) and kv_first > 0
    return {"above": above[:3], "left": left[:3], "skipped": skipped}


def _collect_kernel(ns, seed):
    """:func:`harness.collect`, each call given its ``causal``; lse and the rows read kept."""
    fn = answer(ns, TASK.function)
    if not callable(fn):
        return {"not_callable": f"{type(fn).__name__} {fn!r:.60}"}

    def run(case, log, reads, device):
        got, start, mark = {}, len(log.launches), len(reads) if reads is not None else 0
        def call(q, k, v):
            got["qkv"] = (q, k, v)
            got["out"] = fn(q, k, v, case.params["causal"], window=case.params["window"],
                            softcap=case.params["softcap"])
            return got["out"]
        rec = harness.run_trial(TASK, call, ns, case.seeded(seed), log, device)
        out = got.get("out") if isinstance(got.get("out"), (tuple, list)) else ()
        lse = out[1] if len(out) == 2 and isinstance(out[1], torch.Tensor) else None
        own = [x for x in log.launches[start:] if x.defined_in(ns) and x.traced]
        rec["lse"], rec["lse_written"] = (None, None) if lse is None else (
            lse.detach().cpu().clone(), list(bounds.written_by(own, lse)) if own else None)
        if reads is not None and case.params["causal"] and "qkv" in got:
            rec["tiles"] = _tiles(reads[mark:], got["qkv"], case.params["n"], case.params["d"],
                                  case.params["window"])
        return rec
    raw, reads = {"trials": [], "unwatched": TASK.unwatchable()}, None
    with contextlib.ExitStack() as stack:
        if raw["unwatched"]:
            log = stack.enter_context(bounds.watch(guard=False))
        else:
            stack.enter_context(bounds.interpreted(ns))
            log = stack.enter_context(bounds.watch(guard=True))
            reads = stack.enter_context(_reads())
        first = run(TASK.first(), log, reads, runtime.device())
        raw["trials"].append(first)
        for case in [] if first["not_implemented"] else TASK.cases(first["blocks"]):
            if case.label != first["label"]:
                raw["trials"].append(run(case, log, reads, runtime.device()))
    if runtime.is_gpu() and not any(t["error"] for t in raw["trials"]):
        with bounds.watch(guard=False) as log:
            raw["trials"] += [run(c, log, None, "cuda") for c in TASK.compiled_cases(
                first["blocks"])]
    return raw


def _of(v, causal=None, kinds=("", LARGE, NEGATIVE)):
    return [t for t in v.trials if t.case.params.get("kind") in kinds
            and causal in (None, t.case.params.get("causal"))]


def _o_part(causal, kinds=("", LARGE, NEGATIVE)):
    def judge(part, raw):
        v = harness.verdict_of(TASK, raw)
        trials = _of(v, causal, kinds)
        return v.correctness(part, "O matches the reference on " + (
            TASK.summary([t.case for t in trials]) if kinds[0] != ACCUMULATION else
            "V in the thousands, where acc passes fp16's 65504: the running sums are fp32"),
            trials)
    return judge


def _lse_problem(t) -> str | None:
    rec, (bh, n) = t.rec, (t.case.params["heads"], t.case.params["n"])
    lse, (given, unwritten, changed) = rec.get("lse"), rec.get("lse_written") or (1, 0, 0)
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (bh, n) or lse.dtype != FP32:
        return (f"lse is {lse.dtype if isinstance(lse, torch.Tensor) else type(lse).__name__} "
                f"of shape {getattr(lse, 'shape', ())}: it must be float32 of shape {(bh, n)}")
    if not given or unwritten:
        return (f"{unwritten} of {lse.numel()} elements of lse were never stored by your kernel: "
                "tl.store m + log(l) for every row < seq_len, from the kernel")
    if changed:
        return "the launcher changed lse after your kernel wrote it: return what it stored"
    want = _reference(t.case, TASK.inputs(t.case, "cpu"))[1]
    if harness.close_hint(lse, want, *LSE_TOL) is None:
        return None
    if harness.close_hint(lse, want / math.log(2), *LSE_TOL) is None:
        return ("lse is in base 2 (log2 of the sum of 2^s): the backward pass wants the "
                "natural log, so multiply by ln 2")
    return "lse must be log(sum_j exp(s_ij)) = m + log(l), with s the scaled scores"


def _lse(part, raw):
    v = harness.verdict_of(TASK, raw)
    right = [t for t in v.trials if not t.problem]
    if v.not_implemented or not right:
        return not_implemented(part) if v.not_implemented else Feedback(
            part, False, "lse is judged where O is right, and O is wrong on every call: make "
            f"2a and 2b pass first ({v.first_failure()})")
    problem = next(((t, p) for t in right if (p := _lse_problem(t))), None)
    if problem:
        return Feedback(part, False, f"{problem[0].where}: {problem[1]}")
    return Feedback(part, True, "lse = m + log(l), natural log, on every call where O is right")


def _skipping(part, raw):
    v = harness.verdict_of(TASK, raw)
    if v.not_implemented or v.unwatched:
        return not_implemented(part) if v.not_implemented else Feedback(
            part, False, v.unwatched, status="not checked here")
    causal = [t for t in v.watched if t.case.params.get("causal")]
    for t in causal:
        tiles = t.rec.get("tiles")
        if t.raised or not t.own_launches or not isinstance(tiles, dict):
            return Feedback(part, False, f"could not be checked: at {t.where}, "
                            f"{t.problem or 'no record of the loads'}")
        if tiles.get("above"):
            program, last, first = tiles["above"][0]
            return Feedback(part, False, f"at {t.where}, program {program} (queries up to row "
                            f"{last}) loaded keys from row {first} on, a tile wholly above the "
                            "diagonal that none of its queries sees: stop the causal loop at the "
                            "end of the diagonal, min(start_m + BLOCK_M, seq_len)")
        if tiles.get("left"):
            program, first, last = tiles["left"][0]
            return Feedback(part, False, f"at {t.where}, program {program} (queries from row "
                            f"{first}) loaded keys up to row {last}, a tile wholly left of the "
                            "window that none of its queries sees: start the loop at the tile "
                            "that holds the first key its first query sees")
    if not any((t.rec.get("tiles") or {}).get("skipped") for t in causal):
        return Feedback(part, False, "no causal call had a tile to skip (grader tampered with?)")
    return Feedback(part, True, "causal programs load K and V only from the tile their window "
                    "starts in up to the tile that holds their last query: the tiles above the "
                    "diagonal and left of the window are never read")


# --- The assignment, and the calls the notebook makes. -------------------------------------------


def _kernel_part(key, title, points, judge):
    return Part(key, title, points, lambda raw: judge(f"{key} {title}", raw),
                ("attention_forward",), group="kernel", collect=_collect_kernel)


def _timed_part(key, title, judge):
    return Part(key, title, 3, lambda raw: judge(f"{key} {title}", raw), ("attention_forward",),
                gpu=True, group="speed", collect=collect_timings, after="kernel")


ASSIGNMENT = Assignment(
    name="06_flash_attention",
    title="FlashAttention for sliding windows and soft-capped scores",
    parts=(
        Part("1", "merge_states", 3, judge_merge, ("merge_states",), collect=collect_merge),
        _kernel_part("2a", "O without a mask, soft-capped or not", 4, _o_part(False)),
        _kernel_part("2b", "O causal, with and without a window", 4, _o_part(True)),
        _kernel_part("2c", "lse is right", 2, _lse),
        _kernel_part("2d", "unseen tiles skipped", 2, _skipping),
        _kernel_part("2e", "the kernel stays in bounds", 2,
                     lambda part, raw: harness.verdict_of(TASK, raw).in_bounds(part)),
        _kernel_part("2f", "fp32 running sums", 2, _o_part(None, (ACCUMULATION,))),
        _timed_part("3a", "a sliding window pays for its tiles only", window_speed),
        _timed_part("3b", "within 20% of the course's kernel", course_speed),
        *(Part(key, title, points, judge(f"{key} {title}"), ("attention_backward",),
               group="backward", collect=backward.collect) for key, title, points, judge in (
            ("4a", "gradients without a mask, soft-capped or not", 3, backward.gradients),
            ("4b", "gradients causal, with and without a window", 3, backward.gradients),
            ("4c", "the backward kernels stay in bounds", 2, backward.in_bounds))),
    ),
)

check_merge = check_function(ASSIGNMENT, ("1",),
    "Part 1: ``merge_states`` on random rows, large scores, masked keys, fully masked rows.")

check_kernel = check_function(ASSIGNMENT, ("2a", "2b", "2c", "2d", "2e", "2f"),
    "Part 2: ``attention_forward`` on awkward lengths, causal and not, watched.")

check_speed = check_function(ASSIGNMENT, ("3a", "3b"),
    "Part 3: a window timed against the course's causal kernel; both masks against it (GPU).")

check_backward = check_function(ASSIGNMENT, ("4a", "4b", "4c"),
    "Part 4: ``attention_backward`` against float64 autograd, causal and not, watched.")

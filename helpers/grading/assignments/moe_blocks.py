"""Assignment 08, parts 2 and 3: copies laid out in blocks of one expert, the kernel that
reads them, and the padding a random router leaves.

Lesson 08's grouped GEMM finds each tile's expert inside the kernel, from the counts. Part 2
asks for the other design, the one inference engines run (vLLM's fused MoE kernel): before
the launch, ``align_blocks(d, block_m)`` lays the sorted copies out in blocks of
``block_m`` slots, each block holding copies of one expert, empty slots marked; the kernel
reads its block's expert from a table, gathers its tokens' rows through the slots and
writes each copy's row of the output in copy order. Nothing the course ships builds that
layout, and its worst-case length is not the course's grid bound.

* 2a, 2b: ``align_blocks`` on the grader's routings, judged by the rules the kernel relies
  on (every kept copy in one slot, one expert per block, no block more than its expert's
  copies need) and by its length, which may depend only on the sizes, never on the routing
  (the host cannot read the counts without waiting for the GPU): the fewest slots that hold
  any counts of R rows over E experts.
* 2c, 2d: ``expert_matmul`` through the learner's own layout, watched
  (:class:`ExpertMatmul`).
* 3a, 3b: ``expected_padding(tokens, experts, top_k, block_m)`` on sizes of the grader's,
  against :mod:`.keys_moe` (sealed in a student release): exact, so a simulation does not
  pass.
"""

from __future__ import annotations

import math
import numbers

import torch

from ... import runtime
from ...feedback import Feedback, graded_number, not_implemented
from ...kernels import moe
from .. import answers, harness
from ..registry import SEED, answer, is_not_implemented
from . import moe_dispatch as md

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
DTYPE_OF = {harness.dtype_name(d): d for d in (FP16, BF16, FP32)}
TOL = {FP32: (2e-2, 2e-2), FP16: (2e-2, 2e-2), BF16: (1e-1, 5e-2)}   # |C| ~ 1
DEFAULT_BLOCK_M = 16


def draw_ids(T: int, E: int, top_k: int, kind: str, seed: int) -> torch.Tensor:
    """``ids`` (T, top_k) int64 of distinct experts per token: ``every`` (each expert used),
    ``skewed`` (two experts take most), ``empty`` (every fourth expert unused), ``one``
    (every copy to expert E // 2, top-1), ``any``."""
    g = harness.generator(seed)
    if kind == "one":
        return torch.full((T, 1), E // 2, dtype=torch.long)
    weight = torch.ones(E)
    if kind == "skewed":
        weight[[1, E - 2]] = 20.0
    if kind == "empty":
        weight[::4] = 0.0
    for _ in range(1000):
        ids = torch.multinomial(weight.repeat(T, 1), top_k, generator=g) if T else \
            torch.zeros((0, top_k), dtype=torch.long)
        if kind not in ("every", "skewed") or torch.bincount(ids.flatten(), minlength=E).all():
            return ids
    raise RuntimeError("no routing with every expert used")   # pragma: no cover


def fewest_blocks(rows: int, experts: int, block_m: int) -> int:
    """The blocks the costliest counts of ``rows`` over ``experts`` need (the grader's bound,
    never shown: each expert holding a row starts a block, the rest fill whole ones)."""
    holding = min(rows, experts)
    return holding + (rows - holding) // block_m


# --- 2a, 2b: the layout. ---------------------------------------------------------------

# label, group, tokens, experts, top_k, kind, capacity, block_m
ALIGNS = (
    ("uniform routing, 40 tokens, 8 experts, top-2, blocks of 4", "layout", 40, 8, 2, "every",
     None, 4),
    ("skewed routing, 64 tokens, 8 experts, top-2, blocks of 16", "layout", 64, 8, 2,
     "skewed", None, 16),
    ("every fourth expert empty, 24 tokens, 12 experts, top-2, blocks of 8", "layout", 24, 12,
     2, "empty", None, 8),
    ("every copy to one expert of 6, blocks of 4", "layout", 20, 6, 1, "one", None, 4),
    ("one token, 6 experts, top-2, blocks of 16", "layout", 1, 6, 2, "any", None, 16),
    ("3 tokens, 64 experts, top-8, blocks of 16", "layout", 3, 64, 8, "any", None, 16),
    ("top_k = E = 4, 7 tokens, blocks of 2", "layout", 7, 4, 4, "any", None, 2),
    ("blocks of 1", "layout", 10, 4, 2, "every", None, 1),
    ("no tokens at all", "layout", 0, 4, 2, "any", None, 8),
    ("skewed, capacity 1.25 x the fair share, blocks of 4", "layout", 48, 8, 2, "skewed",
     moe.capacity(48, 2, 8, 1.25), 4),
    ("every copy to one expert of 8, 80 tokens, blocks of 4", "layout", 80, 8, 1, "one", None,
     4),
)


def align_inputs(case: harness.Case, spec) -> moe.Dispatch:
    _, _, T, E, top_k, kind, capacity, _ = spec
    return moe.dispatch(draw_ids(T, E, top_k, kind, case.seed), E, capacity)


def collect_align(ns, seed) -> dict:
    def run(call, spec, case):
        d = align_inputs(case, spec)
        device = runtime.device()
        got = call(moe.Dispatch(*(getattr(d, f).to(device) for f in md.FIELDS)), spec[7])
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return {"returned": f"{type(got).__name__} {got!r:.40}"}
        return {"slots": md._tensor(got[0]), "block_expert": md._tensor(got[1])}
    return md.collect_trials(ns, seed, "align_blocks", ALIGNS, run)


def _copy_problem(slots, d, copies: int) -> str | None:
    kept = d.order
    strange = slots[(slots != copies) & ~torch.isin(slots, kept)]
    if len(strange):
        v = int(strange[0])
        if 0 <= v < copies:
            return (f"a slot holds copy {v}, which the dispatch dropped (its position is -1): "
                    "a dropped copy has no slot")
        return (f"a slot holds {v}, neither a copy number (t * top_k + j, below T * top_k = "
                f"{copies}) nor the empty slot's marker, T * top_k")
    values, seen = torch.unique(slots[slots != copies], return_counts=True)
    if (seen > 1).any():
        return f"copy {int(values[seen > 1][0])} sits in {int(seen[seen > 1][0])} slots"
    missing = kept[~torch.isin(kept, slots)]
    if len(missing):
        return (f"copy {int(missing[0])} is in no slot ({len(missing)} of the {len(kept)} kept "
                "copies are missing)" + (": the slots are too few for this routing"
                                         if len(slots) < len(kept) else ""))
    return None


def _form_problem(spec, rec, seed) -> str | None:
    """What is wrong with the form of one trial's ``(slots, block_expert)``, if anything."""
    label, bm = spec[0], spec[7]
    if rec.get("seed") != md.trial_case(label, seed).seed:
        return md.TAMPERED
    if rec.get("error"):
        return f"align_blocks raised {rec['error']}"
    if md.copied(rec.get("calls"), "align_blocks"):
        return md.copied(rec.get("calls"), "align_blocks")
    if "returned" in rec:
        return f"align_blocks returned {rec['returned']}: return the pair (slots, block_expert)"
    slots, owner = rec.get("slots"), rec.get("block_expert")
    for name, t in (("slots", slots), ("block_expert", owner)):
        if not md._integer(t) or t.dim() != 1:
            what = f"{harness.dtype_name(t.dtype)} {tuple(t.shape)}" if isinstance(
                t, torch.Tensor) else f"{t!r:.40}"
            return f"{name} is {what}: it must be a 1-D tensor of integers"
    if len(slots) != bm * len(owner):
        return (f"slots holds {len(slots)} entries for {len(owner)} blocks of {bm}: it must "
                "hold exactly block_m slots per block")
    return None


def layout_problem(spec, rec, seed) -> str | None:
    """What breaks the rules in one trial's layout (the lengths are 2b's)."""
    label, _, T, E, top_k, _, _, bm = spec
    found = _form_problem(spec, rec, seed)
    if found:
        return found
    case = md.trial_case(label, seed)
    slots, owner = rec["slots"], rec["block_expert"]
    d = align_inputs(case, spec)
    copies = T * top_k
    slots, owner = slots.long(), owner.long()
    found = _copy_problem(slots, d, copies)
    if found:
        return found
    expert_of = draw_ids(T, E, top_k, spec[5], case.seed).reshape(-1)
    blocks = slots.view(-1, bm)
    for b in range(len(owner)):
        held = blocks[b][blocks[b] != copies]
        e = int(owner[b])
        if not len(held):
            if e != -1:
                return (f"block {b} holds no copy but block_expert says expert {e}: a block "
                        "with no copy gets -1 (an expert takes only the blocks its copies fill)")
            continue
        if not 0 <= e < E:
            return f"block {b} holds copies but block_expert says {e}, not an expert (0..E-1)"
        theirs = expert_of[held]
        if (theirs != e).any():
            other = int(theirs[theirs != e][0])
            return (f"block {b} holds a copy of expert {other}, but block_expert says expert "
                    f"{e}: a block holds copies of one expert, the one block_expert names")
    counts = d.counts.long()
    used = torch.bincount(owner[owner >= 0], minlength=E)[:E]
    need = (counts + bm - 1) // bm
    over = (used > need).nonzero().flatten()
    if len(over):
        e = int(over[0])
        return (f"expert {e} takes {int(used[e])} blocks for its {int(counts[e])} copies: an "
                "expert takes only the blocks its copies need; only its last one may have "
                "empty slots")
    return None


def _length_problem(spec, rec, seed, lengths) -> str | None:
    label, _, T, E, top_k, _, _, bm = spec
    found = _form_problem(spec, rec, seed)
    if found:
        return found
    R = align_inputs(md.trial_case(label, seed), spec).order.numel()
    blocks = len(rec["block_expert"])
    others = lengths.get((R, E, bm), set())
    if len(others) > 1:
        return (f"two routings of the same sizes ({R} rows, {E} experts, blocks of {bm}) got "
                f"{' and '.join(str(n) for n in sorted(others))} blocks: the length depends on "
                "the routing, so the host read the counts, a wait for the GPU. It may depend "
                "only on R, E and block_m")
    fewest = fewest_blocks(R, E, bm)
    if blocks > fewest:
        return (f"{blocks} blocks for {R} rows over {E} experts, blocks of {bm}: more than any "
                "counts of R rows over E experts need. Which counts need the most blocks?")
    if blocks < fewest:
        return (f"{blocks} blocks for {R} rows over {E} experts, blocks of {bm}: some counts of "
                "R rows over E experts need more (this routing fit; another would lose copies)")
    return None


def judge_layout(part, raw) -> Feedback:
    return md.judge_trials(part, raw, ALIGNS, layout_problem, "every rule holds on ")


def judge_length(part, raw) -> Feedback:
    if raw.get("not_implemented"):
        return not_implemented(part)
    seed, lengths = raw.get(SEED, 0), {}
    for spec, rec in zip(ALIGNS, raw.get("trials") or []):
        if isinstance(rec.get("block_expert"), torch.Tensor):
            d = align_inputs(md.trial_case(spec[0], seed), spec)
            lengths.setdefault((d.order.numel(), spec[3], spec[7]), set()).add(
                len(rec["block_expert"]))
    return md.judge_trials(part, raw, ALIGNS, lambda s, r, x: _length_problem(s, r, x, lengths),
                           "the fewest blocks that hold any counts of the sizes, on ")


# --- 2c, 2d: the kernel, through the learner's own layout. -----------------------------

class ExpertMatmul(harness.KernelTask):
    """``expert_matmul(a, w, *align_blocks(d, BLOCKS["BLOCK_M"]), top_k)`` on the grader's
    routing: the trial's inputs are ``a`` (tokens), ``w`` and the routing ``ids``."""

    function = "expert_matmul"
    call = "expert_matmul(a, w, slots, block_expert, top_k)"
    outputs = ("C",)
    inputs_named = ("a", "w")
    tensors = "a, w, slots, block_expert and C"
    mask_hint = ("Mask the empty slots (copy number = T * top_k) at the store, the loads past "
                 "K and N, and return at once from a block whose expert is -1")

    @staticmethod
    def case(what, routing, K, N, dtype, group, compiled=False):
        T, E, top_k, kind = routing
        label = (f"{what}: {T} tokens, {E} experts, top-{top_k}, K={K}, N={N}, "
                 f"{harness.dtype_name(dtype)}")
        return harness.Case(label, {"T": T, "E": E, "top_k": top_k, "kind": kind, "K": K,
                                    "N": N, "group": group,
                                    "dtype": harness.dtype_name(dtype)}, 0, compiled)

    def entry(self, namespace):
        return _pair(namespace)

    def first(self):
        return self.case("a first small one", (6, 2, 1, "every"), 16, 16, FP32, "kernel")

    def cases(self, blocks):
        bm = _block_m(blocks)
        return [self.case(*c) for c in (
            ("whole blocks", (4 * bm, 4, 1, "every"), 48, 40, FP16, "kernel"),
            ("a skewed routing, top-2", (3 * bm + 5, 8, 2, "skewed"), 37, 33, FP32, "kernel"),
            ("a long K, a ragged N", (bm + 3, 3, 2, "every"), 100, 70, FP32, "kernel"),
            ("a K shorter than any tile", (bm, 4, 2, "every"), 5, 24, FP32, "kernel"),
            ("every copy to one expert", (2 * bm + 1, 5, 1, "one"), 16, 24, FP16, "kernel"),
            ("every fourth expert empty", (bm, 12, 3, "empty"), 24, 16, FP32, "kernel"),
            ("more experts than copies", (2, 16, 2, "any"), 16, 16, FP32, "kernel"),
            ("no tokens at all", (0, 4, 2, "any"), 16, 8, FP32, "kernel"))]

    def compiled_cases(self, blocks):
        return [self.case(*c, compiled=True) for c in (
            ("8 experts", (700, 8, 2, "skewed"), 256, 192, FP16, "kernel"),
            ("64 experts, a quarter empty", (300, 64, 4, "empty"), 128, 96, BF16, "kernel"),
            ("a K shorter than tl.dot's 16", (150, 4, 2, "every"), 8, 64, FP16, "kernel"))]

    def inputs(self, case, device):
        p, g = case.params, harness.generator(case.seed)
        ids = draw_ids(p["T"], p["E"], p["top_k"], p["kind"], case.seed + 1)
        a = torch.randn(p["T"], p["K"], generator=g)
        w = torch.randn(p["E"], p["K"], p["N"], generator=g) / math.sqrt(p["K"])
        dtype = DTYPE_OF[p["dtype"]]
        return a.to(dtype).to(device), w.to(dtype).to(device), ids.to(device)

    def reference(self, case, inputs):
        a, w, ids = inputs
        top_k = ids.shape[1]
        rows = a.double()[torch.arange(ids.numel()) // top_k]
        c = torch.einsum("rk,rkn->rn", rows, w.double()[ids.reshape(-1)])
        return (c.to(a.dtype),)

    def compare(self, case, got, want, inputs, blocks):
        atol, rtol = TOL[got[0].dtype]
        bad = harness.close_hint(got[0], want[0], atol, rtol)
        if bad is None:
            return None
        return (f"{bad[0]} of {want[0].numel()} elements of C are off (tolerance {atol:g} + "
                f"{rtol:g} x |expected|). " + _kernel_hint(got[0], inputs))

    def summary(self, cases):
        return f"{len(cases)} routings, fp32 and fp16"


TASK = ExpertMatmul()


def _block_m(blocks) -> int:
    v = {k.upper(): x for k, x in (blocks or {}).items()}.get("BLOCK_M")
    return v if isinstance(v, int) and v > 0 else DEFAULT_BLOCK_M


def _kernel_hint(c, inputs) -> str:
    """What the first wrong row of C says: which row of a, or which expert, it used."""
    a, w, ids = (t.cpu() for t in inputs)
    top_k, T = ids.shape[1], a.shape[0]
    atol, rtol = TOL[c.dtype]
    expert = ids.reshape(-1)
    want = harness.close_hint(c, TASK.reference(None, (a, w, ids))[0], atol, rtol)
    r = want[1][0]
    t, e = r // top_k, int(expert[r])

    def close(row, x):
        return harness.close_hint(c[r:r + 1], (row.double() @ w[x].double()).to(c.dtype)[None],
                                  atol, rtol) is None

    if r < T and r // top_k != r and close(a[r], e):
        return (f"row {r} of C (token {t}'s copy {r % top_k}) holds row {r} of a times its "
                "expert's weights: copy t * top_k + j reads token t's row, copy // top_k")
    other = [x for x in range(w.shape[0]) if x != e and close(a[t], x)]
    if other:
        return (f"row {r} of C (copy {r}, of expert {e}) was multiplied by expert {other[0]}'s "
                "weights: read each block's expert from block_expert")
    return (f"row {r} of C (copy {r}, token {t}, expert {e}) holds what no expert gives that "
            "token: store each slot's result at row `copy` of C, the copy it holds")


def _pair(ns):
    """The call 2c grades (:meth:`ExpertMatmul.entry`): the learner's layout, then the
    learner's kernel."""
    def expert_matmul_on(a, w, ids):
        blocks = ns.get("BLOCKS")
        block_m = blocks.get("BLOCK_M") if isinstance(blocks, dict) else None
        if not isinstance(block_m, int) or block_m < 1:
            raise ValueError("the notebook's BLOCKS has no BLOCK_M: keep the BLOCKS cell")
        d = moe.dispatch(ids, w.shape[0])
        slots, block_expert = answer(ns, "align_blocks")(d, block_m)
        return answer(ns, "expert_matmul")(a, w, slots, block_expert, ids.shape[1])
    return expert_matmul_on


def collect_kernel(ns, seed):
    answer(ns, "align_blocks")
    raw = harness.collect(TASK, ns, seed)
    for rec in raw.get("trials", []):     # the kernel must read a and w; ids it never sees
        read = rec.get("inputs_read")
        if isinstance(read, list) and len(read) == 3:
            rec["inputs_read"] = read[:2]
    return raw


def kernel_part(part, raw) -> Feedback:
    return harness.verdict_of(TASK, raw).correctness(
        part, "C matches the reference through your layout on skewed and uniform routings, "
        "empty experts, one expert, a long K and no tokens at all")


def bounds_part(part, raw) -> Feedback:
    return harness.verdict_of(TASK, raw).in_bounds(part)


# --- 3a, 3b: the padding a random router leaves, on the grader's sizes. ------------------

# tokens, experts, top_k, block_m; the second group reaches the edges.
PADDING_SIZES = {"3a": ((1024, 128, 8, 64), (4096, 8, 2, 128), (512, 64, 6, 16),
                        (300, 16, 1, 32)),
                 "3b": ((50, 4, 4, 16), (5, 64, 8, 16), (2000, 2, 1, 96))}


def key() -> answers.Key:
    """The expected paddings: formulas in keys_moe (instructor), sealed in a release."""
    return answers.load_key("08_moe", "helpers.grading.assignments.keys_moe")


def _plain(v):
    """A number as a float (NumPy's and 0-d tensors too), anything else as its short repr:
    what crosses to the judge is data, never the learner's objects."""
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, numbers.Number) or (isinstance(v, torch.Tensor) and v.numel() == 1):
        try:
            return float(v)
        except (TypeError, ValueError, OverflowError):
            pass
    return repr(v)[:60]


def collect_padding(ns, seed) -> dict:
    fn, out, errors = answer(ns, "expected_padding"), {}, {}
    for part, sizes in PADDING_SIZES.items():
        for i, size in enumerate(sizes):
            try:
                out[f"{part}/{i}"] = _plain(fn(*size))
            except Exception as err:  # noqa: BLE001 - the learner's error, reported
                if is_not_implemented(err):
                    return {"not_implemented": True}
                errors[f"{part}/{i}"] = f"raised {type(err).__name__}: {str(err)[:200]}"
    return {"values": out, "errors": errors}


def judge_padding(group: str):
    def judge(part, raw) -> Feedback:
        if raw.get("not_implemented"):
            return not_implemented(part)
        values, errors = raw.get("values") or {}, raw.get("errors") or {}
        for i, (T, E, top_k, bm) in enumerate(PADDING_SIZES[group]):
            got = values.get(f"{group}/{i}")
            where = f"{T} tokens, {E} experts, top-{top_k}, blocks of {bm}"
            if f"{group}/{i}" in errors:
                return Feedback(part, False, f"expected_padding({T}, {E}, {top_k}, {bm}) "
                                f"{errors[f'{group}/{i}']}")
            fb = graded_number(part, got, key()[f"{group}/{i}"], unit="empty slots",
                               hint="the expectation over every routing the random router "
                                    "can draw, exactly (a simulation is not exact); one "
                                    "expert's count first, then linearity")
            if not fb.passed:
                return Feedback(part, False, f"{where}: {fb.message}", status=fb.status)
        return Feedback(part, True, "exact on " + "; ".join(
            f"{T} tokens, {E} experts, top-{k}, blocks of {bm}"
            for T, E, k, bm in PADDING_SIZES[group]))
    return judge

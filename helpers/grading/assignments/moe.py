"""Assignment 08, a Mixture-of-Experts layer: its graded parts and ``check_*`` calls.

The references are the course's own (:mod:`helpers.kernels.moe`): ``route`` and
``dispatch`` for part 1 (:mod:`.moe_dispatch`), a float64 product per expert for the grouped
GEMM, ``moe_reference`` for the layer and ``moe_loop`` beside it on a GPU; the padding
answers live in :mod:`.keys_moe`. No expected value is typed in. Parts (24 points; 21 in CPU
mode, 3 on a GPU):

=====  ==========================================================  ======
1a     ``route``: top_k of the softmax, renormalised, fp32              2
1b     ``dispatch``: permutation, counts, offsets, rows, position      2
1c     ... on empty experts, one token, one expert, top_k = E          2
1d     ... with a capacity: late copies dropped, marked -1             2
2a     ``grouped_matmul`` launches its kernel; right on whole and       3
       partial tiles, one expert, a long K
2b     ... with empty experts, more experts than rows, one row         3
2c     its kernel never reads or writes outside its tensors            2
3a     rows of padding for the routing the notebook shows              2
3b     the fraction of the computed rows that is padding                1
4a     ``moe_layer`` (route, dispatch, grouped GEMMs, combine) right    2
4b     >= 0.7x the speed of the course's layer, 128 experts (GPU)      3
=====  ==========================================================  ======
"""

from __future__ import annotations

import math

import torch

from ... import bounds, runtime
from ...feedback import Feedback, graded_number, target
from ...kernels import moe
from .. import answers, harness
from ..gpu import gpu_lock
from ..registry import Assignment, Part, answer, check_function
from . import moe_dispatch as md

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
DTYPE_OF = {harness.dtype_name(d): d for d in (FP16, BF16, FP32)}
TOL = {FP32: (2e-2, 2e-2), FP16: (2e-2, 2e-2), BF16: (1e-1, 5e-2)}   # grouped GEMM, |C| ~ 1
LAYER_TOL = {d: (2 * a, 2 * r) for d, (a, r) in moe.TOLERANCES.items()}
DEFAULT_BLOCK_M = 16

# Part 3: the routing the notebook shows (a given, not an answer): rows per expert.
PADDING_COUNTS = (150, 0, 64, 7, 192, 93, 0, 1, 33, 200, 65, 12, 0, 71, 129, 48)
PADDING_BLOCK_M = 64


def key() -> answers.Key:
    """The padding answers: formulas in keys_moe (instructor), sealed in a student release.
    Loaded when judged: keys_moe reads the routing above from this module."""
    return answers.load_key("08_moe", "helpers.grading.assignments.keys_moe")


# Part 4b: lesson 08's many-small-experts layer, timed beside the course's own layer
# (moe.moe_forward: one grouped launch per projection, its tiles measured in lesson 08) and
# the per-expert loop model code often starts from. The course's layer is 26-36x faster
# than the loop, so the bar is set against it: on an H100 the solution's layer (its own
# tiles, not the course's measured ones) took 1.171 ms against the course's 0.946 ms, 0.81x
# (bash tests/gpu/device.sh pytest tests/test_grading_08.py); the goal sits below that.
SPEED_SHAPE, SPEED_TOKENS, SPEED_DTYPE, SPEED_GOAL = moe.MANY_SMALL, 1024, BF16, 0.7
SPEED_ERROR = 2e-2          # |yours - loop| / |loop| over the whole output (bf16 roundings)


# --- Part 2: the grouped GEMM, on the grader's counts. -----------------------------------

def _layout(counts) -> tuple[list[int], torch.Tensor]:
    """Each expert's first sorted row, and the expert of every row."""
    counts = [int(c) for c in counts]
    starts = [sum(counts[:e]) for e in range(len(counts))]
    return starts, torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))


class GroupedMatmul(harness.KernelTask):
    function = "grouped_matmul"
    call = "grouped_matmul(a, counts, w)"
    outputs = ("C",)
    tensors = "a, counts, w and C"
    inputs_named = ("a", "w")     # counts may be read on the host (a tile table is fine)
    mask_hint = ("Mask the padding rows of each expert's last tile (rows >= the expert's end) "
                 "at the store, and the loads past K and N")

    @staticmethod
    def case(what, counts, K, N, dtype, group, compiled=False):
        label = f"{what}: counts {list(counts)}, K={K}, N={N}, {harness.dtype_name(dtype)}"
        return harness.Case(label, {"counts": list(counts), "K": K, "N": N, "group": group,
                                    "dtype": harness.dtype_name(dtype)}, 0, compiled)

    def first(self):
        return self.case("two experts", (3, 5), 16, 16, FP32, "tiles")

    def cases(self, blocks):
        bm = _block_m(blocks)
        return [self.case(*c) for c in (
            ("every count a whole number of tiles", (bm, 2 * bm, bm), 48, 40, FP16, "tiles"),
            ("counts not multiples of the tile", (bm + 3, 5, 2 * bm - 1, 1), 37, 33, FP32,
             "tiles"),
            ("one expert", (2 * bm + 5,), 20, 24, FP16, "tiles"),
            ("a long K, a ragged N", (bm + 1, bm - 1), 100, 70, FP32, "tiles"),
            ("a K shorter than any tile", (bm + 2, 3), 5, 24, FP32, "tiles"),
            ("empty experts first, between and last", (0, bm + 1, 0, 0, 3, 0), 24, 16, FP32,
             "empty"),
            ("every row to one expert of 4", (0, 0, 2 * bm + 1, 0), 16, 24, FP16, "empty"),
            ("more experts than rows", (0, 1, 0, 0, 2, 0, 0, 1, 0, 0, 1, 0), 16, 16, FP32,
             "empty"),
            ("one row", (0, 1, 0), 16, 8, FP32, "empty"),
            ("no rows at all", (0, 0, 0), 16, 8, FP32, "empty"))]

    def compiled_cases(self, blocks):
        many = tuple((37 * e) % 150 if e % 5 else 0 for e in range(64))
        return [self.case(*c, compiled=True) for c in (
            ("8 experts", (300, 0, 128, 77, 1, 0, 513, 64), 256, 192, FP16, "tiles"),
            ("64 experts, some empty", many, 128, 96, BF16, "tiles"),
            ("4 experts", (100, 37, 0, 250), 100, 70, FP32, "tiles"),
            ("a K shorter than tl.dot's 16", (100, 0, 37), 8, 64, FP16, "tiles"))]

    def inputs(self, case, device):
        p, g = case.params, harness.generator(case.seed)
        counts = torch.tensor(p["counts"], dtype=torch.int32)
        a = torch.randn(int(counts.sum()), p["K"], generator=g)
        w = torch.randn(len(counts), p["K"], p["N"], generator=g) / math.sqrt(p["K"])
        dtype = DTYPE_OF[p["dtype"]]
        return a.to(dtype).to(device), counts.to(device), w.to(dtype).to(device)

    def reference(self, case, inputs):
        a, counts, w = inputs
        starts, _ = _layout(counts)
        c = torch.cat([a[s:s + int(n)].double() @ w[e].double()
                       for e, (s, n) in enumerate(zip(starts, counts))])
        return (c.to(a.dtype),)

    def compare(self, case, got, want, inputs, blocks):
        atol, rtol = TOL[got[0].dtype]
        bad = harness.close_hint(got[0], want[0], atol, rtol)
        if bad is None:
            return None
        return (f"{bad[0]} of {want[0].numel()} elements of C are off (tolerance {atol:g} + "
                f"{rtol:g} x |expected|). " + _kernel_hint(case, got[0], inputs, blocks))

    def summary(self, cases):
        return f"{len(cases)} routings, fp32 and fp16"


TASK = GroupedMatmul()


def _block_m(blocks) -> int:
    v = {k.upper(): x for k, x in (blocks or {}).items()}.get("BLOCK_M")
    return v if isinstance(v, int) and v > 0 else DEFAULT_BLOCK_M


def _rows_close(got, want, dtype) -> torch.Tensor:
    atol, rtol = TOL[dtype]
    return ((got.double() - want.double()).abs() <= atol + rtol * want.double().abs()).all(-1)


def _kernel_hint(case, c, inputs, blocks) -> str:
    """What the pattern of wrong rows says about the tile map."""
    a, counts, w = (t.cpu() for t in inputs)
    starts, expert = _layout(counts)
    bm, E, a = _block_m(blocks), len(starts), a.double()

    def product(experts):     # row r of a times the weights of experts[r]
        out = torch.zeros(len(a), w.shape[2], dtype=torch.float64)
        for x in experts.unique().tolist():
            out[experts == x] = a[experts == x] @ w[x].double()
        return out

    right = _rows_close(c, product(expert), c.dtype)
    straddled = product(expert[torch.arange(len(expert)) // bm * bm])
    bad = (~right).nonzero().flatten().tolist()
    r, e = bad[0], int(expert[bad[0]])
    where = f"row {r} (expert {e}'s row {r - starts[e]})"
    one_tile = ("A tile never holds rows of two experts: expert e owns cdiv(counts[e], BLOCK_M) "
                "tiles of its own, starting at its first row, the last one partly padding")
    if _rows_close(c, straddled, c.dtype).all():
        return ("your tiles cut the sorted rows as one matrix, each tile using the expert of "
                f"its first row, so a tile that crosses an expert's end multiplies the next "
                f"expert's rows by the wrong weights. {one_tile}")
    other = [x for x in range(E) if x != e and _rows_close(
        c[r:r + 1], a[r:r + 1] @ w[x].double(), c.dtype).all()]
    if other:
        return f"{where} was multiplied by expert {other[0]}'s weights. {one_tile}"
    if _rows_close(c[r:r + 1].expand(len(expert), -1), a @ w[e].double(), c.dtype).any():
        return (f"{where} holds the product of another row of a: the tile's rows start at the "
                "wrong place. Expert e's first row is counts[0] + ... + counts[e - 1] (rows, "
                "not tiles), and its tile j starts BLOCK_M x j rows after it")
    empty = [x for x in range(E) if int(counts[x]) == 0]
    experts = sorted({int(expert[b]) for b in bad})
    text = (f"the rows of expert{'s' * (len(experts) > 1)} {', '.join(map(str, experts[:6]))} "
            "hold values no expert's weights give: no program stored them")
    if empty and all(x > empty[0] for x in experts):
        return (f"{text}. This routing has experts with no rows ({', '.join(map(str, empty[:6]))}"
                "): an expert with no rows must own no tile (cdiv(0, BLOCK_M) = 0); one that "
                "takes a tile anyway shifts every tile after it, and the last real tiles fall "
                "outside the grid")
    return (f"{text}: every real tile needs a program, so the grid must cover the worst case, "
            "min(R, R // BLOCK_M + E) row tiles (each tile holds at least one row, and each "
            "expert adds at most one partial tile)")


def _collect_kernel(ns, seed):
    raw = harness.collect(TASK, ns, seed)
    for rec in raw.get("trials", []):     # the kernel must read a and w; counts need not
        read = rec.get("inputs_read")
        if isinstance(read, list) and len(read) == 3:
            rec["inputs_read"] = [read[0], read[2]]
    return raw


def _kernel_part(group, summary):
    def judge(part, raw):
        v = harness.verdict_of(TASK, raw)
        trials = [t for t in v.trials if t.case.params.get("group") == group
                  or (group == "tiles" and t.case.compiled)]
        return v.correctness(part, f"C matches the reference on {summary}", trials)
    return judge


# --- Part 3: the padding of the routing the notebook shows. ------------------------------

def _wasted_rows(ns):
    return graded_number(
        "3a rows of padding", answer(ns, "wasted_rows"), key()["3a"], unit="rows",
        hint=f"each expert's rows are rounded up to whole tiles of {PADDING_BLOCK_M} on their "
             "own; padding is what the tiles compute beyond the real rows.")


def _wasted_fraction(ns):
    return graded_number(
        "3b fraction of the computed rows that is padding", answer(ns, "wasted_fraction"),
        key()["3b"], hint="padding rows / every row the tiles compute (real rows + padding).")


# --- Part 4a: the layer, against the float64 reference. -----------------------------------

LAYERS = (  # label, tokens, experts, top_k, hidden, width, dtype
    ("24 tokens, 6 experts, top-2, fp32", 24, 6, 2, 32, 48, FP32),
    ("20 tokens, 8 experts, top-2, fp16", 20, 8, 2, 32, 32, FP16),
    ("12 tokens, top_k = E = 4, fp32", 12, 4, 4, 16, 32, FP32))


def layer_inputs(case: harness.Case, spec):
    """``(x, weights)`` in the case's dtype, on the CPU: every expert gets a copy and no
    token's top_k is a near tie (the learner routes in fp16 where the reference uses fp64)."""
    _, T, E, top_k, H, I, dtype = spec
    for attempt in range(1000):
        g = harness.generator(case.seed + attempt)
        w = moe.make_weights(E, H, I, device="cpu", seed=case.seed + attempt)
        w.router *= 3                               # logits of order 3: clear winners
        x = torch.randn(T, H, generator=g).to(dtype)
        w = w.to(dtype=dtype)
        logits = torch.sort(x.double() @ w.router.double(), -1, descending=True).values
        used = torch.bincount(moe.route(x.double() @ w.router.double(), top_k)[1].flatten(),
                              minlength=E)
        if used.all() and (top_k == E or (logits[:, top_k - 1] - logits[:, top_k]).min() > 0.1):
            return x, w
    raise RuntimeError("no clear routing found")    # pragma: no cover


def _launched(log, ns) -> dict:
    """How many launches were of the notebook's kernels, and which other kernels ran."""
    return {"own": sum(k.defined_in(ns) for k in log.launches),
            "others": sorted({f"{k.module}.{k.name}" for k in log.launches
                              if not k.defined_in(ns)})}


def _collect_layer(ns, seed) -> dict:
    def run(call, spec, case):
        (x, w), device = layer_inputs(case, spec), runtime.device()
        with bounds.watch(guard=runtime.is_cpu()) as log:
            y = call(x.to(device), w.to(device=device), spec[3])
        return {"out": md._tensor(y), **_launched(log, ns)}
    return md.collect_trials(ns, seed, "moe_layer", LAYERS, run)


def _reference(x, w, top_k, renormalize=True, weighted=True):
    weights, ids = moe.route(x.double() @ w.router.double(), top_k, renormalize)
    weights = weights if weighted else torch.ones_like(weights)
    x = x.double()
    every = torch.stack([(torch.nn.functional.silu(x @ w.gate[e].double()) * (
        x @ w.up[e].double())) @ w.down[e].double() for e in range(w.experts)])
    return (weights[..., None] * every[ids, torch.arange(len(x))[:, None]]).sum(1)


def _layer_problem(spec, rec, seed) -> str | None:
    label, T, E, top_k, H, _, dtype = spec
    case = md.trial_case(label, seed)
    if rec.get("seed") != case.seed:
        return md.TAMPERED
    if rec.get("error"):
        return f"moe_layer raised {rec['error']}"
    course = [k for k in rec.get("others", []) if "grouped_gemm" in k]
    if course:
        return (f"moe_layer launched the course's {course[0]}: run the experts with your own "
                "grouped_matmul")
    if md.copied(rec.get("calls"), "moe_layer"):
        return md.copied(rec.get("calls"), "moe_layer") + " (use your own route and dispatch)"
    if not rec.get("own"):
        ran = ", ".join(rec.get("others", [])) or "no Triton kernel at all"
        return (f"moe_layer launched no kernel of your notebook ({ran}): the experts' matrix "
                "products must run in your grouped_matmul's kernel")
    y = rec.get("out")
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (T, H) or y.dtype != dtype:
        what = f"{harness.dtype_name(y.dtype)} {tuple(y.shape)}" if isinstance(
            y, torch.Tensor) else f"{y!r:.40}"
        return f"moe_layer returned {what}: it must be {harness.dtype_name(dtype)} {(T, H)}"
    x, w = layer_inputs(case, spec)
    atol, rtol = LAYER_TOL[dtype]
    bad = harness.close_hint(y, _reference(x, w, top_k), atol, rtol)
    if bad is None:
        return None
    text = f"{bad[0]} of {y.numel()} outputs are off (tolerance {atol:g} + {rtol:g} x |expected|)"
    for kw, slip in (({"renormalize": False}, "the routing weights are not renormalised (part "
                      "1a)"), ({"weighted": False}, "the experts' outputs are added without "
                      "their routing weights: pass weights to the combine")):
        if harness.close_hint(y, _reference(x, w, top_k, **kw), atol, rtol) is None:
            return f"{text}: {slip}"
    return (f"{text}. Check each step against moe.moe_loop: route on x @ w.router, dispatch, "
            "x[d.rows], silu(gate) * up, down, then combine(y, d.position, weights)")


def _layer(part, raw) -> Feedback:
    return md.judge_trials(part, raw, LAYERS, _layer_problem, "matches the float64 reference, "
                           "with your own kernel, on ")


# --- Part 4b (GPU): the layer beside the per-expert loop. ---------------------------------

def speed_inputs(seed: int = 0):
    """``(x, weights)`` of part 4b on the GPU, drawn there in bf16 (no host copy of the
    experts' 1.2 GB): the same scaling as :func:`helpers.kernels.moe.make_weights`."""
    s, g = SPEED_SHAPE, torch.Generator(device="cuda").manual_seed(seed)

    def normal(*shape, fan_in):
        return torch.randn(*shape, device="cuda", dtype=SPEED_DTYPE, generator=g) \
            / math.sqrt(fan_in)

    w = moe.MoEWeights(normal(s.hidden, s.experts, fan_in=s.hidden),
                       normal(s.experts, s.hidden, s.width, fan_in=s.hidden),
                       normal(s.experts, s.hidden, s.width, fan_in=s.hidden),
                       normal(s.experts, s.width, s.hidden, fan_in=s.width))
    return normal(SPEED_TOKENS, s.hidden, fan_in=1), w


def _collect_speed(ns, seed) -> dict:
    """In the collection process: ``moe_layer``, the course's layer and ``moe.moe_loop``
    timed side by side."""
    from ... import bench

    fn, s = answer(ns, "moe_layer"), SPEED_SHAPE
    x, w = speed_inputs(seed)
    with gpu_lock():
        with bounds.watch(guard=False) as log:
            y = fn(x, w, s.top_k)
            torch.cuda.synchronize()
        loop = moe.moe_loop(x, w, s.top_k).float()
        error = ((y.float() - loop).norm() / loop.norm()).item() if isinstance(
            y, torch.Tensor) and y.shape == loop.shape else float("inf")
        yours = bench.time_ms(lambda: fn(x, w, s.top_k))
        course = bench.time_ms(lambda: moe.moe_forward(x, w, s.top_k))
        looped = bench.time_ms(lambda: moe.moe_loop(x, w, s.top_k))
    return {"gpu": torch.cuda.get_device_name(), "error": error, "yours": yours,
            "course": course, "loop": looped, **_launched(log, ns)}


def _speed(part, raw) -> Feedback:
    s = SPEED_SHAPE
    where = (f"on {raw['gpu']}, {SPEED_TOKENS} tokens, {s.experts} experts, top-{s.top_k}, "
             f"H={s.hidden}, I={s.width}, bf16")
    if not raw["own"] or any("grouped_gemm" in k for k in raw["others"]):
        return Feedback(part, False, f"{where}: moe_layer must run the experts in your own "
                        "kernel (part 4a)")
    if not raw["error"] <= SPEED_ERROR:
        return Feedback(part, False, f"{where}: the output differs from moe.moe_loop's by "
                        f"{raw['error']:.3g} of its norm (at most {SPEED_ERROR:g})")
    ratio = raw["course"] / raw["yours"]
    return target(part, ratio >= SPEED_GOAL, f"{where}: yours {raw['yours']:.3f} ms, the "
                  f"course's layer {raw['course']:.3f} ms: {ratio:.2f}x its speed (the goal is "
                  f"{SPEED_GOAL:g}x; the per-expert loop took {raw['loop']:.3f} ms)",
                  "No host sync inside the layer (no .item(), .tolist() or nonzero), "
                  "GPU-sized tiles (compare yours with lesson 08's measured ones), and one "
                  "grouped launch per projection for all 128 experts")


# --- The assignment, and the calls the notebook makes. ------------------------------------

def _labelled(key, title, points, judge, names, **kw):
    return Part(key, title, points, lambda raw: judge(f"{key} {title}", raw), names, **kw)


ASSIGNMENT = Assignment(
    name="08_moe",
    title="A Mixture-of-Experts layer: dispatch, grouped GEMM, padding",
    parts=(
        _labelled("1a", "route", 2, md.judge_route, ("route",), collect=md.collect_route),
        *(_labelled(k, t, 2, md.judge_dispatch(g), ("dispatch",), group="dispatch",
                    collect=md.collect_dispatch) for k, t, g in (
            ("1b", "dispatch: permutation, counts, offsets", "ordinary"),
            ("1c", "dispatch: empty experts and other edges", "edges"),
            ("1d", "dispatch with a capacity", "capacity"))),
        _labelled("2a", "whole and partial tiles", 3, _kernel_part(
            "tiles", "whole and partial tiles, one expert, a long K"), ("grouped_matmul",),
            group="kernel", collect=_collect_kernel),
        _labelled("2b", "empty experts, more experts than rows", 3, _kernel_part(
            "empty", "empty experts, more experts than rows, one row"), ("grouped_matmul",),
            group="kernel", collect=_collect_kernel),
        _labelled("2c", "the kernel stays in bounds", 2,
                  lambda part, raw: harness.verdict_of(TASK, raw).in_bounds(part),
                  ("grouped_matmul",), group="kernel", collect=_collect_kernel),
        Part("3a", "rows of padding", 2, _wasted_rows, ("wasted_rows",)),
        Part("3b", "fraction of the computed rows that is padding", 1, _wasted_fraction,
             ("wasted_fraction",)),
        _labelled("4a", "the layer", 2, _layer, ("moe_layer",), group="layer",
                  collect=_collect_layer),
        _labelled("4b", "within reach of the course's layer", 3, _speed, ("moe_layer",),
                  gpu=True, group="speed", collect=_collect_speed, after="layer"),
    ),
)

check_route = check_function(ASSIGNMENT, ("1a",), "Part 1: ``route`` on the grader's logits.")
check_dispatch = check_function(ASSIGNMENT, ("1b", "1c", "1d"),
    "Part 1: ``dispatch`` on skewed, empty-expert and capacity routings.")
check_kernel = check_function(ASSIGNMENT, ("2a", "2b", "2c"),
    "Part 2: ``grouped_matmul`` on the grader's counts, watched.")
check_padding = check_function(ASSIGNMENT, ("3a", "3b"),
    "Part 3: ``wasted_rows`` and ``wasted_fraction``.")
check_layer = check_function(ASSIGNMENT, ("4a",), "Part 4: ``moe_layer`` against the reference.")
check_speed = check_function(ASSIGNMENT, ("4b",),
    "Part 4: timed against the per-expert loop (GPU mode; pending on a CPU).")

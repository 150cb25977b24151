"""Assignment 08, a Mixture-of-Experts layer: its graded parts and ``check_*`` calls.

The references are the course's own (:mod:`helpers.kernels.moe`): ``route`` and
``dispatch`` for part 1 (:mod:`.moe_dispatch`), rules and a float64 product per copy for the
block layout and its kernel (:mod:`.moe_blocks`), ``moe_reference`` for the layer and
``moe_loop`` beside it on a GPU; the expected paddings live in :mod:`.keys_moe`. No expected
value is typed in. Parts (26 points; 23 in CPU mode, 3 on a GPU):

=====  ==========================================================  ======
1a     ``route``: top_k of the softmax, renormalised, fp32              2
1b     ``dispatch``: permutation, counts, offsets, rows, position      2
1c     ... on empty experts, one token, one expert, top_k = E          2
1d     ... with a capacity: late copies dropped, marked -1             2
2a     ``align_blocks``: every kept copy in one slot, one expert     3
       per block, no block more than its expert needs
2b     ... in the fewest slots that hold any counts of the sizes      2
2c     ``expert_matmul`` through that layout: right, own kernel        3
2d     its kernel never reads or writes outside its tensors            2
3a     ``expected_padding`` of a random router, exact, on the         2
       grader's sizes
3b     ... at the edges (top_k = E, fewer tokens than blocks)          1
4a     ``moe_layer`` (route, dispatch, blocks, 3 kernels, sum) right    2
4b     >= 0.45x the speed of the course's layer, 128 experts (GPU)     3
=====  ==========================================================  ======
"""

from __future__ import annotations

import math

import torch

from ... import bounds, runtime
from ...feedback import Feedback, target
from ...kernels import moe
from .. import harness
from ..gpu import gpu_lock
from ..registry import Assignment, Part, answer, check_function
from . import moe_blocks as mb
from . import moe_dispatch as md

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
TASK = mb.TASK              # part 2's graded kernel (the class leaderboard times it)
LAYER_TOL = {d: (2 * a, 2 * r) for d, (a, r) in moe.TOLERANCES.items()}

# Part 4b: lesson 08's many-small-experts layer, timed beside the course's own layer
# (moe.moe_forward: one grouped launch per projection, its tiles measured in lesson 08) and
# the per-expert loop model code often starts from. The course's layer is 26-36x faster
# than the loop, so the bar is set against it. At this size the host's launches, not the
# GPU, set the time: on an H100 the solution's layer (block layout built with ~12 torch
# ops, GShard-priority dispatch, three kernel launches, silu and the weighted sum in torch)
# took 2.09 ms against the course's 1.04 ms (0.50x; its kernels 0.58 ms of it, route and
# dispatch 1.14 ms, the layout 0.41 ms; `bash tests/gpu/device.sh pytest
# tests/test_grading_08.py` grades it); the goal sits below that.
SPEED_SHAPE, SPEED_TOKENS, SPEED_DTYPE, SPEED_GOAL = moe.MANY_SMALL, 1024, BF16, 0.45
SPEED_ERROR = 2e-2          # |yours - loop| / |loop| over the whole output (bf16 roundings)


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
                "expert_matmul")
    if md.copied(rec.get("calls"), "moe_layer"):
        return md.copied(rec.get("calls"), "moe_layer") + " (use your own route and dispatch)"
    if not rec.get("own"):
        ran = ", ".join(rec.get("others", [])) or "no Triton kernel at all"
        return (f"moe_layer launched no kernel of your notebook ({ran}): the experts' matrix "
                "products must run in your expert_matmul's kernel")
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
                      "their routing weights: weight each copy's row before the sum")):
        if harness.close_hint(y, _reference(x, w, top_k, **kw), atol, rtol) is None:
            return f"{text}: {slip}"
    return (f"{text}. Check each step against moe.moe_loop: route on x @ w.router, dispatch, "
            "align_blocks, silu(gate) * up, down, then each token's weighted sum of its copies")


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
    title="A Mixture-of-Experts layer: dispatch, blocks of one expert, padding",
    parts=(
        _labelled("1a", "route", 2, md.judge_route, ("route",), collect=md.collect_route),
        *(_labelled(k, t, 2, md.judge_dispatch(g), ("dispatch",), group="dispatch",
                    collect=md.collect_dispatch) for k, t, g in (
            ("1b", "dispatch: permutation, counts, offsets", "ordinary"),
            ("1c", "dispatch: empty experts and other edges", "edges"),
            ("1d", "dispatch with a capacity", "capacity"))),
        _labelled("2a", "align_blocks: the layout's rules", 3, mb.judge_layout,
                  ("align_blocks",), group="align", collect=mb.collect_align),
        _labelled("2b", "align_blocks: the fewest slots for the sizes", 2, mb.judge_length,
                  ("align_blocks",), group="align", collect=mb.collect_align),
        _labelled("2c", "expert_matmul through the layout", 3, mb.kernel_part,
                  ("align_blocks", "expert_matmul"), group="kernel", collect=mb.collect_kernel),
        _labelled("2d", "the kernel stays in bounds", 2, mb.bounds_part,
                  ("align_blocks", "expert_matmul"), group="kernel", collect=mb.collect_kernel),
        _labelled("3a", "expected padding of a random router", 2, mb.judge_padding("3a"),
                  ("expected_padding",), group="padding", collect=mb.collect_padding),
        _labelled("3b", "expected padding at the edges", 1, mb.judge_padding("3b"),
                  ("expected_padding",), group="padding", collect=mb.collect_padding),
        _labelled("4a", "the layer", 2, _layer, ("moe_layer",), group="layer",
                  collect=_collect_layer),
        _labelled("4b", "within reach of the course's layer", 3, _speed, ("moe_layer",),
                  gpu=True, group="speed", collect=_collect_speed, after="layer"),
    ),
)

check_route = check_function(ASSIGNMENT, ("1a",), "Part 1: ``route`` on the grader's logits.")
check_dispatch = check_function(ASSIGNMENT, ("1b", "1c", "1d"),
    "Part 1: ``dispatch`` on skewed, empty-expert and capacity routings.")
check_align = check_function(ASSIGNMENT, ("2a", "2b"),
    "Part 2: ``align_blocks`` on the grader's routings.")
check_kernel = check_function(ASSIGNMENT, ("2c", "2d"),
    "Part 2: ``expert_matmul`` through your layout, on the grader's routings, watched.")
check_padding = check_function(ASSIGNMENT, ("3a", "3b"),
    "Part 3: ``expected_padding`` on the grader's sizes.")
check_layer = check_function(ASSIGNMENT, ("4a",), "Part 4: ``moe_layer`` against the reference.")
check_speed = check_function(ASSIGNMENT, ("4b",),
    "Part 4: timed against the per-expert loop (GPU mode; pending on a CPU).")

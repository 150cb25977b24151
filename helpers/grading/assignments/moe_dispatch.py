"""Assignment 08, part 1: the learner's router and dispatch, run on the grader's routings.

:mod:`helpers.grading.assignments.moe` holds the assignment; this module holds part 1's
trials and judges. ``route(logits, top_k)`` and ``dispatch(ids, experts, capacity=None)``
are plain PyTorch, so each trial records what they returned and the judge compares it with
the course's :func:`helpers.kernels.moe.route` and :func:`~helpers.kernels.moe.dispatch`
on the same inputs, remade from the seed. A dispatch may order the rows of one expert as
it likes: what is judged is what the grouped GEMM and the combine rely on (each expert's
copies in its rows ``offsets[e]:offsets[e + 1]``, ``rows`` the token of each row,
``position`` the way back). With a capacity, what each expert keeps is checked as a property
(GShard's priority: every first choice before any second), which the course's dispatch does
not follow. Messages name the rule that broke, never the expected values.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types

import torch

from ... import runtime
from ...feedback import Feedback, not_implemented
from ...kernels import moe
from .. import harness
from ..registry import SEED, answer, is_not_implemented

FIELDS = ("order", "rows", "counts", "offsets", "position")
TAMPERED = "the record of the run is not the grader's (was the grader tampered with?)"


def _course_function(fn, names) -> bool:
    """``fn`` is one of the course's ``names``, defined in the MoE kernel family (a package:
    ``route`` in its routing module, ``dispatch`` in its face)."""
    code = getattr(fn, "__code__", None)
    return getattr(fn, "__name__", "") in names and code is not None \
        and os.path.dirname(code.co_filename).endswith(os.path.join("helpers", "kernels", "moe"))


@contextlib.contextmanager
def course_calls(ns: dict, names=("route", "dispatch")):
    """The course's own ``route`` or ``dispatch`` called while the block runs: a graded
    function must not hand the work to them. Every copy a notebook can reach is watched
    for the block: the module's (the notebook's import and the grader's fresh one, found
    through the notebook's modules) and functions imported by name."""
    seen: list[str] = []
    modules, frontier = {}, [sys.modules.get("helpers.kernels.moe"), *ns.values()]
    for _ in range(3):      # moe, kernels.moe, helpers.kernels.moe
        found = [m for m in frontier if isinstance(m, types.ModuleType)
                 and m.__name__.startswith("helpers")]
        modules.update({id(m): m for m in found})
        frontier = [v for m in found for v in vars(m).values()]
    undo = []

    def spy(owner, name, fn, assign):
        def watched(*args, **kwargs):
            seen.append(fn.__name__)
            return fn(*args, **kwargs)
        assign(owner, name, watched)
        undo.append((owner, name, fn, assign))

    for m in modules.values():
        for name in names:
            if _course_function(vars(m).get(name), names):
                spy(m, name, vars(m)[name], setattr)
    for name, value in list(ns.items()):
        if _course_function(value, names):
            spy(ns, name, value, dict.__setitem__)
    try:
        yield seen
    finally:
        for owner, name, fn, assign in reversed(undo):
            assign(owner, name, fn)


def copied(calls, function: str) -> str | None:
    if not calls:
        return None
    return (f"your {function} calls the course's helpers.kernels.moe.{calls[0]}: write it "
            "yourself, with torch operations")


def trial_case(label: str, seed: int) -> harness.Case:
    return harness.Case(label, {}).seeded(seed)


def _tensor(v):
    return v.detach().cpu().clone() if isinstance(v, torch.Tensor) else repr(v)[:60]


def collect_trials(ns, seed, name: str, specs, run) -> dict:
    """One record per spec (``spec[0]`` its label): ``run(call, spec, case)`` makes the
    inputs, calls the notebook's ``name`` through ``call`` (watched for the course's own
    route and dispatch) and returns what to record; an error is recorded, a stub ends it."""
    fn, out = answer(ns, name), []
    for spec in specs:
        case = trial_case(spec[0], seed)
        rec = {"label": spec[0], "seed": case.seed, "error": None, "calls": []}

        def call(*args):
            with course_calls(ns) as seen:
                try:
                    return fn(*args)
                finally:
                    rec["calls"] += seen
        try:
            rec.update(run(call, spec, case))
        except Exception as err:  # noqa: BLE001 - the learner's error, reported
            if is_not_implemented(err):
                return {"not_implemented": True}
            rec["error"] = f"{type(err).__name__}: {str(err)[:200]}"
        out.append(rec)
    return {"trials": out}


def judge_trials(part, raw, specs, problem, passed: str, keep=lambda spec: True) -> Feedback:
    """The first ``problem(spec, rec, seed)`` among the specs ``keep`` selects, or a pass."""
    if raw.get("not_implemented"):
        return not_implemented(part)
    trials = raw.get("trials") or []
    if len(trials) != len(specs):
        return Feedback(part, False, TAMPERED)
    chosen = [(spec, rec) for spec, rec in zip(specs, trials) if keep(spec)]
    for spec, rec in chosen:
        found = problem(spec, rec, raw.get(SEED, 0))
        if found:
            return Feedback(part, False, f"on {spec[0]}: {found}")
    return Feedback(part, True, passed + "; ".join(spec[0] for spec, _ in chosen))


def _distinct(rows: int, experts: int, g) -> torch.Tensor:
    """Each row a random order of ``experts`` distinct values (no ties in any top-k)."""
    return torch.rand(rows, experts, generator=g).argsort(-1).float()


# --- 1a: the router. --------------------------------------------------------------------

ROUTES = (  # label, tokens, experts, top_k, logits' dtype
    ("32 tokens, 8 experts, top-2", 32, 8, 2, "float32"),
    ("one token, 8 experts, top-2", 1, 8, 2, "float32"),
    ("5 tokens, 128 experts, top-8", 5, 128, 8, "float32"),
    ("9 tokens, 4 experts, top-1", 9, 4, 1, "float32"),
    ("6 tokens, 4 experts, top_k = E = 4", 6, 4, 4, "float32"),
    ("16 tokens, 16 experts, top-4, fp16 logits", 16, 16, 4, "float16"))


def route_inputs(case: harness.Case, spec) -> tuple[torch.Tensor, int]:
    _, T, E, top_k, dtype = spec
    g = harness.generator(case.seed)
    if dtype == "float16":     # values 4 k / E - 2: exact in fp16, distinct within a row
        logits = _distinct(T, E, g) * (4 / E) - 2
    else:
        logits = 2 * torch.randn(T, E, generator=g)
    return logits.to(getattr(torch, dtype)), top_k


def collect_route(ns, seed) -> dict:
    def run(call, spec, case):
        logits, top_k = route_inputs(case, spec)
        got = call(logits.to(runtime.device()), top_k)
        return {"out": [_tensor(t) for t in got] if isinstance(got, (tuple, list))
                else repr(got)[:60]}
    return collect_trials(ns, seed, "route", ROUTES, run)


def _route_problem(spec, rec, seed) -> str | None:
    label, T, E, top_k, _ = spec
    case = trial_case(label, seed)
    if rec.get("seed") != case.seed:
        return TAMPERED
    if rec.get("error"):
        return f"route raised {rec['error']}"
    if copied(rec.get("calls"), "route"):
        return copied(rec.get("calls"), "route")
    out = rec.get("out")
    if not isinstance(out, list) or len(out) != 2 or not all(
            isinstance(t, torch.Tensor) for t in out):
        return f"route returned {out!r:.60}; return the pair (weights, ids)"
    weights, ids = out
    for name, t in (("weights", weights), ("ids", ids)):
        if tuple(t.shape) != (T, top_k):
            return f"{name} has shape {tuple(t.shape)}: it must be (tokens, top_k) = {(T, top_k)}"
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        return f"ids are {harness.dtype_name(ids.dtype)}: expert numbers are integers"
    if weights.dtype != torch.float32:
        return (f"weights are {harness.dtype_name(weights.dtype)}: keep them in float32 (the "
                "softmax of fp16 logits too: logits.float()), the combine sums in fp32")
    logits, _ = route_inputs(case, spec)
    want_w, want_ids = moe.route(logits, top_k)
    chosen = torch.sort(ids.long(), -1).values
    if not torch.equal(chosen, torch.sort(want_ids, -1).values):
        if torch.equal(chosen, torch.sort(torch.topk(logits.float(), top_k, -1, largest=False)
                                          .indices, -1).values):
            return "ids are the top_k *smallest* logits of each token: take the largest"
        return ("ids are not each token's top_k experts: the top_k largest of its softmax "
                "probabilities (torch.topk over the experts, dim=-1)")
    # Pair each weight with its expert (any order of the top_k within a token is fine).
    def by_expert(w, i):
        return torch.gather(w.double(), 1, torch.argsort(i.long(), -1))
    got, want = by_expert(weights, ids), by_expert(want_w, want_ids)
    if torch.allclose(got, want, rtol=1e-4, atol=1e-6):
        return None
    probs = torch.softmax(logits.double(), -1).gather(1, chosen)
    if torch.allclose(got, probs, rtol=1e-4, atol=1e-6):
        return ("the weights are the softmax probabilities as they are: renormalise them so "
                "that each token's top_k weights sum to 1 (divide by their sum)")
    if not torch.allclose(got.sum(-1), torch.ones(T, dtype=got.dtype), atol=1e-4):
        return "each token's weights must sum to 1: renormalise over its top_k experts"
    return ("the weights are not softmax(logits) at the chosen experts, renormalised: pair "
            "each weight with its id")


def judge_route(part, raw) -> Feedback:
    return judge_trials(part, raw, ROUTES, _route_problem, "right on ")


# --- 1b-1d: the dispatch. -------------------------------------------------------------

SKEWED = (1, 1, 20, 1, 1, 20, 1, 1)      # two experts take most copies
# label, group, tokens, experts, top_k, how the ids are drawn, capacity
DISPATCHES = (
    ("uniform routing, 40 tokens, 8 experts, top-2", "ordinary", 40, 8, 2, "every", None),
    ("skewed routing, 64 tokens, 8 experts, top-2", "ordinary", 64, 8, 2, "skewed", None),
    ("experts 0, 3, 7, 8 and 9 empty, 10 experts, top-2", "edges", 24, 10, 2, "empty", None),
    ("one token, 6 experts, top-2", "edges", 1, 6, 2, "any", None),
    ("every copy to expert 3 of 5, top-1", "edges", 20, 5, 1, "one", None),
    ("top_k = E = 4: every token to every expert", "edges", 7, 4, 4, "all", None),
    ("3 tokens, 64 experts, top-8", "edges", 3, 64, 8, "any", None),
    ("skewed, capacity 1.25 x the fair share", "capacity", 48, 8, 2, "skewed",
     moe.capacity(48, 2, 8, 1.25)),
    ("capacity 1, 12 tokens, 4 experts, top-2", "capacity", 12, 4, 2, "every", 1),
    ("capacity above every expert's count", "capacity", 16, 4, 2, "every", 32))
GROUPS = {"ordinary": "1b", "edges": "1c", "capacity": "1d"}


def dispatch_inputs(case: harness.Case, spec) -> torch.Tensor:
    """``ids`` (T, top_k) int64: each token's distinct experts, drawn from the seed."""
    _, _, T, E, top_k, kind, _ = spec
    g = harness.generator(case.seed)
    if kind == "one":
        return torch.full((T, 1), 3, dtype=torch.long)
    if kind == "all":
        return _distinct(T, E, g).long()
    weight = {"skewed": torch.tensor(SKEWED, dtype=torch.float),
              "empty": torch.tensor([0, 1, 1, 0, 1, 1, 1, 0, 0, 0], dtype=torch.float)}.get(
        kind, torch.ones(E))
    for _ in range(1000):     # "every", "skewed": until each expert has a copy
        ids = torch.multinomial(weight.repeat(T, 1), top_k, generator=g)
        if kind not in ("every", "skewed") or torch.bincount(ids.flatten(), minlength=E).all():
            return ids
    raise RuntimeError("no routing with every expert used")   # pragma: no cover


def collect_dispatch(ns, seed) -> dict:
    def run(call, spec, case):
        ids = dispatch_inputs(case, spec)
        given = ids.to(runtime.device())
        got = call(given, spec[3]) if spec[6] is None else call(given, spec[3], spec[6])
        if not all(hasattr(got, f) for f in FIELDS):
            return {"returned": f"{type(got).__name__} {got!r:.40}"}
        return {"changed": not torch.equal(given.cpu(), ids),
                "fields": {f: _tensor(getattr(got, f)) for f in FIELDS}}
    return collect_trials(ns, seed, "dispatch", DISPATCHES, run)


def _integer(t) -> bool:
    return isinstance(t, torch.Tensor) and not (t.is_floating_point() or t.is_complex()
                                                or t.dtype == torch.bool)


def _form(got: dict, T: int, E: int, top_k: int) -> str | None:
    shapes = {"counts": (E,), "offsets": (E + 1,), "position": (T, top_k)}
    for name in FIELDS:
        t = got.get(name)
        if not _integer(t):
            return (f"{name} is {t!r:.40}" if not isinstance(t, torch.Tensor) else
                    f"{name} is {harness.dtype_name(t.dtype)}") + ": it must be an integer tensor"
        if name in shapes and tuple(t.shape) != shapes[name]:
            if name == "counts" and t.dim() == 1 and t.numel() < E:
                return (f"counts has {t.numel()} entries for {E} experts: the experts after the "
                        "last one that got a copy are missing. torch.bincount counts only up to "
                        "the largest id it sees: pass minlength=experts")
            if name == "offsets" and tuple(t.shape) == (E,):
                return (f"offsets has {E} entries: it needs E + 1 = {E + 1}, starting at 0 and "
                        "ending at the number of rows, so that expert e's rows are "
                        "offsets[e]:offsets[e + 1]")
            return f"{name} has shape {tuple(t.shape)}: it must be {shapes[name]}"
        if name in ("order", "rows") and t.dim() != 1:
            return f"{name} has shape {tuple(t.shape)}: it must be one-dimensional"
    return None


def _offsets_slip(got, want) -> str:
    if torch.equal(got[1:], want[:-1]):
        return ("offsets are shifted one expert late: offsets[e] must be the first row of "
                "expert e itself, the sum of counts[:e] (offsets[0] = 0, offsets[E] = rows)")
    if torch.equal(got[:-1], want[1:]):
        return ("offsets[e] holds where expert e's rows end (an inclusive sum): it must be "
                "where they start, the sum of counts[:e], with offsets[0] = 0 and offsets[E] "
                "= rows")
    if torch.equal(got, want + 1) or torch.equal(got, want - 1):
        return "offsets are off by one row: offsets[0] is 0 and offsets[E] is the number of rows"
    return ("offsets are not the running sum of counts: offsets[0] = 0 and offsets[e + 1] = "
            "offsets[e] + counts[e]")


def dispatch_problem(spec, rec, seed) -> str | None:
    label, _, T, E, top_k, _, cap = spec
    case = trial_case(label, seed)
    if rec.get("seed") != case.seed:
        return TAMPERED
    if rec.get("error"):
        ids = dispatch_inputs(case, spec)
        empty = (torch.bincount(ids.flatten(), minlength=E) == 0).nonzero().flatten().tolist()
        return f"dispatch raised {rec['error']}" + (
            f" (experts {', '.join(map(str, empty[:8]))} get no copy here, the last one "
            "among them: every per-expert tensor still has one entry per expert, and "
            "torch.bincount counts only up to the largest id it sees unless given minlength)"
            if empty and empty[-1] == E - 1 else "")
    if copied(rec.get("calls"), "dispatch"):
        return copied(rec.get("calls"), "dispatch")
    if rec.get("changed"):
        return "dispatch changed ids: it must only read them"
    got = rec.get("fields")
    if not isinstance(got, dict):
        return (f"dispatch returned {rec.get('returned')}: return "
                "moe.Dispatch(order, rows, counts, offsets, position)")
    problem = _form(got, T, E, top_k)
    if problem:
        return problem
    ids = dispatch_inputs(case, spec)
    flat, want = ids.flatten(), moe.dispatch(ids, E, cap)
    counts, offsets, order = (got[f].long() for f in ("counts", "offsets", "order"))
    if not torch.equal(counts, want.counts.long()):
        if cap is not None and torch.equal(counts, torch.bincount(flat, minlength=E)):
            return ("counts still count the copies an expert was sent: with a capacity they "
                    "count the rows it keeps, at most the capacity")
        return "counts[e] must be the number of copies routed to expert e"
    if not torch.equal(offsets, want.offsets):
        return _offsets_slip(offsets, want.offsets)
    R = want.order.numel()
    if order.numel() != R:
        if cap is not None and order.numel() == flat.numel():
            return (f"order keeps all {flat.numel()} copies: with a capacity each expert keeps "
                    "`capacity` of them, and the rest are dropped")
        return f"order has {order.numel()} rows: it must hold one per copy that counts count"
    if order.numel() and (order.min() < 0 or order.max() >= flat.numel()
                          or order.unique().numel() != R):
        return ("order must hold each copy at most once, as the number token * top_k + slot "
                f"(0 to {flat.numel() - 1}); yours repeats copies or holds other numbers")
    expert_of_row = torch.repeat_interleave(torch.arange(E), want.counts.long())
    if not torch.equal(flat[order], expert_of_row):
        return ("the copies are not sorted by expert: sorted rows offsets[e]:offsets[e + 1] "
                "must hold exactly the copies routed to expert e")
    if cap is not None:
        problem = _priority_problem(order, flat, T, top_k, E, want)
        if problem:
            return problem
    if not torch.equal(got["rows"].long(), order // top_k):
        return "rows[r] must be the token that sorted row r reads: order[r] // top_k"
    position = got["position"].long().flatten()
    if not torch.equal(position[order], torch.arange(R)):
        return ("position[t, j] must be the sorted row that holds copy (t, j): position.view(-1)"
                "[order] = arange(rows)")
    dropped = torch.ones(flat.numel(), dtype=torch.bool)
    dropped[order] = False
    if (position[dropped] != -1).any():
        return (f"{int((position[dropped] != -1).sum())} copies were dropped (they are in no "
                "sorted row) but their position is not -1: the combine would add another "
                "copy's row in their place, so tokens lose an expert silently. Mark each "
                "dropped copy -1: then the combine adds nothing for it, and it can be counted")
    return None


def _priority_problem(order, flat, T: int, top_k: int, E: int, by_token) -> str | None:
    """With a capacity, GShard's order: each expert keeps the copies of highest priority,
    every first choice (slot 0) before any second choice, and so on, the earlier token
    first among copies of one slot. Checked as a property, never by a list of the copies
    to keep: no kept copy of an expert may rank below one it dropped. ``by_token`` is the
    dispatch that keeps the earliest tokens whatever their slot (a plausible other rule)."""
    copy = torch.arange(flat.numel())
    priority = (copy % top_k) * T + copy // top_k
    kept = torch.zeros(flat.numel(), dtype=torch.bool)
    kept[order] = True
    for e in range(E):
        mine = flat == e
        if (mine & kept).any() and (mine & ~kept).any() and \
                priority[mine & kept].max() > priority[mine & ~kept].min():
            if torch.equal(torch.sort(order).values, torch.sort(by_token.order).values):
                return (f"expert {e} is over capacity and keeps its earliest tokens whatever "
                        "their choice: the rule ranks every first choice before any second "
                        "choice, and token order decides only among copies of one choice")
            return (f"expert {e} is over capacity and keeps a copy of lower priority than one "
                    "it drops: it keeps the copies of highest priority, every first choice "
                    "before any second choice, the earlier token first within one choice")
    return None


def judge_dispatch(group: str):
    def judge(part, raw) -> Feedback:
        return judge_trials(part, raw, DISPATCHES, dispatch_problem, "right on ",
                            lambda spec: spec[1] == group)
    return judge

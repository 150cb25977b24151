"""Assignment 06, part 4: the backward pass of the learner's attention variant (sliding
windows, soft-capped scores), judged against float64 autograd.

The course's backward kernels (:mod:`helpers.kernels.attention`) have neither a window nor
a cap; the learner derives what changes in the gradients (which tiles each program visits,
what the cap does to dS) and writes the kernels. Each trial hands the learner the forward's
O and lse from the float64 reference (cast to the inputs' dtype, lse fp32), so the backward
is judged on its own, whatever the learner's forward does. The learner may reduce
D = rowsum(dO * O) with torch first: O is the one input its kernels need not read.

=====  ==========================================================  ======
4a     dQ, dK, dV without a mask, soft-capped or not                     3
4b     ... causal, with and without sliding windows                      3
4c     the backward kernels never read or write outside their tensors    2
=====  ==========================================================  ======
"""

from __future__ import annotations

import math
from functools import partial

import torch

from .. import harness

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
DTYPE_OF = {harness.dtype_name(d): d for d in (FP16, BF16, FP32)}
LARGE = "large scores"
INF = math.inf
# Gradients sum a row's or a column's worth of rounded products: judged relative to the
# largest gradient of the call (atol: one query alone has dQ = dK = 0, which a GPU's TF32
# products leave at about 1e-3 of dV) and to each element (rtol); bf16 keeps 8 bits.
TOL = {FP32: (1e-2, 1e-2), FP16: (1e-2, 1e-2), BF16: (6e-2, 6e-2)}
NAMES = ("dQ", "dK", "dV")


def _visible(n: int, causal, window) -> torch.Tensor:
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    keep = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool)
    return keep & (j > i - window) if window else keep


def _forward64(q, k, v, causal, window, softcap):
    """O and lse in float64 (the grader's reference of part 2, differentiable)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~_visible(q.shape[-2], causal, window), -INF)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v, lse


def reference_grads(case, inputs) -> tuple[torch.Tensor, ...]:
    """dQ, dK, dV in float64, by autograd through the float64 forward."""
    p = case.params
    q, k, v, _, _, do = inputs
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o, _ = _forward64(*leaves, p["causal"], p["window"], p["softcap"])
    o.backward(do.double())
    return tuple(x.grad for x in leaves)


def _by_hand(case, inputs, cap_derivative=True, scaled=True, delta=True, masked=True,
             windowed=True):
    """dQ, dK, dV in float64 written out, with one of the steps a learner may slip on left
    out: the cap's derivative, the 1/sqrt(d) of dQ and dK, D, the mask or only its window."""
    p = case.params
    q, k, v, o, lse, do = (x.double() for x in inputs)
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale
    chain = torch.ones_like(s)
    if p["softcap"]:
        t = torch.tanh(s / p["softcap"])
        s, chain = p["softcap"] * t, (1 - t * t if cap_derivative else chain)
    seen = _visible(q.shape[-2], p["causal"], p["window"] if windowed else None) if masked \
        else torch.ones(s.shape[-2:], dtype=torch.bool)
    prob = torch.exp(s - lse[..., None]).masked_fill(~seen, 0.0)
    dp = do @ v.transpose(-1, -2)
    ds = prob * (dp - ((do * o).sum(-1, keepdim=True) if delta else 0)) * chain
    ds = ds * (scale if scaled else 1)
    return ds @ k, ds.transpose(-1, -2) @ q, prob.transpose(-1, -2) @ do


def _blocks(constexprs) -> tuple[int, int]:
    c = {k.upper(): v for k, v in (constexprs or {}).items() if isinstance(v, int) and v > 1}
    return c.get("BLOCK_M", 32), c.get("BLOCK_N", c.get("BLOCK_M", 32))


def variant_case(n, d, dtype, causal, kind="", heads=2, compiled=False, window=None,
                 softcap=None, what=""):
    """A trial of part 2 (forward) or part 4 (``what="backward, "``): its label says it all."""
    name = harness.dtype_name(dtype)
    label = (f"{what}{'causal' if causal else 'no mask'}, {heads} x {n} x {d} {name}"
             + (f", window {window}" if window else "")
             + (f", softcap {softcap:g}" if softcap else "") + (f", {kind}" if kind else ""))
    return harness.Case(label, {"n": n, "d": d, "dtype": name, "causal": causal, "kind": kind,
                                "heads": heads, "window": window, "softcap": softcap}, 0,
                        compiled)


class FlashBackward(harness.KernelTask):
    function = "attention_backward"
    call = "attention_backward(q, k, v, o, lse, do, causal, window, softcap)"
    outputs = NAMES
    inputs_named = ("q", "k", "v", "O", "lse", "dO")
    optional_reads = ("O",)       # D = rowsum(dO * O) may come from torch
    mask_hint = ("Mask rows and keys past seq_len on every load and store of Q, K, V, dO, lse, "
                 "D, dQ, dK and dV")
    loops = True

    case = staticmethod(partial(variant_case, what="backward, "))

    def keywords(self, case):
        p = case.params
        return {"causal": p["causal"], "window": p["window"], "softcap": p["softcap"]}

    def first(self):
        return self.case(7, 16, FP32, False)

    def cases(self, blocks):
        bm, bn = _blocks(blocks)
        long = 2 * max(bm, bn) + 3           # several tiles, the last one partial
        # Caps near the scores' size, where tanh bends: its derivative is far from 1.
        # Windows of one tile and a few keys, and of half a tile, soft-capped: key tiles the
        # last queries of the sequence no longer see.
        return [self.case(long, 32, FP16, False), self.case(long, 16, FP32, False, softcap=2.0),
                self.case(1, 16, FP32, True), self.case(long, 16, FP32, True),
                self.case(long, 16, FP16, True, LARGE, heads=1),
                self.case(long, 16, FP32, True, window=bn + 5),
                self.case(long, 32, FP16, True, heads=3, window=max(bm, bn) // 2 + 1,
                          softcap=2.0)]

    def compiled_cases(self, blocks):
        out = [self.case(n, d, dt, c, heads=h, compiled=True) for c in (False, True)
               for n, d, dt, h in ((1000, 128, BF16, 4), (517, 64, FP16, 3), (300, 32, FP32, 2))]
        return out + [self.case(1000, 64, BF16, True, heads=4, compiled=True, window=256,
                                softcap=30.0),
                      self.case(517, 64, FP16, False, heads=3, compiled=True, softcap=20.0)]

    def inputs(self, case, device):
        p, g = case.params, harness.generator(case.seed)
        q, k, v, do = (torch.randn(p["heads"], p["n"], p["d"], generator=g) for _ in range(4))
        if p["kind"] == LARGE:                  # scores in the hundreds: exp overflows
            q, k = 8 * q, 8 * k
        dtype = DTYPE_OF[p["dtype"]]
        q, k, v, do = (t.to(dtype) for t in (q, k, v, do))
        with torch.no_grad():
            o, lse = _forward64(q.double(), k.double(), v.double(), p["causal"], p["window"],
                                p["softcap"])
        return tuple(t.to(device) for t in (q, k, v, o.to(dtype), lse.float(), do))

    def reference(self, case, inputs):
        return tuple(g.to(inputs[0].dtype) for g in reference_grads(case, inputs))

    def compare(self, case, got, want, inputs, blocks):
        exact = reference_grads(case, inputs)
        atol, rtol = TOL[got[0].dtype]
        top = max(float(w.abs().max()) if w.numel() else 0.0 for w in exact)
        wrong = [(name, bad) for name, g, w in zip(NAMES, got, exact)
                 if (bad := _off(g, w, atol, rtol, top))]
        if not wrong:
            return None
        (name, (count, where)), *rest = wrong
        first = (f"{count} of {got[0].numel()} elements of {name} are off, the first at "
                 f"{list(where)}" + (f" (also {', '.join(n for n, _ in rest)})" if rest else "")
                 + f"; tolerance {atol:g} of the largest + {rtol:g} x |expected|")
        return f"{first}. {_hint(case, got, inputs, wrong)}"

    def unpack(self, result):
        if isinstance(result, (tuple, list)) and len(result) == 3:
            return tuple(result)
        return f"{self.function} returned {type(result).__name__}; expected (dq, dk, dv)"

    def summary(self, cases):
        p = [c.params for c in cases]
        lengths = ", ".join(map(str, sorted({q["n"] for q in p})))
        dims = " and ".join(map(str, sorted({q["d"] for q in p})))
        kinds = [words for words, present in (
            ("windows", any(q["window"] for q in p)),
            ("soft-capped scores", any(q["softcap"] for q in p)),
            ("scores in the hundreds", any(q["kind"] == LARGE for q in p))) if present]
        return (f"lengths {lengths}, d = {dims}, "
                f"{' and '.join(sorted({q['dtype'] for q in p}))}"
                + (f"; {', '.join(kinds)}" if kinds else ""))


TASK = FlashBackward()


def _off(got, want, atol, rtol, top):
    """``close_hint`` with the absolute tolerance taken relative to ``top``, the largest
    gradient of the call."""
    return harness.close_hint(got, want, atol * max(top, 1e-6), rtol)


def _hint(case, got, inputs, wrong) -> str:
    """What the pattern of a wrong gradient says about the kernels."""
    p, names = case.params, {name for name, _ in wrong}
    if not all(torch.isfinite(g.float()).all() for g in got):
        return ("a gradient holds NaN or inf: rebuild P = exp(s - lse) from the saved lse (no "
                "running maximum is needed), and give rows and keys past seq_len, and keys a "
                "query does not see, P = 0 before they meet dO or dS")
    atol, rtol = TOL[got[0].dtype]

    def like(**slip):
        alt = _by_hand(case, inputs, **slip)
        top = max(float(a.abs().max()) if a.numel() else 0.0 for a in alt)
        return all(_off(g, a, atol, rtol, top) is None for g, a in zip(got, alt))
    if p["softcap"] and like(cap_derivative=False):
        return ("right but for the cap: the scores went through softcap * tanh(s / softcap) "
                "on the way forward, so dS must go back through that function too")
    if like(scaled=False):
        return "dQ and dK miss the 1/sqrt(d) by which the scores were scaled"
    if like(delta=False):
        return ("dS = P * dP is the gradient of exp, not of the softmax: each row's "
                "normalisation contributes a term too (the lesson's D)")
    if p["window"] and like(windowed=False):
        return ("right for causal attention without a window: the backward counts keys left "
                "of a query's window, which the forward never saw")
    if (p["causal"] or p["window"]) and like(masked=False):
        return ("the gradients count keys a query does not see: the backward needs the "
                "forward's mask on every tile it computes")
    if names == {"dQ"}:
        return ("dK and dV are right, dQ is not: check the key tiles each query program walks "
                "(all those its queries see, with the forward's mask) and what it sums")
    if names <= {"dK", "dV"}:
        return ("dQ is right, dK or dV is not: check the query tiles each key program walks "
                "(every query that sees one of its keys, with the forward's mask)")
    return ("compare with the chain rule through O = P V, the softmax, the cap and the scaled "
            "scores, one tile at a time")


collect = partial(harness.collect, TASK)      # (namespace, seed) -> raw results


def gradients(part):
    """The judge of 4a (``causal`` False) or 4b (True): every trial of that mask right."""
    causal = part.startswith("4b")

    def judge(raw):
        v = harness.verdict_of(TASK, raw)
        trials = [t for t in v.trials if t.case.params.get("causal") == causal]
        return v.correctness(part, "dQ, dK and dV match float64 autograd on "
                             + TASK.summary([t.case for t in trials]), trials)
    return judge


def in_bounds(part):
    return lambda raw: harness.verdict_of(TASK, raw).in_bounds(part)

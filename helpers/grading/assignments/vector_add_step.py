"""Assignment 03, part 5: a fused optimizer step the course does not ship.

The momentum step of mixed-precision training, SGD with momentum: fp32 weights ``w`` and
momentum ``m``, an fp16 gradient ``g``, and two hyperparameters,

    m_new = BETA * m + g          (g converted to fp32 first)
    w_new = w - LR * m_new

``momentum_step(w, m, g) -> (w_new, m_new)``, both new fp32 tensors. The notebook states the
arithmetic, not the kernel: what it reads and writes, and so its bytes, intensity and time,
the learner works out (5a, 5b, 5e in :mod:`.keys_vector_add`). This module holds 5c-5d (the
kernel, on awkward sizes and special values, watched) and 5f's timing (GPU): the course has
no such kernel, so nothing it ships answers them.
"""

from __future__ import annotations

import torch

from ... import bench
from .. import harness

LR, BETA = 0.01, 0.9
FP16, FP32 = torch.float16, torch.float32
TOLERANCE = (1e-6, 2e-6)      # fp32 rounding: the kernel rounds m_new before it uses it
SIZES = (1, 3, 127, 128, 129, 1023, 1024, 1025, 4097, 100_003)   # 100003 is prime


def reference(w, m, g):
    """``(w_new, m_new)`` in float64 from the fp32 m_new the kernel keeps, cast to fp32."""
    m_new = (BETA * m.double() + g.double()).float()
    return (w.double() - LR * m_new.double()).float(), m_new


class MomentumStep(harness.KernelTask):
    function = "momentum_step"
    call = "momentum_step(w, m, g)"
    spec = "the momentum step"
    outputs = ("w_new", "m_new")
    inputs_named = ("w", "m", "g")
    mask_hint = ("Compute mask = offsets < n_elements and pass mask=mask to every tl.load and "
                 "tl.store.")

    @staticmethod
    def _case(n, values="randn", compiled=False):
        label = f"n={n}" + ("" if values == "randn" else f", {values}")
        return harness.Case(label, {"n": n, "values": values}, compiled=compiled)

    def first(self):
        return self._case(3)

    def cases(self, blocks):
        block = next((v for k, v in (blocks or {}).items() if "BLOCK" in k.upper()
                      and isinstance(v, int)), None)
        sizes = sorted(set(SIZES) | ({block - 1, block, block + 1} if block else set()) - {0})
        return [self._case(n) for n in sizes] + [self._case(1000, "special")]

    def compiled_cases(self, blocks):
        return [self._case(n, compiled=True) for n in (1_000_003, 2**22)]

    def inputs(self, case, device):
        n, g = case.params["n"], harness.generator(case.seed)
        if case.params["values"] == "special":
            pool = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1.0])
            w, m, grad = (pool[torch.randint(0, len(pool), (n,), generator=g)] for _ in range(3))
        else:
            w, m, grad = (torch.randn(n, generator=g) for _ in range(3))
        return w.to(FP32).to(device), m.to(FP32).to(device), grad.to(FP16).to(device)

    def reference(self, case, inputs):
        return reference(*(t.cpu() for t in inputs))

    def compare(self, case, got, want, inputs, blocks):
        w, m, g = (t.cpu() for t in inputs)
        for name, c, ref in zip(self.outputs, got, want):
            bad = harness.close_hint(c, ref, *TOLERANCE)
            if bad is None:
                continue
            count, (i,) = bad
            first = (f"{count} of {case.params['n']} elements of {name} are off; first at index "
                     f"{i}: expected {harness.finite_or_nan(ref[i].item())}, got "
                     f"{harness.finite_or_nan(c[i].item())}")
            return f"{first}. {self._hint(name, c, w, m, g, case)}"
        return None

    @staticmethod
    def _hint(name, c, w, m, g, case) -> str:
        if case.params["values"] != "randn":
            return ("right on ordinary values, wrong on inf, NaN or signed zeros: compute with "
                    "the loaded values as they are, so they come out as the formula gives them")
        if name == "w_new":
            old_m = (w.double() - LR * m.double()).float()
            if harness.close_hint(c, old_m, *TOLERANCE) is None:
                return "w_new uses the old momentum: step w with m_new, the one you just computed"
        if name == "m_new" and harness.close_hint(
                c, (BETA * m.double() + g.half().double()).float(), 1e-3, 1e-3) is None:
            return ("close, but not within fp32 rounding: convert g to fp32 before the "
                    "arithmetic (fp16 keeps 11 bits)")
        return ("check each formula, and that each output is the tensor your kernel stored "
                "into")

    def summary(self, cases):
        sizes = sorted({c.params["n"] for c in cases})
        return f"n = {', '.join(map(str, sizes))} (w, m fp32, g fp16), with inf, NaN and signed zeros"


STEP = MomentumStep()


def step_bytes(n: int) -> int:
    """What one fused step moves: read w, m (fp32) and g (fp16), write w_new and m_new."""
    return n * (4 + 4 + 2 + 4 + 4)


def time_step(n: int, fn) -> dict:
    """``fn(w, m, g)`` timed beside eager PyTorch on the same ``n`` elements (GPU), after a
    check of its result: a row of the shape part 4's judge reads."""
    w, m = (torch.randn(n, device="cuda") for _ in range(2))
    g = torch.randn(n, device="cuda").to(FP16)

    def eager(w, m, g):
        m_new = torch.add(g, m, alpha=BETA)      # casts g to fp32 on the way
        return torch.add(w, m_new, alpha=-LR), m_new

    got = fn(w, m, g)
    m_new = BETA * m + g.float()           # on the GPU: a host copy of 2^28 elements is 1 GiB
    want = (w - LR * m_new, m_new)
    if not (isinstance(got, (tuple, list)) and len(got) == 2
            and all(isinstance(a, torch.Tensor) and a.shape == b.shape
                    and torch.allclose(a.float(), b, atol=1e-5, rtol=1e-5)
                    for a, b in zip(got, want))):
        raise AssertionError(f"momentum_step is wrong at n={n}")
    del want, m_new
    ours = bench.time_ms(lambda: fn(w, m, g))
    ref = bench.time_ms(lambda: eager(w, m, g))
    nbytes = step_bytes(n)
    return {"n": n, "triton_gbps": bench.gbps(nbytes, ours), "torch_gbps": bench.gbps(nbytes, ref)}

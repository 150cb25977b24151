"""Checks for lesson 02 (the roofline): intensities, bounds, predicted times, why a
measured point sits below its roof, and predictions made before a record prints.

Expected answers come from :mod:`helpers.intensity` (counts), :mod:`helpers.prediction`
(bounds and times) and the hardware table; the launch cost comes from the measurement
record the notebook passes in. The predictions (bottom) read the record too: a wrong one
is told what it overlooked, never the recorded value, so the learner can try again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import hardware, intensity, prediction, roofline
from ..dtypes import element_size
from ..feedback import Feedback, _read_number, check_number, choice_word


def check_vector_add_intensity(answer, dtype="fp16") -> Feedback:
    """Exercise: the arithmetic intensity of ``c = a + b`` in ``dtype`` (FLOP/byte)."""
    s = element_size(dtype)
    expected = intensity.vector_add(1, dtype).intensity  # independent of n
    return check_number(
        f"intensity of a {hardware.dtype_key(dtype)} vector add", answer, expected, rel=0.01,
        unit="FLOP/B",
        mistakes=[(1 / (2 * s), "you forgot to count the write of c"),
                  (1 / 3, "you counted elements, not bytes"),
                  (3 * s, "you divided bytes by FLOPs (inverted)"),
                  (1 / (24 * s), "you counted bits, not bytes")],
        hint="1 FLOP per element; bytes per element: read a, read b, write c")


def check_matmul_intensity(answer, n: int, dtype="bf16") -> Feedback:
    """Exercise: the intensity of an ``n x n x n`` matmul, each matrix moved once."""
    work = intensity.matmul(n, n, n, dtype)
    naive = intensity.matmul(n, n, n, dtype, block_m=1, block_n=1)
    s = element_size(dtype)
    return check_number(
        f"intensity of a {n}^3 {hardware.dtype_key(dtype)} matmul", answer, work.intensity,
        rel=0.01, unit="FLOP/B",
        mistakes=[(2 * n**3 / (2 * n * n * s), "you forgot the write of C"),
                  (n**3 / (3 * n * n * s), "you counted n^3 FLOPs; a multiply-add is 2"),
                  (naive.intensity, "you counted the naive kernel that reloads A and B for "
                                    "every output")],
        hint="2 n^3 FLOPs; A and B read once, C written once, each n^2 elements")


def classification_cases() -> dict[str, intensity.Work]:
    """The ops of the classification exercise, labelled as the notebook shows them."""
    return {
        "vector add, 2^28 fp32": intensity.vector_add(2**28, "fp32"),
        "softmax, 32768 x 4096 bf16": intensity.softmax(32768, 4096, "bf16"),
        "layer norm, 1 row of 4096 bf16": intensity.layer_norm(1, 4096, "bf16"),
        "matmul 64^3 bf16": intensity.matmul(64, 64, 64, "bf16"),
        "matmul 1024^3 bf16": intensity.matmul(1024, 1024, 1024, "bf16"),
        "matmul 8192^3 bf16": intensity.matmul(8192, 8192, 8192, "bf16"),
        "attention (tiled), 32 heads, seq 4096, d 128, bf16":
            intensity.attention_tiled(32, 4096, 128, "bf16"),
        "attention (materialised), 32 heads, seq 4096, d 128, bf16":
            intensity.attention_materialised(32, 4096, 128, "bf16"),
    }


def check_classification(answers, launch_us: float, gpu: str = "H100-SXM") -> Feedback:
    """Exercise: label each op of :func:`classification_cases` ``"memory"``,
    ``"compute"`` or ``"latency"`` (a dict: label -> answer)."""
    part = "classify the ops"
    cases = classification_cases()
    if answers is None or answers is Ellipsis:
        return Feedback(part, False, "no answer yet: fill in a dict {op label: 'memory' | "
                        "'compute' | 'latency'}", status="not implemented")
    if not isinstance(answers, dict):
        return Feedback(part, False, f"expected a dict of op label -> bound, got "
                        f"{type(answers).__name__}")
    spec = hardware.lookup(gpu)
    wrong, missing = [], [label for label in cases if label not in answers]
    unknown = [label for label in answers if label not in cases]
    for label, work in cases.items():
        if label not in answers:
            continue
        got = answers[label]
        pred = prediction.predict(work, spec, launch_us=launch_us)
        if got is Ellipsis or got is None:
            missing.append(label)
        elif choice_word(got) not in prediction.BOUNDS:
            wrong.append(f"{label}: {got!r} is not one of {prediction.BOUNDS}")
        elif choice_word(got) != pred.bound:
            wrong.append(f"{label}: you said {choice_word(got)}, but memory "
                         f"{pred.memory_ms * 1e3:.3g} µs, compute {pred.compute_ms * 1e3:.3g} "
                         f"µs, launch {pred.launch_ms * 1e3:.3g} µs: {pred.bound}-bound")
    right = len(cases) - len(wrong) - len(missing)
    if not wrong and not missing and not unknown:
        return Feedback(part, True, f"all {len(cases)} right")
    lines = [f"{right} of {len(cases)} right."]
    lines += wrong
    if missing:
        lines.append("not answered yet: " + "; ".join(missing))
    if unknown:
        lines.append("not an op of the exercise (check the spelling): " + "; ".join(unknown))
    status = "not implemented" if missing and not wrong and right == 0 else ""
    return Feedback(part, False, "\n   ".join(lines), status=status)


def check_predicted_time(answer_us, work: intensity.Work, launch_us: float,
                         gpu: str = "H100-SXM") -> Feedback:
    """Exercise: the roofline's lower bound on ``work``'s time, in microseconds."""
    pred = prediction.predict(work, hardware.lookup(gpu), launch_us=launch_us)
    m, c, lu = pred.memory_ms * 1e3, pred.compute_ms * 1e3, pred.launch_ms * 1e3
    return check_number(
        f"predicted time of {work.op} [{work.shape}]", answer_us, pred.time_ms * 1e3, rel=0.03,
        unit="µs",
        mistakes=[(max(m, c), "you left out the launch cost"),
                  (m + c + lu, "you added the memory and compute times; they overlap, so take "
                               "the larger one"),
                  (c + lu, "you used the compute time where the memory time is larger"),
                  (m + lu, "you used the memory time where the compute time is larger")],
        hint="launch + max(bytes / bandwidth, FLOPs / peak)")


def _below_roof_cases() -> dict:
    small = intensity.matmul(256, 256, 256, "bf16")
    tiles = (256 // 128) ** 2
    h100 = hardware.GPUS["H100-SXM"]
    mat = intensity.attention_materialised(1, 4096, 128, "bf16")
    tiled = intensity.attention_tiled(1, 4096, 128, "bf16")
    return {
        "small matmul": {
            "question": "A 256 x 256 x 256 bf16 matmul reaches a tiny fraction of the roof "
                        "at its own intensity, while large matmuls come close to theirs. Why?",
            "options": {
                "a": "it moves more bytes than the napkin count",
                "b": "it is too small: the launch and the start-up of its few blocks cost "
                     "more than the work, and most SMs have no tile to work on",
                "c": "its intensity is below the ridge point, so it is memory-bound",
                "d": "bf16 tensor cores are slower than the datasheet says",
            },
            "answer": "b",
            "not_it": {
                "a": "its operands are 3 small matrices that fit in L2; it cannot move much "
                     "more than the count",
                "c": "the roof at its intensity already accounts for that: memory-bound ops "
                     "still reach most of their roof (the large vector add does), and its "
                     f"{small.nbytes / 1024:.0f} KiB take a fraction of a microsecond at HBM "
                     "speed",
                "d": "the large matmuls of the same record, on the same tensor cores, reach "
                     "a much larger share of the roof",
            },
            "why": f"256^3 is {small.flops / 1e6:.3g} MFLOP, "
                   f"{small.flops / (h100.peak('bf16') * 1e12) * 1e6:.2g} µs at the peak of an {h100.name}: less than a launch costs; with 128 x 128 "
                   f"output tiles there are {tiles} tiles for {h100.sm_count} SMs.",
        },
        "materialised attention": {
            "question": "Materialised attention does the same FLOPs as the tiled (flash) "
                        "kernel, yet reaches a small fraction of the bf16 roof. Why?",
            "options": {
                "a": "it is too small to fill the GPU",
                "b": "its softmax runs in fp32",
                "c": "the seq x seq scores and probabilities go to DRAM and back, so its "
                     "intensity is far below the ridge: the memory slope limits it",
                "d": "cuBLAS is slower than FlashAttention at matrix products",
            },
            "answer": "c",
            "not_it": {
                "a": f"it has {4096 // 128 * 32} query tiles of 128 rows (seq 4096, 32 heads) "
                     f"for the {h100.sm_count} SMs of an H100: plenty of work",
                "b": "the softmax is a small share of the FLOPs, and the tiled kernel also "
                     "runs it in fp32",
                "d": "its matrix products are ordinary cuBLAS calls; it is the bytes of S "
                     "and P around them that cost",
            },
            "why": f"S and P cost 4 seq^2 elements of traffic per head against 4 seq d for Q, "
                   f"K, V and O: at seq 4096 and d 128 the materialised version moves "
                   f"{mat.nbytes / tiled.nbytes:.3g}x the bytes of the tiled one, for the "
                   "same FLOPs.",
        },
    }


BELOW_ROOF_CASES = _below_roof_cases()


def check_below_roof(answer, case: str) -> Feedback:
    """Exercise: pick the letter that explains why ``case`` sits below its roof."""
    if case not in BELOW_ROOF_CASES:
        raise KeyError(f"no case {case!r}; cases: {', '.join(BELOW_ROOF_CASES)}")
    c = BELOW_ROOF_CASES[case]
    part = f"why the {case} sits below the roof"
    options = tuple(c["options"])
    if answer is None or answer is Ellipsis:
        return Feedback(part, False, f"no answer yet: choose one of {options}",
                        status="not implemented")
    if not isinstance(answer, str) or answer.strip().lower() not in options:
        return Feedback(part, False, f"answer with one of the letters {options}, got {answer!r}")
    letter = answer.strip().lower()
    if letter == c["answer"]:
        return Feedback(part, True, f"{letter!r} is right. {c['why']}")
    return Feedback(part, False, f"{letter!r} is not it: {c['not_it'][letter]}.")


def show_below_roof(case: str) -> None:
    """Print a case's question and options."""
    c = BELOW_ROOF_CASES[case]
    print(c["question"])
    for letter, text in c["options"].items():
        print(f"  {letter}) {text}")


# --------------------------------------------------------------------------------------
# Launch floors: the one the model uses, and what a kernel pays inside a CUDA graph.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchFloors:
    """The fixed cost a kernel pays, measured several ways (microseconds).

    ``isolated_us``: one launch with the L2 flushed before it, how every point of the
    roofline record was timed (its smallest time). The others come from lesson 01's size
    sweep of a tiny copy: ``copy_isolated_us`` timed the same way, ``graph_us`` replayed
    back to back inside a CUDA graph with its data warm in L2, and ``host_us`` the host
    clock per call of a Python loop (``None`` if not recorded).
    """

    isolated_us: float
    copy_isolated_us: float
    graph_us: float
    host_us: float | None
    sources: tuple[str, str]

    def us(self, which: str) -> float:
        if which not in FLOORS:
            raise KeyError(f"no floor {which!r}; floors: {', '.join(FLOORS)}")
        return self.isolated_us if which == "isolated" else self.graph_us

    def table(self) -> str:
        rows = [("one isolated launch, L2 flushed (the model's floor)", self.isolated_us),
                ("  lesson 01's tiny copy, timed the same way", self.copy_isolated_us),
                ("  the copy, back to back in a CUDA graph, per kernel", self.graph_us),
                ("  the copy from a Python loop, host clock per call", self.host_us)]
        lines = [f"{label + ':':<54}{us:6.2f} µs" for label, us in rows if us is not None]
        lines.append(f"one copy on its own costs {self.copy_isolated_us / self.graph_us:.1f}x a "
                     "copy in a graph")
        return "\n".join(lines + [f"sources: {self.sources[0]} (this lesson's ops);",
                                   f"         {self.sources[1]} (lesson 01's copy)"])


FLOORS = ("isolated", "graph")


def launch_floors(roofline_rec, memory_wall_rec) -> LaunchFloors:
    """The floors of two records: ``roofline`` (this lesson's) and ``memory_wall`` (lesson 01's
    size sweep of a copy)."""
    sweep = memory_wall_rec.results["size_sweep"]
    hosts = [r["wall_us_per_call"] for r in sweep if "wall_us_per_call" in r]
    return LaunchFloors(roofline_rec.results["launch_floor_us"],
                        min(r["cold_ms"] for r in sweep) * 1e3,
                        min(r["warm_ms"] for r in sweep) * 1e3, min(hosts) if hosts else None,
                        (roofline_rec.label, memory_wall_rec.label))


def bounds_by_floor(works, floors: LaunchFloors, spec: hardware.GPUSpec) -> str:
    """A table: each op's memory and compute times and its bound under each floor."""
    works = list(works)
    width = max(len(f"{w.op} {w.shape}") for w in works) + 2
    rows = [f"{'op':<{width}}{'memory µs':>10}{'compute µs':>11}" + "".join(
        f"{f'{f} ({floors.us(f):.3g} µs)':>22}" for f in FLOORS)]
    for w in works:
        p = {f: prediction.predict(w, spec, launch_us=floors.us(f)) for f in FLOORS}
        rows.append(f"{w.op + ' ' + w.shape:<{width}}{p['graph'].memory_ms * 1e3:>10.3g}"
                    f"{p['graph'].compute_ms * 1e3:>11.3g}"
                    + "".join(f"{p[f].bound:>22}" for f in FLOORS))
    return "\n".join(rows)


def check_floor_bound(answer, work: intensity.Work, floors: LaunchFloors, which: str,
                      spec: hardware.GPUSpec) -> Feedback:
    """Prediction: the model's bound of ``work`` when each launch costs floor ``which``."""
    part = f"bound of {work.op} [{work.shape}] with the {which} floor"
    pred = prediction.predict(work, spec, launch_us=floors.us(which))
    if answer is None or answer is Ellipsis:
        return Feedback(part, False, f"no answer yet: choose one of {prediction.BOUNDS}",
                        status="not implemented")
    got = choice_word(answer)
    if got not in prediction.BOUNDS:
        return Feedback(part, False, f"answer with one of {prediction.BOUNDS}, got {answer!r}")
    m, c, f = pred.memory_ms * 1e3, pred.compute_ms * 1e3, floors.us(which)
    if got == pred.bound:
        return Feedback(part, True, f"{got!r} is right: memory {m:.3g} µs, compute {c:.3g} µs, "
                        f"floor {f:.3g} µs; the largest decides.")
    others = [o for o in FLOORS if o != which]
    if any(prediction.predict(work, spec, launch_us=floors.us(o)).bound == got for o in others):
        why = (f"that is its bound with the {others[0]} floor; with the {which} floor each "
               f"launch costs {f:.3g} µs: compare that with the op's own times")
    elif got == "latency":
        why = "the floor is not the largest of the three times: work out FLOPs / peak"
    elif got == "memory":
        why = (f"its intensity, {work.intensity:.3g} FLOP/B, is right of the {pred.peak_dtype} "
               f"ridge ({spec.ridge_point(pred.peak_dtype):.3g}): its bytes take less time than "
               "its FLOPs")
    else:
        why = (f"its intensity, {work.intensity:.3g} FLOP/B, is left of the {pred.peak_dtype} "
               f"ridge ({spec.ridge_point(pred.peak_dtype):.3g}): its FLOPs take less time "
               "than its bytes")
    return Feedback(part, False, f"{got!r} is not it: {why}.")


# --------------------------------------------------------------------------------------
# Predictions made before a table or the record prints their answer.
# --------------------------------------------------------------------------------------

# What a fraction of the roof too high or too low overlooks, per point of the record.
ROOF_FRACTION_HINTS = {
    "vector add n=2^28": {
        "high": "no streaming kernel moves data at the datasheet bandwidth (lesson 01's copy "
                "measured how close one gets)",
        "low": "a large vector add streams long, coalesced rows: lesson 01's copy showed how "
               "close that comes to the memory roof"},
    "matmul 1024^3": {
        "high": "the model's time (the isolated floor plus the larger of the bytes' and the "
                "FLOPs' times) is a lower bound: at this size the arithmetic at the bf16 peak "
                "takes less than one isolated launch, and a real product also pays to start "
                "and finish its few tiles, which the model does not count",
        "low": "the product still does 2 GFLOP: the launch floor costs a few microseconds, "
               "comparable with the arithmetic, not orders of magnitude more"},
    "matmul 4096^3": {
        "high": "no real kernel runs at the datasheet peak: the clocks drop under a full "
                "tensor-core load, and starting and finishing each tile costs time the napkin "
                "math does not count",
        "low": "a large square product is the tensor cores' best case: hundreds of tiles keep "
               "every SM busy, and cuBLAS is tuned for exactly this shape"},
    "attention tiled (flash) seq=4096": {
        "high": "right of the ridge only says the bytes are not the limit; how close a kernel "
                "comes to the flat roof depends on how well it keeps the tensor cores fed, and "
                "PyTorch's flash backend was written for the GPU generation before Hopper",
        "low": "it is large (32 heads of 4,096 queries fill every SM) and its bytes are cheap: "
               "it is neither latency- nor memory-bound"},
}
ROOF_FRACTION_TOLERANCE = 0.1  # absolute: 0.1 = within 10 percentage points


def _named_point(points, name: str) -> dict:
    for p in points:
        if p["name"] == name:
            return p
    raise KeyError(f"no point {name!r} in the record; it has {[p['name'] for p in points]}")


def roof_fraction(points, name: str, spec: hardware.GPUSpec) -> float:
    """Measured TFLOP/s of point ``name`` over the roof at its intensity on ``spec``."""
    p = _named_point(points, name)
    w = p["work"]
    return p["tflops"] / roofline.attainable_tflops(w["intensity"], spec, w["peak_dtype"])


def check_roof_fraction(answer, points, name: str, spec: hardware.GPUSpec) -> Feedback:
    """Prediction: the fraction of its roof (0 to 1) point ``name`` of the record reaches."""
    part = f"fraction of the roof, {name}"
    if answer is None or answer is Ellipsis:
        return Feedback(part, False, "no answer yet: a fraction between 0 and 1 (measured "
                        "TFLOP/s over the roof at its intensity)", status="not implemented")
    try:
        value = float(answer) if not isinstance(answer, (bool, str)) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if math.isnan(value) or math.isinf(value):
        return Feedback(part, False, f"expected a number between 0 and 1, got {answer!r}")
    if 1 < value <= 100:
        return Feedback(part, False, f"{value:g} looks like a percentage: answer as a fraction "
                        "(0.5 for 50%)")
    if not 0 < value <= 1:
        return Feedback(part, False, f"{value:g} is not a fraction of the roof: the roof is the "
                        "most the GPU allows at that intensity, so a point sits between 0 and 1")
    frac = roof_fraction(points, name, spec)
    if abs(value - frac) <= ROOF_FRACTION_TOLERANCE:
        return Feedback(part, True, f"{value:g} is within {ROOF_FRACTION_TOLERANCE:g} of the "
                        f"recorded {frac:.3f}")
    side = "high" if value > frac else "low"
    hint = ROOF_FRACTION_HINTS.get(name, {}).get(side, "")
    return Feedback(part, False, f"{value:g} is too {side}" + (f": {hint}." if hint else "."))


def check_ridge_side(answer, work: intensity.Work, spec: hardware.GPUSpec) -> Feedback:
    """Prediction: does ``work`` sit left (``"memory"``) or right (``"compute"``) of the
    ridge point of its roof on ``spec``? Asked before a table prints its intensity."""
    part = f"side of the ridge, {work.op} [{work.shape}]"
    ridge = spec.ridge_point(work.peak_dtype)
    expected = "memory" if work.intensity < ridge else "compute"
    if answer is None or answer is Ellipsis:
        return Feedback(part, False, "no answer yet: choose one of ('memory', 'compute')",
                        status="not implemented")
    got = choice_word(answer)
    if got not in ("memory", "compute"):
        return Feedback(part, False, f"answer with 'memory' or 'compute', got {answer!r}")
    if got == expected:
        return Feedback(part, True, f"{got!r} is right: {work.intensity:.3g} FLOP/B against a "
                        f"{work.peak_dtype} ridge of {ridge:.3g}")
    if got == "compute":
        why = ("being made of matrix products does not make an op compute-bound: count every "
               "byte it moves to and from DRAM, intermediates included, and compare its FLOPs "
               f"per byte with the {work.peak_dtype} ridge point")
    else:
        why = ("count only the bytes that must reach DRAM; what stays on chip is free, and "
               f"then compare its FLOPs per byte with the {work.peak_dtype} ridge point")
    return Feedback(part, False, f"{got!r} is not it: {why}.")


# --------------------------------------------------------------------------------------
# Run-to-run noise: two identical launches (the ``noise`` record).
# --------------------------------------------------------------------------------------

IDENTICAL_GAP_FACTOR = 2.0   # right within a factor of 2 of the recorded gap: the order matters


def check_identical_gap(answer, noise_rec) -> Feedback:
    """Prediction: how far apart, in percent of the slower, the fastest and the slowest of
    the rounds of two identical launches (one Triton configuration, taken in turns) were."""
    from ..plots.noise import identical_gap

    part = "gap between two identical launches"
    value = _read_number(part, answer, "%")
    if isinstance(value, Feedback):
        return value
    if value < 0:
        return Feedback(part, False, f"expected a percentage of at least 0, got {answer!r}")
    gap = 100 * identical_gap(noise_rec)["rounds"]
    if gap / IDENTICAL_GAP_FACTOR <= value <= gap * IDENTICAL_GAP_FACTOR:
        return Feedback(part, True, f"{value:g}% is the right size: the rounds were "
                        f"{gap:.1f}% apart")
    if value < gap / IDENTICAL_GAP_FACTOR:
        if gap / IDENTICAL_GAP_FACTOR <= 100 * value <= gap * IDENTICAL_GAP_FACTOR:
            return Feedback(part, False, f"{value:g} looks like a fraction: answer in percent "
                            "(5 for 5%)")
        return Feedback(part, False, f"{value:g}% is too low: the same code is not the same "
                        "conditions. The SM clock follows power and temperature from round to "
                        "round, and every round times a fresh L2 flush and its own launches")
    return Feedback(part, False, f"{value:g}% is too high: the clock moves by a few percent "
                    "under load, not by halves, and each round is already a median of many "
                    "runs")

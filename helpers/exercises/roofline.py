"""Checks for lesson 02 (the roofline): intensities, bounds, predicted times, and why a
measured point sits below its roof.

Expected answers come from :mod:`helpers.intensity` (counts), :mod:`helpers.prediction`
(bounds and times) and the hardware table; the launch cost comes from the measurement
record the notebook passes in.
"""

from __future__ import annotations

from .. import hardware, intensity, prediction
from ..dtypes import element_size
from ..feedback import Feedback, check_number, choice_word


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

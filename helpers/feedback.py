"""Immediate feedback for exercises: what is wrong, on which input, by how much.

Every ``check_*`` function in the course returns a :class:`Feedback`. In a notebook it
prints one line (a tick or a cross, the part, the reason); the grader reads
``passed`` and ``message`` from the same object, so the learner and the gradebook
always agree.

:func:`check_number` knows the classic slips of napkin math: a value that matches a
*known mistake* (bits for bytes, forgetting the write of the output, GB versus GiB)
gets a message that names the mistake rather than a bare "wrong".
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Feedback:
    part: str
    passed: bool
    message: str
    status: str = ""  # "", "not implemented", "needs a GPU", "error"

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        mark = "✔" if self.passed else ("…" if self.status == "needs a GPU" else "✘")
        return f"{mark} {self.part}: {self.message}"

    __repr__ = __str__


def not_implemented(part: str) -> Feedback:
    return Feedback(part, False, "not implemented yet: replace the `raise NotImplementedError` "
                    "with your code", status="not implemented")


def needs_gpu(part: str) -> Feedback:
    return Feedback(part, False, "needs a GPU: this part is graded on a GPU and costs no "
                    "points in CPU mode", status="needs a GPU")


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0) or (a == b)


def _number(x: float) -> str:
    """12,288 for a whole number a reader can take in at a glance; 4 significant digits else."""
    return f"{x:,.0f}" if x == int(x) and abs(x) < 1e7 else f"{x:.4g}"


# Slips of scale a wrong number often shows: (factor, what it suggests).
_SCALES = ((8, "8 (bits vs bytes?)"), (1e3, "1000 (a unit prefix?)"),
           (1e6, "a million (a unit prefix?)"), (1e9, "a billion (a unit prefix?)"),
           (1024**3 / 1e9, "1.074 (GiB vs GB?)"))


def _read_number(part: str, got, unit: str) -> float | Feedback:
    """``got`` as a finite float, or the Feedback that says why it is not one."""
    u = f" {unit}" if unit else ""
    if got is None or got is Ellipsis:
        return Feedback(part, False, f"no answer yet: set it to a number in{u or ' the stated unit'}",
                        status="not implemented")
    if isinstance(got, bool) or not isinstance(got, (int, float)) and not hasattr(got, "__float__"):
        return Feedback(part, False, f"expected a number{u}, got {type(got).__name__} {got!r}")
    try:
        value = float(got)
    except (TypeError, ValueError):
        return Feedback(part, False, f"expected a single number{u}, got {got!r}")
    if math.isnan(value) or math.isinf(value):
        return Feedback(part, False, f"got {value}; expected a finite number{u}")
    return value


def _scale_slip(matches, value: float) -> str:
    """" Your answer is the expected one times 8 (bits vs bytes?)", if ``matches`` says so."""
    slip = ""
    for factor, name in _SCALES:
        for r, word in ((factor, "times"), (1 / factor, "divided by")):
            if matches(value / r):
                slip = f" Your answer is the expected one {word} {name}"
    return slip


def check_number(part: str, got, expected: float, *, rel: float = 0.02, unit: str = "",
                 mistakes: list[tuple[float, str]] = (), hint: str = "") -> Feedback:
    """Accept ``got`` within ``rel`` (relative) of ``expected`` (lesson exercises: the
    message may show the expected value; graded parts use :func:`graded_number`).

    ``mistakes`` lists ``(value, description)`` pairs: a ``got`` close to one of those
    values gets the description ("you counted bits, not bytes") in its message.
    """
    u = f" {unit}" if unit else ""
    value = _read_number(part, got, unit)
    if isinstance(value, Feedback):
        return value
    if _close(value, expected, rel):
        return Feedback(part, True, f"{_number(value)}{u} is right")
    for wrong, description in mistakes:
        if _close(value, wrong, rel):
            return Feedback(part, False, f"{_number(value)}{u} is what you get if {description}; "
                            f"expected {_number(expected)}{u}")
    off = (value - expected) / expected if expected else float("inf")
    scale = _scale_slip(lambda v: _close(v, expected, rel), value)
    text = (f"{_number(value)}{u} is off by {off:+.1%} (expected {_number(expected)}{u}, "
            f"tolerance {rel * 100:.3g}%).{scale}")
    if hint:
        text += f" Hint: {hint}"
    return Feedback(part, False, text)


def choice_word(got) -> str | None:
    """``" Memory-bound"`` -> ``"memory"``: the word a choice is made of."""
    if not isinstance(got, str):
        return None
    return got.strip().lower().removesuffix("bound").strip(" -_")


def check_choice(part: str, got, expected: str, options: tuple[str, ...],
                 why: str = "") -> Feedback:
    """One answer out of ``options`` (e.g. ``"memory"``, ``"compute"``, ``"latency"``);
    ``"memory-bound"`` counts as ``"memory"``."""
    if got is None or got is Ellipsis:
        return Feedback(part, False, f"no answer yet: choose one of {options}", status="not implemented")
    answer = choice_word(got)
    if answer not in options:
        return Feedback(part, False, f"answer with one of {options}, got {got!r}")
    if answer == expected:
        return Feedback(part, True, f"{expected!r} is right. {why}".strip())
    return Feedback(part, False, f"{got!r} is not it. {why}".strip())


def graded_number(part: str, got, answer, *, unit: str = "", hint: str = "") -> Feedback:
    """A graded napkin-math number against an answer key entry: names the mistake, never
    the answer (not even how far off: a percentage would give it away).

    ``answer`` is an :class:`helpers.grading.answers.Answer`: ``matches(v)``, ``mistake(v)``
    and ``expected``, the same in the instructor's course and in a student release.
    """
    u = f" {unit}" if unit else ""
    value = _read_number(part, got, unit)
    if isinstance(value, Feedback):
        return value
    if answer.matches(value):
        return Feedback(part, True, f"{_number(value)}{u} is right")
    slip = answer.mistake(value)
    if slip:
        return Feedback(part, False, f"{_number(value)}{u} is what you get if {slip}")
    scale = _scale_slip(answer.expected.matches, value)
    text = f"{_number(value)}{u} is not right (within {answer.rel * 100:.3g}%).{scale}"
    if hint:
        text += f" Hint: {hint}"
    return Feedback(part, False, text)


def graded_choice(part: str, got, answer, options: tuple[str, ...], why: str = "") -> Feedback:
    """One answer out of ``options`` against an answer key entry (``"memory-bound"`` counts
    as ``"memory"``)."""
    if got is None or got is Ellipsis:
        return Feedback(part, False, f"no answer yet: choose one of {options}", status="not implemented")
    chosen = choice_word(got)
    if chosen not in options:
        return Feedback(part, False, f"answer with one of {options}, got {got!r}")
    if answer.matches(chosen):
        return Feedback(part, True, f"{chosen!r} is right. {why}".strip())
    return Feedback(part, False, f"{got!r} is not it. {why}".strip())


def target(part: str, met: bool, measured: str, advice: str) -> Feedback:
    """A measured goal (a speed, a bandwidth): what was measured, and advice when it falls
    short."""
    return Feedback(part, met, measured if met else f"{measured}. {advice}")

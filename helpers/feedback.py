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


def _matches(expected, value: float, rel: float) -> bool:
    """``value`` within ``rel`` of ``expected``: a number, or a key entry with ``matches``
    (the student release keeps sealed answers, see :mod:`helpers.grading.answers`)."""
    if hasattr(expected, "matches"):
        return bool(expected.matches(value))
    return _close(value, expected, rel)


# Slips of scale a wrong number often shows: (factor, what it suggests).
_SCALES = ((8, "8 (bits vs bytes?)"), (1e3, "1000 (a unit prefix?)"),
           (1e6, "a million (a unit prefix?)"), (1e9, "a billion (a unit prefix?)"),
           (1024**3 / 1e9, "1.074 (GiB vs GB?)"))


def check_number(part: str, got, expected, *, rel: float = 0.02, unit: str = "",
                 mistakes=(), hint: str = "", reveal: bool = True) -> Feedback:
    """Accept ``got`` within ``rel`` (relative) of ``expected``.

    ``mistakes`` lists ``(value, description)`` pairs: a ``got`` close to one of those
    values gets the description ("you counted bits, not bytes") in its message.

    ``reveal=False`` is for graded parts: the message names the mistake and gives the
    hint but never the expected value, nor how far off the answer is (which would give
    it away). Lesson exercises reveal it.
    """
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
    if _matches(expected, value, rel):
        return Feedback(part, True, f"{_number(value)}{u} is right")
    for wrong, description in mistakes:
        if _matches(wrong, value, rel):
            said = f"{_number(value)}{u} is what you get if {description}"
            if reveal:
                said += f"; expected {_number(expected)}{u}"
            return Feedback(part, False, said)
    scale = ""
    for factor, name in _SCALES:
        for r, word in ((factor, "times"), (1 / factor, "divided by")):
            if _matches(expected, value / r, rel):
                scale = f" Your answer is the expected one {word} {name}"
    if reveal:
        off = (value - expected) / expected if expected else float("inf")
        text = (f"{_number(value)}{u} is off by {off:+.1%} (expected {_number(expected)}{u}, "
                f"tolerance {rel * 100:.3g}%).{scale}")
    else:
        text = f"{_number(value)}{u} is not right (within {rel * 100:.3g}%).{scale}"
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
    if answer.matches(value):
        return Feedback(part, True, f"{_number(value)}{u} is right")
    slip = answer.mistake(value)
    if slip:
        return Feedback(part, False, f"{_number(value)}{u} is what you get if {slip}")
    scale = ""
    for factor, name in _SCALES:
        for r, word in ((factor, "times"), (1 / factor, "divided by")):
            if answer.expected.matches(value / r):
                scale = f" Your answer is the expected one {word} {name}"
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

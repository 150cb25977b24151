"""Answer keys: what a graded number should be, in a form that can travel without the answer.

A graded napkin-math part compares the learner's number with the expected value, within
a relative tolerance, and with the values that known mistakes give ("8 times the answer:
bits, not bytes"), so that its feedback can name the mistake. It must never print the
expected value. In the instructor's course the values come from formulas; a student
release must not carry those formulas, yet the notebook's ``check_*`` calls must still
answer at once. So every check asks one question of an :class:`Expected`:

    ``expected.matches(value) -> bool``    is ``value`` within ``expected.rel`` of it?

and never reads the value itself. There are two kinds:

* :class:`Exact` (instructor side) holds the value: ``math.isclose(v, value, rel_tol=rel)``.
* :class:`Sealed` (student release) holds no value. The line of numbers is cut into bins
  of equal width in log space (``rel / 20`` wide, one bin per sign, and a bin for zero);
  at sealing time the salted SHA-256 digests of the bins that lie *wholly inside* the
  acceptance window are stored; ``matches(v)`` hashes the bin of ``v`` and looks it up.

  **The bound.** Exact accepts ``v`` iff ``ln|v|`` lies in ``[ln|e| + ln(1 - rel),
  ln|e| - ln(1 - rel)]`` (with ``v`` of the sign of ``e``). Sealed accepts only inside
  that window (a bin is stored only if it fits inside), and rejects an accepted value
  only when ``ln|v|`` is less than one bin width (``rel / 20``) from an edge of it: a
  value within about ``rel / 20`` (relative) of ``e * (1 - rel)`` or ``e / (1 - rel)``.
  Far from the answer, or not finite, a value never matches.

  A sealed key hides the value from anyone who *reads* the release (files, feedback);
  it does not stop a search: a loop over the bins finds the answer, as a loop over
  ``check_*`` calls would. The verdict that counts is the grader's, made with the
  instructor's :class:`Exact` keys.

A check of a scale slip works through the same interface: ``expected.matches(v / 8)``
says "your answer is 8 times the right one" without knowing the right one.

**Keys.** An assignment's :class:`Key` maps a part (``"1b"``) to an :class:`Answer`: the
:class:`Expected` of the right value and a list of ``(Expected, description)`` for known
mistakes. Its source, the *values*, is a dict, the format of ``answer_key()``::

    {"1b": (BYTES, 0.02, [(2 * N * 2, "you forget the write of C"), ...]), ...}
     part   value  rel    known mistakes: (value, what the learner did)

* :func:`exact_key` turns values into a :class:`Key` of :class:`Exact` entries;
* :func:`seal` turns them into a JSON-able dict without any value (a fresh salt each
  release: :func:`new_salt`), and :func:`load_sealed` turns that dict into a :class:`Key`.

**Where the values live (the contract with each assignment).** The formulas of assignment
``NN_topic``, graded by the module ``<package>.<topic>`` (e.g.
``helpers.grading.assignments.vector_add``), live in the sibling module
``<package>.keys_<topic>``, whose function ``answer_key()`` returns the values above. The
assignment module never computes an answer itself; it asks::

    KEY = answers.load_key("03_vector_add_intensity",
                           "helpers.grading.assignments.keys_vector_add")

:func:`load_key` imports the formulas module if it exists (the instructor's course:
Exact keys, so the grader judges with the true values, and a stray JSON can never
shadow changed formulas) and otherwise reads the sealed
``helpers/grading/keys/NN_topic.json`` (a student release: ``./course release`` omits
every ``keys_*.py`` under ``helpers/grading/`` and writes those files). Messages and hints
of an assignment module must not use the formulas' values either: in a release they are
not there.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol, runtime_checkable

KEYS_DIR = Path(__file__).resolve().parent / "keys"
BINS_PER_REL = 20           # bin width in log space: rel / BINS_PER_REL
DIGEST_CHARS = 16           # 64 bits of each SHA-256: no accidental match in practice
FORMAT = "triton-course sealed answer key"
VERSION = 1


@runtime_checkable
class Expected(Protocol):
    """What a graded number is compared with; never says what it is."""

    rel: float

    def matches(self, value: float) -> bool:
        """True if ``value`` is within the relative tolerance ``rel`` of the expected one."""
        ...


def _finite(value) -> float | None:
    """``value`` as a finite float, or None (text and booleans are not numbers here)."""
    if isinstance(value, (str, bytes, bool)):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class Exact:
    """The instructor's side: the value itself."""

    value: float
    rel: float = 0.02

    def matches(self, value: float) -> bool:
        v = _finite(value)
        return v is not None and (v == self.value or
                                  math.isclose(v, self.value, rel_tol=self.rel, abs_tol=0.0))

    def __repr__(self) -> str:       # a key printed by accident still shows no value
        return f"Exact(rel={self.rel})"


def _bin(value: float, width: float) -> str:
    """The label of ``value``'s bin: ``"0"``, or its sign and ``floor(ln|value| / width)``."""
    if value == 0:
        return "0"
    return f"{'-' if value < 0 else '+'}{math.floor(math.log(abs(value)) / width)}"


def _digest(salt: str, label: str) -> str:
    return hashlib.sha256(f"{salt}|{label}".encode()).hexdigest()[:DIGEST_CHARS]


@dataclass(frozen=True)
class Sealed:
    """A student release's side: digests of the bins inside the acceptance window."""

    salt: str
    digests: frozenset[str]
    rel: float
    width: float = field(default=0.0)          # bin width in log space; rel / 20 if 0

    def __post_init__(self):
        if not self.width:
            object.__setattr__(self, "width", self.rel / BINS_PER_REL)
        object.__setattr__(self, "digests", frozenset(self.digests))

    def matches(self, value: float) -> bool:
        v = _finite(value)
        if v is None:
            return False
        return _digest(self.salt, _bin(v, self.width)) in self.digests

    @classmethod
    def of(cls, value: float, rel: float, salt: str) -> "Sealed":
        """Seal ``value``: the bins wholly inside ``[|e|(1 - rel), |e| / (1 - rel)]``."""
        e = _finite(value)
        if e is None:
            raise ValueError(f"cannot seal a non-finite value ({value!r})")
        if not 0 < rel < 1:
            raise ValueError(f"a sealed value needs a relative tolerance in (0, 1), got {rel}")
        width = rel / BINS_PER_REL
        if e == 0:      # isclose with abs_tol=0 accepts only zero itself
            return cls(salt, frozenset({_digest(salt, "0")}), rel, width)
        sign = "-" if e < 0 else "+"
        centre, half = math.log(abs(e)), -math.log1p(-rel)
        slack = 1e-12 * max(1.0, abs(centre))       # rounding of the logs: stay inside
        lo, hi = centre - half + slack, centre + half - slack
        first, last = math.ceil(lo / width), math.floor(hi / width) - 1
        labels = [f"{sign}{k}" for k in range(first, last + 1)]
        if not labels:      # cannot happen with BINS_PER_REL >= 2; kept as a guard
            raise ValueError("tolerance too small for the bin width")
        return cls(salt, frozenset(_digest(salt, s) for s in labels), rel, width)

    def __repr__(self) -> str:
        return f"Sealed(rel={self.rel}, {len(self.digests)} bins)"


def word(value) -> str | None:
    """A choice in canonical form: a word (``"memory"``) or a set of words, sorted and joined
    by ``|``; None for anything else. The check normalises spellings before it asks."""
    if isinstance(value, str):
        return value.strip().lower()
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value):
        return "|".join(sorted({v.strip().lower() for v in value}))
    return None


@dataclass(frozen=True)
class ExactWord:
    """A graded choice (a word, or a set of words), on the instructor's side."""

    value: str
    rel: float = 0.0

    def matches(self, value) -> bool:
        return word(value) is not None and word(value) == word(self.value)

    def __repr__(self) -> str:
        return "ExactWord()"


@dataclass(frozen=True)
class SealedWord:
    """A graded choice in a student release: the salted digest of its canonical form."""

    salt: str
    digest: str
    rel: float = 0.0

    def matches(self, value) -> bool:
        w = word(value)
        return w is not None and _digest(self.salt, f"word:{w}") == self.digest

    @classmethod
    def of(cls, value, salt: str) -> "SealedWord":
        return cls(salt, _digest(salt, f"word:{word(value)}"))

    def __repr__(self) -> str:
        return "SealedWord()"


def _is_word(value) -> bool:
    return word(value) is not None


@dataclass(frozen=True)
class Answer:
    """One graded number: the right value and the known mistakes, each an :class:`Expected`."""

    expected: Expected
    mistakes: tuple[tuple[Expected, str], ...] = ()

    @property
    def rel(self) -> float:
        return self.expected.rel

    def matches(self, value: float) -> bool:
        return self.expected.matches(value)

    def mistake(self, value: float) -> str | None:
        """The description of the first known mistake that ``value`` matches, if any."""
        for wrong, description in self.mistakes:
            if wrong.matches(value):
                return description
        return None


class Key(dict):
    """An assignment's answers: part key (``"1b"``) -> :class:`Answer`."""

    def __init__(self, assignment: str, answers: dict[str, Answer]):
        super().__init__(answers)
        self.assignment = assignment

    def __getitem__(self, part: str) -> Answer:
        try:
            return super().__getitem__(part)
        except KeyError:
            raise KeyError(f"the answer key of {self.assignment} has no part {part!r}; it "
                           f"has {sorted(self)}") from None


Values = dict[str, tuple[float, float, Iterable[tuple[float, str]]]]


def exact_key(values: Values, assignment: str = "") -> Key:
    """The instructor's :class:`Key` from ``answer_key()``'s values."""
    return Key(assignment, {
        part: Answer(ExactWord(value), ()) if _is_word(value) else
        Answer(Exact(float(value), rel), tuple((Exact(float(w), rel), str(d)) for w, d in mistakes))
        for part, (value, rel, mistakes) in values.items()})


def new_salt() -> str:
    return secrets.token_hex(16)


def seal(values: Values, salt: str, assignment: str = "") -> dict:
    """``answer_key()``'s values as a JSON-able dict that holds digests, never a value.

    Each number gets its own salt (``salt:part:answer``, ``salt:part:mistake<i>``), so
    equal values in two places give unrelated digests.
    """
    parts = {}
    for part, (value, rel, mistakes) in values.items():
        if _is_word(value):     # a choice: one digest of its canonical form
            parts[part] = {"word": SealedWord.of(value, f"{salt}:{part}:answer").digest}
            continue

        def sealed(v, what):
            s = Sealed.of(float(v), rel, f"{salt}:{part}:{what}")
            return {"digests": sorted(s.digests)}
        parts[part] = {"rel": rel, "answer": sealed(value, "answer"),
                       "mistakes": [dict(sealed(w, f"mistake{i}"), description=str(d))
                                    for i, (w, d) in enumerate(mistakes)]}
    return {"format": FORMAT, "version": VERSION, "assignment": assignment, "salt": salt,
            "bins_per_rel": BINS_PER_REL, "parts": parts}


def load_sealed(data: dict) -> Key:
    """The :class:`Key` of a dict written by :func:`seal`."""
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"not a sealed answer key of version {VERSION}: "
                         f"{data.get('format')!r} version {data.get('version')!r}")
    salt, per = data["salt"], data["bins_per_rel"]

    def sealed(entry, rel, what):
        return Sealed(f"{salt}:{part}:{what}", frozenset(entry["digests"]), rel, rel / per)

    answers = {}
    for part, p in data["parts"].items():
        if "word" in p:
            answers[part] = Answer(SealedWord(f"{salt}:{part}:answer", p["word"]), ())
            continue
        rel = p["rel"]
        answers[part] = Answer(sealed(p["answer"], rel, "answer"), tuple(
            (sealed(m, rel, f"mistake{i}"), m["description"]) for i, m in enumerate(p["mistakes"])))
    return Key(data.get("assignment", ""), answers)


def key_path(assignment: str, keys_dir: Path = KEYS_DIR) -> Path:
    """Where a release keeps the sealed key of ``assignment``."""
    return Path(keys_dir) / f"{assignment}.json"


def load_key(assignment: str, formulas: str, keys_dir: Path = KEYS_DIR) -> Key:
    """The answer key of ``assignment``: Exact from the module ``formulas`` if it exists
    (the instructor's course), else the sealed JSON a release ships (see the top)."""
    try:
        module = importlib.import_module(formulas)
    except ModuleNotFoundError as err:
        if err.name != formulas:
            raise                       # the formulas module exists but imports something missing
        path = key_path(assignment, keys_dir)
        if not path.is_file():
            raise FileNotFoundError(
                f"no answer key for {assignment}: neither the module {formulas} (the "
                f"instructor's course) nor {path} (a student release) exists") from None
        return load_sealed(json.loads(path.read_text()))
    return exact_key(module.answer_key(), assignment)


class LazyKey:
    """:func:`load_key` on first use, then kept: for a key whose formulas are costly to
    evaluate (05's traces its eager version, which imports torch's compiler), so that a
    process that never judges those parts (the clean collection process) never pays."""

    def __init__(self, assignment: str, formulas: str):
        self.assignment, self.formulas, self._key = assignment, formulas, None
        LAZY_KEYS.append(self)

    def load(self) -> Key:
        if self._key is None:
            self._key = load_key(self.assignment, self.formulas)
        return self._key

    def __getitem__(self, part: str):
        return self.load()[part]


LAZY_KEYS: list[LazyKey] = []     # every one made: the judge's fork server loads them once


def load_lazy_keys(assignment: str) -> None:
    """Load the :class:`LazyKey` of ``assignment`` now (in a process that forks judges, each
    child inherits it loaded); one that cannot load says so when it is judged."""
    for key in (k for k in LAZY_KEYS if k.assignment == assignment):
        try:
            key.load()
        except Exception:  # noqa: BLE001 - said by the part that reads it
            pass


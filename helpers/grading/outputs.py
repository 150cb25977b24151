"""Reference outputs of a graded function: exact (instructor) or sealed (student release).

A graded PyTorch function (06's ``merge_states``) is judged element by element against a
reference function's outputs on inputs remade from a seed, within ``atol + rtol * |expected|``
as ``torch.isclose`` has it. The reference function answers the part, so it lives with the
answer formulas in the instructor-only ``keys_<topic>.py`` (:mod:`.answers`), which a
release leaves out. A release carries instead the reference's outputs on the inputs of the
notebook's ``check_*`` call, sealed as :class:`.answers.Sealed` seals one number: for each
element, the salted digests of the bins that lie wholly inside its window, and no value.

The bins are cut in ``t(v) = asinh(v * rtol / atol) / rtol``, which grows like ``v / atol``
near zero and like ``log|v| / rtol`` far from it: every window spans at least about 2 in
``t``, and a bin is :data:`WIDTH` wide. A sealed output accepts only values inside the
window, and every value within about three quarters of it; an infinity matches only itself,
NaN nothing.

Both kinds answer two questions::

    reference.knows(seed) -> bool     does it hold the outputs on this seed's inputs?
    reference.close(seed, outputs) -> [a bool tensor per output] | None (not known)

An exact reference knows every seed; a sealed one the notebook's only.
:func:`load` gives the exact reference where the formulas module exists (the instructor's
course), else the sealed one from the release's key file.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from . import answers

WIDTH = 0.25            # a bin's width in t: a window holds 5 to 8 of them


def _t(v: float, atol: float, rtol: float) -> float:
    return math.asinh(v * rtol / atol) / rtol


def _v(t: float, atol: float, rtol: float) -> float:
    return math.sinh(t * rtol) * atol / rtol


def _label(v: float, atol: float, rtol: float) -> str | None:
    if math.isnan(v):
        return None
    if math.isinf(v):
        return "+inf" if v > 0 else "-inf"
    return str(math.floor(_t(v, atol, rtol) / WIDTH))


def _inside(e: float, atol: float, rtol: float) -> list[str]:
    """The labels of the bins wholly inside the window of the expected value ``e``."""
    if math.isnan(e) or math.isinf(e):
        return [lab] if (lab := _label(e, atol, rtol)) else []
    tol = atol + rtol * abs(e)
    lo, hi = e - tol * (1 - 1e-9), e + tol * (1 - 1e-9)   # rounding of t: stay inside
    first, last = math.ceil(_t(lo, atol, rtol) / WIDTH), math.floor(_t(hi, atol, rtol) / WIDTH)
    return [str(k) for k in range(first, last)
            if _v(k * WIDTH, atol, rtol) >= lo and _v((k + 1) * WIDTH, atol, rtol) <= hi]


def _digest(salt: str, output: int, index: int, label: str) -> str:
    return answers._digest(salt, f"{output}|{index}|{label}")


def seal(entry: dict, salt: str) -> dict:
    """``{"seed", "atol", "rtol", "outputs": [nested lists]}`` (a keys module's
    ``reference_outputs()`` entry) as digests: the shapes, the tolerances, no value."""
    atol, rtol = float(entry["atol"]), float(entry["rtol"])
    shapes, digests = [], set()
    for k, values in enumerate(entry["outputs"]):
        t = torch.tensor(values, dtype=torch.float64)
        shapes.append(list(t.shape))
        for i, e in enumerate(t.flatten().tolist()):
            digests |= {_digest(salt, k, i, lab) for lab in _inside(e, atol, rtol)}
    return {"seed": int(entry["seed"]), "atol": atol, "rtol": rtol, "shapes": shapes,
            "salt": salt, "digests": sorted(digests)}


@dataclass(frozen=True)
class Exact:
    """The instructor's side: the reference function itself, run on the seed's inputs."""

    function: Callable
    inputs: Callable[[int], tuple]
    atol: float
    rtol: float

    def knows(self, seed: int) -> bool:
        return True

    def close(self, seed: int, outputs) -> list[torch.Tensor]:
        want = self.function(*self.inputs(seed))
        return [torch.isclose(g.double(), w.double(), rtol=self.rtol, atol=self.atol)
                for g, w in zip(outputs, want)]


@dataclass(frozen=True)
class Sealed:
    """A student release's side: the digests of the outputs on one seed's inputs."""

    seed: int
    atol: float
    rtol: float
    shapes: tuple
    salt: str
    digests: frozenset

    @classmethod
    def of(cls, data: dict) -> Sealed:
        return cls(int(data["seed"]), float(data["atol"]), float(data["rtol"]),
                   tuple(tuple(s) for s in data["shapes"]), str(data["salt"]),
                   frozenset(data["digests"]))

    def knows(self, seed: int) -> bool:
        return seed == self.seed

    def close(self, seed: int, outputs) -> list[torch.Tensor] | None:
        if not self.knows(seed):
            return None
        out = []
        for k, g in enumerate(outputs):
            flat = [(lab := _label(v, self.atol, self.rtol)) is not None
                    and _digest(self.salt, k, i, lab) in self.digests
                    for i, v in enumerate(g.double().flatten().tolist())]
            out.append(torch.tensor(flat, dtype=torch.bool).reshape(g.shape))
        return out


class Missing:
    """No reference at all (a copy of the course without formulas or sealed key)."""

    def knows(self, seed: int) -> bool:
        return False

    def close(self, seed: int, outputs) -> None:
        return None


def load(assignment: str, formulas: str, part: str, function: str, inputs, atol: float,
         rtol: float, keys_dir: Path = answers.KEYS_DIR):
    """The reference of ``part``: :class:`Exact` with ``formulas.<function>`` if the formulas
    module exists, else :class:`Sealed` from the release's key file (:class:`Missing` if
    that has none)."""
    try:
        module = importlib.import_module(formulas)
    except ModuleNotFoundError as err:
        if err.name != formulas:
            raise
        path = answers.key_path(assignment, keys_dir)
        data = json.loads(path.read_text()) if path.is_file() else {}
        entry = data.get("outputs", {}).get(part)
        return Sealed.of(entry) if entry else Missing()
    return Exact(getattr(module, function), inputs, atol, rtol)

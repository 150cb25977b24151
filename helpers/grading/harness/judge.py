"""Judge, anywhere (in the grader's own process when grading): the raw results of
:mod:`.collect` read as data, each trial's inputs remade from the seed, the reference
computed, the first problem named in the standard words; and a napkin-math part built in
one call (:func:`number_part`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ... import runtime
from ...feedback import Feedback, graded_number, not_implemented
from ..registry import SEED, Part, answer
from .task import Case, KernelTask, dtype_name

MAX_BLOCK = 1 << 20     # Triton's largest block (tl.arange): no kernel's constexpr is larger


@dataclass
class Trial:
    """One trial's raw record and the first problem the verdict found in it."""

    case: Case
    rec: dict
    problem: str | None = None
    extra: dict = field(default_factory=dict)    # what an assignment's compare noted

    @property
    def where(self) -> str:
        return ("compiled on the GPU, " if self.case.compiled else "") + self.case.label

    @property
    def raised(self) -> bool:
        return bool(self.rec.get("error"))

    @property
    def own_launches(self) -> int:
        return int(self.rec.get("own_launches") or 0)


def _int(x) -> int:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0


class Verdict:
    """The problems in one raw record, found the same way for every assignment."""

    def __init__(self, task: KernelTask, raw: dict):
        self.task = task
        if not isinstance(raw, dict) or "trials" not in raw:
            text = raw.get("not_callable") if isinstance(raw, dict) else None
            raise TypeError(f"`{task.function}` should be a function, but it is {text}"
                            if text else "the raw results are not a record of trials")
        self.unwatched = raw.get("unwatched")
        records = [rec for rec in raw["trials"] if isinstance(rec, dict)]
        self.blocks = next((rec.get("blocks") for rec in records
                            if isinstance(rec.get("blocks"), dict) and rec.get("blocks")), {})
        seed = raw.get(SEED)
        odd = None
        if isinstance(seed, int) and records:
            records, odd = self._own_cases(seed, records)
        else:
            records = [(rec, None) for rec in records]
        self.trials = [self._judge(rec, case) for rec, case in records]
        self.watched = [t for t in self.trials if not t.case.compiled]
        self.compiled = [t for t in self.trials if t.case.compiled]
        if odd:
            self._refuse(task.first().seeded(seed), f"the record of the run is not the "
                                                    f"grader's: {odd} (was the grader "
                                                    "tampered with?)")
        elif isinstance(seed, int) and self.trials:
            self._check_cover(seed)

    def _wanted(self, seed: int, first: dict, compiled: bool = True) -> list[Case]:
        """The trials the seed calls for, from the grader's own list: the sizes follow the
        first trial's block sizes, as in collect."""
        task = self.task
        blocks = first.get("blocks") if isinstance(first.get("blocks"), dict) else {}
        wanted = [task.first()]
        if not first.get("not_implemented"):
            wanted += [c for c in task.cases(blocks) if c.label != wanted[0].label]
            if runtime.is_gpu() and compiled:
                wanted += task.compiled_cases(blocks)
        return [c.seeded(seed) for c in wanted]

    def _own_cases(self, seed: int, records: list[dict]):
        """Each record paired with the grader's own case of that label (its parameters are
        the grader's, never the record's), and what is odd about the record, if anything:
        a trial the grader did not ask for, one run twice, block sizes no kernel has."""
        blocks = self.blocks
        if not all(isinstance(k, str) and isinstance(v, (int, bool, str, float)) and
                   (not isinstance(v, int) or abs(v) <= MAX_BLOCK) for k, v in blocks.items()):
            return [], "its block sizes are not a kernel's"
        wanted = {(c.label, c.compiled): c for c in self._wanted(seed, records[0])}
        paired, seen = [], set()
        for rec in records:
            key = (str(rec.get("label", "?")), bool(rec.get("compiled")))
            if key not in wanted:
                return [], f"trial {key[0]} was not asked for"
            if key in seen:
                return [], f"trial {key[0]} was run twice"
            seen.add(key)
            case = wanted[key]
            paired.append((rec, Case(case.label, case.params, _int(rec.get("seed")),
                                     case.compiled)))
        return paired, None

    def _refuse(self, case: Case, problem: str) -> None:
        self.trials.insert(0, Trial(case, {"error": None}, problem))
        self.watched = [t for t in self.trials if not t.case.compiled]
        self.compiled = [t for t in self.trials if t.case.compiled]

    def _check_cover(self, seed: int) -> None:
        """Every trial the seed calls for is in the record, made from that seed.

        The record comes from the learner's process; one that left trials out (the edge
        inputs, say) or ran them on inputs of its own choosing fails here, whatever the
        trials it kept say.
        """
        have = {(t.case.label, t.case.compiled): t.case.seed for t in self.trials}
        compiled = not any(t.raised for t in self.watched)
        for expected in self._wanted(seed, self.trials[0].rec, compiled):
            got = have.get((expected.label, expected.compiled))
            if got != expected.seed:
                why = "is missing" if got is None else "ran on other inputs"
                self._refuse(expected, f"the record of the run is not the grader's: trial "
                                       f"{expected.label} {why} (was the grader tampered "
                                       "with?)")
                return

    # -- one trial ------------------------------------------------------------------

    def _judge(self, rec: dict, case: Case | None = None) -> Trial:
        if case is None:        # a record judged without the grader's seed (the notebook's)
            case = Case(str(rec.get("label", "?")), dict(rec.get("params") or {}),
                        _int(rec.get("seed")), bool(rec.get("compiled")))
        trial = Trial(case, rec)
        trial.problem = self._problem(trial)
        return trial

    def _problem(self, trial: Trial) -> str | None:
        task, rec = self.task, trial.rec
        if rec.get("error"):
            return f"{task.call} raised {rec['error']}"
        inputs = task.inputs(trial.case, "cpu")
        want = task.reference(trial.case, inputs)
        # A case whose outputs hold no element (no rows at all) needs no launch, and no input
        # is read: it is judged on the outputs' form alone.
        empty = all(w.numel() == 0 for w in want)
        if not trial.own_launches and not empty:
            others = rec.get("other_kernels") or []
            if others:
                return (f"{task.function} launched {', '.join(others)}, not a kernel defined "
                        "in your notebook: write and launch your own @triton.jit kernel")
            return (f"{task.function} launched no Triton kernel: it computed the result some "
                    "other way (torch?). Launch your @triton.jit kernel with kernel[grid](...)")
        if rec.get("form"):
            return rec["form"]
        got = rec.get("outputs")
        if not isinstance(got, list) or len(got) != len(task.outputs) \
                or not all(isinstance(t, torch.Tensor) for t in got):
            return "the raw results hold no outputs (was the grader tampered with?)"
        for name, g, w in zip(task.outputs, got, want):
            if tuple(g.shape) != tuple(w.shape):
                return f"{name} has shape {tuple(g.shape)}, expected {tuple(w.shape)}"
            if g.dtype != w.dtype:
                return (f"{name} is {dtype_name(g.dtype)} for {dtype_name(inputs[0].dtype)} "
                        f"inputs: allocate it with the inputs' dtype (torch.empty_like)")
        written = rec.get("written") or []
        where = rec.get("input_device")
        for name, device in zip(task.outputs, rec.get("output_devices") or []):
            if device != where:
                return f"{name} is on {device}, the inputs are on {where}"
        if rec.get("inputs_changed"):
            return f"changed its inputs: {task.call} must only read them"
        wrong = task.compare(trial.case, tuple(got), tuple(want), inputs, self.blocks)
        if wrong:
            return wrong
        read = rec.get("inputs_read")
        unread = [n for n, r in zip(task.inputs_named, read) if not r
                  and n not in task.optional_reads] if isinstance(read, list) else []
        if not empty and unread:
            trial.extra["not_its_work"] = True
            return (f"your kernel never read {', '.join(unread)}: it must compute the output "
                    "from the inputs, not copy a result computed some other way")
        for name, w in zip(task.outputs, written):
            trial.extra["not_its_work"] = True       # until every check below has passed
            if not _int(w.get("given")):
                return (f"returned a {name} your kernel was not given: it must be the output "
                        "your kernel writes, not computed some other way")
            if _int(w.get("unwritten")):
                return (f"{_int(w['unwritten'])} elements of {name} were never stored by your "
                        "kernel: the launcher filled them some other way. Every element of "
                        "the output must come from your kernel's tl.store")
            if _int(w.get("changed")):
                return (f"the launcher changed {_int(w['changed'])} elements of {name} after "
                        "your kernel wrote them: return what the kernel stored")
            trial.extra.pop("not_its_work")
        return None

    # -- the whole battery --------------------------------------------------------------

    @property
    def not_implemented(self) -> bool:
        return any(t.rec.get("not_implemented") for t in self.trials)

    @property
    def failed(self) -> list[Trial]:
        return [t for t in self.watched if t.problem]

    @property
    def violations(self) -> list[tuple[Trial, str]]:
        return [(t, v) for t in self.watched for v in t.rec.get("violations") or []]

    @property
    def crashed(self) -> list[Trial]:
        return [t for t in self.watched if t.raised]

    @property
    def ran_own_kernel(self) -> bool:
        return any(t.own_launches for t in self.trials)

    @property
    def compiled_problem(self) -> str | None:
        bad = next((t for t in self.compiled if t.problem), None)
        return f"{bad.where}: {bad.problem}" if bad else None

    @property
    def correct(self) -> bool:
        return not self.failed and not self.compiled_problem and not self.not_implemented

    def first_failure(self, trials=None) -> str | None:
        failed = [t for t in (self.watched if trials is None else trials) if t.problem]
        if not failed:
            return None
        t = failed[0]
        more = f" ({len(failed)} of {len(trials or self.watched)} calls failed)" \
            if len(failed) > 1 else ""
        return f"{t.where}: {t.problem}{more}"

    # -- the standard parts ---------------------------------------------------------

    def correctness(self, part: str, passed: str, trials=None) -> Feedback:
        """Right on every trial (``trials``: a subset), and on the compiled ones."""
        if self.not_implemented:
            return not_implemented(part)
        failure = self.first_failure(trials)
        if failure:
            return Feedback(part, False, failure)
        if trials is None and self.compiled_problem:
            return Feedback(part, False, self.compiled_problem)
        return Feedback(part, True, passed)

    def in_bounds(self, part: str) -> Feedback:
        """Every load and store of the notebook's kernel stayed inside its tensors."""
        if self.not_implemented:
            return not_implemented(part)
        if self.unwatched:     # this machine's limit, not the learner's: left out of the score
            return Feedback(part, False, self.unwatched, status="not checked here")
        if not self.ran_own_kernel:
            return Feedback(part, False, "no kernel of yours ran, so nothing to check: "
                            f"{self.trials[0].problem}")
        borrowed = [t for t in self.watched if t.extra.get("not_its_work")]
        if borrowed:
            t = borrowed[0]
            return Feedback(part, False, f"your kernel did not compute the output, so its "
                            f"loads and stores say nothing about it: at {t.where}, {t.problem}")
        if self.violations:
            t, v = self.violations[0]
            labels = list(dict.fromkeys(t.case.label for t, _ in self.violations))
            return Feedback(part, False, f"at {t.where}, {v}. Out-of-bounds accesses happened "
                            f"on {'; '.join(labels[:6])}. {self.task.mask_hint}")
        crashed = self.crashed
        if crashed:
            t = crashed[0]
            return Feedback(part, False, f"could not be checked: at {t.where}, {t.problem}; a "
                            "call that fails never shows all the loads and stores it would make")
        return Feedback(part, True, f"every load and store stayed inside {self.task.tensors} "
                        f"on {self.task.summary([t.case for t in self.watched])}")


def verdict_of(task: KernelTask, raw) -> Verdict:
    """The verdict on ``raw``, made once however many parts read it."""
    if isinstance(raw, dict):
        cached = raw.get("__verdict__")
        if isinstance(cached, Verdict):
            return cached
        v = Verdict(task, raw)
        raw["__verdict__"] = v
        return v
    return Verdict(task, raw)


def close_hint(got, want, atol: float, rtol: float) -> tuple[int, tuple] | None:
    """``(count, index of the first)`` of the elements of ``got`` outside the tolerance."""
    g, w = got.float(), want.float()
    ok = (g - w).abs() <= atol + rtol * w.abs()
    ok |= torch.isnan(g) & torch.isnan(w)
    ok |= torch.isinf(w) & (g == w)
    bad = ~ok
    if not bad.any():
        return None
    return int(bad.sum()), tuple(bad.nonzero()[0].tolist())


def finite_or_nan(x: float) -> str:
    return "NaN" if math.isnan(x) else f"{x:.4g}"


def number_part(key, part: str, title: str, points: float, name: str, unit: str,
                hint: str = "") -> Part:
    """A napkin-math part worth ``points``: the notebook's number ``name`` against
    ``key[part]``, the assignment's answer key (read when judged: sealed in a student
    release). The verdict names a known slip, never the answer; ``hint`` is shown when no
    known slip matches."""
    def judge(ns):
        return graded_number(f"{part} {title}", answer(ns, name), key[part], unit=unit,
                             hint=hint)
    return Part(part, title, points, judge, (name,))

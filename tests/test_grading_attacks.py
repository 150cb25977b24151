"""Submissions that attack the grading itself, graded in a class beside honest students.

The verdict is made in the grader's process from raw results collected after the
notebook has run, on inputs made from a seed drawn then, and the grader reads the
notebook's source before it trusts a run: a notebook that patches the course's checks, its
collector or its judge, shadows ``__import__``, or rewrites the record of its run as it is
saved gets no points, its verdicts withheld and flagged for the instructor, and the honest
students beside it keep their marks. (Kernels that leave their output to torch are planted in each assignment's own
tests: tests/test_grading*.py.) The feedback of graded numbers never gives the answer away.
"""

from __future__ import annotations

import importlib
import re

import nbformat
import pytest

import helpers
from helpers.grading import registry

from grading_class import ASSIGNMENT, SOLUTION, grade_class  # tests/grading_class.py
from planting import edit  # tests/planting.py

cpu_only = pytest.mark.skipif(helpers.is_gpu(), reason="expected scores are CPU mode's")

# Replaces every piece of the course a verdict could come from, in its own process: each
# part's judge, the registry's judge and reader, the collector and the harness, and the
# function the grader used to call in the kernel before verdicts moved out of it.
PATCH_THE_GRADER = """
import torch
import helpers.grading.registry as _r
import helpers.grading.harness as _h
from helpers.feedback import Feedback
from helpers.grading.assignments import vector_add as _va

for _p in _va.ASSIGNMENT.parts:
    object.__setattr__(_p, "judge", lambda raw, _p=_p: Feedback(_p.label, True, "full marks"))
_r.judge = lambda part, raw: (Feedback(part.label, True, "full marks"), [])
_r.read_results = lambda path: {"ok": True, "raw": {}}
_r.grade_to_file = lambda *args, **kwargs: None
def _fake_collect(assignment, key, seed, namespace, path):
    torch.save({"ok": True, "raw": {"add_flops": 1e9}}, path)
_r.collect_to_file = _fake_collect
_h.collect = lambda task, namespace, seed: {"trials": []}
"""

# Shadows __import__ in the notebook's namespace: "import helpers..." run there would get
# a module whose every function does nothing.
SHADOW_IMPORT = """
import builtins
import types

class _Hollow(types.ModuleType):
    def __getattr__(self, name):
        return lambda *args, **kwargs: None

_real_import = builtins.__import__

def __import__(name, *args, **kwargs):
    if name.startswith("helpers"):
        return _Hollow(name)
    return _real_import(name, *args, **kwargs)
"""

# Computes with torch, launches nothing, and rewrites the record of its run as it is saved,
# so that it looks like its own kernel wrote every output.
FORGE_THE_RECORD = """
import torch as _t
_orig_save = _t.save
def _forging_save(obj, f, *args, **kwargs):
    raw = obj.get("raw") if isinstance(obj, dict) else None
    if isinstance(raw, dict) and isinstance(raw.get("trials"), list):
        for trial in raw["trials"]:
            trial.update(own_launches=1, other_kernels=[], violations=[], traced=True,
                         inputs_read=[True, True],
                         written=[{"given": 1, "unwritten": 0, "changed": 0}])
    return _orig_save(obj, f, *args, **kwargs)
_t.save = _forging_save

def vector_add(a, b):
    return a + b
"""

LIMITS = ("--cell-timeout", "60", "--part-timeout", "60", "--memory-gb", "3", "--jobs", "2")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    blank = nbformat.read(ASSIGNMENT, as_version=4)
    tmp = tmp_path_factory.mktemp("attacks")
    solution = nbformat.read(SOLUTION, as_version=4)
    return grade_class(tmp, {
        "alice": SOLUTION,
        "patcher": edit(append=[PATCH_THE_GRADER])(blank),
        "shadow": edit(append=[SHADOW_IMPORT])(blank),
        "forger": edit(append=[FORGE_THE_RECORD])(solution),
    }, *LIMITS)


@cpu_only
@pytest.mark.parametrize("attacker", ["patcher", "shadow", "forger"])
def test_an_attacker_gets_what_its_answers_are_worth(graded, attacker):
    assert graded.returncode == 0, graded.output[-3000:]
    report = graded.reports[attacker]
    assert report["score"] == 0, report
    for part in report["parts"]:
        assert part["points"] == 0 and "full marks" not in part["message"], part
        assert part["status"] in ("error", "needs a GPU"), part
    # Its source shows what it did: the verdicts are withheld and the instructor told.
    assert any("tampering" in note for note in report["notes"]), report["notes"]
    row = graded.rows[attacker]
    assert "tampering" in row["notes"], row


@cpu_only
def test_honest_students_beside_attackers_keep_their_marks(graded):
    alice = graded.reports["alice"]
    assert alice["score"] == alice["max_score"] > 0, alice
    graded.assert_honest_unchanged(["alice"])
    graded.assert_repo_unchanged()
    graded.assert_no_leftovers()


# --------------------------------------------------------------------------------------
# Feedback on graded numbers names the mistake, never the answer.
# --------------------------------------------------------------------------------------


def _formats(value: float) -> set[str]:
    """The ways a message could print ``value``."""
    out = {f"{value:.4g}", f"{value:.3g}", f"{value:g}", repr(value)}
    if float(value).is_integer() and abs(value) < 1e16:
        out |= {f"{int(value):,}", str(int(value))}
    return {s for s in out if len(s.replace(".", "").replace(",", "")) >= 3}


def _keys():
    """Each assignment that grades numbers as such, with its answer key (an assignment made
    only of kernels and functions, 06 and 07, has no numbers to leak; 08 grades a function
    against its key, tested in tests/test_grading_08.py)."""
    for name, module in registry.modules().items():
        topic = module.rsplit(".", 1)[1]
        try:
            keys = importlib.import_module(f"helpers.grading.assignments.keys_{topic}")
        except ModuleNotFoundError:
            continue
        if any(p.key in keys.answer_key() for p in registry.get(name).parts):
            yield registry.get(name), keys.answer_key()


def _wrong_values(value, mistakes):
    yield value * 1.37                       # plainly wrong
    yield value * 8                          # a scale slip
    for wrong, _ in mistakes:                # each named mistake
        yield wrong


@pytest.mark.parametrize("spec,values", list(_keys()), ids=lambda x: getattr(x, "name", ""))
def test_graded_numbers_never_print_the_expected_value(spec, values):
    checked = 0
    for part in spec.parts:
        entry = values.get(part.key)
        if part.collect is not None or entry is None or isinstance(entry[0], str):
            continue
        value, _, mistakes = entry
        (name,) = part.names
        for wrong in _wrong_values(value, mistakes):
            fb = part.judge({name: wrong})
            if fb.passed:
                continue
            said = re.sub(re.escape(f"{wrong:,.0f}") if float(wrong).is_integer() else
                          re.escape(f"{wrong:.4g}"), "", fb.message)   # the learner's own number
            for text in _formats(value):
                assert text not in said, (f"{spec.name} {part.key}: the message gives away "
                                          f"the answer ({text}): {fb.message}")
            checked += 1
    assert checked >= 5, "no graded number was checked"


# --------------------------------------------------------------------------------------
# A record of a run must be the one the seed calls for.
# --------------------------------------------------------------------------------------


def _record(seed):
    """The raw results of the course's own vector add, as the grader would collect them."""
    import triton
    import triton.language as tl

    from helpers.grading.assignments import vector_add as va

    namespace = {}
    exec("""
import torch, triton, triton.language as tl

@triton.jit
def add_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    tl.store(c_ptr + offsets, tl.load(a_ptr + offsets, mask=mask)
             + tl.load(b_ptr + offsets, mask=mask), mask=mask)

def vector_add(a, b):
    c = torch.empty_like(a)
    add_kernel[(triton.cdiv(a.numel(), 128),)](a, b, c, a.numel(), BLOCK_SIZE=128)
    return c
""", namespace)
    assert triton and tl
    raw = registry.collect(va.ASSIGNMENT, "kernel", namespace, seed)
    raw[registry.SEED] = seed
    return va, raw


def _verdict(va, raw):
    return registry.judge(va.ASSIGNMENT.part("3a"), raw)[0]


def test_a_record_with_a_trial_left_out_or_reseeded_is_not_the_graders():
    va, raw = _record(1234)
    assert _verdict(va, dict(raw)).passed
    short = dict(raw, trials=[t for t in raw["trials"] if "special" not in t["label"]])
    fb = _verdict(va, short)
    assert not fb.passed and "not the grader's" in fb.message and "is missing" in fb.message, fb
    other = dict(raw, trials=[dict(t, seed=t["seed"] + 1) for t in raw["trials"]])
    fb = _verdict(va, other)
    assert not fb.passed and "ran on other inputs" in fb.message, fb
    # The judge pairs each record with the grader's own case: a record names trials, never
    # their sizes; one the grader did not ask for, one run twice or block sizes no kernel
    # has refuse it, before any reference is computed.
    first = raw["trials"][0]
    asked_for_nothing = dict(raw, trials=raw["trials"] + [dict(first, label="n=10**10")])
    fb = _verdict(va, asked_for_nothing)
    assert not fb.passed and "was not asked for" in fb.message, fb
    fb = _verdict(va, dict(raw, trials=raw["trials"] + [raw["trials"][1]]))
    assert not fb.passed and "run twice" in fb.message, fb
    giant = dict(raw, trials=[dict(t, blocks={"BLOCK_SIZE": 2**40}) for t in raw["trials"]])
    fb = _verdict(va, giant)
    assert not fb.passed and "block sizes" in fb.message, fb
    huge = [dict(t, params=dict(t["params"], n=10**10)) for t in raw["trials"]]
    assert _verdict(va, dict(raw, trials=huge)).passed     # judged on the grader's sizes

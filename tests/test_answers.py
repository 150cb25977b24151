"""Answer keys (helpers.grading.answers): sealed keys agree with exact ones, except within
one bin width of the acceptance window's edges, and carry no value."""

from __future__ import annotations

import json
import math
import random
import re
import sys

import pytest

from helpers.grading import answers
from helpers.grading.answers import (Answer, Exact, Expected, Sealed, exact_key, load_key,
                                     load_sealed, seal)

CASES = [(6e9, 0.02), (1 / 6, 0.02), (120, 0.005), (49152, 0.02), (-3.25, 0.02),
         (1.791044776119403, 0.02), (1e-300, 0.02), (1e300, 0.1), (5.25, 0.001)]


def _window(e, rel):
    """ln|v| at the edges of Exact's window: math.isclose accepts [e(1-rel), e/(1-rel)]."""
    c, half = math.log(abs(e)), -math.log1p(-rel)
    return c - half, c + half


@pytest.mark.parametrize("e, rel", CASES)
def test_sealed_agrees_with_exact_except_one_bin_at_the_edges(e, rel):
    exact, sealed = Exact(e, rel), Sealed.of(e, rel, answers.new_salt())
    assert isinstance(exact, Expected) and isinstance(sealed, Expected)
    lo, hi = _window(e, rel)
    width = rel / answers.BINS_PER_REL
    assert sealed.width == width
    rng = random.Random(0)
    # Uniform over three window widths, and dense sampling within two bins of each edge.
    ts = [rng.uniform(lo - 2 * (hi - lo), hi + 2 * (hi - lo)) for _ in range(4000)]
    ts += [edge + rng.uniform(-2 * width, 2 * width) for edge in (lo, hi) for _ in range(4000)]
    near, disagree = 0, 0
    for t in ts:
        v = math.copysign(math.exp(t), e)
        s, x = sealed.matches(v), exact.matches(v)
        if s:      # conservative: sealed never accepts what exact rejects
            assert x, f"sealed accepts {v!r} outside the window of {e} ± {rel:.1%}"
        if s != x:
            disagree += 1
            ln = math.log(abs(v))
            assert min(abs(ln - lo), abs(ln - hi)) < width * (1 + 1e-9), \
                f"{v!r} is rejected more than one bin width inside the window"
            near += 1
    assert sealed.matches(e) and exact.matches(e)
    assert disagree < len(ts) / 4      # only the edge samples can disagree


@pytest.mark.parametrize("e, rel", CASES)
def test_far_values_wrong_signs_and_non_finite_never_match(e, rel):
    sealed = Sealed.of(e, rel, "salt")
    rng = random.Random(1)
    for _ in range(2000):
        factor = math.exp(rng.choice([-1, 1]) * rng.uniform(3 * rel, 50))
        assert not sealed.matches(e * factor)
    for v in (-e, 0.0, -0.0, math.nan, math.inf, -math.inf, None, str(e), [e], True):
        assert not sealed.matches(v), v
        assert not Exact(e, rel).matches(v), v


def test_zero_and_negative_values():
    zero = Sealed.of(0.0, 0.02, "s")
    assert zero.matches(0.0) and zero.matches(-0.0) and zero.matches(0)
    assert not zero.matches(1e-300) and not zero.matches(-1e-300)
    neg = Sealed.of(-4.0, 0.02, "s")
    assert neg.matches(-4.0) and neg.matches(-4.05) and not neg.matches(4.0)
    with pytest.raises(ValueError):
        Sealed.of(math.nan, 0.02, "s")
    with pytest.raises(ValueError):
        Sealed.of(1.0, 0.0, "s")


def test_integers_numpy_and_torch_scalars_are_numbers():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    s = Sealed.of(120, 0.005, "s")
    for v in (120, 120.0, np.float32(120), np.int64(120), torch.tensor(120.0)):
        assert s.matches(v), type(v)


VALUES = {"1a": (1e9, 0.02, [(2e9, "two FLOPs per add"), (3e9, "a FLOP per value")]),
          "1b": (6e9, 0.02, [(4e9, "the write of C forgotten"), (48e9, "bits, not bytes"),
                             (6.0, "gigabytes")]),
          "2d": (120, 0.005, [(239, "an FMA as one FLOP")])}


def test_seal_round_trip_through_json_names_mistakes_and_scales():
    data = json.loads(json.dumps(seal(VALUES, answers.new_salt(), "99_test")))
    key, exact = load_sealed(data), exact_key(VALUES, "99_test")
    assert set(key) == set(exact) == set(VALUES)
    for k in (key, exact):
        b = k["1b"]
        assert isinstance(b, Answer) and b.rel == 0.02
        assert b.matches(6.05e9) and not b.matches(6.5e9)
        assert b.mistake(4e9) == "the write of C forgotten"
        assert b.mistake(4.8e10) == "bits, not bytes"
        assert b.mistake(6.01) == "gigabytes"
        assert b.mistake(6e9) is None and b.mistake(7e9) is None
        # A scale slip, checked through the same interface: 8x the answer.
        assert b.expected.matches(4.8e10 / 8) and not b.expected.matches(4.8e10)
        assert k["2d"].matches(120) and not k["2d"].matches(121) and not k["2d"].matches(119)
    with pytest.raises(KeyError, match="no part '9z'"):
        key["9z"]


def test_a_sealed_key_holds_no_value_and_salts_differ():
    text = json.dumps(seal(VALUES, "fixed-salt", "99_test"))
    # Whole tokens only: a hex digest may well contain "6e9" or "120".
    tokens = set(re.findall(r"[\w.,+-]+", text))
    for needle in ("6000000000", "6e9", "6e+09", "6.0e+09", "6,000,000,000", "1000000000",
                   "1e9", "48000000000", "4e9", "120", "239", "6000000000.0"):
        assert needle not in tokens, needle
    a, b = seal(VALUES, "one", ""), seal(VALUES, "two", "")
    assert not set(a["parts"]["1b"]["answer"]["digests"]) & set(b["parts"]["1b"]["answer"]["digests"])
    # The same value in two places gets unrelated digests (no cross-part correlation).
    twin = seal({"x": (5.0, 0.02, []), "y": (5.0, 0.02, [])}, "s", "")
    assert not set(twin["parts"]["x"]["answer"]["digests"]) & set(twin["parts"]["y"]["answer"]["digests"])
    assert "6" not in repr(load_sealed(seal(VALUES, "s"))["1b"].expected)
    assert "6" not in repr(exact_key(VALUES)["1b"].expected)   # not even in a printed key


def test_a_wrong_format_is_refused():
    with pytest.raises(ValueError, match="not a sealed answer key"):
        load_sealed({"format": "something else", "version": 1})


def test_load_key_prefers_the_formulas_then_the_sealed_file(tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg_answers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "keys_topic.py").write_text(
        "def answer_key():\n    return {'1a': (6e9, 0.02, [(4e9, 'the write of C')])}\n")
    (pkg / "keys_broken.py").write_text("import a_module_that_is_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    keys = tmp_path / "keys"
    keys.mkdir()
    key = load_key("99_topic", "fakepkg_answers.keys_topic", keys)
    assert isinstance(key["1a"].expected, Exact) and key.assignment == "99_topic"
    # Without the formulas module: the sealed file.
    (keys / "99_other.json").write_text(json.dumps(seal(VALUES, "s", "99_other")))
    key = load_key("99_other", "fakepkg_answers.keys_other", keys)
    assert isinstance(key["1b"].expected, Sealed) and key["1b"].matches(6e9)
    with pytest.raises(FileNotFoundError, match="no answer key for 99_none"):
        load_key("99_none", "fakepkg_answers.keys_none", keys)
    # A formulas module with a bug of its own is an error, not a silent fallback.
    with pytest.raises(ModuleNotFoundError, match="a_module_that_is_not_there"):
        load_key("99_other", "fakepkg_answers.keys_broken", keys)
    for name in [m for m in sys.modules if m.startswith("fakepkg_answers")]:
        monkeypatch.delitem(sys.modules, name)

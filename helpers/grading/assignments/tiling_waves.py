"""Assignment 04, part 5: which setting to launch for a shape, from the recorded sweep.

Lesson 04's knob sweep (the ``tiling`` record, H100, fp16, 4096^3) measured settings of the
tiled kernel: tile, stages, warps, what the compiler made of each (registers per thread,
shared memory per program) and its TFLOP/s. At 4096^3 every setting keeps every SM busy for
several waves. On other shapes a setting pays for what its waves leave idle: partial tiles at
the edges of Y, and program slots of the last wave that hold no tile. The learner writes

* 5a ``waves(M, N, setting)``: how many waves the setting's programs take on the H100 for an
  M x N output (a wave: every SM running as many programs of it as fit at once);
* 5b ``choose_setting(M, N)``: the setting to launch for that shape, judged by its predicted
  speed: the recorded speed with the share of its 4096^3 waves that did work divided out,
  times the share of its waves on M x N that do work. Within 3 % of the best setting's,
  on shapes the grader draws (some just past a whole wave).

Nothing here is the learner's answer: the judge works the model forward for every setting
and compares; the occupancy is :func:`helpers.compiled.occupancy`'s (lesson 04).
"""

from __future__ import annotations

import math
import random

from ... import compiled, hardware, records
from ...feedback import Feedback, not_implemented
from ..registry import SEED, MissingAnswer, answer, is_not_implemented

WAVES, CHOOSE = "waves", "choose_setting"
GPU = hardware.GPUS["H100-SXM"]
RECORD_N = 4096
KNOBS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")
GOAL = 0.97                    # 5b: the chosen setting's predicted speed / the best's
DRAWS = 12


def settings() -> list[dict]:
    """The sweep's settings that ran (the record's ``knobs`` rows with a speed)."""
    rows = records.load("tiling", "H100-SXM").results["knobs"]
    return [r for r in rows if not r.get("cublas") and r.get("tflops")
            and r.get("n") == RECORD_N and r.get("dtype") == "fp16"]


def per_sm(setting: dict) -> int:
    """Programs of ``setting`` one H100 SM runs at once (lesson 04's occupancy)."""
    found = compiled.Resources(kernel="matmul", capability=90, num_warps=setting["num_warps"],
                               num_stages=setting["num_stages"],
                               registers_per_thread=setting["registers"],
                               shared_bytes=setting["shared_bytes"])
    return compiled.occupancy(found, GPU).programs_per_sm


def wave_count(M: int, N: int, setting: dict) -> int:
    tiles = math.ceil(M / setting["BLOCK_M"]) * math.ceil(N / setting["BLOCK_N"])
    return math.ceil(tiles / (GPU.sm_count * per_sm(setting)))


def busy(M: int, N: int, setting: dict) -> float:
    """The share of the program slots of all the waves that compute elements of Y."""
    slots = wave_count(M, N, setting) * GPU.sm_count * per_sm(setting)
    return M * N / (slots * setting["BLOCK_M"] * setting["BLOCK_N"])


def predicted_tflops(M: int, N: int, setting: dict) -> float:
    return setting["tflops"] / busy(RECORD_N, RECORD_N, setting) * busy(M, N, setting)


def draws(seed: int) -> list[tuple[int, int]]:
    """``(M, N)``: sizes from a single tile to 16384, and shapes whose tiles land just past a
    whole number of waves, four of them of the fastest setting at 4096^3 (one or two waves
    and a few tiles: where it is not the one to launch)."""
    rng, table = random.Random(seed), settings()
    fastest = max(table, key=lambda r: r["tflops"])
    out = [(rng.randint(64, 16384), rng.randint(64, 16384)) for _ in range(DRAWS // 2)]
    while len(out) < DRAWS:
        s = fastest if len(out) < DRAWS - 2 else rng.choice(table)
        slots = GPU.sm_count * per_sm(s)
        tiles_n = rng.randint(2, 40)
        whole = rng.randint(1, 2) if s is fastest else rng.randint(1, 4)
        tiles_m = math.ceil((whole * slots + rng.randint(1, 8)) / tiles_n)
        out.append((tiles_m * s["BLOCK_M"] - rng.randint(0, s["BLOCK_M"] - 1),
                    tiles_n * s["BLOCK_N"] - rng.randint(0, s["BLOCK_N"] - 1)))
    return out


def _plain(v):
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in list(v.items())[:20]}
    try:
        return int(v) if float(v) == int(v) else float(v)
    except (TypeError, ValueError, OverflowError):
        return repr(v)[:80]


def collect(ns, seed) -> dict:
    """In the learner's process: both functions on the draws of ``seed``, as plain data."""
    out, table = {}, settings()
    for name in (WAVES, CHOOSE):
        try:
            fn = answer(ns, name)
        except MissingAnswer:
            out[name] = {"missing": name}
            continue
        got = {}
        for i, (M, N) in enumerate(draws(seed)):
            args = (M, N, dict(table[i % len(table)])) if name == WAVES else (M, N)
            try:
                got[i] = _plain(fn(*args))
            except Exception as err:  # noqa: BLE001 - the learner's error, reported
                if is_not_implemented(err):
                    got = {"not_implemented": True}
                    break
                got[i] = f"raised {type(err).__name__}: {str(err)[:200]}"
        out[name] = got
    return out


def _mine(raw, name):
    got = raw.get(name) or {}
    if got.get("missing"):
        raise MissingAnswer(got["missing"])
    return got


def _value(got, i):
    return got.get(i, got.get(str(i)))


def judge_waves(raw) -> Feedback:
    part, got = "5a waves of a setting", _mine(raw, WAVES)
    if got.get("not_implemented"):
        return not_implemented(part)
    table = settings()
    for i, (M, N) in enumerate(draws(raw.get(SEED, 0))):
        s, value = table[i % len(table)], _value(got, i)
        call = (f"waves({M}, {N}, {{BLOCK_M: {s['BLOCK_M']}, BLOCK_N: {s['BLOCK_N']}, "
                f"num_stages: {s['num_stages']}, num_warps: {s['num_warps']}, ...}})")
        if isinstance(value, str) and value.startswith("raised"):
            return Feedback(part, False, f"{call} {value}")
        if not isinstance(value, (int, float)):
            return Feedback(part, False, f"{call} returned {value!s:.60}: the answer is a whole "
                            "number of waves")
        want = wave_count(M, N, s)
        if value == want:
            continue
        tiles = math.ceil(M / s["BLOCK_M"]) * math.ceil(N / s["BLOCK_N"])
        if value == math.ceil(tiles / GPU.sm_count) and per_sm(s) > 1:
            why = ("an SM runs more than one program of this setting at once: its registers, "
                   "shared memory and warps leave room for several (lesson 04's occupancy)")
        elif value == math.ceil(M * N / (s["BLOCK_M"] * s["BLOCK_N"] * GPU.sm_count *
                                          per_sm(s))):
            why = "a partial tile at an edge of Y still takes a whole program"
        elif value < want:
            why = "too few: count the tiles, and the programs a wave holds"
        else:
            why = "too many: a wave holds every program the SMs can run at once"
        return Feedback(part, False, f"{call}: {why}")
    return Feedback(part, True, f"right on {DRAWS} shapes and settings of the grader's drawing")


def _row(value, table):
    """The setting a learner's answer names: an index into the table or a row of it."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(table):
        return table[value]
    if isinstance(value, dict):
        for row in table:
            if all(value.get(k) == row[k] for k in KNOBS):
                return row
    return None


def judge_choice(raw) -> Feedback:
    part, got = "5b the setting to launch", _mine(raw, CHOOSE)
    if got.get("not_implemented"):
        return not_implemented(part)
    table, worst = settings(), 1.0
    for i, (M, N) in enumerate(draws(raw.get(SEED, 0))):
        value = _value(got, i)
        if isinstance(value, str) and value.startswith("raised"):
            return Feedback(part, False, f"choose_setting({M}, {N}) {value}")
        row = _row(value, table)
        if row is None:
            return Feedback(part, False, f"choose_setting({M}, {N}) returned {value!r:.80}: "
                            "return a row of the table (or its index)")
        speeds = [predicted_tflops(M, N, s) for s in table]
        share = predicted_tflops(M, N, row) / max(speeds)
        worst = min(worst, share)
        if share >= GOAL:
            continue
        best = table[max(range(len(table)), key=speeds.__getitem__)]
        if busy(M, N, row) < busy(M, N, best):
            why = ("its waves leave more of the GPU idle there than a slower setting's do: "
                   "weigh the recorded speed by the share of the program slots that work")
        else:
            why = ("another setting is faster there and wastes no more of its waves: take the "
                   "recorded speed into account, with its own 4096^3 waves divided out")
        return Feedback(part, False, f"choose_setting({M}, {N}): predicted {share:.0%} of the "
                        f"best setting's speed (the goal: {GOAL:.0%}); {why}")
    return Feedback(part, True, f"within {1 - worst:.1%} of the best setting's predicted speed "
                    f"on {DRAWS} shapes of the grader's drawing")

"""Assignment 07, autotuning: ``config_space()``, ``prune`` and ``shape_key`` for lesson 05's
online softmax (:func:`helpers.kernels.softmax.softmax_kernel_online`), a kernel the course
launches by one rule and never tuned (15 points; 12 in CPU mode, 3 on a GPU).

No rule is stated to the learner: the notebook shows half of a recorded sweep (every
setting of the kernel's three knobs timed on 24 shapes, :mod:`helpers.experiments.
softmax_tuning`) and the learner derives a space, a pruning rule and a key from it. The
verdicts are read from the whole sweep, the 12 shapes the notebook does not show included,
and from shapes the grader draws from its seed; on a GPU part 4 tunes on a shape of
neither. A message names the shape and what went wrong, never a space, rule or key.
"""

from __future__ import annotations

import math
import random
import time
from functools import lru_cache

import torch
import triton

from ... import records
from ...feedback import Feedback, not_implemented, target
from ..gpu import gpu_lock
from ..registry import SEED, Assignment, Part, answer, check_function, is_not_implemented

RECORD = "softmax_tuning"
KNOBS = ("BLOCK_SIZE",)                        # a config's kwargs; warps and stages apart
SETTING = ("BLOCK_SIZE", "num_warps", "num_stages")
SHOWN_COLS = (500, 3000, 12000, 50000)         # the notebook's table; the rest is held out
SPACE_MAX = 12          # settings in a space: each costs a compile and a timing per key
COVER = 1.10            # 1b, 2a: the best of what you keep, over the sweep's best
PRUNE_MAX = 18          # 2b: settings a prune may keep of the sweep's grid, on any shape
SHARE = 1.10            # 3a: one shape's best setting on another shape of the same key
KEYS_MAX, KEY_DRAWS = 64, 300   # 3b: distinct keys over the grader's drawn shapes
GOAL = 1.10             # 4: the tuner's choice over the best of the space's full sweep
LAUNCH = {"grid": (1,), "warmup": False}       # what a tuner passes on, besides named_args


@lru_cache(maxsize=1)
def sweep() -> dict:
    """The recorded sweep: ``{"gpu", "grid": [setting], "ms": {(M, N): {setting: ms}}}``."""
    rec = records.load(RECORD)
    grid = [tuple(g) for g in rec.results["grid"]]
    ms = {tuple(s): dict(zip(grid, times))
          for s, times in zip(rec.results["shapes"], rec.results["ms"])}
    return {"gpu": rec.gpu, "grid": grid, "ms": ms}


def shapes() -> list[tuple[int, int]]:
    return list(sweep()["ms"])


def _where(shape) -> str:
    seen = "" if shape[1] in SHOWN_COLS else ", a shape the notebook does not show"
    return f"{shape[0]} rows x {shape[1]} columns{seen}"


def _best(shape) -> tuple[tuple, float]:
    times = sweep()["ms"][shape]
    s = min(times, key=times.get)
    return s, times[s]


def describe(s) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(SETTING, s))


def named_args(M: int, N: int, dtype=torch.float16, device="meta") -> dict:
    """What the autotuner hands a pruning function for an ``M x N`` softmax (meta tensors:
    a shape and a dtype, no memory)."""
    x, y = (torch.empty((M, N), dtype=dtype, device=device) for _ in range(2))
    return dict(x_ptr=x, y_ptr=y, n_cols=N, x_row_stride=N, y_row_stride=N)


def _entry(c) -> dict:
    """One configuration as data the judge reads without running anything."""
    def plain(v):
        return v if v is None or type(v) in (int, float, str) else repr(v)[:40]
    if not isinstance(c, triton.Config) or not isinstance(c.kwargs, dict):
        return {"type": type(c).__name__}
    return {"type": "Config", "kwargs": {str(k): plain(v) for k, v in c.kwargs.items()},
            "num_warps": plain(c.num_warps), "num_stages": plain(c.num_stages)}


def invalid(e: dict) -> str | None:
    """Why one configuration is not a setting the sweep measured, or None."""
    if e.get("type") != "Config":
        return f"is a {e.get('type')}, not a triton.Config"
    if set(e["kwargs"]) != set(KNOBS):
        return (f"sets {', '.join(sorted(e['kwargs'])) or 'nothing'}: a configuration sets "
                "exactly BLOCK_SIZE (with num_warps and num_stages beside it)")
    if _setting(e) not in sweep()["grid"]:
        return (f"is {describe(_setting(e))}, not one of the settings the sweep measured: "
                "choose from the table, whose settings are the ones timed")
    return None


def _setting(e: dict) -> tuple:
    return (e["kwargs"].get("BLOCK_SIZE"), e.get("num_warps"), e.get("num_stages"))


def config(s) -> triton.Config:
    return triton.Config({"BLOCK_SIZE": s[0]}, num_warps=s[1], num_stages=s[2])


# --- Part 1: the space. ----------------------------------------------------------------

def _collect_space(ns, seed) -> dict:
    space = answer(ns, "config_space")()
    return {"entries": [_entry(c) for c in space[:1000]]} if isinstance(space, (list, tuple)) \
        else {"type": type(space).__name__}


def _nearest_knob(shape, have) -> str:
    """Which knob of the winner at ``shape`` no setting of ``have`` comes near."""
    win, _ = _best(shape)
    if not any(s[0] == win[0] for s in have):
        return "no setting of your space has the BLOCK_SIZE of the fastest ones there"
    return ("your space has their BLOCK_SIZE, but not with the num_warps (or num_stages) "
            "that make it fast")


def _space(part: str, raw) -> Feedback:
    if "entries" not in raw:
        return Feedback(part, False, f"config_space() returns a {raw.get('type')}: return a "
                        "list of triton.Config")
    entries = raw["entries"]
    bad = next((i for i, e in enumerate(entries) if invalid(e)), None)
    settings = [_setting(e) for e in entries if invalid(e) is None]
    twice = next((s for i, s in enumerate(settings) if s in settings[:i]), None)
    if part.startswith("1a"):
        problem = (f"configuration {bad} of your space {invalid(entries[bad])}"
                   if bad is not None else "config_space() is empty" if not settings
                   else f"{describe(twice)} appears twice: a duplicate only costs tuning "
                   "time" if twice else f"{len(settings)} settings: at most {SPACE_MAX} (each "
                   "costs a compile and a timing at every new key)"
                   if len(settings) > SPACE_MAX else None)
        return Feedback(part, problem is None, problem or f"{len(settings)} settings, each "
                        "one the sweep measured")
    if not settings:
        return Feedback(part, False, "no valid setting in the space (part 1a)")
    for shape in shapes():
        times = sweep()["ms"][shape]
        ratio = min(times[s] for s in settings) / _best(shape)[1]
        if ratio > COVER:
            return Feedback(part, False, f"at {_where(shape)}: the best of your space runs "
                            f"more than {COVER - 1:.0%} slower than the sweep's best: "
                            f"{_nearest_knob(shape, settings)}")
    return Feedback(part, True, f"within {COVER - 1:.0%} of the sweep's best on all "
                    f"{len(shapes())} recorded shapes, the {len(shapes()) // 2} the notebook "
                    "does not show included")


# --- Part 2: the pruning function. -----------------------------------------------------

def drawn_prunes(seed) -> list[dict]:
    """Shapes off the record, the edges among them, each with the whole grid or with a few
    settings only (a tuner's list need not hold any setting a rule would pick)."""
    r, out = random.Random(f"{seed}/prune"), []
    grid = sweep()["grid"]
    for M in (1, 7, 64, 300, 5000, 65536):
        for N in (1, 17, r.randint(600, 5000), r.randint(20000, 90000), 262144):
            out.append({"M": M, "N": N, "given": grid if (M + N) % 2 else r.sample(grid, 3)})
    return out


def _run_prune(fn, M, N, given) -> dict:
    configs = [config(s) for s in given]
    passed = list(configs)
    try:
        out = fn(passed, named_args(M, N), **LAUNCH)
    except Exception as err:  # noqa: BLE001 - recorded; the judge says what it means
        if is_not_implemented(err):
            raise
        hint = (" (the autotuner passes keyword arguments too: def prune(configs, named_args, "
                "**kwargs))" if "keyword argument" in str(err) else "")
        return {"error": f"{type(err).__name__}: {err}"[:300] + hint}
    if not isinstance(out, (list, tuple)):
        return {"returned": type(out).__name__}
    return {"mutated": passed != configs,
            "kept": [list(_setting(e)) if e.get("type") == "Config" else None
                     for e in map(_entry, out)]}


def _collect_prune(ns, seed) -> dict:
    fn, grid = answer(ns, "prune"), sweep()["grid"]
    return {"recorded": [_run_prune(fn, M, N, grid) for M, N in shapes()],
            "drawn": [_run_prune(fn, t["M"], t["N"], t["given"]) for t in drawn_prunes(seed)]}


def _kept(rec, given, where) -> list | str:
    """The settings a prune kept, or what is wrong with its answer."""
    if "error" in rec:
        return f"your prune raised {rec['error']} at {where}"
    if "returned" in rec:
        return f"your prune returns a {rec['returned']}: return the list of the configs it keeps"
    if rec["mutated"]:
        return ("your prune changes the list it is given: the autotuner passes its own list, so "
                "the next shape would see fewer settings; build a new list")
    kept = [tuple(k) if isinstance(k, list) else k for k in rec["kept"]]
    stray = next((k for k in kept if k not in given), "none")
    if stray != "none":
        return (f"your prune returns {describe(stray) if stray else 'something not a Config'}, "
                f"which it was not given ({where})")
    if not kept:
        return (f"your prune keeps nothing at {where}: the autotuner then has nothing to run "
                "and the launch fails. Keep at least one of what you are given")
    return kept


def _missed(win, kept) -> str:
    """Which way the fastest setting lies from what a prune kept (never the setting)."""
    blocks = sorted({k[0] for k in kept})
    if win[0] > blocks[-1]:
        return "the fastest settings there have larger blocks than any it keeps"
    if win[0] < blocks[0]:
        return "the fastest settings there have smaller blocks than any it keeps"
    warps = sorted({k[1] for k in kept if k[0] == win[0]})
    if not warps:
        return "it keeps blocks on both sides of the fastest ones, not theirs"
    side = "more" if win[1] > warps[-1] else "fewer" if win[1] < warps[0] else "other"
    return f"it keeps their BLOCK_SIZE, but the fastest run it with {side} warps (or stages)"


def _prune_judge(part, raw) -> Feedback:
    grid, recs = sweep()["grid"], raw.get("recorded") or []
    if len(recs) != len(shapes()):
        return Feedback(part, False, "the record does not hold the grader's trials")
    most = 0
    for shape, rec in zip(shapes(), recs):
        kept = _kept(rec, grid, _where(shape))
        if isinstance(kept, str):
            return Feedback(part, False, kept)
        most = max(most, len(kept))
        if part.startswith("2a"):
            times, (win, best) = sweep()["ms"][shape], _best(shape)
            if min(times[s] for s in kept) > COVER * best:
                return Feedback(part, False, f"at {_where(shape)}: your prune drops every "
                                f"setting within {COVER - 1:.0%} of the sweep's best: "
                                f"{_missed(win, kept)}")
        elif len(kept) > PRUNE_MAX:
            return Feedback(part, False, f"at {_where(shape)}: your prune keeps {len(kept)} of "
                            f"the {len(grid)} settings: at most {PRUNE_MAX}; the tuner times "
                            "every one it keeps, at every new key")
    return Feedback(part, True, f"a setting within {COVER - 1:.0%} of the best kept on all "
                    f"{len(shapes())} recorded shapes" if part.startswith("2a") else
                    f"at most {most} of the {len(grid)} settings kept on any recorded shape")


def _prune_anywhere(part, raw) -> Feedback:
    trials, recs = drawn_prunes(raw[SEED]), raw.get("drawn") or []
    if len(recs) != len(trials):
        return Feedback(part, False, "the record does not hold the grader's trials")
    for t, rec in zip(trials, recs):
        where = f"{t['M']} rows x {t['N']} columns, given {len(t['given'])} settings"
        kept = _kept(rec, [tuple(s) for s in t["given"]], where)
        if isinstance(kept, str):
            return Feedback(part, False, kept)
    return Feedback(part, True, f"a new, non-empty list on {len(trials)} shapes from 1 x 1 to "
                    "65536 x 262144, given the whole grid or three settings")


# --- Part 3: the shape key. ------------------------------------------------------------

def drawn_shapes(seed) -> list[tuple[int, int]]:
    """Rows from 1 to 65536 and columns from 1 to 262144, log-uniform, edges included."""
    r = random.Random(f"{seed}/key")
    out = [(1, 1), (1, 262144), (65536, 1), (65536, 262144)]
    while len(out) < KEY_DRAWS:
        out.append((int(math.exp(r.uniform(0, math.log(65536)))),
                    int(math.exp(r.uniform(0, math.log(262144))))))
    return out


def _labels(keys) -> list[int]:    # the partition as data: keys by first appearance
    seen: dict = {}
    return [seen.setdefault(k, len(seen)) for k in keys]


def _collect_key(ns, seed) -> dict:
    fn, out = answer(ns, "shape_key"), {}
    for group, shapes_ in (("recorded", shapes()), ("drawn", drawn_shapes(seed))):
        try:
            keys = [fn(*s) for s in shapes_]
            out[group] = {"labels": _labels(keys),
                          "stable": keys == [fn(*s) for s in shapes_], "error": ""}
        except Exception as err:  # noqa: BLE001 - recorded for the judge
            if is_not_implemented(err):
                raise
            hashable = " (a key must be hashable: return a tuple)" * ("unhashable" in str(err))
            out[group] = {"labels": [], "error": f"{type(err).__name__}: {err}"[:200] + hashable}
    return out


def _key_shares(part, raw) -> Feedback:
    rec = raw["recorded"]
    if rec["error"]:
        return Feedback(part, False, f"shape_key raised {rec['error']}")
    labels, recorded = rec["labels"], shapes()
    if len(labels) != len(recorded):
        return Feedback(part, False, "the record does not hold the grader's shapes")
    ms = sweep()["ms"]
    for i, a in enumerate(recorded):
        for j, b in enumerate(recorded):
            if i != j and labels[i] == labels[j]:
                win, _ = _best(a)
                if ms[b][win] > SHARE * _best(b)[1]:
                    return Feedback(part, False, (
                        f"{_where(a)} and {_where(b)} share your key, so one tuning, but the "
                        f"fastest setting of the first runs more than {SHARE - 1:.0%} slower "
                        "than the best on the second: what tells them apart?"))
    groups = len(set(labels))
    return Feedback(part, True, f"the recorded shapes fall in {groups} keys, and the best "
                    f"setting of each shape is within {SHARE - 1:.0%} on every shape of its key")


def _key_coarse(part, raw) -> Feedback:
    rec = raw["drawn"]
    if rec["error"]:
        return Feedback(part, False, f"shape_key raised {rec['error']}")
    if not rec["stable"]:
        return Feedback(part, False, "shape_key gives a shape another key when called again: "
                        "a key must depend on the shape alone")
    groups = len(set(rec["labels"]))
    if groups > KEYS_MAX:
        return Feedback(part, False, f"your key takes {groups} values over {KEY_DRAWS} shapes "
                        f"from 1 x 1 to 65536 x 262144: at most {KEYS_MAX}. Each value is a "
                        "tuning (every kept setting timed); shapes whose best settings agree "
                        "should share one")
    return Feedback(part, True, f"{groups} keys over {KEY_DRAWS} shapes from 1 x 1 to "
                    "65536 x 262144")


# --- Part 4 (GPU): the autotuner with all three, beside the full sweep of the space. ----

def tuning_shape(seed) -> tuple[int, int]:
    """The grader's shape: rows and columns of no recorded shape."""
    r = random.Random(f"{seed}/tuning")
    while True:
        M = int(math.exp(r.uniform(math.log(100), math.log(16384))))
        N = int(math.exp(r.uniform(math.log(700), math.log(120000))))
        if (M, N) not in sweep()["ms"]:
            return M, N


def tune_and_sweep(config_space, prune, shape_key, M, N, seed: int = 0) -> dict:
    """On a GPU: ``triton.autotune`` with all three (a tuner per key) on an fp16 softmax,
    then every setting of the space timed on the same input."""
    from ... import bench
    from ...kernels.softmax import softmax_kernel_online

    good = [_setting(e) for e in map(_entry, config_space()) if invalid(e) is None]
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, N, device="cuda", generator=g).to(torch.float16)
    y = torch.empty_like(x)
    args, tuners = (x, y, N, N, N), {}
    raw = {"shape": [M, N], "gpu": torch.cuda.get_device_name(), "space": len(good)}

    def timed(s):
        return bench.time_ms(lambda: softmax_kernel_online[(M,)](
            *args, BLOCK_SIZE=s[0], num_warps=s[1], num_stages=s[2]))

    with gpu_lock():
        try:
            raw["kept"] = len(prune([config(s) for s in good], named_args(M, N), **LAUNCH))
            start = time.perf_counter()
            tuner = tuners.setdefault(shape_key(M, N), triton.autotune(
                configs=[config(s) for s in good], key=[],
                prune_configs_by={"early_config_prune": prune})(softmax_kernel_online))
            tuner[(M,)](*args)
            torch.cuda.synchronize()
            b = tuner.best_config
            raw["tune_s"] = time.perf_counter() - start
            chosen = (b.kwargs["BLOCK_SIZE"], b.num_warps, b.num_stages)
        except Exception as err:  # noqa: BLE001 - the judge reports it
            if is_not_implemented(err):
                raise
            return {**raw, "error": f"{type(err).__name__}: {err}"[:300]}
        want = torch.softmax(x.float(), -1)
        raw["max_error"] = (y.float() - want).abs().max().item()
        times = {s: [timed(s)] for s in dict.fromkeys(good + [chosen])}
        for _ in range(2):                       # the fastest again, side by side: less noise
            for s in dict.fromkeys(sorted(times, key=lambda s: min(times[s]))[:3] + [chosen]):
                times[s].append(timed(s))
    return {**raw, "chosen": list(chosen),
            "sweep": [{"config": list(s), "ms": min(v)} for s, v in times.items()]}


def _tuned(part: str, raw) -> Feedback:
    if list(raw.get("shape", [])) != list(tuning_shape(raw[SEED])):
        return Feedback(part, False, "the record was not made on the grader's shape")
    where = f"on {raw['gpu']} at {raw['shape'][0]} rows x {raw['shape'][1]} columns, fp16"
    if raw.get("error") or not raw["max_error"] < 1e-2:
        return Feedback(part, False, f"{where} the tuner failed: {raw['error']}"
                        if raw.get("error") else f"{where} the tuned run's softmax is wrong "
                        f"(off by {raw['max_error']:.2g})")
    ms, chosen = {tuple(r["config"]): r["ms"] for r in raw["sweep"]}, tuple(raw["chosen"])
    best = min(ms, key=ms.get)
    ratio = ms[chosen] / ms[best]
    text = (f"{where}: your prune kept {raw['kept']} of {raw['space']} settings; the tuner "
            f"chose {describe(chosen)} in {raw['tune_s']:.1f} s: {ms[chosen]:.4f} ms, "
            f"{ratio:.3f}x the best of the space's full sweep of {len(ms)} ({ms[best]:.4f} "
            f"ms; the goal is at most {GOAL:g}x)")
    return target(part, ratio <= GOAL, text, f"The sweep's best was {describe(best)}: "
                  "does your prune drop it at this shape?")


# --- The assignment, and the calls the notebook makes. --------------------------------

SPACE, PRUNE, KEY = ("config_space",), ("prune",), ("shape_key",)
PARTS = (  # key, title, points, judge (its label, raw results), names, collection
    ("1a", "every setting is one the sweep measured", 2, _space, SPACE, "space",
     _collect_space),
    ("1b", "the space holds a fast setting for every recorded shape", 1, _space, SPACE,
     "space", _collect_space),
    ("2a", "keeps a fast setting on every recorded shape", 3, _prune_judge, PRUNE, "prune",
     _collect_prune),
    ("2b", "keeps few settings", 2, _prune_judge, PRUNE, "prune", _collect_prune),
    ("2c", "a new, non-empty list on any shape", 1, _prune_anywhere, PRUNE, "prune",
     _collect_prune),
    ("3a", "shapes that share a key share a fast setting", 2, _key_shares, KEY, "key",
     _collect_key),
    ("3b", "few keys, on any shape", 1, _key_coarse, KEY, "key", _collect_key),
    ("4", f"within {GOAL - 1:.0%} of the space's best on a GPU", 3, _tuned,
     SPACE + PRUNE + KEY, "tuning",
     lambda ns, seed: tune_and_sweep(*(answer(ns, n) for n in SPACE + PRUNE + KEY),
                                     *tuning_shape(seed), seed=seed)))


def _part(key, title, points, judge, names, group, collect) -> Part:
    """A part whose checks say "not implemented" (as the grader does) while a stub raises."""
    def collected(ns, seed):
        try:
            return collect(ns, seed)
        except NotImplementedError:
            return {"not_implemented": True}
    label = f"{key} {title}"
    return Part(key, title, points, lambda raw: not_implemented(label) if raw.get(
        "not_implemented") else judge(label, raw), names, gpu=key == "4", group=group,
        collect=collected)


ASSIGNMENT = Assignment(
    name="07_autotuning",
    title="Tune lesson 05's online softmax: a space, a pruning rule, a key, from a sweep",
    parts=tuple(_part(*p) for p in PARTS))

check_space = check_function(ASSIGNMENT, ("1a", "1b"), "Part 1: ``config_space()``.")
check_prune = check_function(ASSIGNMENT, ("2a", "2b", "2c"), "Part 2: ``prune``.")
check_key = check_function(ASSIGNMENT, ("3a", "3b"), "Part 3: ``shape_key``.")
check_tuning = check_function(ASSIGNMENT, ("4",), "Part 4: tuned on a GPU (pending on a CPU).")

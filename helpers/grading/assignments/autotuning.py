"""Assignment 07, autotuning: ``config_space()``, ``prune`` and ``shape_key`` for lesson
04's ``matmul_kernel_v3`` (15 points; 12 in CPU mode, 3 on a GPU). Every verdict follows from
rules the notebook states, applied to configuration lists and shapes the grader draws from
its seed; a message names one configuration or pair of shapes and the mistake, never the
lists the grader expects."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from functools import partial

import torch
import triton

from ... import hardware, records
from ...feedback import Feedback, not_implemented, target
from ...kernels.matmul.config import MAX_ACCUMULATOR_REGISTERS as MAX_ACC_REGISTERS, TileConfig
from ...kernels.matmul.space import bucket   # the next power of two at or above n, >= 16
from ..gpu import gpu_lock
from ..registry import SEED, Assignment, Part, answer, check_function, is_not_implemented

# The rules the notebook states. A configuration here is a TileConfig (a learner's, once
# valid): shared memory, registers (128 a thread at most) and fit as the kernels count them.
H100, A100 = hardware.lookup("H100-SXM"), hardware.lookup("A100-80GB")   # A100: a known slip
SMEM_LIMIT, OTHER_LIMIT = H100.smem_per_program_bytes, A100.smem_per_program_bytes
BLOCKS, WARPS = (16, 32, 64, 128, 256), (1, 2, 4, 8, 16, 32)
MAX_GROUP_M, SPACE_SIZE, GOAL = 32, (12, 40), 1.05   # GOAL: part 4's time over the sweep's best
KNOBS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")   # a config's kwargs; warps, stages apart
ROW = (*KNOBS, "num_warps", "num_stages")   # a setting in the collected results: a list
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
F16 = "float16"
LAUNCH = {"grid": (1,), "warmup": False, "PRECISION": "tf32"}   # what a tuner passes on


describe = partial(TileConfig.describe, spelled_out=True)   # (t): every knob by its name
registers = TileConfig.accumulator_registers    # (t): the fp32 accumulator over its threads


def fits(t: TileConfig, dtype: str, gpu=H100) -> bool:    # stages x (A + B tiles), registers
    return t.fits(gpu, dtype, max_registers=MAX_ACC_REGISTERS)[0]


def _unrow(row) -> TileConfig:                   # a setting from the results' list
    return TileConfig.from_dict(dict(zip(ROW, row)))


def named_args(M: int, N: int, K: int, dtype=torch.float16, device="meta") -> dict:
    """What the autotuner hands a pruning function (meta tensors: no memory)."""
    a, b, c = (torch.empty(s, dtype=dtype, device=device) for s in ((M, K), (K, N), (M, N)))
    return dict(a_ptr=a, b_ptr=b, c_ptr=c, M=M, N=N, K=K, stride_am=K, stride_ak=1,
                stride_bk=N, stride_bn=1, stride_cm=N, stride_cn=1)


def _entry(c) -> dict:
    """One configuration as data the judge reads without running anything."""
    def plain(v):
        return v if v is None or type(v) in (int, float, str) else repr(v)[:40]
    if not isinstance(c, triton.Config) or not isinstance(c.kwargs, dict):
        return {"type": type(c).__name__}
    return {"type": "Config", "kwargs": {str(k): plain(v) for k, v in c.kwargs.items()},
            "num_warps": plain(c.num_warps), "num_stages": plain(c.num_stages)}


def _setting(e: dict) -> TileConfig:             # a valid entry (see invalid)
    return _unrow([*(e["kwargs"][k] for k in KNOBS), e["num_warps"], e["num_stages"]])


def invalid(e: dict) -> str | None:
    """Why one configuration cannot be tried, or None."""
    if e.get("type") != "Config":
        return f"is a {e.get('type')}, not a triton.Config"
    kw = e["kwargs"]
    if set(kw) != set(KNOBS):
        return (f"sets {', '.join(sorted(kw)) or 'nothing'}: a configuration sets exactly "
                f"{', '.join(KNOBS)} (PRECISION is passed at the launch)")
    checks = [(k, kw[k], BLOCKS, "tl.dot needs a power of two from 16 to 256") for k in KNOBS[:3]]
    checks += [("GROUP_M", kw["GROUP_M"], range(1, MAX_GROUP_M + 1),
                f"a whole number from 1 to {MAX_GROUP_M}"),
               ("num_warps", e["num_warps"], WARPS, "a power of two from 1 to 32"),
               ("num_stages", e["num_stages"], range(1, 1 << 30), "a whole number, at least 1")]
    for name, v, allowed, rule in checks:
        if type(v) is not int or v not in allowed:
            return f"has {name} = {v!r}: {rule}"
    return None


# --- Part 1: the space. ----------------------------------------------------------------

def _collect_space(ns, seed) -> dict:
    space = answer(ns, "config_space")()
    return {"entries": [_entry(c) for c in space[:1000]]} if isinstance(space, (list, tuple)) \
        else {"type": type(space).__name__}


def _space(part: str, raw) -> Feedback:
    if "entries" not in raw:
        return Feedback(part, False, f"config_space() returns a {raw.get('type')}: return a "
                        "list of triton.Config")
    entries = raw["entries"]
    if part.startswith("1a"):
        bad = next((i for i, e in enumerate(entries) if invalid(e)), None)
        return Feedback(part, True, f"all {len(entries)} are valid settings of "
                        "matmul_kernel_v3") if bad is None else \
            Feedback(part, False, f"configuration {bad} of your space {invalid(entries[bad])}")
    ts = [_setting(e) for e in entries if invalid(e) is None]
    twice = [t for i, t in enumerate(ts) if t in ts[:i]]
    usable = [t for t in ts if fits(t, F16)]
    lo, hi = SPACE_SIZE
    problem = (
        f"{describe(twice[0])} appears twice: a duplicate only costs tuning time" if twice
        else f"{len(ts)} valid configurations: the space holds {lo} to {hi} (fewer serve some "
        "shapes badly; more cost tuning time)" if not lo <= len(ts) <= hi
        else "no tile with BLOCK_M <= 32 fits the budget in fp16: a skinny problem (M = 1 to "
        "32, a decode step) needs one" if not any(t.block_m <= 32 for t in usable)
        else "no tile of at least 128 x 128 fits the budget in fp16: large problems need the "
        "reuse of big tiles" if not any(t.block_m >= 128 and t.block_n >= 128 for t in usable)
        else "every configuration has the same num_warps or the same num_stages: let the "
        "tuner choose those too"
        if min(len({t.num_warps for t in ts}), len({t.num_stages for t in ts})) < 2
        else None)
    return Feedback(part, problem is None, problem or f"{len(ts)} distinct configurations, "
                    "skinny tiles and large ones")


# --- Part 2: the pruning function, on the grader's lists. -----------------------------

# Near the limits: 128 registers a thread exactly, just under and over the shared memory.
EDGE_CONFIGS = tuple(map(_unrow, (  # as ROW lists them: the tile, GROUP_M, warps, stages
    (128, 128, 64, 8, 4, 3), (128, 256, 64, 8, 8, 4), (128, 256, 64, 8, 8, 5),
    (256, 128, 64, 8, 8, 4), (128, 256, 64, 8, 4, 3), (64, 256, 32, 8, 4, 4),
    (128, 128, 64, 8, 4, 7), (128, 128, 64, 8, 4, 8), (128, 128, 32, 8, 4, 4),
    (256, 256, 64, 8, 16, 3), (256, 256, 32, 8, 8, 2), (16, 16, 16, 1, 1, 1),
    (64, 64, 128, 8, 2, 4), (128, 64, 64, 8, 2, 3), (256, 256, 256, 8, 16, 1))))
SIZE_EDGES = (1, 15, 16, 17, 31, 32, 33, 64, 65, 100, 127, 128, 129, 200)


def budget_trials(seed) -> list[dict]:
    """Lists near the budget's edges, in three dtypes, on shapes no tile is too large for."""
    r, out = random.Random(f"{seed}/budget"), []
    for i in range(12):
        picks = tuple(TileConfig(r.choice(BLOCKS), r.choice(BLOCKS), r.choice(BLOCKS[:4]),
                                 group_m=r.choice((1, 4, 8)), num_warps=r.choice(WARPS[:5]),
                                 num_stages=r.randint(1, 6)) for _ in range(16))
        configs = list(dict.fromkeys(EDGE_CONFIGS + picks))
        r.shuffle(configs)
        out.append({"M": r.randint(256, 8192), "N": r.randint(256, 8192),
                    "K": r.randint(16, 8192), "dtype": list(DTYPES)[i % 3], "configs": configs})
    return out


def size_trials(seed) -> list[dict]:
    """Every tile shape, well inside the budget, on small and edge-sized problems."""
    r, out = random.Random(f"{seed}/size"), []
    for i, M in enumerate(SIZE_EDGES):
        configs = [TileConfig(bm, bn, 32, num_warps=max(4, bm * bn // 2048),
                              num_stages=r.choice((1, 2))) for bm in BLOCKS for bn in BLOCKS]
        r.shuffle(configs)
        out.append({"M": M, "N": r.choice(SIZE_EDGES + (r.randint(2, 300), 5000)),
                    "K": r.randint(16, 4096), "dtype": list(DTYPES)[i % 3], "configs": configs})
    return out


def recorded_trials(seed=None) -> list[dict]:
    """Lesson 04's recorded sweeps of the tile knobs (4096^3 fp16), one per GPU."""
    out = []
    for gpu in records.available("tiling"):
        rec = records.load("tiling", gpu)
        rows = [r for r in rec.results["knobs"] if "BLOCK_M" in r]
        configs = [TileConfig.of(r) for r in rows]          # GROUP_M 8, as the sweep ran
        ms, i = min((r["ms"], i) for i, r in enumerate(rows) if r.get("ms"))
        out.append({"M": rows[0]["n"], "N": rows[0]["n"], "K": rows[0]["n"], "dtype": F16,
                    "configs": configs, "fastest": configs[i], "ms": ms, "gpu": rec.gpu})
    return out


def _run_prune(fn, trial) -> dict:
    given = [t.triton_config(KNOBS) for t in trial["configs"]]
    passed = list(given)
    try:
        out = fn(passed, named_args(*(trial[k] for k in "MNK"), DTYPES[trial["dtype"]]), **LAUNCH)
    except Exception as err:  # noqa: BLE001 - recorded; the judge says what it means
        if is_not_implemented(err):
            raise
        hint = (" (the autotuner passes keyword arguments too: def prune(configs, named_args, "
                "**kwargs))" if "keyword argument" in str(err) else "")
        return {"error": f"{type(err).__name__}: {err}"[:300] + hint}
    if not isinstance(out, (list, tuple)):
        return {"returned": type(out).__name__}
    return {"mutated": passed != given, "kept": [dict(_setting(e)) if invalid(e) is None else
                                                 f"a {e.get('type')}" for e in map(_entry, out)]}


def _collect_prune(ns, seed) -> dict:
    fn = answer(ns, "prune")
    return {group: [_run_prune(fn, t) for t in trials] for group, trials in
            (("budget", budget_trials(seed)), ("size", size_trials(seed)),
             ("recorded", recorded_trials()))}


def _decisions(part, trials, recs):
    """``[(trial, config, kept?)]`` over every trial, or the Feedback that says why not."""
    if len(recs) != len(trials):
        return Feedback(part, False, "the record does not hold the grader's trials")
    out = []
    for trial, rec in zip(trials, recs):
        where = f"M, N, K = {trial['M']}, {trial['N']}, {trial['K']} in {trial['dtype']}"
        kept = {TileConfig.from_dict(k) if isinstance(k, dict) else k for k in rec.get("kept", [])}
        strays = sorted(describe(k) if isinstance(k, TileConfig) else k
                        for k in kept - set(trial["configs"]))
        problem = (f"your prune raised {rec['error']} at {where}" if "error" in rec
                   else f"your prune returns a {rec['returned']}: return the list of the "
                   "configs it keeps" if "returned" in rec
                   else "your prune changes the list it is given: the autotuner passes its "
                   "own list, so the next shape would see fewer configurations; build a new "
                   "list" if part.startswith("2a") and rec["mutated"]
                   else f"your prune returns {strays[0]}, which it was not given ({where})"
                   if strays else None)
        if problem:
            return Feedback(part, False, problem)
        out += [(trial, t, t in kept) for t in trial["configs"]]
    return out


# Known mistakes: a rule (config, trial) -> kept?, and what it means.
BUDGET_SLIPS = (
    (lambda t, tr: fits(replace(t, num_stages=1), tr["dtype"]),
     "it counts one stage: each of num_stages stages holds its own A and B tiles"),
    (lambda t, tr: fits(t, F16), "it takes 2 bytes an element whatever the dtype: fp32 has 4 "
                                 "(named_args['a_ptr'].element_size())"),
    (lambda t, tr: t.shared_memory_bytes(tr["dtype"]) <= SMEM_LIMIT,
     "it never checks the accumulator's registers"),
    (lambda t, tr: registers(t) <= MAX_ACC_REGISTERS, "it never checks the shared memory"),
    (lambda t, tr: fits(t, tr["dtype"]) and registers(t) < MAX_ACC_REGISTERS,
     "exactly 128 registers a thread is within the budget: use <=, not <"),
    (lambda t, tr: fits(t, tr["dtype"], A100),
     f"its limit is smaller than the stated one, the H100's, as the A100's {OTHER_LIMIT:,} "
     "bytes would be"))
SIZE_SLIPS = (
    (lambda t, tr: True, "it keeps tiles of any size"),
    (lambda t, tr: t.block_m <= tr["M"] and t.block_n <= tr["N"], "it compares with M and N "
     "themselves: a tile may reach their next power of two, and 16 at least"),
    (lambda t, tr: t.block_m <= triton.next_power_of_2(tr["M"])
     and t.block_n <= triton.next_power_of_2(tr["N"]),
     "it forgets the floor: a 16-row tile is the smallest tl.dot takes, even for M = 1"),
    (lambda t, tr: t.block_m < bucket(tr["M"]) and t.block_n < bucket(tr["N"]),
     "a tile equal to the bucket is not too large: use <=, not <"))


def _slip(decisions, slips) -> str:    # the first known mistake that explains every decision
    return next((f" ({meaning})" for rule, meaning in slips
                 if all(rule(t, tr) == kept for tr, t, kept in decisions)), "")


def _prune_rule(group, trials, rule, slips, done, say):
    """Judges one group: ``rule`` says whether a config must be kept (None: either way)."""
    def judge(part, raw):
        decisions = _decisions(part, trials(raw[SEED]), raw[group])
        if isinstance(decisions, Feedback):
            return decisions
        wrong = [(tr, t, k) for tr, t, k in decisions if rule(t, tr) not in (None, k)]
        if not wrong:
            return Feedback(part, True, done.format(len(decisions)))
        return Feedback(part, False, say(*wrong[0]) + _slip(decisions, slips))
    return judge


def _say_budget(trial, t, kept) -> str:
    d, s, regs = trial["dtype"], t.shared_memory_bytes(trial["dtype"]), registers(t)
    over = (f"needs {s:,} bytes of shared memory in {d}, over the {SMEM_LIMIT:,} stated"
            if s > SMEM_LIMIT else
            f"holds {regs:g} accumulator registers a thread, over the {MAX_ACC_REGISTERS} stated")
    return f"config {describe(t)} {over}: your prune keeps it" if kept else (
        f"config {describe(t)} fits in {d} ({s:,} bytes of shared memory, {regs:g} registers a "
        "thread) but your prune drops it")


_budget = _prune_rule("budget", budget_trials, lambda t, tr: fits(t, tr["dtype"]),
                      BUDGET_SLIPS, "right on {} configurations in fp16, bf16 and fp32, at "
                      "and around both limits", _say_budget)
_size = _prune_rule("size", size_trials,
                    lambda t, tr: t.block_m <= bucket(tr["M"]) and t.block_n <= bucket(tr["N"]),
                    SIZE_SLIPS, "right on {} tiles, M and N from 1 to 5000",
                    lambda tr, t, kept: f"at M = {tr['M']}, N = {tr['N']} a {t.block_m} x "
                    f"{t.block_n} tile is {'' if kept else 'not '}larger than the problem by the "
                    f"stated rule: your prune {'keeps' if kept else 'drops'} it")
_fastest = _prune_rule("recorded", recorded_trials,
                       lambda t, tr: True if t == tr["fastest"] and fits(t, F16) else None, (),
                       "it keeps the fastest configuration of lesson 04's recorded sweeps",
                       lambda tr, t, kept: f"your prune drops {describe(t)}, the fastest "
                       f"configuration of lesson 04's sweep at 4096^3 fp16 (recorded on the "
                       f"{tr['gpu']}: {tr['ms']:.3f} ms); it fits the budget "
                       f"({t.shared_memory_bytes():,} bytes, {registers(t):g} registers a thread)")


# --- Part 3: the shape key, on the grader's shapes. -----------------------------------

KEY_EDGES = (1, 2, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025,
             4096, 4097)


def _inner(r, e: int) -> int:     # a size in the bucket 2^e, away from its edges
    return r.randint(2 ** (e - 1) + 2, 2 ** e - 2)


def ordinary_shapes(seed) -> list[tuple]:
    """Shapes off the edges, each with a neighbour in its bucket and one in the next."""
    r, out = random.Random(f"{seed}/ordinary"), []
    for _ in range(16):
        es = [r.randint(5, 13) for _ in range(3)]
        shape, d = [_inner(r, e) for e in es], r.randrange(3)
        same, other = list(shape), list(shape)
        same[d] = _inner(r, es[d])
        other[d] = _inner(r, es[d] + (1 if es[d] < 13 else -1))
        out += [tuple(shape), tuple(same), tuple(other)]
    return out


def edge_shapes(seed) -> list[tuple]:
    r = random.Random(f"{seed}/edges")
    base = [_inner(r, r.randint(6, 12)) for _ in range(3)]
    return [tuple(s if i == d else base[i] for i in range(3)) for d in range(3) for s in KEY_EDGES]


def _labels(keys) -> list[int]:    # the partition as data: buckets by first appearance
    seen: dict = {}
    return [seen.setdefault(k, len(seen)) for k in keys]


def _collect_key(ns, seed) -> dict:
    fn, out = answer(ns, "shape_key"), {}
    for group, shapes in (("ordinary", ordinary_shapes(seed)), ("edges", edge_shapes(seed))):
        try:
            out[group] = {"labels": _labels(fn(*s) for s in shapes), "error": ""}
        except Exception as err:  # noqa: BLE001 - recorded for the judge
            if is_not_implemented(err):
                raise
            hashable = " (a key must be hashable: return a tuple)" * ("unhashable" in str(err))
            out[group] = {"labels": [], "error": f"{type(err).__name__}: {err}"[:200] + hashable}
    return out


KEY_SLIPS = (
    (lambda M, N, K: (M, N, K), "your key never buckets: every shape gets its own tuning "
     "(round each size up to a power of two, at least 16)"),
    (lambda M, N, K: tuple(bucket(2 ** n.bit_length()) for n in (M, N, K)),
     "an exact power of two is its own bucket: 1024 stays 1024; 2 ** n.bit_length() doubles it"),
    (lambda M, N, K: tuple(triton.next_power_of_2(n) for n in (M, N, K)),
     "sizes below 16 share the bucket 16 (the floor): your key separates them"),
    (lambda M, N, K: (bucket(M), bucket(N)), "your key ignores K: a long K wants other tiles"))


def _judge_key(part, raw, group, shapes_of, done):
    rec, shapes = raw[group], shapes_of(raw[SEED])
    if rec["error"]:
        return Feedback(part, False, f"shape_key raised {rec['error']}")
    got, want = rec["labels"], _labels(tuple(map(bucket, s)) for s in shapes)
    if len(got) != len(shapes):
        return Feedback(part, False, "the record does not hold the grader's shapes")
    bad = next(((i, j) for i in range(len(shapes)) for j in range(i + 1, len(shapes))
                if (want[i] == want[j]) != (got[i] == got[j])), None)
    if bad is None:
        return Feedback(part, True, done)
    slip = next((m + ". " for f, m in KEY_SLIPS if _labels(f(*s) for s in shapes) == got), "")
    a, b = (shapes[k] for k in bad)
    return Feedback(part, False, slip + (
        f"{a} and {b} share a bucket, so one tuning: your key separates them"
        if want[bad[0]] == want[bad[1]] else
        f"{a} and {b} fall in different buckets: your key joins them"))


# --- Part 4 (GPU): the autotuner with all three, beside the full sweep. ---------------

def tuning_shape(seed) -> tuple[int, int, int]:
    """The grader's shape: multiples of 16 (as models' mostly are), off the 128 grid."""
    r = random.Random(f"{seed}/tuning")
    sides = ([16 * r.randrange(lo, hi) for _ in range(64)] for lo, hi in
             ((128, 384), (128, 384), (64, 256)))
    return tuple(next(v for v in side if v % 128) for side in sides)


def tune_and_sweep(config_space, prune, shape_key, M, N, K, seed: int = 0) -> dict:
    """On a GPU: ``triton.autotune`` with all three (a tuner per key) on an fp16 product,
    then the full sweep: every configuration of the space that fits the budget."""
    from ... import bench
    from ...kernels.matmul.ladder import matmul_kernel_v3

    good = [_setting(e) for e in map(_entry, config_space()) if invalid(e) is None]
    configs = [t.triton_config(KNOBS) for t in good]
    g = torch.Generator(device="cuda").manual_seed(seed)
    a, b = (torch.randn(s, device="cuda", dtype=torch.float16, generator=g)
            for s in ((M, K), (K, N)))
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)   # one tuner per key below:
    args, times, tuners = (a, b, c, M, N, K, K, 1, N, 1, N, 1), {}, {}
    raw = {"shape": [M, N, K], "gpu": torch.cuda.get_device_name(), "space": len(good)}

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    def timed(t):
        try:
            return bench.time_ms(lambda: matmul_kernel_v3[grid(t)](*args, **t.as_dict(ROW),
                                                                    PRECISION="tf32"))
        except triton.runtime.errors.OutOfResources:    # not a candidate on this GPU
            return float("inf")

    with gpu_lock():
        try:
            raw["kept"] = len(prune([t.triton_config(KNOBS) for t in good],
                                    named_args(M, N, K), **LAUNCH))
            start = time.perf_counter()
            tuner = tuners.setdefault(shape_key(M, N, K), triton.autotune(
                configs=configs, key=[],
                prune_configs_by={"early_config_prune": prune})(matmul_kernel_v3))
            tuner[grid](*args, PRECISION="tf32")
            torch.cuda.synchronize()
            raw["tune_s"], chosen = time.perf_counter() - start, TileConfig.from_triton(
                tuner.best_config)
        except Exception as err:  # noqa: BLE001 - the judge reports it
            if is_not_implemented(err):
                raise
            return {**raw, "error": f"{type(err).__name__}: {err}"[:300]}
        ref = torch.matmul(a, b).float()
        raw["rel_error"] = ((c.float() - ref).abs().max() / ref.abs().max()).item()
        for t in dict.fromkeys([t for t in good if fits(t, F16)] + [chosen]):
            times[t] = [timed(t)]
        for _ in range(2):                       # the fastest again, side by side: less noise
            for t in dict.fromkeys(sorted(times, key=lambda t: min(times[t]))[:3] + [chosen]):
                times[t].append(timed(t))
    row = lambda t: [*t.as_dict(ROW).values()]  # noqa: E731 - the results' list, as _unrow reads
    return {**raw, "chosen": row(chosen),
            "sweep": [{"config": row(t), "ms": min(v)} for t, v in times.items()]}


def _tuned(part: str, raw) -> Feedback:
    if list(raw.get("shape", [])) != list(tuning_shape(raw[SEED])):
        return Feedback(part, False, "the record was not made on the grader's shape")
    where = f"on {raw['gpu']} at M, N, K = {', '.join(map(str, raw['shape']))} fp16"
    if raw.get("error") or not raw["rel_error"] < 1e-2:
        return Feedback(part, False, f"{where} the tuner failed: {raw['error']}"
                        if raw.get("error") else f"{where} the tuned run's product is "
                        f"wrong (error {raw['rel_error']:.2g} of the largest value)")
    ms, chosen = {_unrow(r["config"]): r["ms"] for r in raw["sweep"]}, _unrow(raw["chosen"])
    best = min(ms, key=ms.get)
    ratio = ms[chosen] / ms[best]
    text = (f"{where}: your prune kept {raw['kept']} of {raw['space']} configurations; "
            f"the tuner chose {describe(chosen)} in {raw['tune_s']:.1f} s: "
            f"{ms[chosen]:.4f} ms, {ratio:.3f}x the best of the full sweep of {len(ms)} "
            f"({ms[best]:.4f} ms; the goal is at most {GOAL:g}x)")
    return target(part, ratio <= GOAL, text, f"The sweep's best was {describe(best)}: "
                  "does your prune drop it, or your space lack its neighbours?")


# --- The assignment, and the calls the notebook makes. --------------------------------

SPACE, PRUNE, KEY = ("config_space",), ("prune",), ("shape_key",)
PARTS = (  # key, title, points, judge (its label, raw results), names, collection
    ("1a", "every configuration is valid", 2, _space, SPACE, "space", _collect_space),
    ("1b", "the space covers skinny and large problems", 1, _space, SPACE, "space",
     _collect_space),
    ("2a", "keeps exactly what fits the budget", 3, _budget, PRUNE, "prune", _collect_prune),
    ("2b", "drops the tiles larger than the problem", 2, _size, PRUNE, "prune", _collect_prune),
    ("2c", "keeps the fastest recorded configuration", 1, _fastest, PRUNE, "prune",
     _collect_prune),
    ("3a", "nearby shapes share a tuning", 2, lambda p, raw: _judge_key(
        p, raw, "ordinary", ordinary_shapes, "right on 48 shapes, sizes 17 to 8192"), KEY, "key",
     _collect_key),
    ("3b", "the bucket edges", 1, lambda p, raw: _judge_key(p, raw, "edges", edge_shapes,
     "right at exact powers of two, one past them and below the floor"), KEY, "key",
     _collect_key),
    ("4", f"within {GOAL - 1:.0%} of the full sweep", 3, _tuned, SPACE + PRUNE + KEY, "tuning",
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
    name="07_autotuning", title="Tune lesson 04's matmul: a space, a pruning rule, a shape key",
    parts=tuple(_part(*p) for p in PARTS))

check_space = check_function(ASSIGNMENT, ("1a", "1b"), "Part 1: ``config_space()``.")
check_prune = check_function(ASSIGNMENT, ("2a", "2b", "2c"), "Part 2: ``prune``.")
check_key = check_function(ASSIGNMENT, ("3a", "3b"), "Part 3: ``shape_key``.")
check_tuning = check_function(ASSIGNMENT, ("4",), "Part 4: tuned on a GPU (pending on a CPU).")

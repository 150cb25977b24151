"""Checks for lesson 07 (autotuning): predict, then see the answer.

The expected values come from the setting itself (a
:class:`~helpers.kernels.matmul.config.TileConfig`: its shared memory and registers), from
:mod:`helpers.kernels.matmul.tuned` (the buckets of its key) or from a record passed in
(which setting won, what took longest): never from a typed-in number. A wrong answer that
matches a classic slip (one pipeline stage counted, 2 bytes for fp32, threads forgotten,
shapes not bucketed, the split forgotten) gets a message that names it. The last prediction
asks where the tuned path keeps the persistent TMA kernel rather than v6
(:func:`kernel_patterns` says it group by group).
"""

from __future__ import annotations

import math

import torch

from ..dtypes import element_size
from ..feedback import Feedback, check_choice, check_number
from ..kernels.matmul import tuned as mt
from ..kernels.matmul.config import TileConfig
from ..plots.autotuning import describe, heatmap, kernel_choice_rows


def _keep(expected: float, mistakes):
    """The slips that give a different number than the right answer (and each once)."""
    seen, out = {expected}, []
    for value, text in mistakes:
        if value not in seen:
            seen.add(value)
            out.append((value, text))
    return out


def check_shared_memory(answer, config: TileConfig, dtype=torch.float16) -> Feedback:
    """Exercise: the bytes of shared memory the software pipeline of ``config`` keeps, in
    ``dtype``: ``num_stages x (BLOCK_M x BLOCK_K + BLOCK_K x BLOCK_N) x element size``."""
    config = TileConfig.of(config)
    expected = config.shared_memory_bytes(dtype)
    s, stages = element_size(dtype), config.num_stages
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    mistakes = [(expected / stages, "you counted one stage: the pipeline keeps num_stages "
                 "A and B tiles in flight"),
                (expected * 8, "you counted bits, not bytes"),
                (expected / s, "you counted elements, not bytes"),
                (stages * bm * bk * s, "you counted the A tile alone: each stage holds a B "
                 "tile too"),
                (stages * bk * bn * s, "you counted the B tile alone: each stage holds an A "
                 "tile too"),
                (stages * bm * bn * s, "you counted the output tile: C stays in registers; "
                 "the stages hold BLOCK_M x BLOCK_K of A and BLOCK_K x BLOCK_N of B")]
    for other in (2, 4):
        if other != s:
            mistakes.append((expected / s * other, f"you took {other} bytes an element; "
                             f"{str(dtype).removeprefix('torch.')} has {s}"))
    return check_number(f"shared memory of {config.describe()}", answer, expected, rel=0.001,
                        unit="B", mistakes=_keep(expected, mistakes),
                        hint="stages x (A tile + B tile) x bytes an element")


def check_registers(answer, config: TileConfig) -> Feedback:
    """Exercise: the fp32 accumulator registers a thread holds for ``config``'s tile."""
    config = TileConfig.of(config)
    expected = config.accumulator_registers()
    bm, bn, w = config.block_m, config.block_n, config.num_warps
    mistakes = [(bm * bn / w, "you shared the tile among warps, not threads: a warp is 32 "
                 "threads"),
                (bm * bn, "you counted the whole tile: it is spread over the program's "
                 "32 x num_warps threads"),
                (bm * bn / 32, "you forgot num_warps: a program has 32 x num_warps threads")]
    return check_number(f"accumulator registers a thread for {config.describe()}", answer,
                        expected, rel=0.001, mistakes=_keep(expected, mistakes),
                        hint="BLOCK_M x BLOCK_N fp32 values over 32 x num_warps threads")


def buckets(shapes) -> int:
    """How many tunings ``shapes`` need when the key is :func:`mt.shape_key`."""
    return len({mt.shape_key(*s) for s in shapes})


def check_buckets(answer, shapes) -> Feedback:
    """Exercise: how many different values :func:`mt.shape_key` takes on ``shapes``."""
    shapes = [tuple(s) for s in shapes]
    expected = buckets(shapes)
    mistakes = [(len(set(shapes)), "you counted every shape: with a bucketed key, shapes "
                 "whose sizes round up to the same powers of two share one tuning"),
                (len({tuple(_bucket_without_floor(n) for n in s) for s in shapes}),
                 "you forgot the floor: every size up to 16 shares the bucket 16"),
                (len({tuple(2 ** int(n).bit_length() for n in s) for s in shapes}),
                 "you rounded with 2**n.bit_length(), which sends a power of two (1024) to "
                 "the next one (2048)")]
    return check_number("tunings for these shapes", answer, expected, rel=0.0,
                        mistakes=_keep(expected, mistakes),
                        hint="round each of M, N, K up to a power of two (at least 16), "
                             "then count the different triples")


def _bucket_without_floor(n: int) -> int:
    """The power of two at or above ``n``, with no floor (1 stays 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def split_k_programs(M: int, N: int, config: TileConfig) -> int:
    """Programs of a launch of ``config`` on an ``M x N`` output: ``SPLIT_K`` per tile."""
    c = TileConfig.of(config)
    return math.ceil(M / c.block_m) * math.ceil(N / c.block_n) * c.split_k


def check_split_k_programs(answer, M: int, N: int, config: TileConfig) -> Feedback:
    """Exercise: how many programs a launch of ``config`` runs on an ``M x N`` output."""
    config = TileConfig.of(config)
    expected = split_k_programs(M, N, config)
    tiles = expected // config.split_k
    mistakes = [(tiles, "you counted the output tiles: split-K runs SPLIT_K programs on each"),
                ((M // config.block_m) * (N // config.block_n) * config.split_k,
                 "you rounded the tiles down: a partial tile at the edge is a program too")]
    return check_number(f"programs of {config.describe()} on {M} x {N}", answer, expected,
                        rel=0.0, mistakes=_keep(expected, mistakes),
                        hint="ceil(M / BLOCK_M) x ceil(N / BLOCK_N) tiles, SPLIT_K programs each")


# --------------------------------------------------------------------------------------
# Predictions read from a record.
# --------------------------------------------------------------------------------------


def _entry(rec, label: str) -> dict:
    for e in rec.results["heatmaps"]:
        if e["label"] == label:
            return e
    raise KeyError(f"{label!r} is not a heatmap of this record; it has "
                   f"{[e['label'] for e in rec.results['heatmaps']]}")


def same_winner(rec, first: str, second: str) -> bool:
    """Whether the fastest setting of heatmap ``first`` is also the fastest of ``second``."""
    a, b = (heatmap(_entry(rec, x))["best"] for x in (first, second))
    return all(a[k] == b[k] for k in mt.KEYS)


def check_same_winner(answer, rec, first: str, second: str) -> Feedback:
    """Prediction: is the fastest setting for shape ``first`` also the fastest for
    ``second``? (``"yes"`` or ``"no"``)"""
    a, b = (heatmap(_entry(rec, x))["best"] for x in (first, second))
    why = (f"In the recorded run ({rec.gpu}) the fastest for {first} is {describe(a)}, "
           f"for {second} {describe(b)}.")
    return check_choice(f"the same winner for {first} and {second}", answer,
                        "yes" if same_winner(rec, first, second) else "no", ("yes", "no"), why)


def launch_bound(rec, launcher: str = "autotuned_us") -> str:
    """``"host"`` if one call's host time exceeds the kernel's GPU time, else ``"gpu"``."""
    lo = rec.results["launch_overhead"]
    return "host" if lo[launcher] > lo["gpu_us"] else "gpu"


def check_launch_bound(answer, rec) -> Feedback:
    """Prediction: at the tiny shape of the record's launch test, which takes longer per
    call: the host's work of the autotuned launcher, or the kernel on the GPU?"""
    lo = rec.results["launch_overhead"]
    shape = "x".join(map(str, lo["shape"]))
    why = (f"In the recorded run ({rec.gpu}) at {shape}: {lo['autotuned_us']:.3g} us of host "
           f"time a call, {lo['gpu_us']:.3g} us of GPU time.")
    return check_choice(f"host or GPU at {shape}", answer, launch_bound(rec), ("host", "gpu"),
                        why)


def split_k_chosen(rec, label: str) -> bool:
    """Whether the tuner chose split-K for sweep shape ``label`` (in every dtype)."""
    rows = [s for s in rec.results["shapes"] if s["label"] == label]
    if not rows:
        raise KeyError(f"{label!r} is not a shape of this record's sweep")
    return all(s["tuned_config"]["SPLIT_K"] > 1 for s in rows)


def check_split_k_chosen(answer, rec, label: str) -> Feedback:
    """Prediction: does the tuner choose split-K for sweep shape ``label``?"""
    rows = [s for s in rec.results["shapes"] if s["label"] == label]
    why = "In the recorded run ({}): {}.".format(
        rec.gpu, "; ".join(f"{s['dtype']} {describe(s['tuned_config'])}" for s in rows))
    return check_choice(f"split-K for {label}", answer,
                        "yes" if split_k_chosen(rec, label) else "no", ("yes", "no"), why)


# --------------------------------------------------------------------------------------
# Which of the two tuned kernels is kept, by group of shapes.
# --------------------------------------------------------------------------------------

# The sweep's shapes in the groups the lesson speaks of, by the start of their label.
GROUPS = {"squares": ("square",), "few rows": ("one row", "16 rows", "128 rows", "skinny"),
          "long K": ("long K",), "off grid": ("off grid",), "tall": ("tall",)}


def shape_group(label: str) -> str:
    """``"square 4096"`` -> ``"squares"`` (a label of no group is a group of its own)."""
    return next((g for g, starts in GROUPS.items() if label.startswith(starts)), label)


def _by_group(rec) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in kernel_choice_rows(rec):
        out.setdefault(shape_group(r["shape"]), []).append(r)
    return out


def persistent_groups(rec) -> set[str]:
    """The groups in which the tuned path kept the persistent kernel for at least one
    (shape, dtype) of the record's sweep."""
    return {g for g, rows in _by_group(rec).items()
            if any(r["kernel kept"] == "persistent" for r in rows)}


def _span(rows) -> str:
    lo, hi = (f(r["tiles per SM"] for r in rows) for f in (min, max))
    return f"{lo:.2g}" if f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g}-{hi:.2g}"


def kernel_patterns(rec) -> list[str]:
    """One sentence per group of shapes: on which the persistent kernel was kept and on how
    many v6, each with its output tiles per SM (of the setting kept)."""
    out = []
    for g, rows in _by_group(rec).items():
        tma = [r for r in rows if r["kernel kept"] == "persistent"]
        v6 = [r for r in rows if r["kernel kept"] != "persistent"]
        text = f"{g}: the persistent kernel on {len(tma)} of {len(rows)}"
        if tma:
            text += (f" ({', '.join(r['shape'] + ' ' + r['dtype'] for r in tma)}; "
                     f"{_span(tma)} tiles per SM)")
        out.append(text + (f", v6 on {len(v6)} ({_span(v6)} tiles per SM)." if v6 else "."))
    return out


def check_persistent_groups(answer, rec) -> Feedback:
    """Prediction: in which groups of the sweep's shapes (:data:`GROUPS`) does the tuned path
    keep the persistent kernel for at least one shape? A list of group names. A wrong answer
    is told which of its groups kept v6 throughout, and how many groups it left out, never
    which: the answer comes only with a right one."""
    part = "groups where the persistent kernel is kept"
    options = tuple(_by_group(rec))
    if answer is None or answer is Ellipsis:
        return Feedback(part, False, f"no answer yet: a list of some of {options}",
                        status="not implemented")
    names = [answer] if isinstance(answer, str) else answer
    try:
        got = {str(n).strip().lower() for n in names}
    except TypeError:
        return Feedback(part, False, f"answer with a list of some of {options}, got {answer!r}")
    unknown = got - {o.lower() for o in options}
    if unknown:
        return Feedback(part, False, f"{sorted(unknown)} is not a group; the groups are {options}")
    expected = persistent_groups(rec)
    got = {o for o in options if o.lower() in got}
    if got == expected:
        kept = sum(r["kernel kept"] == "persistent" for r in kernel_choice_rows(rec))
        return Feedback(part, True, f"{sorted(got)} is right. In the recorded run ({rec.gpu}) "
                        f"the persistent kernel was kept on {kept} of "
                        f"{len(rec.results['shapes'])} rows of the sweep.")
    groups = _by_group(rec)
    slips = [f"{g!r} kept v6 on all {len(groups[g])} of its rows (up to "
             f"{max(r['tiles per SM'] for r in groups[g]):.2g} output tiles per SM)"
             for g in sorted(got - expected)]
    if expected - got:
        slips.append(f"you left out {len(expected - got)} group(s) where it is kept at least "
                     "once: which shapes let a program start the next tile while it stores "
                     "this one, or gain from boxes instead of masks?")
    return Feedback(part, False, "; ".join(slips))


def check_waves(answer, M: int, N: int, sms: int, tile: int = 128) -> Feedback:
    """Exercise: the waves a data-parallel launch of ``tile x tile`` output tiles takes on
    ``sms`` SMs, one tile per SM at a time: a part-filled last wave takes a whole one."""
    tiles = math.ceil(M / tile) * math.ceil(N / tile)
    expected = math.ceil(tiles / sms)
    mistakes = [(tiles // sms, "you rounded down: the tiles past the whole waves run a wave "
                 "of their own"),
                (round(tiles / sms, 2), "you counted the work, not the time: the last wave "
                 "is paid whole however few tiles it holds"),
                (tiles, "you counted tiles: divide by the SMs, one tile each at a time")]
    return check_number(f"waves of {tile}x{tile} tiles of a {M} x {N} output on {sms} SMs",
                        answer, expected, rel=0.0, mistakes=_keep(expected, mistakes),
                        hint=f"ceil(M / {tile}) x ceil(N / {tile}) tiles, {sms} a wave")

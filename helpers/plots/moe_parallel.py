"""Lesson 08 beyond one GPU: the ``moe_parallel`` record (expert parallelism over the GPUs
of one machine, :mod:`helpers.experiments.moe_parallel`) as a table and a figure.

For each shape and token count per rank: the layer exchanging then computing
(sequential), pipelined in chunks (overlapped), sending a token once per rank, and as
:func:`~helpers.kernels.moe.parallel.ep_forward` runs it (the version its trial runs
chose, where the record has it), the token rows' all-to-all alone with
the GB/s it reached, the napkin math's least exchange time over the link, and the local
experts alone. Nothing here measures.
"""

from __future__ import annotations

from . import finish
from .moe import token_axis


def _label(case: dict) -> str:
    return f"E={case['experts']} top-{case['top_k']}"


def _int(item):
    return int(item[0])


def parallel_rows(rec) -> list[dict]:
    """One line per (shape, tokens per rank)."""
    out = []
    for c in rec.results["cases"]:
        out.append({"shape": _label(c), "tokens/rank": c["tokens_per_rank"],
                    "sequential ms": c["sequential_ms"],
                    **({f"overlapped, {k} chunks": ms
                        for k, ms in sorted(c["overlapped_ms_by_chunks"].items(), key=_int)}
                       if "overlapped_ms_by_chunks" in c else {"overlapped ms": c["overlapped_ms"]}),
                    **({"once per rank ms": c["dedup_ms"]} if "dedup_ms" in c else {}),
                    **({"chosen": c["chosen"], "chosen ms": c["chosen_ms"]}
                       if "chosen_ms" in c else {}),
                    "experts ms": c["experts_ms"], "all-to-all ms": c["all_to_all_ms"],
                    "napkin ms": c["napkin_exchange_ms"],
                    "GB/s": c["all_to_all_gb_per_s"] if c["all_to_all_gb_per_s"] else "-"})
    return out


def plot_parallel(rec):
    """Per shape: the layer (sequential, overlapped), the experts alone, two all-to-alls
    measured and the napkin math's two, against the tokens per rank."""
    import matplotlib.pyplot as plt

    cases = rec.results["cases"]
    shapes = list(dict.fromkeys(_label(c) for c in cases))
    fig, axes = plt.subplots(1, len(shapes), figsize=(7 * len(shapes), 4.5), squeeze=False)
    lines = (("sequential_ms", 1, "layer, exchange then compute", "o-"),
             ("overlapped_ms", 1, "layer, overlapped in chunks", "s-"),
             ("dedup_ms", 1, "layer, a token sent once per rank", "D-"),
             ("experts_ms", 1, "local experts alone", "^--"),
             ("all_to_all_ms", 2, "2 x all-to-all (there and back), measured", "v--"),
             ("napkin_exchange_ms", 2, "2 x all-to-all, napkin math at the link's peak", "k:"))
    world, link = rec.results["world"], rec.results["sizes"]["link_gb_per_s"]
    for ax, shape in zip(axes[0], shapes):
        mine = sorted((c for c in cases if _label(c) == shape), key=lambda c: c["tokens_per_rank"])
        xs = [c["tokens_per_rank"] for c in mine]
        for key, times, label, style in lines:
            if all(key in c for c in mine):          # records before a version lack it
                ax.plot(xs, [times * c[key] for c in mine], style, label=label)
        token_axis(ax, xs)
        ax.set_yscale("log")
        finish(ax, title=f"Expert parallelism on {world} GPUs, {shape} "
               f"(link {link:g} GB/s each way)", xlabel="tokens per rank", ylabel="time (ms)",
               source=rec.label)
    fig.tight_layout(w_pad=3)
    return fig


def versions(case: dict) -> dict:
    """The layer's versions in a case of the record and their times (ms)."""
    return {"sequential": case["sequential_ms"], "overlapped": min(
                case.get("overlapped_ms_by_chunks", {"": case["overlapped_ms"]}).values()),
            **({"once per rank": case["dedup_ms"]} if "dedup_ms" in case else {})}


def case_of(rec, experts: int, tokens: int) -> dict:
    for c in rec.results["cases"]:
        if c["experts"] == experts and c["tokens_per_rank"] == tokens:
            return c
    raise KeyError(f"the record has no case with {experts} experts and {tokens} tokens a rank")


def once_per_rank_lines(rec, experts: int, tokens: int) -> list[str]:
    """Where sending a token once per rank wins, how much of the win the exchange explains:
    the all-to-all of every copy as measured, and the same all-to-all scaled to the bytes
    the once-per-rank version sends (at the GB/s measured), there and back."""
    c = case_of(rec, experts, tokens)
    seq, once = c["sequential_ms"], c["dedup_ms"]
    every_mb, once_mb = c["bytes_sent_per_rank"] / 1e6, c["bytes_sent_per_rank_dedup"] / 1e6
    a2a = c["all_to_all_ms"]
    a2a_once = a2a * once_mb / every_mb
    saved = 2 * (a2a - a2a_once)
    return [f"{rec.gpu} x {rec.results['world']}, E={experts} top-{c['top_k']}, {tokens:,} "
            f"tokens a rank ({rec.label}):",
            f"  layer: sequential {seq:.2f} ms, once per rank {once:.2f} ms ({seq / once:.2f}x)",
            f"  bytes a rank sends each way: {every_mb:,.1f} MB of copies, {once_mb:,.1f} MB "
            f"of tokens ({once_mb / every_mb:.0%})",
            f"  one all-to-all of the copies, measured: {a2a:.2f} ms; of the tokens, at the same "
            f"{c['all_to_all_gb_per_s']:.0f} GB/s: {a2a_once:.2f} ms",
            f"  there and back, the exchange saves {saved:.2f} ms of the {seq - once:.2f} ms; "
            f"the other {seq - once - saved:.2f} ms lie outside the all-to-all (sending every "
            f"copy also gathers {every_mb / once_mb:.1f}x the rows before it and combines them "
            f"after)"]

"""Checks and the imbalance explorer for lesson 08 (Mixture-of-Experts): predict, then see.

Expected values come from the napkin math of :mod:`helpers.intensity.moe` (the active
fraction from the shape, the padding of real counts, the bytes of an all-to-all from its
sizes) or from a record passed in (the speed-up, the loop's launches, whether skew slows
the grouped GEMM): never from a typed-in number. The record is read by the experiment's
names for its versions (``OURS``, ``LOOP``) and its link (``LINK_GB_PER_S``). A wrong
answer that matches a classic slip (the fraction inverted, a whole tile of padding per
expert, the rank's own share sent over the link) gets a message that names it.

:class:`ImbalanceExplorer` skews the router live and shows tokens per expert, the padding,
the copies a capacity drops, and the predicted time next to the recorded one.
"""

from __future__ import annotations

import math

import torch

from .. import intensity
from ..dtypes import element_size
from ..experiments.moe import LOOP, OURS
from ..experiments.moe_parallel import LINK_GB_PER_S
from ..feedback import Feedback, check_choice, check_number
from ..kernels import moe
from ..kernels.moe import parallel as ep
from ..plots import moe as moe_plots
from ..plots.explorer import Explorer, readout_box
from ..plots.moe_routing import draw_tokens_per_expert

# Link bandwidths out of one GPU, per direction (GB/s): a datasheet's figure for both
# directions together, halved. The napkin math itself is helpers.intensity.moe's.
H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
LINKS = {
    "NVLink 4 (H100 SXM)": (LINK_GB_PER_S, "NVIDIA H100 datasheet: NVLink 900 GB/s, both "
                                           f"directions together, per GPU ({H100_DATASHEET})"),
    "PCIe Gen5 x16": (64.0, f"NVIDIA H100 datasheet: PCIe Gen5 128 GB/s ({H100_DATASHEET})"),
    "InfiniBand 400 Gb/s (one NIC a GPU)": (50.0, "400 Gb/s / 8 bits; DeepEP's README: "
                                                  "'~50 GB/s maximum bandwidth' "
                                                  "(https://github.com/deepseek-ai/DeepEP)"),
}
SPEEDUP_BINS = ("<2x", "2-5x", "5-20x", ">20x")
LAUNCHES_PER_EXPERT = ("1", "3", "10")


# --------------------------------------------------------------------------------------
# Napkin math.
# --------------------------------------------------------------------------------------


def check_active_fraction(answer, experts: int, top_k: int) -> Feedback:
    """Exercise: what fraction of the layer's expert FLOPs does one token pay for?"""
    expected = intensity.active_fraction(experts, top_k)
    slips = [(experts / top_k, "you inverted it: a token uses top_k of the E experts"),
             (1 / experts, "you sent each token to one expert; top-k sends it to k"),
             (100 * expected, "you gave a percentage; the question asks for a fraction")]
    return check_number(f"fraction of the experts a token uses (E={experts}, top-{top_k})",
                        answer, expected, rel=0.01,
                        mistakes=[(v, d) for v, d in slips if not math.isclose(v, expected)],
                        hint="top_k of the E experts run on each token")


def check_padding_rows(answer, counts, block_m: int) -> Feedback:
    """Exercise: estimate the padding rows a grouped GEMM with ``block_m``-row tiles
    computes for the tokens per expert ``counts`` (25% is close enough)."""
    counts = [int(c) for c in counts]
    expected = intensity.padding_rows(counts, block_m)
    rows = sum(counts)
    slips = [(len(counts) * block_m, "you gave every expert a whole tile of padding: its "
                                     "last tile is only partly empty, about half on average"),
             ((-rows) % block_m, "you padded all the rows once; each expert's rows are "
                                 "padded to whole tiles separately")]
    return check_number(f"padding rows at BLOCK_M = {block_m}", answer, expected, rel=0.25,
                        unit="rows", mistakes=[(v, d) for v, d in slips if v != expected],
                        hint="each expert's last tile is partly empty: about half a tile "
                             "per expert with rows")


def check_all_to_all_bytes(answer, tokens_per_rank: int, top_k: int, hidden: int,
                           ranks: int, dtype="bf16") -> Feedback:
    """Exercise: the bytes one rank sends in the dispatch all-to-all."""
    expected = intensity.bytes_sent_per_rank(tokens_per_rank, top_k, hidden, ranks, dtype)
    s = element_size(dtype)
    everything = tokens_per_rank * top_k * hidden * s
    slips = [(everything, "you sent every copy over the link: 1/ranks of them are for "
                          "experts on the rank itself and stay home"),
             (expected / top_k, "you sent each token once; each of its top-k copies goes "
                                "to its expert"),
             (2 * expected, "you counted the dispatch and the combine; the question asks "
                            "for one all-to-all"),
             (8 * expected, "you counted bits, not bytes"),
             (expected / s, "you counted elements, not bytes")]
    return check_number(f"bytes one rank sends ({ranks} ranks)", answer, expected, rel=0.02,
                        unit="B", mistakes=[(v, d) for v, d in slips if v != expected],
                        hint="copies x H x bytes an element x (ranks - 1) / ranks")


# --------------------------------------------------------------------------------------
# Predictions read from a record.
# --------------------------------------------------------------------------------------


def _layer_entry(rec, shape: str, tokens: int) -> dict:
    for e in moe_plots.entries(rec, "layer", shape):
        if e["tokens"] == tokens:
            return e
    raise KeyError(f"the record has no layer timing at {shape} with {tokens} tokens")


def speedup_bin(speedup: float) -> str:
    for edge, name in zip((2, 5, 20), SPEEDUP_BINS):
        if speedup < edge:
            return name
    return SPEEDUP_BINS[-1]


def check_layer_speedup(answer, rec, shape: str, tokens: int) -> Feedback:
    """Prediction: how many times faster than the per-expert loop is the grouped layer?
    One of :data:`SPEEDUP_BINS`."""
    e = _layer_entry(rec, shape, tokens)
    value = moe_plots.ratio(e, LOOP)
    why = (f"In the recorded run ({rec.gpu}, {moe_plots.shape_label(rec, shape)}, {tokens:,} "
           f"tokens): the loop {moe_plots.ms(e, LOOP):.3g} ms, ours {moe_plots.ms(e, OURS):.3g} "
           f"ms, {value:.3g}x.")
    return check_choice(f"speed-up at {moe_plots.shape_label(rec, shape)}", answer,
                        speedup_bin(value), SPEEDUP_BINS, why)


def check_loop_launches(answer, rec, shape: str) -> Feedback:
    """Prediction: about how many kernels does the per-expert loop launch for one forward,
    per expert? One of ``"1"``, ``"3"``, ``"10"`` (the nearest, on a log scale)."""
    p = rec.results["profile"][shape]
    launches = p[LOOP]["launches"]
    E = rec.results["config"]["shapes"][shape]["experts"]
    nearest = min(LAUNCHES_PER_EXPERT, key=lambda k: abs(math.log(launches / E / float(k))))
    why = (f"In the recorded run ({rec.gpu}, {p['tokens']:,} tokens): {launches:,.0f} launches "
           f"for E = {E}, {launches / E:.1f} per expert; ours: {p[OURS]['launches']:,.0f}.")
    if isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)                      # 10 as well as "10"
    return check_choice("the loop's launches per expert", answer, nearest, LAUNCHES_PER_EXPERT,
                        why)


def check_fastest_parallel(answer, rec, experts: int, tokens: int) -> Feedback:
    """Prediction: which version of the expert-parallel layer ran fastest in the record?
    ``"sequential"``, ``"overlapped"`` (its best chunk count) or ``"once per rank"``."""
    from ..plots import moe_parallel as parallel_plots

    case = parallel_plots.case_of(rec, experts, tokens)
    times = parallel_plots.versions(case)
    fastest = min(times, key=times.get)
    why = (f"In the recorded run ({rec.gpu} x {rec.results['world']}, E = {experts}, "
           f"{tokens:,} tokens a rank): " + ", ".join(f"{k} {v:.3g} ms" for k, v in times.items())
           + ".")
    return check_choice("the fastest version", answer, fastest, tuple(times), why)


def skew_slows(rec, threshold: float = 1.15) -> bool:
    """Whether ours took ``threshold`` times longer at the strongest skew than unskewed."""
    levels = sorted(rec.results["imbalance"]["levels"], key=lambda lv: lv["strength"])
    t0, t1 = (moe_plots.level_ms(lv, OURS) for lv in (levels[0], levels[-1]))
    return t1 > threshold * t0


def check_skew_slows(answer, rec) -> Feedback:
    """Prediction: when a few experts get most of the tokens, does the grouped GEMM on
    one GPU get markedly (15%) slower? ``"yes"`` or ``"no"``."""
    levels = sorted(rec.results["imbalance"]["levels"], key=lambda lv: lv["strength"])
    lo, hi = levels[0], levels[-1]
    why = (f"In the recorded run ({rec.gpu}): unskewed {moe_plots.level_ms(lo, OURS):.3g} ms; "
           f"at s = {hi['strength']:g}, where the busiest expert holds {hi['max_over_mean']:.1f}x "
           f"the mean, {moe_plots.level_ms(hi, OURS):.3g} ms.")
    return check_choice("the grouped GEMM under skew", answer,
                        "yes" if skew_slows(rec) else "no", ("yes", "no"), why)


# --------------------------------------------------------------------------------------
# The imbalance explorer.
# --------------------------------------------------------------------------------------


def _dense_entry(rec, shape: str, tokens: int) -> dict | None:
    return next((e for e in moe_plots.entries(rec, "experts", shape) if e["tokens"] == tokens),
                None)


def predicted_ms(rec, counts_kept, block_m: int) -> dict:
    """The experts' time for a routing, from the unskewed recorded run: ours in proportion
    to the rows its tiles compute (real and padding); the loop as a cost per expert with
    rows plus the FLOPs at the dense matmul's rate (both calibrated on the unskewed run)."""
    im = rec.results["imbalance"]
    base = min(im["levels"], key=lambda lv: lv["strength"])
    kept = [int(c) for c in counts_kept]
    rows = sum(kept) + intensity.padding_rows(kept, block_m)
    out = {"ours": moe_plots.level_ms(base, OURS) * rows / (im["copies"] + base["padding_rows"])}
    dense = _dense_entry(rec, im["shape"], im["tokens"])
    loop0 = moe_plots.level_ms(base, LOOP)
    if dense and loop0 and moe_plots.ms(dense, moe_plots.DENSE):
        dense_ms = moe_plots.ms(dense, moe_plots.DENSE)
        active0 = len(base["counts"]) - base["idle_experts"]
        per_expert = max(0.0, loop0 - dense_ms) / active0
        out["loop"] = per_expert * sum(c > 0 for c in kept) + dense_ms * sum(kept) / im["copies"]
    return out


def busiest_rank(counts, ranks: int) -> float:
    """Expert parallelism over ``ranks`` GPUs, consecutive experts on each: the busiest
    GPU's rows over the mean."""
    counts = [int(c) for c in counts]
    per = len(counts) // ranks
    loads = [sum(counts[r * per:(r + 1) * per]) for r in range(ranks)]
    return max(loads) / (sum(loads) / ranks)


class ImbalanceExplorer(Explorer):
    """Skew the router toward the record's hot experts; see tokens per expert, padding,
    dropped copies and the experts' predicted time beside the recorded one."""

    figsize = (10, 5.2)

    def __init__(self, rec, logits: torch.Tensor | None = None, strength: float | None = None,
                 block_m: int | None = None, capacity="none", ranks: int = 8):
        import ipywidgets as w

        self.rec, self.im, self.ranks = rec, rec.results["imbalance"], ranks
        shape = rec.results["config"]["shapes"][self.im["shape"]]
        self.experts, self.top_k = shape["experts"], shape["top_k"]
        self.logits = logits if logits is not None else moe.router_logits(
            self.im["tokens"], shape["hidden"], self.experts, seed=701)
        strengths = [lv["strength"] for lv in self.im["levels"]]
        tuned = self.im["block_m"]
        sizes = sorted({16, 32, 64, 128, tuned})
        controls = {
            "strength": w.SelectionSlider(options=strengths, value=strength if strength
                                          in strengths else strengths[len(strengths) // 2],
                                          description="skew s", continuous_update=False),
            "block_m": w.Dropdown(options=sizes, value=block_m or tuned, description="BLOCK_M"),
            "capacity": w.Dropdown(options=["none", *self.im["capacity_factors"]],
                                   value=capacity, description="capacity")}
        super().__init__(controls, [w.HBox(list(controls.values()))])

    def draw(self, ax, strength, block_m, capacity) -> str:
        T = self.logits.shape[0]
        _, ids = moe.skewed_route(self.logits, self.top_k, strength, self.im["hot"])
        cap = None if capacity == "none" else moe.capacity(T, self.top_k, self.experts, capacity)
        d = moe.dispatch(ids, self.experts, cap)
        full = torch.bincount(ids.reshape(-1), minlength=self.experts)
        drawn = draw_tokens_per_expert(
            ax, full, block_m, cap, title=f"{T:,} tokens routed to top-{self.top_k} of "
            f"{self.experts} experts, the first {self.im['hot']} favoured by s = {strength:g}",
            source=f"routing computed now; times {self.rec.label}")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.7)          # room for the readout above the bars
        ax.legend(fontsize=7, loc="upper right")
        pred = predicted_ms(self.rec, d.counts, block_m)
        level = next(lv for lv in self.im["levels"] if lv["strength"] == strength)
        rec_ours = self._recorded(level, block_m, capacity)
        copies = T * self.top_k
        lines = [f"busiest expert {drawn['max']:,} rows = {drawn['max'] / drawn['mean']:.1f}x "
                 f"the mean ({drawn['mean']:,.0f})",
                 f"padding at BLOCK_M {block_m}: {drawn['padding']:,} rows "
                 f"({100 * drawn['padding'] / copies:.1f}% of {copies:,})"]
        if cap is not None:
            lines.append(f"capacity {capacity:g} = {cap:,} rows: {d.dropped:,} copies dropped "
                         f"({100 * d.dropped / copies:.1f}%)")
        lines.append(f"ours: predicted {pred['ours']:.3g} ms | recorded " + (
            f"{rec_ours:.3g} ms" if rec_ours else f"only at BLOCK_M {self.im['block_m']}"))
        if "loop" in pred and capacity == "none":
            lines.append(f"loop: predicted {pred['loop']:.3g} ms | recorded "
                         f"{moe_plots.level_ms(level, LOOP):.3g} ms")
        lines.append(f"{self.ranks} GPUs x {self.experts // self.ranks} experts: busiest GPU "
                     f"{busiest_rank(d.counts, self.ranks):.2f}x the mean")
        text = "\n".join(lines)
        readout_box(ax, text)
        return text

    def _recorded(self, level: dict, block_m: int, capacity) -> float | None:
        if block_m != self.im["block_m"]:
            return None
        if capacity == "none":
            return moe_plots.level_ms(level, OURS)
        return next((c.get("ms") for c in level["capacity"] if c["factor"] == capacity), None)


# --------------------------------------------------------------------------------------
# Expert parallelism on two ranks (gloo on the CPU, NCCL on two GPUs).
# --------------------------------------------------------------------------------------

EP_DEMO = {"experts": 4, "top_k": 2, "hidden": 32, "width": 48, "tokens_per_rank": 24}


def ep_demo_rank(rank: int, world: int, sizes: dict = EP_DEMO) -> dict:
    """One rank of a tiny expert-parallel layer (start it with
    ``helpers.parallel.launch(ep_demo_rank, 2)``): every rank draws the same full weights
    and all ranks' tokens, keeps its shard of the experts and its own tokens, and runs both
    versions of :mod:`helpers.kernels.moe.parallel`. Returns their largest difference from
    one process's ``moe_forward`` on all the tokens, and the rows it sent to each rank."""
    E, k, H, I, T = (sizes[n] for n in ("experts", "top_k", "hidden", "width",
                                         "tokens_per_rank"))
    w = moe.make_weights(E, H, I, seed=3)
    x_all = torch.randn(world * T, H, generator=torch.Generator().manual_seed(4)).to(w.gate)
    want = moe.moe_forward(x_all, w, k)[rank * T:(rank + 1) * T]
    x, shard = x_all[rank * T:(rank + 1) * T], ep.shard_weights(w, rank, world)
    out = {"rank": rank, "experts held": list(ep.local_experts(E, world, rank))}
    for name, run in (("sequential", lambda: ep.ep_forward_sequential(x, shard, k)),
                      ("overlapped", lambda: ep.ep_forward_overlapped(x, shard, k, chunks=2))):
        out[f"{name} max error"] = (run() - want).abs().max().item()
    p = ep.plan(x, shard, k)
    out["rows sent to each rank"] = p.send_splits[0]
    out["rows received from each rank"] = p.recv_splits[0]
    return out

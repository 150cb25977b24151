"""Lesson 06's online softmax, one block at a time: the update, its step table, its explorer.

Softmax needs the row's maximum before its first ``exp``; attention's rows are too long to
hold. The online softmax walks a row in blocks and keeps two numbers, the running maximum
``m`` and the running sum ``l`` of ``exp(x - m)``. When a block raises the maximum, the sum
so far was counted against the old one and is rescaled by ``exp(m_old - m_new)``:

    m_new = max(m_old, max(block))
    l_new = l_old * exp(m_old - m_new) + sum(exp(block - m_new))

Lesson 05's ``softmax_kernel_online`` runs this update in Triton over long rows
(:mod:`helpers.kernels.softmax`). Here it is in plain PyTorch, the way lesson 06 derives it:

* :func:`update`: one block of scores for a batch of rows; :func:`online_softmax` (the
  softmax and the log-sum-exp from one pass over the blocks) and
  :func:`online_softmax_matmul` (``softmax(scores) @ values`` in one pass, the output
  accumulator rescaled by the same factor: FlashAttention's inner loop, one K/V block at a
  time);
* :func:`step_table`: every step of one row as plain numbers, for tables and tests;
* :class:`OnlineSoftmaxExplorer`: a slider over the blocks of one row; the block's values,
  the running maximum, the running sum, the rescale factor, and the partial softmax beside
  ``torch.softmax``;
* :func:`draw_causal_tiles`: which K/V tiles each Q tile of causal attention computes,
  masks or skips.

Edge rows follow FlashAttention's convention: ``-inf`` entries (masked keys) get
probability 0; a row that is masked entirely gives the output 0 and the log-sum-exp
``-inf``, where ``torch.softmax`` gives NaN (0 / 0). The subtraction uses a *safe*
maximum, 0 while nothing finite has been seen, so that ``exp(-inf - (-inf))`` never arises.
"""

from __future__ import annotations

import math

import torch

from . import finish
from .explorer import Explorer, new_figure, readout_box

NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------
# The update, and the two loops built on it.
# --------------------------------------------------------------------------------------


def update(m: torch.Tensor, l: torch.Tensor, scores: torch.Tensor):  # noqa: E741
    """One block of ``scores`` (rows x block) folded into the running max ``m`` and sum ``l``
    (one per row). Returns ``(m_new, l_new, rescale, p)``: ``p = exp(scores - m_new)``."""
    m_new = torch.maximum(m, scores.amax(dim=-1))
    safe = torch.where(m_new == NEG_INF, 0.0, m_new)   # nothing finite seen yet: subtract 0
    rescale = torch.exp(m - safe)                      # exp(m_old - m_new): 1 if m unchanged
    p = torch.exp(scores - safe[:, None])              # masked (-inf) scores give 0
    l_new = l * rescale + p.sum(dim=-1)                # the old sum, counted against m_new
    return m_new, l_new, rescale, p


def _start(x: torch.Tensor):
    rows = x.shape[0]
    return (torch.full((rows,), NEG_INF, dtype=x.dtype, device=x.device),
            torch.zeros(rows, dtype=x.dtype, device=x.device))


def _lse(m: torch.Tensor, l: torch.Tensor) -> torch.Tensor:  # noqa: E741
    """``m + log(l)``: the row's log-sum-exp, ``-inf`` where nothing was seen (l = 0)."""
    return torch.where(l > 0, m + torch.log(l), NEG_INF)


def online_softmax(x: torch.Tensor, block: int = 4):
    """Softmax over the last dimension of ``x`` (rows x n) from one online pass in blocks of
    ``block``: returns ``(y, lse)``. Fully masked rows give ``y = 0`` and ``lse = -inf``."""
    x2 = x.reshape(-1, x.shape[-1])
    m, l = _start(x2)  # noqa: E741
    for start in range(0, x2.shape[-1], block):
        m, l, _, _ = update(m, l, x2[:, start:start + block])  # noqa: E741
    # The second pass writes exp(x - m) / l. (It equals exp(x - lse), but near 1e4 the
    # larger lse keeps fewer fp32 digits of its fraction; x - m is exact there.)
    safe = torch.where(m == NEG_INF, 0.0, m)
    y = torch.exp(x2 - safe[:, None]) / l.clamp_min(1e-30)[:, None]
    y = torch.where(l[:, None] > 0, y, 0.0)
    return y.reshape(x.shape), _lse(m, l).reshape(x.shape[:-1])


def online_softmax_matmul(scores: torch.Tensor, values: torch.Tensor, block: int = 4):
    """``softmax(scores) @ values`` in one pass over blocks of keys, never holding a
    normalised row: the accumulator is rescaled like the sum and divided by ``l`` once at
    the end. ``scores`` is rows x n, ``values`` n x d; returns ``(o, lse)``."""
    m, l = _start(scores)  # noqa: E741
    acc = torch.zeros(scores.shape[0], values.shape[-1], dtype=scores.dtype,
                      device=scores.device)
    for start in range(0, scores.shape[-1], block):
        m, l, rescale, p = update(m, l, scores[:, start:start + block])  # noqa: E741
        acc = acc * rescale[:, None] + p @ values[start:start + block]
    o = torch.where(l[:, None] > 0, acc / l.clamp_min(1e-30)[:, None], 0.0)
    return o, _lse(m, l)


# --------------------------------------------------------------------------------------
# One row, step by step.
# --------------------------------------------------------------------------------------


def step_table(row, block: int = 4) -> list[dict]:
    """Each block of one row as a dict: ``block`` (0-based), ``start``, ``stop``,
    ``block_max``, ``running_max`` (after it), ``rescale`` (``exp(m_old - m_new)``, the factor
    the old sum is multiplied by), ``block_sum`` (``sum(exp(block - m_new))``) and
    ``running_sum`` (after it). Computed in float64; values are Python floats."""
    x = torch.as_tensor(row, dtype=torch.float64).reshape(1, -1)
    if x.numel() == 0:
        raise ValueError("the row is empty: give it at least one score")
    if block < 1:
        raise ValueError(f"block must be a positive number of elements, got {block}")
    m, l = _start(x)  # noqa: E741
    steps = []
    for i, start in enumerate(range(0, x.shape[-1], block)):
        chunk = x[:, start:start + block]
        m, l_new, rescale, p = update(m, l, chunk)
        steps.append({"block": i, "start": start, "stop": start + chunk.shape[-1],
                      "block_max": chunk.max().item(), "running_max": m.item(),
                      "rescale": rescale.item(), "block_sum": p.sum().item(),
                      "running_sum": l_new.item()})
        l = l_new  # noqa: E741
    return steps


def format_steps(steps: list[dict]) -> str:
    """A fixed-width table of :func:`step_table` (deterministic, for notebooks)."""
    head = (f"{'block':>5} {'elements':>9} {'block max':>10} {'running max':>12} "
            f"{'rescale':>9} {'block sum':>10} {'running sum':>12}")
    lines = [head, "-" * len(head)]
    for s in steps:
        lines.append(f"{s['block']:>5} {s['start']:>4}-{s['stop'] - 1:<4} {s['block_max']:>10.4g} "
                     f"{s['running_max']:>12.4g} {s['rescale']:>9.4g} {s['block_sum']:>10.4g} "
                     f"{s['running_sum']:>12.5g}")
    return "\n".join(lines)


def partial_softmax(row, steps: list[dict], upto: int) -> torch.Tensor:
    """``exp(x - m) / l`` over the elements seen after block ``upto`` (0-based): the answer if
    the row ended there; zeros where the seen part is masked entirely."""
    s = steps[upto]
    seen = torch.as_tensor(row, dtype=torch.float64)[: s["stop"]]
    if s["running_sum"] == 0:
        return torch.zeros_like(seen)
    return torch.exp(seen - s["running_max"]) / s["running_sum"]


class OnlineSoftmaxExplorer(Explorer):
    """Step through the blocks of one row: what the block adds, how the max and the sum
    move, how far the partial softmax is from ``torch.softmax`` of the same elements.

    ``rows`` is one row (1-D) or a dict of named rows (a dropdown picks one)."""

    figsize = (9, 9.5)

    def __init__(self, rows, block: int = 4, step: int = 1):
        import ipywidgets as w

        if not isinstance(rows, dict):
            rows = {"row": rows}
        self.rows = {name: torch.as_tensor(r, dtype=torch.float64).flatten()
                     for name, r in rows.items()}
        self.block = block
        self.steps = {name: step_table(r, block) for name, r in self.rows.items()}
        first = next(iter(self.rows))
        n = len(self.steps[first])
        slider = w.IntSlider(value=min(max(step, 1), n), min=1, max=n, description="block",
                             continuous_update=False)
        controls = {"step": slider}
        layout = [slider]
        if len(self.rows) > 1:
            controls["row"] = w.Dropdown(options=list(self.rows), value=first, description="row")
            layout = [w.HBox([controls["row"], slider])]
        super().__init__(controls, layout)

    def on_change(self, name: str, change: dict) -> None:
        if name == "row":                  # another row may have another number of blocks
            slider = self.controls["step"]
            n = len(self.steps[change["new"]])
            slider.value = min(slider.value, n)
            slider.max = n

    def axes(self):
        # The readout on top, in a panel of its own; then scores, running values, softmax.
        fig, axes = new_figure(self.figsize, nrows=4,
                               gridspec_kw={"height_ratios": [1.2, 3, 2, 3]})
        axes[0].axis("off")
        self._axes = axes[1:]
        return fig, axes[0]

    def draw(self, ax, step: int, row: str | None = None) -> str:
        name = row or next(iter(self.rows))
        x, steps = self.rows[name], self.steps[name]
        k = min(step, len(steps)) - 1
        _draw_scores(self._axes[0], x, steps, k, self.block)
        _draw_running(self._axes[1], steps, k)
        err = _draw_partial(self._axes[2], x, steps, k)
        ax.set_title(f"The online softmax, block by block ({self.block} elements a block)")
        s, old = steps[k], (steps[k - 1] if k else None)
        m_old = old["running_max"] if old else NEG_INF
        l_old = old["running_sum"] if old else 0.0
        text = (f"{name}: block {k + 1} of {len(steps)} (elements {s['start']}-{s['stop'] - 1})\n"
                f"block max     {s['block_max']:.6g}\n"
                f"running max   {m_old:.6g} -> {s['running_max']:.6g}\n"
                f"rescale       exp(m_old - m_new) = {s['rescale']:.4g}\n"
                f"running sum   {l_old:.5g} x {s['rescale']:.4g} + {s['block_sum']:.5g} "
                f"= {s['running_sum']:.5g}\n"
                f"partial softmax vs torch.softmax(x[:{s['stop']}]): {err}")
        readout_box(ax, text)
        return text


def _label(ax, title: str, xlabel: str, ylabel: str) -> None:
    """Title and axis labels of an upper panel (the bottom panel carries the source line)."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.25)


def _draw_scores(ax, x, steps, k, block):
    n = x.numel()
    finite = torch.isfinite(x)
    colors = ["C1" if steps[k]["start"] <= i < steps[k]["stop"] else
              ("C0" if i < steps[k]["start"] else "0.8") for i in range(n)]
    heights = torch.where(finite, x, 0.0).tolist()
    ax.bar(range(n), heights, color=colors, width=0.8, label="scores (orange: this block)")
    masked = [i for i in range(n) if not finite[i]]
    if masked:
        ax.plot(masked, [0] * len(masked), "x", color="C3", label="-inf (masked)")
    for i, s in enumerate(steps[: k + 1]):
        if math.isfinite(s["running_max"]):
            ax.hlines(s["running_max"], s["start"] - 0.5, s["stop"] - 0.5, color="k", lw=2,
                      label="running max after the block" if i == 0 else None)
    for start in range(block, n, block):
        ax.axvline(start - 0.5, color="0.6", ls=":", lw=0.8)
    lo, hi = min(heights + [0.0]), max(heights + [0.0])
    ax.set_ylim(lo - 0.1 * (hi - lo or 1), hi + 0.45 * (hi - lo or 1))   # room for the legend
    ax.set_xlim(-0.6, n - 0.4)
    _label(ax, "One row of scores, walked in blocks", "element of the row", "score")
    ax.legend(fontsize=7, loc="upper center", ncol=3)


def _draw_running(ax, steps, k):
    blocks = [s["block"] + 1 for s in steps[: k + 1]]
    ax.bar(blocks, [s["rescale"] for s in steps[: k + 1]], color="C2", alpha=0.5, width=0.5,
           label="rescale exp(m_old - m_new)")
    ax.set_ylim(0, 1.15)
    ax.set_xlim(0.4, len(steps) + 0.6)
    ax.set_xticks(range(1, len(steps) + 1))
    twin = ax.twinx()
    twin.plot(blocks, [s["running_sum"] for s in steps[: k + 1]], "o-", color="C0",
              label="running sum l")
    twin.set_ylabel("running sum l")
    twin.set_ylim(0, max(s["running_sum"] for s in steps) * 1.15 or 1)
    _label(ax, "After each block", "block", "rescale factor")
    handles = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper left")


def _draw_partial(ax, x, steps, k) -> str:
    """The partial softmax of the seen elements against torch.softmax; returns the error."""
    stop = steps[k]["stop"]
    mine = partial_softmax(x, steps, k)
    want = torch.softmax(x[:stop], dim=0)
    final = torch.softmax(x, dim=0)
    ax.bar(range(stop), mine.tolist(), color="C0", width=0.8,
           label="online: exp(x - m) / l, elements seen so far")
    ax.plot(range(stop), want.tolist(), "k.", label="torch.softmax of the same elements")
    ax.plot(range(x.numel()), final.tolist(), "o", mfc="none", color="0.5", ms=5,
            label="torch.softmax of the whole row")
    ax.set_xlim(-0.6, x.numel() - 0.4)
    finish(ax, title="The partial softmax: the answer if the row ended here",
           xlabel="element of the row", ylabel="probability",
           source="computed in float64 by helpers.plots.attention_steps (no GPU involved)")
    if torch.isnan(want).all():
        return "torch.softmax gives NaN (all masked); online gives 0"
    return f"max |diff| {(mine - want).abs().max().item():.1e}"


# --------------------------------------------------------------------------------------
# Causal attention, tile by tile.
# --------------------------------------------------------------------------------------


def causal_tile_kinds(seq: int, block_m: int, block_n: int) -> list[list[str]]:
    """For each Q tile (rows) and K/V tile (columns) of causal attention (query i sees keys
    j <= i): ``"full"`` (every key visible: no mask), ``"diagonal"`` (some keys masked: the
    mask is applied) or ``"skipped"`` (every key masked: the tile is never loaded)."""
    kinds = []
    for r0 in range(0, seq, block_m):
        r1 = min(r0 + block_m, seq) - 1                  # the tile's last query
        line = []
        for c0 in range(0, seq, block_n):
            c1 = min(c0 + block_n, seq) - 1              # the tile's last key
            line.append("skipped" if c0 > r1 else ("full" if c1 <= r0 else "diagonal"))
        kinds.append(line)
    return kinds


def draw_causal_tiles(ax, seq: int, block_m: int, block_n: int) -> dict:
    """The tile grid of causal attention, coloured by :func:`causal_tile_kinds`; returns the
    count of each kind."""
    import numpy as np
    from matplotlib.colors import ListedColormap

    kinds = causal_tile_kinds(seq, block_m, block_n)
    colors = {"skipped": "white", "diagonal": "#9ecae1", "full": "#3182bd"}
    code = {kind: i for i, kind in enumerate(colors)}
    grid = np.array([[code[k] for k in line] for line in kinds])
    ax.imshow(grid, cmap=ListedColormap(list(colors.values())), vmin=-0.5, vmax=2.5)
    counts = {k: int((grid == v).sum()) for k, v in code.items()}
    for kind, color in colors.items():
        ax.plot([], [], "s", color=color, mec="0.5", ms=9, label=f"{kind}: {counts[kind]} tiles")
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    finish(ax, title=f"Causal attention, seq {seq}: {block_m} x {block_n} tiles",
           xlabel=f"K/V tile ({block_n} keys each)", ylabel=f"Q tile ({block_m} queries each)",
           source="tile counts computed by helpers.plots.attention_steps")
    ax.grid(False)
    return counts

"""The widget toolkit: move a control, watch the model answer.

An explorer is a few ipywidgets controls wired to a drawing function with
``ipywidgets.interactive_output``; the drawing is plain matplotlib, shown inline. Each
lesson's explorer lives with that lesson's figures (:mod:`helpers.plots.memory_wall`,
:mod:`helpers.plots.roofline`, :mod:`helpers.plots.tiling`); what they share is here.

Without a browser (a notebook executed by nbconvert or nbval, or opened on a site that
cannot run widgets) a widget is just a grey box. So every explorer also carries a
static picture of its current state: displaying it sends the live widget *and* a PNG
of the same figure, and each front end shows the richest one it can (JupyterLab the
live widget, a static renderer the picture). The text readout is drawn into the
figure too (:func:`readout_box`), so the picture stands on its own.

Two rules every explorer keeps, because a browser showed what breaks without them:

* **One redraw per change.** Changing one control often changes others (a GPU without
  bf16 narrows the dtype list; another op has another size range). Those dependent
  updates happen in :meth:`Explorer.on_change` with redraws held, and the change that
  caused them redraws once, in a consistent state.
* **Every point on the axes.** :func:`log_limits` widens a log axis to cover the points
  drawn on it, so a prediction far right of the usual range still shows.
"""

from __future__ import annotations

import base64
import functools
import io
import math


def new_figure(figsize=(8, 5), **subplots):
    """A pyplot figure and its axes (``subplots`` passes on, e.g. ``ncols=2``)."""
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize, **subplots)


def png(fig) -> str:
    """``fig`` as a base64 PNG, cropped to what is drawn (what a static renderer shows)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def readout_box(ax, text: str) -> None:
    """The explorer's readout, drawn in the top left corner of ``ax``."""
    ax.text(0.02, 0.98, text, transform=ax.transAxes, va="top", ha="left", fontsize=8,
            family="monospace", bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.9,
                                      "edgecolor": "0.7"})


def log_limits(lo: float, hi: float, values, base: float = 2.0, margin: float = 2.0):
    """The log-axis limits ``(lo, hi)``, widened by whole powers of ``base`` until every
    positive value lies at least a factor ``margin`` inside them. Unchanged when the
    values already fit, so a familiar picture keeps its familiar axes."""
    for v in values:
        if v is None or not math.isfinite(v) or v <= 0:
            continue
        while v / margin < lo:
            lo /= base
        while v * margin > hi:
            hi *= base
    return lo, hi


class Explorer:
    """Controls + a drawing function, live in JupyterLab and static everywhere else.

    Subclasses build ``controls`` (name -> widget) and implement
    ``draw(ax, **values) -> str``, which draws on ``ax`` and returns the readout text;
    they override :meth:`on_change` to update controls that depend on others. After
    every redraw ``self.readout`` holds that text, ``self.values`` the controls' values
    and ``self.redraws`` counts the redraws, so tests can drive an explorer without a
    browser.
    """

    figsize = (8, 5)

    def __init__(self, controls: dict, layout):
        import ipywidgets as w

        self.controls = controls
        self.readout = ""
        self.values: dict = {}
        self.redraws = 0
        self._holding = False
        # Registered before interactive_output's own observers, so that dependent
        # controls have settled when the redraw for this change comes.
        for name, control in controls.items():
            control.observe(functools.partial(self._changed, name), "value")
        self.output = w.interactive_output(self._redraw, controls)
        self.widget = w.VBox([*layout, self.output])

    def draw(self, ax, **values) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_change(self, name: str, change: dict) -> None:
        """Update the controls that depend on control ``name`` (default: none).

        Runs with redraws held: whatever it changes draws nothing by itself."""

    def _changed(self, name: str, change: dict) -> None:
        if self._holding:
            return
        self._holding = True
        try:
            self.on_change(name, change)
        finally:
            self._holding = False

    def axes(self):
        """A new figure for one state: ``(fig, ax)``, ``ax`` being what ``draw`` gets."""
        return new_figure(self.figsize)

    def decorate(self, fig) -> None:
        """Draw the figure's other panels after ``draw`` (default: nothing)."""

    def figure(self, **values):
        """A new matplotlib figure of the state ``values`` (default: the current one)."""
        import matplotlib.pyplot as plt

        values = {**{k: c.value for k, c in self.controls.items()}, **values}
        fig, ax = self.axes()
        try:
            self.readout = self.draw(ax, **values)
            self.decorate(fig)
            fig.tight_layout()
        except Exception:
            plt.close(fig)       # never leave a half-drawn figure for pyplot to show later
            raise
        self.values = values
        return fig

    def _redraw(self, **values) -> None:
        import matplotlib.pyplot as plt
        from IPython.display import display

        if self._holding:        # a dependent control moved: the cause redraws once
            return
        fig = self.figure(**values)
        self.redraws += 1
        display(fig)
        plt.close(fig)

    def static_png(self) -> str:
        """The current state as a base64 PNG (what a static renderer shows)."""
        import matplotlib.pyplot as plt

        fig = self.figure()
        try:
            return png(fig)
        finally:
            plt.close(fig)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = self.widget._repr_mimebundle_()
        bundle["image/png"] = self.static_png()
        bundle["text/plain"] = self.readout
        return bundle

    def __repr__(self) -> str:
        return self.readout

"""Small plotting conventions shared by every lesson: each figure says where its data came from."""

from __future__ import annotations


def add_source(ax, text: str) -> None:
    """Write the data's provenance under the axes (e.g. a record's label)."""
    ax.annotate(f"source: {text}", xy=(0, 0), xycoords="axes fraction", xytext=(0, -38),
                textcoords="offset points", fontsize=7, color="0.35", va="top")


def finish(ax, *, title: str, xlabel: str, ylabel: str, source: str, legend: bool = True):
    """Title, labelled axes with units, a legend and the source line: the course's minimum."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.25)
    if legend:
        ax.legend(fontsize=8)
    add_source(ax, source)
    return ax

"""Planting mistakes in a copy of a solution notebook, for the grader tests."""

from __future__ import annotations

import copy

import nbformat


def edit(replace=(), append=(), insert_after_first=()):
    """A function that plants a mistake in a copy of the solution notebook.

    ``replace`` pairs must each match exactly one code cell of the solution, so a plant
    that no longer applies (the solution changed) fails loudly instead of testing nothing.
    """

    def apply(nb):
        nb = copy.deepcopy(nb)
        for old, new in replace:
            hits = [c for c in nb.cells if c.cell_type == "code" and old in c.source]
            assert len(hits) == 1, f"the solution changed: {old!r} found {len(hits)} times"
            hits[0].source = hits[0].source.replace(old, new)
        for i, src in enumerate(insert_after_first):
            first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
            nb.cells.insert(first + 1 + i, nbformat.v4.new_code_cell(src))
        for src in append:
            nb.cells.append(nbformat.v4.new_code_cell(src))
        return nb

    return apply

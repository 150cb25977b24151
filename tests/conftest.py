"""Shared set-up for every test: the ``gpu`` marker skips by itself without a CUDA GPU, and
under parallel workers the long work starts first.

A test that needs compiled kernels or real timings carries ``@pytest.mark.gpu`` (declared
in pyproject.toml) and nothing else: in CPU mode it is reported as skipped, on the GPU
machine it runs. Shared assertions live in ``tests/support.py``.

``./course test`` runs the suite on a pytest-xdist worker per core and one more, with ``--dist
loadscope``: a notebook's cells, a module's tests or a class's tests go to one worker, in
order, as one unit. Workers take units from one queue as they finish the last one, so a long
unit taken last keeps one worker busy while the others idle. The queue therefore starts with
the longest kinds of unit: those with a fixture named ``graded...`` (it runs the grader over
whole notebooks, 40 s to 2 min on two cores), then the notebooks, then modules with a shared
module or class fixture, then the rest, each kind in collection order.
"""

import pytest

import helpers


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):          # a pytest-xdist worker
        _longest_units_first(items)
    if helpers.is_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (compiled kernels or real timings); "
                                   "runs on the GPU machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def unit(item) -> str:
    """The unit loadscope hands to one worker: the test's module or class, or the notebook."""
    return item.nodeid.rsplit("::", 1)[0]


def expected_length(item) -> int:
    """3: uses a ``graded...`` fixture; 2: a notebook's cell (nbval); 1: shares a module or
    class fixture; 0: the rest."""
    names = getattr(item, "fixturenames", ())
    if any(name.startswith("graded") for name in names):
        return 3
    if ".ipynb::" in item.nodeid:
        return 2
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    shared = any(d.scope in ("module", "class") and d.baseid.startswith("tests")
                 for chain in defs for d in chain)
    return 1 if shared else 0


def _longest_units_first(items) -> None:
    """Reorder ``items`` so the longest kinds of unit come first; a unit stays in order, as
    the sort is stable (nbval's cells must run one after another in one kernel)."""
    length: dict[str, int] = {}
    for item in items:
        length[unit(item)] = max(length.get(unit(item), 0), expected_length(item))
    items.sort(key=lambda item: -length[unit(item)])

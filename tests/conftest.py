"""Shared set-up for every test: the ``gpu`` marker skips by itself without a CUDA GPU.

A test that needs compiled kernels or real timings carries ``@pytest.mark.gpu`` (declared
in pyproject.toml) and nothing else: in CPU mode it is reported as skipped, on the GPU
machine it runs. Shared assertions live in ``tests/support.py``.
"""

import pytest

import helpers


def pytest_collection_modifyitems(config, items):
    if helpers.is_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (compiled kernels or real timings); "
                                   "runs on the GPU machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)

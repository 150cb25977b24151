"""Triton kernels, one module per topic, each read top to bottom like a lesson.

A module holds: a pure-PyTorch reference (the spec), the Triton kernels from naive to
best (``_v1``, ``_v2``, ...), a launcher that checks its inputs, allocates, picks the
grid and launches.
Kernels import only torch, triton, :mod:`helpers.runtime`, :mod:`helpers.dtypes` and
:mod:`helpers.kernels.checks`; the napkin math of every op lives in :mod:`helpers.intensity`.
"""

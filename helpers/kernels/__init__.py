"""Triton kernels, one module per op, each read top to bottom like a lesson.

A module holds: a pure-PyTorch reference (the spec), the Triton kernels from naive to
best (``_v1``, ``_v2``, ...), a launcher that checks its inputs, allocates, picks the
grid and launches. An op family that needs several modules is a package whose
``__init__`` is its face (spec, launchers, the entry point a lesson calls), one module
per idea inside: :mod:`.matmul` (lessons 04, 05, 07; its one tile-setting type is
:class:`.matmul.config.TileConfig`), :mod:`.attention` (06), :mod:`.moe` (08).
Kernels import only torch, triton, :mod:`helpers.runtime`, :mod:`helpers.dtypes`, their
siblings here, and two modules of data and formulas: the napkin math
:mod:`helpers.intensity` and the GPU table :mod:`helpers.hardware`.
"""

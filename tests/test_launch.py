"""helpers.kernels.launch: a compiled kernel launched again without Triton's per-call
Python. Triton's compiled kernels exist only on a GPU; here a stand-in with the same
attributes records what the launcher is handed. The compiled launches are exercised by
the GPU tests of the kernels that use it (decoding, the tuned matmul, the operand copy).
"""

from __future__ import annotations

import pytest
import triton

from helpers.kernels import launch


class Compiled:
    """A compiled kernel's shape, as Triton 3.6 gives it: ``run`` (the launcher),
    ``function``, ``packed_metadata`` and ``[grid]`` (the usual path)."""

    function, packed_metadata = 1234, ("metadata",)

    def __init__(self):
        self.calls, self.usual = [], []

    def run(self, *args):
        self.calls.append(args)

    def __getitem__(self, grid):
        return lambda *args: self.usual.append((grid, args))


def test_a_lean_launch_hands_the_launcher_what_the_usual_path_does(monkeypatch):
    compiled = Compiled()
    streams = {}
    go = launch.lean(compiled, (4, 2, 1), 3, current_stream=lambda d: streams.setdefault(d, 77))
    go("a", "b", 5, 64)
    # grid, the device's current stream, the function, the metadata, no launch metadata
    # and no hooks, then every argument as compiled[grid] takes it.
    assert compiled.calls == [(4, 2, 1, 77, 1234, ("metadata",), None, None, None,
                               "a", "b", 5, 64)]
    assert streams == {3: 77} and compiled.usual == []


def test_a_set_hook_sends_the_launch_the_usual_way(monkeypatch):
    compiled = Compiled()
    go = launch.lean(compiled, (1, 1, 1), 0, current_stream=lambda d: 0)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    go("x")
    assert compiled.usual == [((1, 1, 1), ("x",))] and compiled.calls == []


def test_a_grid_needs_three_axes():
    with pytest.raises(ValueError, match="three axes"):
        launch.lean(Compiled(), (4, 2), 0, current_stream=lambda d: 0)


def test_a_launch_hook_counts_only_when_one_is_set():
    """Newer Tritons keep an empty HookChain where older ones kept None: an empty chain is
    no hook (else every lean launch would take the slow path), a chain with a call is."""
    class Chain:                    # triton.knobs.HookChain's shape (Triton 3.6, 3.7)
        def __init__(self):
            self.calls = []

    chain = getattr(triton.knobs, "HookChain", Chain)()
    assert not launch.hooked(None) and not launch.hooked(chain)
    chain.calls.append(print)
    assert launch.hooked(chain) and launch.hooked(lambda *a: None)

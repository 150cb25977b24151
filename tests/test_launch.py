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


class _CompiledCopy:
    """What pack_kernel[grid](...) returns on a GPU, standing in here: ``[grid]`` launches
    the real kernel the usual way (the interpreter's), ``run`` is its launcher."""

    function = packed_metadata = 0

    def __init__(self, kernel, grid, log):
        self.kernel, self.grid, self.log = kernel, grid, log

    def _launch(self, how, *args):
        self.log.append(how)
        self.kernel[self.grid](*args[:-2], TILE_R=args[-2], TILE_C=args[-1])

    def run(self, *args):
        self._launch("lean", *args[9:])      # past grid, stream, function, metadata, hooks

    def __getitem__(self, grid):
        return lambda *args: self._launch("usual", *args)


def _stand_in_copy(monkeypatch, log: list, lean=None):
    """matmul's operand copy on a stand-in GPU: its kernel's first launch runs in the
    interpreter and returns a :class:`_CompiledCopy` that logs each later launch; ``lean``
    replaces the copy's direct launcher (default: the real one, told the stream)."""
    from helpers.kernels.matmul import pack

    real = pack.pack_kernel

    class Kernel:
        def __getitem__(self, grid):
            def first(*args, **kwargs):
                real[grid](*args, **kwargs)
                return _CompiledCopy(real, grid, log)
            return first

    monkeypatch.setattr(pack, "pack_kernel", Kernel())
    monkeypatch.setattr(pack.runtime, "is_gpu", lambda: True)
    monkeypatch.setattr(pack, "lean", lean or (lambda k, grid, device: launch.lean(
        k, grid, device, current_stream=lambda d: 0)))
    return pack


@pytest.mark.parametrize("broken", [False, True], ids=["lean", "broken launcher"])
def test_the_operand_copy_checks_its_first_direct_launch(monkeypatch, broken):
    """The copy's later calls go through its launcher (lean); the first of them is checked,
    and a launcher that does not copy is dropped for the usual launch."""
    import torch

    log = []
    pack = _stand_in_copy(monkeypatch, log, (lambda k, grid, device: lambda *a: log.append(
        "none")) if broken else None)
    a = torch.randn(37, 999, dtype=torch.float16)          # rows off 16 bytes: copied
    b = torch.randn(999, 77, dtype=torch.float16)
    copy = pack.packer(a, 999, b, 80, 16)
    for step in range(3):
        x, y = copy(a + step, b - step)
        assert torch.equal(x, a + step) and torch.equal(y[:, :77], b - step), step
    assert log == (["none", "usual", "usual"] if broken else ["lean", "lean"])


def test_the_operand_copy_leaves_its_check_for_after_a_graph_capture(monkeypatch):
    """Under CUDA-graph capture the first direct launch's check (which synchronises) waits:
    the copy goes the usual way, and the next call outside the capture is checked."""
    import torch

    log = []
    pack = _stand_in_copy(monkeypatch, log)
    a = torch.randn(37, 999, dtype=torch.float16)
    b = torch.randn(999, 77, dtype=torch.float16)
    copy = pack.packer(a, 999, b, 80, 16)
    copy(a, b)
    monkeypatch.setattr(pack, "_capturing", lambda: True)
    x, _ = copy(a + 1, b)
    assert log == ["usual"] and torch.equal(x, a + 1)
    monkeypatch.setattr(pack, "_capturing", lambda: False)
    x, _ = copy(a + 2, b)
    assert log == ["usual", "lean"] and torch.equal(x, a + 2)

"""helpers.kernels.lean: a kernel launched through the JIT on a key's first call, directly
after that, and only when the direct launch gives what the JIT launch gave.

CPU mode compiles nothing, so these tests drive :class:`Lean` with a stand-in kernel whose
"JIT launch" and "direct launch" write their outputs the way a real one would; the
attention GPU tests run it on compiled kernels."""

from __future__ import annotations

import pytest
import torch

from helpers.kernels import lean


class _Compiled:
    """A compiled kernel's ``[grid](*args)``: doubles x into out (or writes ``wrong``)."""

    def __init__(self, log, wrong=None, fails=False):
        self.log, self.wrong, self.fails = log, wrong, fails

    def __getitem__(self, grid):
        def run(*args):
            self.log.append(("direct", grid, args[-2:]))
            if self.fails:
                raise TypeError("this launcher takes other arguments")
            x, out = args[0], args[1]
            out.copy_(x * 2 if self.wrong is None else self.wrong)
        return run


class _Kernel:
    """A ``@triton.jit`` kernel: ``kernel(x, out, n, scale, BLOCK, EVEN)``."""
    arg_names = ["x", "out", "n", "scale", "BLOCK", "EVEN"]

    def __init__(self, **compiled):
        self.log, self.compiled = [], compiled

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", grid, kwargs))
            args[1].copy_(args[0] * 2)
            return _Compiled(self.log, **self.compiled)
        return run


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(lean.runtime, "is_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def _call(launch, x, out, n=64, scale=0.5, block=32):
    launch((2,), (x, out, n, scale), dict(BLOCK=block, EVEN=True), dict(num_warps=4),
           outputs=(1,))


def test_the_first_call_of_a_key_goes_through_the_jit_then_directly(on_a_gpu):
    kernel = _Kernel()
    launch = lean.Lean(kernel)
    x, out = torch.arange(8.0), torch.zeros(8)
    _call(launch, x, out)
    assert [e[0] for e in kernel.log] == ["jit", "direct"]     # the direct launch checked
    assert kernel.log[0][1] == (2, 1, 1)                        # a 3-D grid
    assert torch.equal(out, x * 2)
    kernel.log.clear()
    _call(launch, x + 1, out, scale=0.25)                       # floats never specialise
    assert kernel.log == [("direct", (2, 1, 1), (32, True))]    # constexprs, in order
    assert torch.equal(out, (x + 1) * 2)


@pytest.mark.parametrize("change", ["length", "dtype", "alignment", "constexpr", "options"])
def test_anything_that_specialises_the_kernel_is_a_new_key(on_a_gpu, change):
    kernel = _Kernel()
    launch = lean.Lean(kernel)
    x, out = torch.arange(8.0), torch.zeros(8)
    _call(launch, x, out)
    kernel.log.clear()
    if change == "length":
        _call(launch, x, out, n=65)
    elif change == "dtype":
        _call(launch, x.double(), out.double())
    elif change == "alignment":             # a view that starts 4 bytes in
        base = torch.arange(9.0)
        _call(launch, base[1:], out)
    elif change == "constexpr":
        _call(launch, x, out, block=64)
    else:
        launch((2,), (x, out, 64, 0.5), dict(BLOCK=32, EVEN=True), dict(num_warps=8),
               outputs=(1,))
    assert kernel.log[0][0] == "jit"


@pytest.mark.parametrize("compiled", [dict(wrong=7.0), dict(fails=True)])
def test_a_direct_launch_that_differs_is_not_kept_and_the_jits_outputs_stay(on_a_gpu,
                                                                            compiled):
    kernel = _Kernel(**compiled)
    launch = lean.Lean(kernel)
    x, out = torch.arange(8.0), torch.zeros(8)
    for _ in range(2):
        _call(launch, x, out)
        assert torch.equal(out, x * 2), "the JIT launch's outputs are put back"
    assert [e[0] for e in kernel.log] == ["jit", "direct", "jit", "direct"]


def test_in_cpu_mode_or_under_graph_capture_every_call_goes_through_the_jit(monkeypatch):
    kernel = _Kernel()
    launch = lean.Lean(kernel)
    x, out = torch.arange(8.0), torch.zeros(8)
    monkeypatch.setattr(lean.runtime, "is_gpu", lambda: False)
    _call(launch, x, out)
    _call(launch, x, out)
    monkeypatch.setattr(lean.runtime, "is_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    _call(launch, x, out)
    assert [e[0] for e in kernel.log] == ["jit"] * 3


def test_arguments_that_do_not_match_the_kernel_are_refused(on_a_gpu):
    launch = lean.Lean(_Kernel())
    x, out = torch.arange(8.0), torch.zeros(8)
    with pytest.raises(TypeError, match="BLOCK"):
        launch((2,), (x, out, 64, 0.5), dict(EVEN=True), {}, outputs=(1,))
    with pytest.raises(TypeError, match="constexprs"):
        launch((2,), (x, out, 64), dict(BLOCK=32, EVEN=True), {}, outputs=(1,))

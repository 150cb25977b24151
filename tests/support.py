"""Assertions the tests share: ``from support import assert_close``.

(pytest puts ``tests/`` on the import path, so every test file can import it.)
"""

import torch


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, what: str,
                 hint: str = "") -> None:
    """Fail unless ``got`` has ``want``'s shape and dtype and every element lies within
    ``atol + rtol * |want|`` of it (NaN only where ``want`` has NaN).

    The message teaches: how many elements are off, the worst error, where the first one
    is and its two values, then ``hint``, the mistake that pattern usually means.
    """
    assert got.shape == want.shape, (f"{what}: shape {tuple(got.shape)}, "
                                     f"expected {tuple(want.shape)}")
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    g, w = got.float(), want.float()
    err = (g - w).abs()
    bad = ~(err <= atol + rtol * w.abs()) & ~(g.isnan() & w.isnan())
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {want.numel()} elements off, the worst by "
            f"{err[bad].max().item():.3g} (allowed {atol:g} + {rtol:.3g} x |reference|); the "
            f"first at {list(first)}: got {g[first].item():.4g}, expected {w[first].item():.4g}."
            + (f" {hint}" if hint else ""))


def assert_unanswered(feedback) -> None:
    """An exercise left as ``answer = ...`` gets "no answer yet": not a pass, not a crash."""
    assert not feedback and feedback.status == "not implemented", feedback
    assert "no answer yet" in feedback.message, feedback.message


def committed_record(name: str, gpu: str | None = None):
    """The committed GPU record of experiment ``name`` on ``gpu`` (default: the GPU
    ``records.load`` prefers); skips the test until there is one."""
    import pytest

    from helpers import records

    have = records.available(name)
    if not have or (gpu is not None and gpu not in have):
        on = f" on {gpu}" if gpu else ""
        pytest.skip(f"no {name} record{on} committed yet: run ./course record {name} on a GPU")
    return records.load(name, gpu)

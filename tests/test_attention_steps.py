"""Lesson 06's online softmax in PyTorch (helpers.plots.attention_steps): the same answers
as torch.softmax on ordinary rows, rows of large values (1e4, where exp overflows without
the maximum), rows with -inf entries, and the convention for fully masked rows (output 0,
log-sum-exp -inf, where torch.softmax gives NaN); the step table by hand; the explorer
without a browser; the causal tile map."""

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from helpers.plots import attention_steps as st  # noqa: E402

INF = float("inf")


def _rows():
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(6, 37, generator=g, dtype=torch.float64)
    x[1] = 1e4 + torch.randn(37, generator=g, dtype=torch.float64)   # exp(1e4) overflows
    x[2, ::3] = -INF                                                 # masked keys
    x[3] = -INF                                                      # a fully masked row
    x[4, :20] = -INF                                                 # masked first blocks
    x[5, -1] = 50.0                                                  # the max arrives last
    return x


@pytest.mark.parametrize("block", [1, 4, 5, 37, 64])
def test_online_softmax_matches_torch(block):
    x = _rows()
    y, lse = st.online_softmax(x, block)
    live = [0, 1, 2, 4, 5]
    assert torch.allclose(y[live], torch.softmax(x[live], -1), atol=1e-12, rtol=1e-9)
    assert torch.allclose(lse[live], torch.logsumexp(x[live], -1), atol=1e-9, rtol=1e-12)
    # Fully masked: FlashAttention's 0 and -inf, where torch.softmax gives NaN (0 / 0).
    assert torch.isnan(torch.softmax(x[3], -1)).all()
    assert (y[3] == 0).all() and lse[3] == -INF
    assert not torch.isnan(y).any()


def test_large_values_need_the_maximum():
    x = _rows()[1:2].float()
    naive = torch.exp(x) / torch.exp(x).sum()
    assert torch.isnan(naive).all()                                  # inf / inf
    y, _ = st.online_softmax(x, 4)
    assert torch.allclose(y, torch.softmax(x, -1), atol=1e-6)


@pytest.mark.parametrize("block", [1, 3, 8, 37])
def test_online_softmax_matmul_is_softmax_times_values(block):
    x = _rows()
    v = torch.randn(37, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    o, lse = st.online_softmax_matmul(x, v, block)
    live = [0, 1, 2, 4, 5]
    assert torch.allclose(o[live], torch.softmax(x[live], -1) @ v, atol=1e-12)
    assert (o[3] == 0).all() and lse[3] == -INF


def test_update_rescales_the_old_sum():
    m, l = torch.tensor([3.0]), torch.tensor([2.0])  # noqa: E741
    m2, l2, rescale, p = st.update(m, l, torch.tensor([[5.0, 1.0]]))
    assert m2.item() == 5.0 and rescale.item() == pytest.approx(math.exp(-2))
    assert l2.item() == pytest.approx(2 * math.exp(-2) + 1 + math.exp(-4))
    # Nothing finite seen yet, nothing finite in the block: no NaN, the sum stays 0.
    m3, l3, r3, p3 = st.update(torch.tensor([-INF]), torch.tensor([0.0]),
                               torch.tensor([[-INF, -INF]]))
    assert m3.item() == -INF and l3.item() == 0 and r3.item() == 0 and (p3 == 0).all()


def test_step_table_by_hand():
    steps = st.step_table([1.0, 2.0, 4.0, 3.0, -INF], block=2)
    assert [s["block"] for s in steps] == [0, 1, 2]
    assert [(s["start"], s["stop"]) for s in steps] == [(0, 2), (2, 4), (4, 5)]
    assert [s["block_max"] for s in steps] == [2.0, 4.0, -INF]
    assert [s["running_max"] for s in steps] == [2.0, 4.0, 4.0]
    assert steps[0]["rescale"] == 0.0                                # no old sum yet
    assert steps[1]["rescale"] == pytest.approx(math.exp(2.0 - 4.0))
    assert steps[2]["rescale"] == 1.0                                # the max did not move
    l1 = math.exp(-1) + 1
    l2 = l1 * math.exp(-2) + 1 + math.exp(-1)
    assert steps[0]["running_sum"] == pytest.approx(l1)
    assert steps[1]["running_sum"] == pytest.approx(l2)
    assert steps[2]["running_sum"] == pytest.approx(l2)
    assert steps[-1]["running_max"] + math.log(steps[-1]["running_sum"]) == pytest.approx(
        torch.logsumexp(torch.tensor([1.0, 2.0, 4.0, 3.0]), 0).item())
    text = st.format_steps(steps)
    assert "running max" in text and len(text.splitlines()) == 5
    with pytest.raises(ValueError, match="empty"):
        st.step_table([], 2)


def test_partial_softmax_is_softmax_of_the_seen_prefix():
    x = _rows()[5]
    steps = st.step_table(x, 8)
    for k, s in enumerate(steps):
        want = torch.softmax(x[: s["stop"]], 0)
        assert torch.allclose(st.partial_softmax(x, steps, k), want, atol=1e-12)


def test_explorer_steps_and_rows():
    x = _rows()
    e = st.OnlineSoftmaxExplorer({"random": x[0], "masked": x[3], "short": x[0, :9]},
                                 block=4, step=2)
    bundle = e._repr_mimebundle_()
    assert bundle["image/png"] and "block 2 of 10" in e.readout
    assert "rescale" in e.readout and "running sum" in e.readout
    e.controls["step"].value = 10
    assert "block 10 of 10" in e.readout and "max |diff|" in e.readout
    redraws = e.redraws
    e.controls["row"].value = "short"        # 3 blocks: the slider follows, one redraw
    assert e.controls["step"].max == 3 and "block 3 of 3" in e.readout
    assert e.redraws == redraws + 1
    e.controls["row"].value = "masked"
    assert "NaN" in e.readout and "gives 0" in e.readout
    single = st.OnlineSoftmaxExplorer(x[0], block=8)
    assert "row" not in single.controls and "block 1 of 5" in single.readout


def test_causal_tiles():
    kinds = st.causal_tile_kinds(256, 128, 64)
    assert kinds == [["diagonal", "diagonal", "skipped", "skipped"],
                     ["full", "full", "diagonal", "diagonal"]]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert st.draw_causal_tiles(ax, 512, 64, 64) == {"skipped": 28, "diagonal": 8, "full": 28}
    plt.close(fig)

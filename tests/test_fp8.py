"""Eight-bit floats (helpers.kernels.fp8): the formats' numbers, quantisation against its
spec at every granularity (saturation, groups of zeros, partial groups at the edges), and
the scaled FP8 matmul at every scaling against the float64 product of its dequantised
operands. In CPU mode the kernels run in Triton's interpreter, which emulates FP8 (its
conversion truncates, so the kernels round first there: see ``round_to_format``)."""

from __future__ import annotations

import importlib

import pytest
import torch
from support import assert_close

import helpers
from helpers.kernels import fp8

quantize_module = importlib.import_module("helpers.kernels.fp8.quantize")  # not the function

DEVICE = helpers.device()
GRANULARITIES = list(fp8.GRANULARITIES)
FORMATS = list(fp8.FORMATS)


def randn(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def test_the_formats_numbers():
    assert (fp8.E4M3.max, fp8.E4M3.smallest_normal, fp8.E4M3.relative_spacing) == (448.0, 2 ** -6, 0.125)
    assert (fp8.E5M2.max, fp8.E5M2.smallest_normal, fp8.E5M2.relative_spacing) == (57344.0, 2 ** -14, 0.25)
    assert fp8.E4M3.smallest_subnormal == 2 ** -9
    tiny = torch.tensor([fp8.E4M3.smallest_subnormal, fp8.E4M3.smallest_subnormal / 4])
    assert tiny.to(torch.float8_e4m3fn).float().tolist() == [2 ** -9, 0.0]


@pytest.mark.parametrize("granularity,shape", [("tensor", (1, 1)), ("row", (70, 1)),
                                               ("1x128", (70, 3)), ("128x128", (1, 3))])
def test_scale_shapes(granularity, shape):
    assert fp8.scale_shape(granularity, (70, 300)) == shape


def awkward(seed=0, dtype=torch.float32):
    """Outliers in one column, a row of zeros, a 128 x 128 corner of zeros, odd sizes."""
    x = randn(150, 300, seed=seed)
    x[:, 5] *= 100
    x[3] = 0
    x[:128, 256:] = 0
    return x.to(dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_quantize_is_the_spec(granularity, fmt):
    x = awkward()
    q, s = fp8.quantize(x, granularity, fmt)
    q_ref, s_ref = fp8.quantize_reference(x, granularity, fmt)
    what = f"quantize({granularity}, {fmt})"
    assert q.dtype == fp8.format_of(fmt).dtype and q.shape == x.shape, f"{what}: {q.dtype} {q.shape}"
    assert torch.equal(s, s_ref), f"{what}: scales differ from amax / max per group"
    assert not q.float().isnan().any() and not s.isnan().any(), f"{what}: NaN (a group of zeros?)"
    if helpers.is_cpu():
        assert torch.equal(q.float(), q_ref.float()), f"{what}: not rounded to nearest"
    # Either way: within half a step of the format of the scaled value.
    back = fp8.dequantize(q, s, granularity)
    step = fp8.format_of(fmt).relative_spacing
    tiny = fp8.format_of(fmt).smallest_subnormal * s.max().item()
    assert_close(back, x.double(), tiny, step / 2 + 1e-6, f"{what}: dequantised")


@pytest.mark.parametrize("granularity", ["row", "tensor"])
def test_long_rows_and_more_tiles_than_amax_programs(granularity, monkeypatch):
    """Rows longer than one load of the row kernel (K = 2,500: three loads a pass), and a
    per-tensor amax with fewer programs than tiles, so each program folds several tiles
    before its one atomic. The largest value sits in the last load of its row, in a tile
    that the last program reaches last: a loop that stops early misses it."""
    monkeypatch.setattr(quantize_module, "AMAX_PROGRAMS", 3)
    x = randn(37, 2500, seed=5)
    x[36, 2490] = 500.0
    q, s = fp8.quantize(x, granularity)
    q_ref, s_ref = fp8.quantize_reference(x, granularity)
    assert torch.equal(s, s_ref), f"{granularity}: scales differ from amax / max"
    if helpers.is_cpu():
        assert torch.equal(q.float(), q_ref.float()), f"{granularity}: values differ"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_delayed_scale_quantises_in_one_pass_and_measures_the_amax(fmt, monkeypatch):
    """quantize_delayed: q = clamp(x / scale) with the scale given (here a stale one, a
    quarter of what this tensor needs, so its largest values saturate), and the tensor's
    own amax for the next step, folded over more tiles than programs."""
    monkeypatch.setattr(quantize_module, "AMAX_PROGRAMS", 3)
    x = awkward()
    x[149, 299] = -7000.0                  # the largest, in the last tile of the last program
    f = fp8.format_of(fmt)
    stale = torch.tensor([7000.0 / f.max / 4], device=DEVICE)
    q, amax = fp8.quantize_delayed(x, stale, fmt)
    assert amax.tolist() == [7000.0], "amax: the tensor's largest magnitude"
    assert q.dtype == f.dtype and not q.float().isnan().any() and q.float().isfinite().all()
    assert q.float()[149, 299].item() == -f.max, "a value past the stale scale: saturated"
    want = (x / stale).clamp(-f.max, f.max).to(f.dtype)
    if helpers.is_cpu():
        assert torch.equal(q.float(), want.float()), "not x / scale, clamped, rounded"
    else:
        assert_close(q.float(), want.float(), 0, f.relative_spacing, "quantize_delayed")


@pytest.mark.parametrize("granularity", ["row", "tensor", "1x128", "delayed"])
def test_rows_of_a_wider_tensor_are_quantised_in_place(granularity):
    """A view of the first 300 columns of a 350-wide tensor: rows 350 values apart, not
    300. A kernel that took K for the row stride would read the wrong values."""
    wide = randn(40, 350, seed=6)
    x = wide[:, :300]
    if granularity == "delayed":
        scale = (x.abs().max() / fp8.E4M3.max).reshape(1)
        q, amax = fp8.quantize_delayed(x, scale)
        assert amax.item() == x.abs().max().item(), "amax of the view, not of the whole tensor"
        want = (x / scale).clamp(-fp8.E4M3.max, fp8.E4M3.max).to(fp8.E4M3.dtype)
        s, s_ref = scale, scale
    else:
        q, s = fp8.quantize(x, granularity)
        want, s_ref = fp8.quantize_reference(x, granularity)
        assert torch.equal(s, s_ref), f"{granularity}: scales of the view"
    if helpers.is_cpu():
        assert torch.equal(q.float(), want.float()), f"{granularity}: values of the view"
    else:
        assert_close(q.float(), want.float(), 0, fp8.E4M3.relative_spacing, granularity)


def test_a_delayed_scale_is_one_fp32_number():
    x = awkward()
    with pytest.raises(ValueError, match="one number for the whole tensor"):
        fp8.quantize_delayed(x, torch.ones(2, device=DEVICE))
    with pytest.raises(TypeError, match="scale has dtype float16"):
        fp8.quantize_delayed(x, torch.ones(1, device=DEVICE, dtype=torch.float16))


def test_a_group_of_zeros_gets_scale_one():
    x = torch.zeros(4, 256, device=DEVICE)
    x[0, 200] = 3.0
    q, s = fp8.quantize(x, "1x128")
    assert s.tolist() == [[1.0, pytest.approx(3.0 / 448)], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    assert q.float().abs().sum().item() == 448.0


def test_quantize_takes_bf16_and_refuses_a_column_view():
    x = awkward(dtype=torch.float16)
    _, s = fp8.quantize(x, "row")
    assert torch.equal(s, fp8.quantize_reference(x, "row")[1])
    with pytest.raises(ValueError, match="rows must be contiguous"):
        fp8.quantize(awkward().T, "row")
    with pytest.raises(ValueError, match="granularity must be one of"):
        fp8.quantize(awkward(), "2x2")


# --------------------------------------------------------------------------------------
# The scaled matmul.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel,promote_every", [("pointer", 0), ("pointer", 32),
                                                   ("persistent", 0), ("persistent", 128)])
@pytest.mark.parametrize("scaling", list(fp8.SCALINGS))
@pytest.mark.parametrize("M,N,K", [(64, 64, 256), (37, 48, 304)], ids=["even", "odd"])
def test_scaled_matmul_is_the_dequantised_product(M, N, K, scaling, kernel, promote_every):
    """Both kernels, every scaling, with and without promotion; odd M and K (N a multiple
    of 8, so that C's rows suit the TMA), past the last whole tile and K block."""
    ga, gb = fp8.GRANULARITY_OF[scaling]
    a, a_s = fp8.quantize(randn(M, K, seed=1), ga)
    b, b_s = fp8.quantize(randn(N, K, seed=2) / K ** 0.5, gb)
    c = fp8.scaled_matmul(a, b, a_s, b_s, scaling, out_dtype=torch.float32,
                          promote_every=promote_every, kernel=kernel)
    want = fp8.scaled_matmul_reference(a, b, a_s, b_s, scaling)
    tol = 1e-4 if helpers.is_cpu() else 2e-2
    assert_close(c, want.float(), tol, tol, f"scaled_matmul {scaling} {M}x{N}x{K}",
                 "each K block's scales (block), or the epilogue's (tensor, row)")


def test_scaled_matmul_checks_its_scales():
    a, a_s = fp8.quantize(randn(16, 256, seed=1), "1x128")
    b, b_s = fp8.quantize(randn(32, 256, seed=2), "128x128")
    with pytest.raises(ValueError, match=r"a_scale has shape \(16, 2\); this scaling needs \(1, 1\)"):
        fp8.scaled_matmul(a, b, a_s, b_s, "tensor")
    with pytest.raises(ValueError, match="same K"):
        fp8.scaled_matmul(a, b[:, :128], a_s, b_s, "block")
    with pytest.raises(TypeError, match="a has dtype float32"):
        fp8.scaled_matmul(a.float(), b, a_s, b_s, "block")
    with pytest.raises(ValueError, match=r"promote_every .* one of \(0, 32, 64, 128\)"):
        fp8.scaled_matmul(a, b, a_s, b_s, "block", promote_every=4)
    with pytest.raises(ValueError, match="kernel must be one of"):
        fp8.scaled_matmul(a, b, a_s, b_s, "block", kernel="cublas")


def test_the_persistent_kernel_says_what_the_tma_cannot_read():
    a, a_s = fp8.quantize(randn(16, 200, seed=1), "tensor")    # 200-byte rows: not 16-aligned
    b, b_s = fp8.quantize(randn(32, 200, seed=2), "tensor")
    with pytest.raises(ValueError, match="rows are not contiguous and 16-byte aligned"):
        fp8.scaled_matmul(a, b, a_s, b_s, kernel="persistent")
    c = fp8.scaled_matmul(a, b, a_s, b_s, out_dtype=torch.float32)     # "auto" falls back
    assert_close(c, fp8.scaled_matmul_reference(a, b, a_s, b_s).float(), 2e-2, 2e-2, "fallback")


def test_block_scales_of_activations_are_kept_column_major():
    """The matmul reads one K block's scales for a tile's rows side by side."""
    _, s = fp8.quantize(randn(40, 384, seed=3), "1x128")
    assert s.shape == (40, 3) and s.stride() == (1, 40)


# --------------------------------------------------------------------------------------
# The experiment's accuracy part (any mode); its timings need a GPU.
# --------------------------------------------------------------------------------------


def test_finer_scales_survive_larger_outliers():
    """FP8's exponent absorbs outliers up to a point, past which one scale per tensor
    crushes the ordinary values toward zero. The outliers are channels, present in every
    row, so a scale per row helps little; a scale per 128-column block keeps the blocks
    without an outlier intact. The lesson's reading of the accuracy table."""
    from helpers.experiments import fp8 as experiment

    table = {r["outlier_scale"]: r["errors"] for r in experiment.accuracy_table(smoke=True)}
    calm, wild = table[1.0], table[max(table)]
    assert max(calm[s] for s in experiment.SCALINGS) < 1.2 * min(calm[s] for s in experiment.SCALINGS)
    assert wild["block"] < wild["row"] <= wild["tensor"], wild
    assert wild["block"] < 0.5 * wild["tensor"], wild
    assert wild["tensor"] > 5 * calm["tensor"]
    assert all(e["bf16 operands"] < min(e[s] for s in experiment.SCALINGS) for e in table.values())
    x, w = experiment.inputs(8, 4, 512, 10.0)
    assert x.abs().max() > 10 and x.shape == (8, 512) and w.shape == (4, 512)


@pytest.mark.skipif(helpers.is_gpu(), reason="CPU mode refuses to time")
def test_the_timed_experiment_needs_a_gpu():
    from helpers.experiments import fp8 as experiment

    with pytest.raises(Exception, match="GPU"):
        experiment.fp8_experiment(smoke=True)


# --------------------------------------------------------------------------------------
# The lesson's predictions and pictures.
# --------------------------------------------------------------------------------------


def test_the_prediction_checks():
    from helpers.exercises import fp8 as ex

    assert ex.check_largest(448, "e4m3") and ex.check_largest(57344, "e5m2")
    assert "inf and NaN" in ex.check_largest(240, "e4m3").message
    assert ex.check_relative_step(0.125, "e4m3") and ex.check_relative_step(0.25, "e5m2")
    assert "half a step" in ex.check_relative_step(0.0625, "e4m3").message
    assert ex.check_scale_bytes(4 * 100 * 3, (100, 300), "1x128")
    assert "not their bytes" in ex.check_scale_bytes(300, (100, 300), "1x128").message
    assert "partial groups" in ex.check_scale_bytes(4 * 100 * 300 / 128, (100, 300),
                                                    "1x128").message
    assert "no answer" in ex.check_largest(None).message


def test_every_fp8_value_is_drawn():
    import matplotlib

    matplotlib.use("Agg")
    from helpers.plots import fp8 as plots

    e4m3, e5m2 = plots.representable("e4m3"), plots.representable("e5m2")
    assert (len(e4m3), e4m3.max().item(), e4m3.min().item()) == (126, 448.0, 2 ** -9)
    assert (len(e5m2), e5m2.max().item(), e5m2.min().item()) == (123, 57344.0, 2 ** -16)
    assert plots.plot_formats().get_title() == "FP8: where the numbers are"


@pytest.mark.parametrize("scaling", list(fp8.SCALINGS))
def test_a_shapes_later_calls_take_their_own_operands(scaling):
    """On a GPU the first call of a shape keeps a launch plan (the compiled kernel, the
    descriptors' encodings per tensor): later calls with other tensors and other scales
    must still compute their own product."""
    ga, gb = fp8.GRANULARITY_OF[scaling]
    M, N, K = (256, 384, 512) if helpers.is_gpu() else (40, 48, 256)
    for seed in (1, 2, 3):
        a, a_s = fp8.quantize(randn(M, K, seed=seed) * seed, ga)
        b, b_s = fp8.quantize(randn(N, K, seed=10 + seed) / K ** 0.5, gb)
        c = fp8.scaled_matmul(a, b, a_s, b_s, scaling, out_dtype=torch.float32)
        want = fp8.scaled_matmul_reference(a, b, a_s, b_s, scaling).float()
        tol = 1e-4 if helpers.is_cpu() else 2e-2
        assert_close(c, want, tol, tol, f"call {seed} of {scaling} at {M}x{N}x{K}")

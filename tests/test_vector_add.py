"""helpers.kernels.vector_add: the kernel against its spec, the launcher's checks, the napkin math.

CPU mode runs the kernel in Triton's interpreter on small sizes; the tests marked `gpu`
run compiled on a GPU machine (`bash tests/gpu/device.sh pytest tests/test_vector_add.py`).
"""

import pytest
import torch

import helpers
from helpers import hardware, intensity
from helpers.kernels import vector_add as va


# (dtype, atol, rtol): one addition rounds once, so the kernel must match torch exactly
# up to that rounding; an error larger than one ulp means a wrong element, not rounding.
TOLERANCES = [
    (torch.float16, 1e-3, 1e-3),
    (torch.bfloat16, 1e-2, 1e-2),
    (torch.float32, 1e-6, 1e-6),
]
B = va.DEFAULT_BLOCK_SIZE
# Powers of two, odd sizes, one either side of the block, more than one block, a prime.
SIZES = [1, 3, 64, 127, B - 1, B, B + 1, 2 * B + 3, 10_007]


def _inputs(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, generator=g).to(dtype).to(helpers.device())
    b = torch.randn(n, generator=g).to(dtype).to(helpers.device())
    return a, b


@pytest.mark.parametrize("dtype, atol, rtol", TOLERANCES)
@pytest.mark.parametrize("n", SIZES)
def test_add_matches_reference(n, dtype, atol, rtol):
    a, b = _inputs(n, dtype)
    got = va.add(a, b)
    want = va.add_reference(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got.float() - want.float()).abs()
    assert torch.allclose(got.float(), want.float(), atol=atol, rtol=rtol), (
        f"n={n} {dtype}: max error {err.max().item():.3g} at index {err.argmax().item()}; "
        f"an error only at indices >= {n // B * B} points at the last, partial block (the mask)"
    )


@pytest.mark.parametrize("block_size", [16, 128, 4096])
def test_block_sizes_give_the_same_answer(block_size):
    a, b = _inputs(5_003, torch.float32, seed=1)
    assert torch.equal(va.add(a, b, block_size=block_size), a + b)


def test_in_place_and_out():
    a, b = _inputs(B + 5, torch.float32, seed=2)
    want = a + b
    out = torch.empty_like(a)
    assert va.add(a, b, out) is out and torch.equal(out, want)
    assert va.add(a, b, out=a) is a and torch.equal(a, want), "A += B must work in place"


def test_shapes_are_kept_and_empty_is_fine():
    a, b = _inputs(6 * 7, torch.float16, seed=3)
    a, b = a.view(6, 7), b.view(6, 7)
    assert va.add(a, b).shape == (6, 7)
    empty = torch.empty(0, device=helpers.device())
    assert va.add(empty, empty).numel() == 0


def test_the_mask_protects_the_memory_after_the_vector():
    # A view into a longer buffer: the kernel may touch only the first n elements.
    n = B + 1
    buf_a, buf_b = _inputs(2 * B, torch.float32, seed=4)
    buf_c = torch.full((2 * B,), -7.0, device=helpers.device())
    va.add(buf_a[:n], buf_b[:n], buf_c[:n])
    assert torch.equal(buf_c[:n], buf_a[:n] + buf_b[:n])
    assert (buf_c[n:] == -7.0).all(), "the kernel wrote past the end of C: check the store's mask"


@pytest.mark.parametrize("bad, match", [
    (lambda a, b: (a, b[:-1]), "same shape"),
    (lambda a, b: (a, b.double()), "dtype"),
    (lambda a, b: (a, b.to(torch.float16)), "convert one"),
    (lambda a, b: (a.view(4, 8).t(), b.view(4, 8).t()), "contiguous"),
    (lambda a, b: ([1.0] * 32, b), "torch.Tensor"),
])
def test_launcher_rejects_bad_inputs_with_a_reason(bad, match):
    a, b = _inputs(32, torch.float32)
    with pytest.raises((TypeError, ValueError), match=match):
        va.add(*bad(a, b))


def test_block_size_must_be_a_power_of_two():
    a, b = _inputs(32, torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        va.add(a, b, block_size=1000)


def test_napkin_math_for_a_billion_fp16_elements():
    n = 10**9
    assert intensity.vector_add(n, torch.float16).flops == 10**9        # one add per element
    assert intensity.vector_add(n, torch.float16).nbytes == 6 * 10**9   # read A, read B, write C
    assert intensity.vector_add(n, torch.float16).intensity == pytest.approx(1 / 6)
    assert intensity.vector_add(n, torch.float32).intensity == pytest.approx(1 / 12)
    assert intensity.vector_add(n, torch.float16, n_inputs=3).intensity == pytest.approx(2 / 8)
    # 1 add + 3 x (multiply + add)
    assert intensity.vector_add(n, torch.float16, fmas_per_element=3).flops == 7 * n
    h100 = hardware.GPUS["H100-SXM"]
    # Far left of the ridge point: memory-bound, whatever the dtype's compute roof.
    assert intensity.vector_add(n, torch.float16).intensity < h100.ridge_point("fp32") / 100


# --------------------------------------------------------------------------------------
# On a GPU: compiled, at full size, against torch.add.
# --------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, B + 1, 1_000_003, 2**24 + 17])
def test_compiled_kernel_is_exact(n):
    for dtype in (torch.float16, torch.float32):
        a, b = _inputs(n, dtype)
        assert torch.equal(va.add(a, b), a + b), f"n={n} {dtype}"


@pytest.mark.gpu
def test_bandwidth_at_2_28_is_near_the_datasheet_peak():
    from helpers.experiments.vector_add import time_pair

    spec = hardware.current_gpu()
    if spec is None:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in the course's GPU table")
    lines, best = [], 0.0
    for dtype in ("fp16", "fp32"):
        row = time_pair(2**28, dtype)
        best = max(best, row["triton_gbps"] / spec.hbm_bandwidth_gbs)
        lines.append(f"{dtype}: triton {row['triton_gbps']:,.0f} GB/s "
                     f"({row['triton_gbps'] / spec.hbm_bandwidth_gbs:.1%}), torch.add "
                     f"{row['torch_gbps']:,.0f} GB/s ({row['torch_gbps'] / spec.hbm_bandwidth_gbs:.1%})")
    print(f"\n{torch.cuda.get_device_name()} (table peak {spec.hbm_bandwidth_gbs:,.0f} GB/s)")
    print("\n".join(lines))
    assert best >= 0.85, "\n".join(lines)


# --------------------------------------------------------------------------------------
# The fused variant: axpy with a cast (x fp16 or bf16, y and z fp32).
# --------------------------------------------------------------------------------------

ALPHA = -0.01


def _axpy_inputs(n, x_dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(x_dtype).to(helpers.device())
    y = torch.randn(n, generator=g).to(helpers.device())
    return x, y


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 3, B - 1, B, B + 1, 10_007])
def test_axpy_matches_reference(n, x_dtype):
    x, y = _axpy_inputs(n, x_dtype)
    got = va.axpy(x, y, ALPHA)
    want = va.axpy_reference(x, y, ALPHA)
    assert got.dtype == torch.float32 and got.shape == want.shape
    # One FMA (or a multiply and an add) in fp32: within a couple of fp32 ulps. An fp16
    # multiply before the cast would be ~1e-3 off.
    err = (got - want).abs()
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-6), (
        f"n={n}, x {x_dtype}: max error {err.max().item():.3g} at index {err.argmax().item()}")


def test_axpy_mask_protects_the_memory_after_the_vector():
    n = B + 1
    x, y = _axpy_inputs(2 * B, seed=5)
    z = torch.full((2 * B,), -7.0, device=helpers.device())
    va.axpy(x[:n], y[:n], ALPHA, z[:n])
    assert torch.allclose(z[:n], va.axpy_reference(x[:n], y[:n], ALPHA), atol=1e-6, rtol=1e-6)
    assert (z[n:] == -7.0).all(), "the kernel wrote past the end of z: check the store's mask"


@pytest.mark.parametrize("bad, match", [
    (lambda x, y: (x.float(), y), "takes float16, bfloat16"),
    (lambda x, y: (x, y.half()), "takes float32"),
    (lambda x, y: (x, y[:-1]), "same shape"),
])
def test_axpy_rejects_bad_inputs_with_a_reason(bad, match):
    x, y = _axpy_inputs(32)
    with pytest.raises((TypeError, ValueError), match=match):
        va.axpy(*bad(x, y), ALPHA)


def test_axpy_bytes_count_the_cast():
    from helpers.experiments.vector_add import axpy_bytes

    x, y = _axpy_inputs(1000)
    assert axpy_bytes(x, y) == 1000 * (2 + 4 + 4)     # read x (fp16), read y, write z (fp32)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, B + 1, 1_000_003, 2**24 + 17])
def test_compiled_axpy_is_right(n):
    x, y = _axpy_inputs(n)
    assert torch.allclose(va.axpy(x, y, ALPHA), va.axpy_reference(x, y, ALPHA),
                          atol=1e-6, rtol=1e-6), f"n={n}"


@pytest.mark.gpu
def test_axpy_bandwidth_at_2_28_is_near_the_datasheet_peak():
    from helpers.experiments.vector_add import time_axpy

    spec = hardware.current_gpu()
    if spec is None:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in the course's GPU table")
    row = time_axpy(2**28)
    line = (f"axpy (fp16 x, fp32 y): triton {row['triton_gbps']:,.0f} GB/s "
            f"({row['triton_gbps'] / spec.hbm_bandwidth_gbs:.1%}), torch.add "
            f"{row['torch_gbps']:,.0f} GB/s ({row['torch_gbps'] / spec.hbm_bandwidth_gbs:.1%})")
    print(f"\n{torch.cuda.get_device_name()}: {line}")
    assert row["triton_gbps"] / spec.hbm_bandwidth_gbs >= 0.85, line

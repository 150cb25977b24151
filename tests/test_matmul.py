"""helpers.kernels.matmul: every version against the spec, on shapes that are not multiples
of any tile, on transposed and sliced inputs, with fp32 accumulation checked in units of
the last place; the program order; the napkin math; the launchers' checks.

CPU mode runs the kernels in Triton's interpreter on tiny shapes. On a GPU machine the
same tests run compiled, plus the `gpu` tests on large shapes and bf16:
`bash tests/gpu/device.sh pytest tests/test_matmul.py`.
"""

import math

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest
import torch
import triton
import triton.language as tl

from helpers import intensity
from helpers.kernels import matmul as mm
from helpers.runtime import InterpreterLimitationError
from support import assert_close


# (dtype, atol, rtol) for randn inputs and K up to a few hundred (|C| ~ sqrt(K) ~ 10).
# fp16 and bf16: the kernels and the reference both round an fp32 sum once, so they may
# differ by one unit in the last place (2^-10 and 2^-7 relative) and no more.
# fp32: on a GPU tl.dot rounds fp32 inputs to TF32 (10 mantissa bits), which costs about
# 1e-3 relative per product; the interpreter computes in true fp32. The tolerance is set
# for TF32 so that it holds in both modes; test_ieee_precision checks the tight one.
TOLERANCES = {
    torch.float16: (2e-2, 2e-3),
    torch.bfloat16: (1e-1, 1.6e-2),
    torch.float32: (5e-2, 1e-2),
}
CPU_DTYPES = [torch.float16, torch.float32]
GPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
DTYPES = GPU_DTYPES if helpers.is_gpu() else CPU_DTYPES

# Small tiles, so that even tiny shapes span several programs and partial tiles.
SMALL = {"v2": dict(block_m=16, block_n=32, block_k=16),
         "v3": dict(block_m=16, block_n=32, block_k=16, group_m=2)}
# (M, N, K): powers of two, primes, one row, K shorter than a block, several K blocks.
SHAPES = [(16, 32, 16), (33, 17, 45), (1, 50, 7), (47, 65, 100), (64, 64, 64)]


def _inputs(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype).to(helpers.device())
    b = torch.randn(K, N, generator=g).to(dtype).to(helpers.device())
    return a, b


def _run(version, a, b):
    if version == "v1":  # few, wide programs: the interpreter pays per program and step
        return mm.matmul_v1(a, b, block_n=64, block_k=64)
    return mm.VERSIONS[version](a, b, **SMALL.get(version, {}))


def _assert_close(got, want, what):
    assert_close(got, want, *TOLERANCES[want.dtype], what,
                 "Wrong only in the last rows or columns points at the M/N masks; wrong "
                 "everywhere by a little, at the K tail (K mask) or the accumulator's dtype.")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_versions_match_reference(version, shape, dtype):
    if helpers.is_gpu() and version == "v4" and shape != (33, 17, 45):
        # Each new shape costs v4 an autotuning search (8 compilations): one will do here;
        # the large GPU tests below cover the rest.
        pytest.skip("v4 is autotuned on a GPU: one small shape is enough")
    a, b = _inputs(*shape, dtype)
    _assert_close(_run(version, a, b), mm.matmul_reference(a, b), f"{version} {shape} {dtype}")


@pytest.mark.parametrize("shape", [(16, 32, 16), (33, 24, 40), (1, 8, 8), (70, 136, 72)],
                         ids=lambda s: "x".join(map(str, s)))
def test_v5_tma_matches_reference(shape):
    # TMA needs rows 16-byte aligned: N and K multiples of 8 in fp16. M is free.
    a, b = _inputs(*shape, torch.float16)
    config = mm.TileConfig(16, 32, 16, group_m=2, num_stages=2, num_warps=4,
                           options={"EPILOGUE_SPLIT": True})
    _assert_close(mm.matmul_v5(a, b, config=config), mm.matmul_reference(a, b), f"v5 {shape}")


def test_v1_handles_bf16_in_cpu_mode_too():
    # v1 multiplies on the CUDA cores after converting to fp32, which the interpreter
    # does exactly; only tl.dot on bf16 is wrong there.
    a, b = _inputs(9, 20, 33, torch.bfloat16)
    _assert_close(mm.matmul_v1(a, b, block_n=16, block_k=16), mm.matmul_reference(a, b), "v1 bf16")


@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_transposed_and_sliced_inputs(version):
    # The kernels index through strides: A given as the transpose of a (K, M) matrix and
    # B as every other column of a wider one must work without a copy.
    g = torch.Generator().manual_seed(3)
    at = torch.randn(40, 23, generator=g).half().to(helpers.device())    # (K, M)
    wide = torch.randn(40, 62, generator=g).half().to(helpers.device())  # (K, 2N)
    a, b = at.t(), wide[:, ::2]
    assert not a.is_contiguous() and not b.is_contiguous()
    _assert_close(_run(version, a, b), mm.matmul_reference(a, b), f"{version} on views")


@pytest.mark.parametrize("version", ["v2", "v3", "v4"])
def test_accumulates_in_fp32(version):
    # All-positive inputs and a long K: the running sum grows to ~K/4, where fp16's
    # spacing is coarse. Rounding once at the end stays within half a unit in the last
    # place; a running sum kept in fp16 rounds at every K step and drifts further.
    M = N = 16
    K = 512
    g = torch.Generator().manual_seed(4)
    a = torch.rand(M, K, generator=g).half().to(helpers.device())
    b = torch.rand(K, N, generator=g).half().to(helpers.device())
    exact = a.double() @ b.double()
    worst = mm.ulp_error(_run(version, a, b), exact).max().item()
    assert worst <= 0.6, f"{version}: {worst:.2f} units in the last place from the exact product"


@triton.jit
def _fp16_accumulator_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK: tl.constexpr):
    # A deliberately wrong kernel: the running sum is rounded to fp16 at every K step.
    r = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float16)
    for k0 in range(0, K, BLOCK):
        a = tl.load(a_ptr + r[:, None] * K + (k0 + r)[None, :])
        b = tl.load(b_ptr + (k0 + r)[:, None] * N + r[None, :])
        acc += tl.dot(a, b).to(tl.float16)
    tl.store(c_ptr + r[:, None] * N + r[None, :], acc)


def test_the_fp32_check_catches_an_fp16_accumulator():
    M = N = 16
    K = 512
    g = torch.Generator().manual_seed(4)
    a = torch.rand(M, K, generator=g).half().to(helpers.device())
    b = torch.rand(K, N, generator=g).half().to(helpers.device())
    c = torch.empty(M, N, dtype=torch.float16, device=helpers.device())
    _fp16_accumulator_kernel[(1,)](a, b, c, M, N, K, BLOCK=16)
    worst = mm.ulp_error(c, a.double() @ b.double()).max().item()
    assert worst > 1.0, f"an fp16 running sum should drift by more than 1 unit, got {worst:.2f}"


def test_ieee_precision_is_true_fp32():
    a, b = _inputs(40, 48, 300, torch.float32, seed=5)
    exact = a.double() @ b.double()
    err = (mm.matmul_v3(a, b, block_m=16, block_n=16, block_k=16, precision="ieee").double()
           - exact).abs().max().item()
    assert err < 1e-3, f"precision='ieee' should multiply in full fp32, max error {err:.3g}"


@pytest.mark.gpu
def test_tf32_is_coarser_than_ieee_on_a_gpu():
    a, b = _inputs(256, 256, 1024, torch.float32, seed=6)
    exact = a.double() @ b.double()
    tf32 = (mm.matmul_v3(a, b, precision="tf32").double() - exact).abs().max().item()
    ieee = (mm.matmul_v3(a, b, precision="ieee").double() - exact).abs().max().item()
    assert ieee * 10 < tf32 < 0.5, f"TF32 error {tf32:.3g}, IEEE error {ieee:.3g}"


def test_empty_and_k_zero():
    a, b = _inputs(5, 7, 3, torch.float16)
    assert mm.matmul_v3(a[:0], b).shape == (0, 7)
    c = mm.matmul_v3(a[:, :0], b[:0])
    assert c.shape == (5, 7) and bool((c == 0).all()), "K = 0 must give zeros"


# --------------------------------------------------------------------------------------
# The program order.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_pid_m, num_pid_n, group_m", [(4, 4, 2), (5, 3, 2), (7, 9, 3),
                                                           (6, 6, 1), (3, 8, 8)])
def test_program_order_covers_every_tile_once(num_pid_m, num_pid_n, group_m):
    order = mm.program_order(num_pid_m, num_pid_n, group_m)
    ids = sorted(p for row in order for p in row)
    assert ids == list(range(num_pid_m * num_pid_n)), "each program must own exactly one tile"


@triton.jit
def _order_probe(out_ptr, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    pid_m, pid_n = mm.grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)
    tl.store(out_ptr + 2 * pid, pid_m)
    tl.store(out_ptr + 2 * pid + 1, pid_n)


@pytest.mark.parametrize("num_pid_m, num_pid_n, group_m", [(5, 3, 2), (4, 6, 4), (3, 3, 1)])
def test_python_order_matches_the_kernel(num_pid_m, num_pid_n, group_m):
    n = num_pid_m * num_pid_n
    out = torch.empty(2 * n, dtype=torch.int32, device=helpers.device())
    _order_probe[(n,)](out, num_pid_m, num_pid_n, GROUP_M=group_m)
    kernel = [tuple(out[2 * p: 2 * p + 2].tolist()) for p in range(n)]
    python = [mm.tile_of_program(p, num_pid_m, num_pid_n, group_m) for p in range(n)]
    assert kernel == python


def test_grouping_shrinks_the_wave_footprint():
    # 8192^3 in 128 x 256 tiles, a first wave of 132 programs (an H100's SMs).
    row_major = mm.wave_footprint(8192, 8192, 8192, torch.float16, 128, 256, 1, 132)
    grouped = mm.wave_footprint(8192, 8192, 8192, torch.float16, 128, 256, 8, 132)
    assert row_major["tiles"] == grouped["tiles"] == 132
    assert row_major["b_strips"] == 8192 // 256, "row-major touches every column of tiles"
    assert grouped["a_strips"] == 8 and grouped["bytes"] < row_major["bytes"]


# --------------------------------------------------------------------------------------
# Napkin math.
# --------------------------------------------------------------------------------------


def test_flops_and_bytes_agree_with_the_course_napkin_math():
    for M, N, K in [(4096, 4096, 4096), (100, 300, 70)]:
        for dtype, key in [(torch.float16, "fp16"), (torch.float32, "fp32")]:
            work = intensity.matmul(M, N, K, key)
            assert intensity.matmul(M, N, K, dtype) == work   # torch dtypes and keys alike
            s = 2 if key == "fp16" else 4
            assert work.flops == 2 * M * N * K
            assert work.nbytes == (M * K + K * N + M * N) * s
            tiled = intensity.matmul(M, N, K, key, block_m=128, block_n=64)
            assert tiled.nbytes == (M * K * -(-N // 64) + K * N * -(-M // 128) + M * N) * s


def test_tile_intensity_and_sram():
    # A square B x B tile: B x B x BLOCK_K multiply-adds for 2 x B x BLOCK_K loaded values,
    # B/2 multiply-adds (B FLOPs) per value: B/2 FLOP/byte in fp16, B/4 in fp32.
    for side in (16, 64, 128):
        assert intensity.tile_intensity(side, side, 32, torch.float16) == pytest.approx(side / 2)
        assert intensity.tile_intensity(side, side, 128, torch.float32) == pytest.approx(side / 4)
    # 128 x 256 x 64 fp16, 3 stages: 3 x (128 x 64 + 64 x 256) x 2 bytes = 144 KiB.
    assert intensity.sram_bytes(128, 256, 64, torch.float16, 3) == 144 * 1024
    assert intensity.accumulator_bytes(128, 256) == 128 * 1024
    # The naive kernel's intensity: one multiply-add (2 FLOPs) per loaded fp16 value of B.
    assert intensity.tile_intensity(1, 64, 32, torch.float16) == pytest.approx(2 * 64 / (65 * 2))
    assert intensity.matmul(64, 64, 64, torch.float16, 1, 1).nbytes == (2 * 64**3 + 64**2) * 2


# --------------------------------------------------------------------------------------
# The launchers refuse what their kernels cannot do, and say why.
# --------------------------------------------------------------------------------------


def test_launcher_checks():
    a, b = _inputs(8, 8, 16, torch.float16)
    with pytest.raises(ValueError, match="inner sizes differ"):
        mm.matmul_v3(a, a)
    with pytest.raises(TypeError, match="convert one"):
        mm.matmul_v3(a, b.float())
    with pytest.raises(TypeError, match="dtype"):
        mm.matmul_v2(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(ValueError, match="2 dimension"):
        mm.matmul_v2(a[None], b)
    with pytest.raises(ValueError, match="power of two"):
        mm.matmul_v3(a, b, block_m=48)
    with pytest.raises(ValueError, match="precision"):
        mm.matmul_v3(a, b, precision="fp8")
    with pytest.raises(ValueError, match="16-byte|multiple of 16"):
        x, y = _inputs(8, 8, 45, torch.float16)
        mm.matmul_v5(x, y)
    with pytest.raises(TypeError, match="fp16 or bf16"):
        mm.matmul_v5(a.float(), b.float())


@pytest.mark.skipif(helpers.is_gpu(), reason="the interpreter's limitation")
def test_bf16_dot_is_refused_in_cpu_mode():
    a, b = _inputs(8, 8, 16, torch.bfloat16)
    with pytest.raises(InterpreterLimitationError, match="bf16"):
        mm.matmul_v2(a, b)


def test_try_configs_runs_every_config_correctly():
    a, b = _inputs(40, 72, 48, torch.float16, seed=7)
    rows = mm.try_configs(a, b)
    assert len(rows) == len(mm.CONFIGS)
    for row in rows:
        assert row["max_abs_error"] < 0.05, row


def test_best_version():
    a, b = _inputs(64, 64, 64, torch.float16)
    assert mm.best_version(a, b) == "v4", "small products go to v4"
    x, y = _inputs(64, 64, 45, torch.float16)
    assert mm.best_version(x, y) == "v4", "rows of 90 bytes rule TMA out"
    _assert_close(mm.matmul(x, y), mm.matmul_reference(x, y), "matmul()")
    hopper = helpers.is_gpu() and torch.cuda.get_device_capability()[0] >= 9
    big = torch.empty(4096, 4096, dtype=torch.float16, device=helpers.device())
    assert mm.best_version(big, big) == ("v5" if hopper else "v4")
    assert mm.best_version(big.float(), big.float()) == "v4", "v5 is 16-bit only"


# --------------------------------------------------------------------------------------
# GPU: every version compiled, on large and odd shapes, in all three dtypes.
# --------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4", "v5"])
@pytest.mark.parametrize("shape", [(1023, 517, 999), (2048, 1536, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_versions_large(version, shape, dtype):
    a, b = _inputs(*shape, dtype)
    if version == "v5" and (dtype == torch.float32 or mm.tma_compatible(a, b)):
        pytest.skip("v5 takes 16-bit, TMA-aligned inputs")
    if version == "v4" and dtype == torch.float32 and shape[0] != 1023:
        pytest.skip("one fp32 autotuning search is enough")
    fn = mm.VERSIONS[version]
    got = fn(a, b) if version != "v1" else mm.matmul_v1(a, b)
    want = mm.matmul_reference(a, b)
    # Over K ~ 1000-4096 the fp32 sums round differently in different orders; scale the
    # absolute tolerance with sqrt(K), the size of |C| for randn inputs.
    atol, rtol = TOLERANCES[dtype]
    scale = math.sqrt(shape[2] / 100)
    ok = torch.isclose(got.float(), want.float(), atol=atol * scale, rtol=rtol)
    assert bool(ok.all()), f"{version} {shape} {dtype}: max error " \
        f"{(got.float() - want.float()).abs().max().item():.3g}"


@pytest.mark.gpu
def test_gpu_transposed_layouts_through_v4():
    a, b = _inputs(2048, 1536, 1024, torch.float16, seed=8)
    for x, y in [(a, b), (a.t().contiguous().t(), b), (a, b.t().contiguous().t())]:
        _assert_close(mm.matmul_v4(x, y), mm.matmul_reference(x, y), "v4 layout")

"""Lesson 07's stream-K matmul (helpers.kernels.matmul.streamk).

In CPU mode Triton's interpreter runs the kernel with a few programs standing in for the
SMs, so that tiles are shared out by K steps there too: tile counts one below, at and one
above a multiple of the program count, every layout of A and B, K steps that do not divide
evenly, and programs with no steps at all. The test marked ``gpu`` runs it compiled.
"""

from __future__ import annotations

import re

import pytest
import torch
import triton

import helpers
from helpers import compiled
from helpers.kernels.matmul import persistent as mp
from helpers.kernels.matmul import streamk as sk
from helpers.kernels.matmul.config import TileConfig

DEVICE = helpers.device()
SMALL = TileConfig(32, 32, 32, num_warps=4, num_stages=1)


def operands(M, N, K, majors=("row", "row"), dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(DEVICE, dtype)
    b = torch.randn(K, N, generator=g).to(DEVICE, dtype)
    a = a if majors[0] == "row" else a.t().contiguous().t()
    b = b if majors[1] == "row" else b.t().contiguous().t()
    return a, b


def assert_product(c, a, b, what):
    want = a.float() @ b.float()
    err = ((c.float() - want).abs().max() / want.abs().max()).item()
    assert c.shape == want.shape and c.dtype == a.dtype, what
    assert err < 2e-2, f"{what}: worst error {err:.2e} of the largest output"


def test_which_tiles_are_shared_out_by_k_steps():
    assert sk.stream_k_tiles(264, 132) == 0, "two whole waves: nothing to share"
    assert sk.stream_k_tiles(140, 132) == 8 + 132, "the remainder and one wave to share it"
    assert sk.stream_k_tiles(100, 132) == 100, "less than a wave: every tile"
    assert sk.stream_k_tiles(131, 132) == 131 and sk.stream_k_tiles(133, 132) == 133


# 32 x 32 tiles: 72 x 72 is 3 x 3 = 9 tiles; with 4 programs 9 is one above a multiple of 4,
# 8 tiles (64 x 128) exactly two waves, 7 tiles (32 x 224) one below.
@pytest.mark.parametrize("shape", [(72, 72, 104), (64, 128, 96), (32, 224, 160), (40, 48, 40)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("sms", [4, 3])
def test_tiles_around_whole_waves_give_the_product(shape, sms):
    a, b = operands(*shape)
    c, run, _ = sk.launch(a, b, SMALL, sms=sms)
    tiles = triton.cdiv(shape[0], 32) * triton.cdiv(shape[1], 32)
    assert_product(c, a, b, f"{shape}, {tiles} tiles on {sms} programs")
    a2, b2 = operands(*shape, seed=1)
    assert_product(run(a2, b2), a2, b2, f"{shape} launched again: the flags were reset")


@pytest.mark.parametrize("majors", [("row", "col"), ("col", "row"), ("col", "col")],
                         ids=lambda m: f"A-{m[0]}-B-{m[1]}")
def test_every_layout(majors):
    a, b = operands(72, 72, 104, majors)
    c, _, _ = sk.launch(a, b, SMALL, sms=4)
    assert_product(c, a, b, f"A {majors[0]}-major, B {majors[1]}-major")


def test_more_programs_than_k_steps_leave_some_idle():
    a, b = operands(32, 32, 64)             # one tile of two K steps, on five programs
    c, _, _ = sk.launch(a, b, SMALL, sms=5)
    assert_product(c, a, b, "2 steps over 5 programs")


def test_wide_tiles_add_the_handed_over_sums_half_a_tile_at_a_time():
    # 128 x 256 tiles (the kernel's wide case: two halves of 128 columns, so that a loaded
    # fp32 tile and the accumulator fit in the registers): 2 x 2 tiles on 3 programs.
    wide = TileConfig(128, 256, 32, num_warps=8, num_stages=2)
    a, b = operands(256, 504, 160)
    c, run, _ = sk.launch(a, b, wide, sms=3)
    assert_product(c, a, b, "128 x 256 tiles on 3 programs")
    a2, b2 = operands(256, 504, 160, seed=1)
    assert_product(run(a2, b2), a2, b2, "launched again")


@pytest.mark.parametrize("block_n", [64, 128])
def test_an_owner_reads_a_partial_tile_through_the_workspaces_descriptor(block_n):
    # Partial tiles go out by address and come back through the TMA unit, whole for a tile
    # of up to 128 x 128 (half at a time for wider ones: the test above).
    config = TileConfig(32, block_n, 32, num_warps=4, num_stages=1)
    assert sk.workspace_box(config) == [32, block_n]
    assert sk.workspace_box(TileConfig(128, 256, 64, num_warps=8, num_stages=3)) == [128, 128]
    a, b = operands(64, 2 * block_n - 8, 160)
    c, _, _ = sk.launch(a, b, config, sms=3)
    assert_product(c, a, b, f"32 x {block_n} tiles on 3 programs")


@pytest.mark.parametrize("majors", [("row", "row"), ("row", "col")], ids=lambda m: f"B-{m[1]}")
def test_c_rows_off_16_bytes_are_stored_without_a_descriptor(majors):
    # N = 60 fp16 is 120 bytes a row: no descriptor of C. B's rows (or, as W.T, its
    # columns) padded onto whole lines, as a plan copies them; C is stored from registers.
    a, b = operands(72, 60, 104, majors)
    b_run = mp.padded_to_lines(b)
    assert not mp.usable(a, b_run)[0] and mp.usable(a, b_run, c_rows=False)[0]
    assert not sk.c_rows_aligned(60, torch.float16) and sk.c_rows_aligned(64, torch.float16)
    c, run, _ = sk.launch(a, b_run, SMALL, sms=3)
    assert_product(c, a, b, f"N = 60, B {majors[1]}-major, on 3 programs")
    a2, b2 = operands(72, 60, 104, majors, seed=1)
    assert_product(run(a2, mp.padded_to_lines(b2)), a2, b2, "launched again")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 4224, 1024), (1000, 1000, 1000), (4000, 3000, 1000),
                                   (2048, 8448, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_compiled(shape):
    a, b = operands(*shape, dtype=torch.bfloat16)
    config = TileConfig(128, 256, 64, num_warps=8, num_stages=3, options=mp.NEITHER)
    for _ in range(3):                      # the flags must come back to 0 every time
        c, run, _ = sk.launch(a, b, config)
        assert_product(c, a, b, f"{shape}")
    assert torch.equal(run(a, b), c), "the same sum every run"


def test_compiled_for_hopper_an_owner_fences_between_its_acquire_and_the_tma_read():
    # The kernel compiled for an H100 here (no GPU needed): a helper releases its flag after
    # its stores; an owner acquires the flag, then fences the proxies, and only then lets the
    # TMA unit read the partial. Without the fence the unit may read the workspace as it was.
    wide = sk.fitted(sk.WIDE)
    got = compiled.resources(
        sk.matmul_kernel_streamk, num_warps=8, num_stages=wide.num_stages, ptx=True,
        signature={"a_desc": "tensordesc<fp16[128, 64]>", "b_desc": "tensordesc<fp16[64, 256]>",
                   "ws_desc": "tensordesc<fp32[128, 128]>",
                   "c_out": "tensordesc<fp16[128, 256]>", "ws_ptr": "*fp32",
                   "flags_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
                   "SK_TILES": "i32", "stride_cm": "i32"},
        constexprs=dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, NUM_SMS=132,
                        A_T=False, B_T=False, C_DESC=True, FENCE=True))
    assert got.ok and not got.spills, got.lines()
    ptx = got.ptx
    release = re.search(r"atom\.global\.(gpu\.release|release\.gpu)\.exch", ptx)
    acquire = re.search(r"atom\.global\.(gpu\.acquire|acquire\.gpu)\.cas", ptx)
    assert release and acquire, "the helper releases its flag, the owner acquires it"
    fence = ptx.find("fence.proxy.async.global", acquire.end())
    assert fence > 0, "a proxy fence after the owner's acquire"
    read = ptx.find("cp.async.bulk.tensor.2d.shared::cta.global", acquire.end())
    assert fence < read, "the fence before the TMA unit reads the partial"


@pytest.mark.gpu
@pytest.mark.parametrize("config", [sk.WIDE, sk.NARROW], ids=lambda c: c.describe())
def test_compiled_hand_overs_give_the_same_bits_launch_after_launch(config):
    # 72 or 144 tiles over every SM: every tile is shared out, and owners read their
    # helpers' partial sums through the TMA unit after an acquire and a proxy fence. The
    # owners add the partials in a fixed order, so a read that raced its helper's stores
    # shows as a launch whose bits differ from the first one's.
    a, b = operands(3048, 688, 6144, dtype=torch.bfloat16)
    c, run, _ = sk.launch(a, b, config)
    assert_product(c, a, b, f"3048 x 688 x 6144, {config.describe()}")
    differ = sum(not torch.equal(run(a, b), c) for _ in range(200))
    assert differ == 0, f"{differ} of 200 launches gave other bits than the first"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1004, 2666, 4896), (851, 1001, 7296), (2000, 1682, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_compiled_with_cs_rows_off_16_bytes(shape):
    a, b = operands(*shape, dtype=torch.bfloat16)
    b_run = mp.padded_to_lines(b)
    for config in (sk.NARROW, sk.WIDE):
        for _ in range(2):                  # the flags must come back to 0 every time
            c, run, _ = sk.launch(a, b_run, config)
            assert_product(c, a, b, f"{shape}, {config.describe()}")
        if triton.__version__.startswith("3.6"):
            assert run.keeps_encodings, "triton 3.6: the direct launch should be in use"
        assert torch.equal(run(a, b_run), c), "the same sum every run"


def test_a_setting_whose_c_tile_does_not_fit_beside_its_stages_loses_a_stage():
    """The persistent kernel stores C in halves; this one stages the whole tile, so
    128 x 256 x 64 with four stages (fine there) must drop to three here."""
    four = TileConfig(128, 256, 64, num_warps=8, num_stages=4, options=mp.SPLIT)
    assert mp.fits(four, "H100-SXM", torch.bfloat16)[0]
    three = sk.fitted(four, torch.bfloat16)
    assert three.num_stages == 3 and not three.option("SPLIT_EPILOGUE")
    assert three.fits("H100-SXM", torch.bfloat16, staged_c=1)[0]
    assert sk.fitted(SMALL) == mp.setting(SMALL), "what fits stays as it is"
    with pytest.raises(ValueError, match="does not fit"):
        sk.fitted(TileConfig(256, 256, 128, num_warps=8, num_stages=3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_wide_candidate_is_the_widest_tile_and_runs_as_stream_k(dtype):
    """The tuner's second stream-K candidate (matmul_tuned on a shape with a part-empty last
    wave): the persistent space's widest tile, which stream-K stages with its C tile whole
    in both dtypes the kernel takes, with at least the two stages a pipeline needs."""
    area = max(c.block_m * c.block_n for c in mp.PERSISTENT_SPACE)
    assert sk.WIDE.block_m * sk.WIDE.block_n == area and sk.WIDE in mp.PERSISTENT_SPACE
    wide = sk.fitted(sk.WIDE, dtype)
    assert (wide.block_m, wide.block_n, wide.block_k) == (sk.WIDE.block_m, sk.WIDE.block_n,
                                                          sk.WIDE.block_k)
    assert wide.num_stages >= 2 and wide.fits("H100-SXM", dtype, staged_c=1)[0]

"""Lesson 07's persistent TMA matmul (helpers.kernels.matmul.persistent).

In CPU mode the kernel runs in Triton's interpreter, which reads and writes through the
same descriptors (zero fill past the edges, stores clipped): products on shapes that are
not multiples of any box, with the split epilogue and the flattened tile loop, on a B
given as a strided view; the rules that say when the kernel can run and when B is worth
padding. The tests marked ``gpu`` run it compiled and autotuned, and check that
``matmul_tuned`` keeps whichever kernel timed faster and launches it again directly.
"""

from __future__ import annotations

import pytest
import torch
import triton

import helpers
from helpers.kernels.matmul import persistent as mp
from helpers.kernels.matmul import tuned as mt
from helpers.kernels.matmul.config import TileConfig
from helpers.kernels.matmul import tma_launch as tma
from helpers.kernels.matmul import streamk as sk
from helpers.runtime import InterpreterLimitationError

DEVICE = helpers.device()
CONFIGS = {
    "cpu default": mp.CPU_CONFIG,
    "split epilogue, flattened": TileConfig(32, 64, 32, num_warps=4, num_stages=1, options=mp.BOTH),
    "tall box, short K step": TileConfig(64, 32, 16, num_warps=4, num_stages=1, options=mp.NEITHER),
}
SHAPES = [(1, 40, 72), (65, 72, 104), (100, 64, 48), (130, 136, 40)]


def operands(M, N, K, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=g).to(DEVICE, dtype),
            torch.randn(K, N, generator=g).to(DEVICE, dtype))


def assert_product(c, a, b, what):
    want = a.float() @ b.float()
    err = ((c.float() - want).abs().max() / want.abs().max()).item()
    assert c.shape == want.shape and c.dtype == a.dtype, f"{what}: {tuple(c.shape)} {c.dtype}"
    assert err < 2e-2, f"{what}: worst error {err:.2e} of the largest output"


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_setting_gives_the_product_past_every_edge(name, shape):
    a, b = operands(*shape)
    c, run, chosen, _ = mp.launch(a, b, CONFIGS[name])
    assert_product(c, a, b, f"{name} on {shape}")
    assert chosen == CONFIGS[name]
    a2, b2 = operands(*shape, seed=1)
    assert_product(run(a2, b2), a2, b2, f"{name} on {shape}, launched again on new inputs")


def laid_out(x: torch.Tensor, major: str) -> torch.Tensor:
    """``x`` with the same values, stored row-major or column-major (a transposed view)."""
    return x if major == "row" else x.t().contiguous().t()


LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


@pytest.mark.parametrize("majors", LAYOUTS, ids=lambda m: f"A-{m[0]}-B-{m[1]}")
@pytest.mark.parametrize("config", ["cpu default", "split epilogue, flattened"])
@pytest.mark.parametrize("shape", [(72, 72, 104), (40, 136, 48)],   # M, K: 16-byte rows
                         ids=lambda s: "x".join(map(str, s)))
def test_every_layout_runs_through_descriptors_of_what_is_stored(majors, config, shape):
    """A transposed view (nn.Linear's ``x @ W.T`` is B = W.T) runs without a copy: its
    descriptor describes the row-major matrix underneath, read box by box the other way."""
    a, b = operands(*shape)
    a, b = laid_out(a, majors[0]), laid_out(b, majors[1])
    assert (mp.transposed(a), mp.transposed(b)) == (majors[0] == "col", majors[1] == "col")
    assert mp.usable(a, b)[0], mp.usable(a, b)[1]
    c, run, _, _ = mp.launch(a, b, CONFIGS[config])
    assert_product(c, a, b, f"{majors} {config} {shape}")
    a2, b2 = operands(*shape, seed=1)
    a2, b2 = laid_out(a2, majors[0]), laid_out(b2, majors[1])
    assert_product(run(a2, b2), a2, b2, f"{majors} {config} {shape}, launched again")


def test_a_transposed_b_is_described_by_the_matrix_underneath():
    a, b = operands(64, 48, 32)
    w = b.t().contiguous()                     # nn.Linear's weight: (out, in)
    config = TileConfig(32, 16, 64, num_warps=4, num_stages=1, options=mp.NEITHER)
    da, db, dc = mp.descriptors(a, w.t(), torch.empty(64, 48, dtype=a.dtype), config)
    assert db.base.data_ptr() == w.data_ptr() and list(db.shape) == [48, 32]
    assert list(db.block_shape) == [16, 64], "B's box as stored: BLOCK_N rows of BLOCK_K"
    assert list(da.block_shape) == [32, 64] and list(dc.block_shape) == [32, 16]
    assert mp.stored(a) is a and not mp.transposed(a[:, ::2]) and mp.stored(a[:, ::2]).stride(1) == 2


def test_a_transposed_b_with_misaligned_rows_is_padded_as_the_matrix_underneath():
    a, _ = operands(40, 24, 60)                # 60 fp16 = 120 bytes: W's rows misaligned
    a = laid_out(a, "col")                     # (A's stored rows: 40 fp16, aligned)
    w = torch.randn(24, 60).to(DEVICE, torch.float16)
    assert "B's columns (it is a transposed view)" in mp.usable(a, w.t())[1]
    padded = mp.padded_to_lines(w.t())
    assert mp.transposed(padded) and torch.equal(padded, w.t())
    assert padded.stride(1) * padded.element_size() % 128 == 0


def test_a_strided_b_with_padded_rows_reads_only_its_columns():
    a, b = operands(70, 40, 56)
    wide = mp.padded_to_lines(b)
    assert wide.stride(0) * wide.element_size() % 128 == 0 and torch.equal(wide, b)
    c, *_ = mp.launch(a, wide, mp.CPU_CONFIG)
    assert_product(c, a, b, "B as a view of rows padded to 128 bytes")


def test_what_the_tma_can_and_cannot_take():
    a, b = operands(64, 64, 64)
    assert mp.usable(a, b)[0]
    assert "fp16 and bf16" in mp.usable(a.float(), b.float())[1]
    odd_a, odd_b = operands(64, 64, 63)
    assert "A's rows" in mp.usable(odd_a, odd_b)[1], "63 fp16 = 126 bytes: rows misaligned"
    a60, b60 = operands(64, 60, 64)
    assert "B's rows" in mp.usable(a60, b60)[1], "60 fp16 = 120 bytes"
    assert "C's rows" in mp.usable(a60, mp.padded_to_lines(b60))[1], "B padded, C still 120"
    assert mp.usable(a, b.t().contiguous().t())[0], "column-major B: nn.Linear's W.T"
    every_other = torch.empty(64, 128, dtype=b.dtype, device=b.device)[:, ::2]
    assert "B's rows" in mp.usable(a, every_other)[1], "strided both ways: neither layout"


def test_b_is_padded_only_when_misaligned_and_read_many_times():
    b = torch.empty(1000, 3000, dtype=torch.float16)          # 6000-byte rows: mid-line
    assert mp.pads_b(4000, b), "32 reads of B pay for one copy"
    assert not mp.pads_b(1000, b), "8 reads of B do not"
    assert not mp.pads_b(4000, torch.empty(1000, 3072, dtype=torch.float16)), "whole lines"


def test_a_direct_launch_is_refused_where_triton_is_not_the_one_it_calls():
    class NotCompiled:                      # the interpreter's "compiled" kernel: nothing
        run = None
    assert tma.direct(NotCompiled(), (1, 1, 1), [[32, 32]]) is None
    assert tma.direct(object(), (1, 1, 1), [[32, 32]]) is None


def test_a_direct_launch_is_kept_only_when_it_gives_the_usual_product():
    a, b = operands(16, 24, 32)
    first = a.float() @ b.float()

    def right(operands, args):
        torch.matmul(operands[0].float(), operands[1].float(), out=operands[2])

    def astray(operands, args):             # arguments gone astray: another product
        torch.matmul(operands[0].float(), operands[1].float().flip(1), out=operands[2])

    def broken(operands, args):
        raise RuntimeError("launch failed")

    assert mp._checked(right, (a, b), first, ()) is right
    assert mp._checked(astray, (a, b), first, ()) is None
    assert mp._checked(broken, (a, b), first, ()) is None
    assert mp._checked(None, (a, b), first, ()) is None


def test_every_candidate_fits_an_h100s_shared_memory():
    for config in mp.PERSISTENT_SPACE:
        used = config.shared_memory_bytes(torch.bfloat16, staged_c=mp.staged_c(config))
        assert used <= 232_448, f"{config}: {used:,} bytes"
        assert mp.fits(config, "H100-SXM", torch.bfloat16)[0], config
    big = TileConfig(128, 256, 64, num_warps=8, num_stages=4, options=mp.NEITHER)
    # 4 stages of 128x64 and 64x256 fp16 tiles, and the whole 128x256 C tile staged.
    assert big.shared_memory_bytes(staged_c=mp.staged_c(big)) == \
        (4 * (128 * 64 + 64 * 256) + 128 * 256) * 2 > 232_448
    assert not mp.fits(big, "H100-SXM")[0], "4 stages of 128x256 and a whole C tile"
    assert mp.fits(big.with_options(SPLIT_EPILOGUE=True), "H100-SXM")[0]


def test_a_setting_of_this_kernel_has_both_switches_and_no_split():
    assert mp.setting(TileConfig(32, 32, 32, num_warps=4, num_stages=1)) == mp.CPU_CONFIG
    flat = mp.setting({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "FLATTEN": True,
                       "num_warps": 4, "num_stages": 1})
    assert flat.option("FLATTEN") is True and flat.option("SPLIT_EPILOGUE") is False
    with pytest.raises(ValueError, match="does not split K"):
        mp.setting(TileConfig(32, 32, 32, split_k=2, num_warps=4, num_stages=1))
    with pytest.raises(ValueError, match="EPILOGUE_SPLIT"):
        mp.setting(mp.CPU_CONFIG.with_options(EPILOGUE_SPLIT=True))


@pytest.mark.skipif(helpers.is_gpu(), reason="the interpreter's limitation: CPU mode only")
def test_bf16_is_refused_in_cpu_mode_not_multiplied_wrong():
    """Triton's interpreter multiplies bf16 wrongly (values near 1e10 at 128 x 256 x 128,
    measured): the kernels' own launchers refuse it, as matmul() does."""
    a = torch.randn(128, 128, dtype=torch.bfloat16)
    b = torch.randn(128, 256, dtype=torch.bfloat16)
    with pytest.raises(InterpreterLimitationError, match="bf16"):
        mp.launch(a, b)
    with pytest.raises(InterpreterLimitationError, match="bf16"):
        sk.launch(a, b, sk.NARROW, sms=4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(4000, 3000, 1000), (1000, 1000, 1000), (4096, 4096, 4096),
                                   (2047, 4096, 1024), (128, 8192, 8192)],
                         ids=lambda s: "x".join(map(str, s)))
def test_compiled_autotuned_and_chosen(shape, dtype):
    a, b = operands(*shape, dtype)
    c, run, chosen, ms = mp.launch(a, b)
    assert_product(c, a, b, f"autotuned persistent kernel {shape}")
    assert ms > 0 and chosen == mp.setting(chosen) and set(chosen.as_dict(mp.KEYS)) == set(mp.KEYS)
    assert torch.equal(run(a, b), c), "the direct launch differs from the tuned one"
    first = mt.matmul_tuned(a, b)
    assert_product(first, a, b, f"matmul_tuned {shape}")
    assert mt.last_choice(a, b)["kernel"] in ("v6", "persistent")
    assert torch.equal(mt.matmul_tuned(a, b), first), "the kept plan differs from the first call"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_kept_encodings_follow_every_new_tensor(dtype):
    """The direct launch keeps descriptor encodings by address: fresh tensors (new
    addresses, and freed addresses reused for other contents), more of them than it
    keeps, and a padded B, each give their own product."""
    for shape in ((1000, 1000, 1000), (2100, 1000, 512)):
        a, b = operands(*shape, dtype)
        flat = TileConfig(128, 128, 64, num_warps=4, num_stages=4, options=mp.FLAT)
        c, run, chosen, _ = mp.launch(a, b, flat)
        if triton.__version__.startswith("3.6"):
            assert run.keeps_encodings, "triton 3.6: the direct launch should be in use"
        for seed in range(tma.MAX_KEPT + 8):
            a2, b2 = operands(*shape, dtype, seed=seed)
            assert_product(run(a2, b2), a2, b2, f"direct launch {shape}, seed {seed}")
            del a2, b2                      # the next pair may land on the same addresses
        assert torch.equal(run(a, b), c), "the first operands again: another product"

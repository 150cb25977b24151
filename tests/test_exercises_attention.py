"""The exercise checks of lesson 06 (FlashAttention): right answers pass, each classic
slip is named, unanswered exercises say so.

The expected values are written out here from first principles, so a change to the
formulas that breaks them fails this test."""

import math

import torch

from helpers.exercises import attention as ex
from support import assert_unanswered


def test_score_bytes():
    # One 16k x 16k fp16 matrix is 512 MiB; 8 sequences x 16 heads of them, 64 GiB.
    n = 16384
    assert ex.check_score_bytes(n * n * 2, n)
    assert ex.check_score_bytes(512 * 2**20, n)
    assert ex.check_score_bytes(8 * 16 * n * n * 2, n, batch=8, heads=16)
    assert ex.check_score_bytes(8 * 16 * n * n * 4, n, torch.float32, batch=8, heads=16)
    msg = lambda got, **kw: ex.check_score_bytes(got, n, **kw).message  # noqa: E731
    assert "bits, not bytes" in msg(8 * n * n * 2)
    assert "elements, not bytes" in msg(n * n)
    assert "S and P together" in msg(2 * n * n * 2)
    assert "4-byte fp32" in msg(n * n * 4)
    assert "S and P together" in msg(2 * n * n * 4, dtype=torch.float32)
    assert "MiB, not bytes" in msg(512)
    assert "batch and the heads" in msg(n * n * 2, batch=8, heads=16)
    assert "forgot the heads" in msg(8 * n * n * 2, batch=8, heads=16)
    assert "forgot the batch" in msg(16 * n * n * 2, batch=8, heads=16)
    assert not ex.check_score_bytes(n * n * 3, n)
    assert_unanswered(ex.check_score_bytes(..., n))
    assert not ex.check_score_bytes("lots", n)


def test_rescale():
    # The max rises from 3 to 5: the old sum is multiplied by exp(3 - 5) = 0.1353.
    assert ex.check_rescale(math.exp(-2), 3.0, 5.0)
    assert ex.check_rescale(0.1353, 3.0, 5.0)
    assert "swapped old and new" in ex.check_rescale(math.exp(2), 3.0, 5.0).message
    assert "forgot the exp" in ex.check_rescale(-2, 3.0, 5.0).message
    # The block's max (1) is below the running max (3): nothing changes, the factor is 1.
    assert ex.check_rescale(1, 3.0, 1.0)
    assert "larger of the two" in ex.check_rescale(math.exp(2), 3.0, 1.0).message
    assert "larger of the two" in ex.check_rescale(math.exp(-2), 3.0, 1.0).message
    assert_unanswered(ex.check_rescale(None, 3.0, 5.0))


def test_backward_ratio():
    # Forward: S = QK^T, O = PV. Backward: S again, dV, dP, dQ, dK. 5 / 2.
    assert ex.backward_flops_ratio() == 2.5
    assert ex.check_backward_ratio(2.5)
    assert "recomputation" in ex.check_backward_ratio(2).message
    assert "O is saved" in ex.check_backward_ratio(3).message
    assert "together" in ex.check_backward_ratio(3.5).message
    assert "divided the forward" in ex.check_backward_ratio(0.4).message
    assert_unanswered(ex.check_backward_ratio(...))


def test_causal_tiles():
    # seq 1024, 128 queries and 64 keys a tile: Q tile 3 holds queries 384-511, which see
    # keys 0-511: K/V tiles 0-7, of which 6 and 7 cross the diagonal. 16 tiles in a row.
    assert ex.check_causal_tiles(8, 1024, 128, 64, 3)
    assert "causal as full" in ex.check_causal_tiles(16, 1024, 128, 64, 3).message
    assert "diagonal tiles" in ex.check_causal_tiles(6, 1024, 128, 64, 3).message
    assert "one short" in ex.check_causal_tiles(7, 1024, 128, 64, 3).message
    assert "square tiles" in ex.check_causal_tiles(4, 1024, 128, 64, 3).message
    # Square tiles: Q tile 0 sees only its own diagonal tile.
    assert ex.check_causal_tiles(1, 512, 64, 64, 0)
    assert ex.check_causal_tiles(8, 512, 64, 64, 7)
    # A ragged last tile: seq 1000, Q tile 7 holds queries 896-999: K/V tiles 0-15.
    assert ex.check_causal_tiles(16, 1000, 128, 64, 7)
    assert_unanswered(ex.check_causal_tiles(..., 1024, 128, 64, 3))
    try:
        ex.check_causal_tiles(1, 1024, 128, 64, 8)
    except ValueError as e:
        assert "q_tile must be 0 to 7" in str(e)
    else:
        raise AssertionError("a Q tile past the end must be refused")


def test_causal_fraction():
    # 8 x 8 square tiles: 36 of 64 computed (the triangle plus the diagonal), 0.5625.
    assert ex.causal_work_fraction(512, 64, 64) == 36 / 64
    assert ex.check_causal_fraction(0.5625, 512, 64, 64)
    assert "triangle's area" in ex.check_causal_fraction(0.5, 512, 64, 64).message
    assert "causal as full" in ex.check_causal_fraction(1, 512, 64, 64).message
    assert_unanswered(ex.check_causal_fraction(None, 512, 64, 64))


def test_memory_growth():
    # Naive: S and P, 2 N^2 bf16 elements per head, dominate: doubling N gives about 4x.
    assert ex.check_memory_growth(4, "naive")
    assert "dominate" in ex.check_memory_growth(2, "naive").message
    # Fused: O and lse, N (d + 2) bf16-sized elements per head: exactly 2x.
    assert ex.check_memory_growth(2, "fused")
    assert "that is naive" in ex.check_memory_growth(4, "fused").message
    assert ex.forward_extra_bytes(1024, "fused") == 1024 * 128 * 2 + 1024 * 4
    assert ex.forward_extra_bytes(1024, "naive") == 2 * 1024 * 1024 * 2 + 1024 * 128 * 2
    assert_unanswered(ex.check_memory_growth(..., "naive"))
    try:
        ex.forward_extra_bytes(1024, "flash")
    except ValueError as e:
        assert "'naive' or 'fused'" in str(e)
    else:
        raise AssertionError("an unknown version must be refused")


def test_backward_ratio_is_the_matmul_count():
    assert ex.backward_flops_ratio() == len(ex.BACKWARD_MATMULS) / len(ex.FORWARD_MATMULS)
    assert ex.backward_flops_ratio(1000, 64) == 2.5

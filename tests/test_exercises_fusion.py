"""The exercise checks of lesson 05 (fusion): the bytes of eager SwiGLU and of the online
softmax. Right answers pass; each classic slip is named; unanswered exercises say so.

The expected counts are written out here from the kernels' reads and writes, so a change
to the napkin math that breaks them fails this test."""

import torch

from helpers.exercises import fusion as ex
from support import assert_unanswered

M, N = 4096, 16384


def test_swiglu_bytes():
    # SiLU reads gate, writes silu(gate); the product reads it and up, writes y: 5 MN
    # elements of 2 bytes (bf16).
    assert ex.check_swiglu_bytes(10 * M * N, M, N)
    assert ex.check_swiglu_bytes(20 * M * N, M, N, torch.float32)
    assert "fused kernel" in ex.check_swiglu_bytes(6 * M * N, M, N).message
    assert "silu(gate) once" in ex.check_swiglu_bytes(8 * M * N, M, N).message
    assert "elements, not bytes" in ex.check_swiglu_bytes(5 * M * N, M, N).message
    assert not ex.check_swiglu_bytes(11 * M * N, M, N)
    assert_unanswered(ex.check_swiglu_bytes(..., M, N))
    assert not ex.check_swiglu_bytes("many", M, N)


def test_online_softmax_bytes():
    n = 65536
    # Pass 1 reads each row (max and sum), pass 2 reads it again and writes y: 3 MN
    # elements of 2 bytes (fp16).
    assert ex.check_online_softmax_bytes(6 * M * n, M, n)
    assert ex.check_online_softmax_bytes(12 * M * n, M, n, torch.float32)
    assert "reads each row twice" in ex.check_online_softmax_bytes(4 * M * n, M, n).message
    assert "writes y once" in ex.check_online_softmax_bytes(8 * M * n, M, n).message
    assert "elements, not bytes" in ex.check_online_softmax_bytes(3 * M * n, M, n).message
    assert_unanswered(ex.check_online_softmax_bytes(..., M, n))

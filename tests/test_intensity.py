"""Napkin math checked against cases small enough to count on paper."""

import math

import pytest
import torch

from helpers import hardware, intensity, launches, prediction, roofline

H100 = hardware.GPUS["H100-SXM"]


def test_vector_add_and_axpy_by_hand():
    w = intensity.vector_add(1000, "fp32")
    assert (w.flops, w.nbytes) == (1000, 12_000)     # 1 add; read a, b, write c: 3 x 4 B
    assert w.intensity == pytest.approx(1 / 12)
    w = intensity.axpy(10, "fp16")
    assert (w.flops, w.nbytes) == (20, 60)           # multiply + add; read x, y, write y
    assert intensity.copy(8, "bf16").nbytes == 32 and intensity.copy(8, "bf16").flops == 0


def test_row_ops_by_hand():
    assert (intensity.softmax(2, 3, "fp32").flops, intensity.softmax(2, 3, "fp32").nbytes) == \
        (2 * 3 * intensity.SOFTMAX_FLOPS_PER_ELEMENT, 48)
    ln = intensity.layer_norm(2, 3, "fp32")
    assert ln.flops == 6 * intensity.LAYER_NORM_FLOPS_PER_ELEMENT
    assert ln.nbytes == 2 * 6 * 4 + 2 * 3 * 4       # x in, y out, weight + bias once
    rs = intensity.row_sum(2, 3, "fp16")
    assert (rs.flops, rs.nbytes) == (6, 6 * 2 + 2 * 4)  # fp32 results


def test_matmul_by_hand():
    w = intensity.matmul(2, 3, 4, "fp32")
    assert w.flops == 2 * 2 * 3 * 4 == 48
    assert w.nbytes == (2 * 4 + 4 * 3 + 2 * 3) * 4 == 104
    # Naive: 1x1 "tiles" re-read A once per column of C and B once per row.
    naive = intensity.matmul(2, 2, 2, "fp32", block_m=1, block_n=1)
    assert naive.nbytes == (4 * 2 + 4 * 2 + 4) * 4 == 80
    # Tiles as large as C: the compulsory count again.
    assert intensity.matmul(64, 64, 64, "fp16", 64, 64).nbytes == \
        intensity.matmul(64, 64, 64, "fp16").nbytes


def test_square_matmul_intensity_grows_like_n():
    # 2 n^3 / (3 n^2 s): n / 3 FLOP per byte in 2-byte types.
    for n in (128, 1024, 8192):
        assert intensity.matmul(n, n, n, "bf16").intensity == pytest.approx(n / 3)


def test_tiling_raises_intensity():
    sizes = [intensity.matmul(4096, 4096, 4096, "bf16", b, b).intensity for b in (1, 16, 128)]
    assert sizes == sorted(sizes) and sizes[-1] > 50 * sizes[0]


def test_attention_by_hand():
    mat = intensity.attention_materialised(1, 4, 2, "fp16")
    tiled = intensity.attention_tiled(1, 4, 2, "fp16")
    flops = 4 * 16 * 2 + intensity.SOFTMAX_FLOPS_PER_ELEMENT * 16
    assert mat.flops == tiled.flops == flops
    assert mat.nbytes == (4 * 4 * 2 + 4 * 16) * 2    # Q, K, V, O plus S and P twice each
    assert tiled.nbytes == 4 * 4 * 2 * 2             # Q, K, V, O only
    assert intensity.attention_tiled(8, 4, 2, "fp16").nbytes == 8 * tiled.nbytes


def test_attention_materialised_intensity_saturates():
    # Materialised: intensity tends to a constant as seq grows; tiled: grows like seq.
    mats = [intensity.attention_materialised(1, s, 128, "bf16").intensity for s in (4096, 65536)]
    tiles = [intensity.attention_tiled(1, s, 128, "bf16").intensity for s in (4096, 65536)]
    assert mats[1] / mats[0] < 1.1
    assert tiles[1] / tiles[0] == pytest.approx(16, rel=0.01)


def test_peak_dtype_rules():
    assert intensity.softmax(4, 4, "bf16").peak_dtype == "fp32"   # CUDA cores, not tensor cores
    assert intensity.matmul(4, 4, 4, "bf16").peak_dtype == "bf16"
    assert intensity.attention_tiled(1, 4, 2, "fp16").peak_dtype == "fp16"


def test_predict_memory_compute_latency():
    # 3.35 GB at 3350 GB/s is exactly 1 ms.
    w = intensity.Work("made-up stream", "-", "fp32", flops=1, nbytes=3_350_000_000,
                       peak_dtype="fp32", counting="test")
    p = prediction.predict(w, H100)
    assert p.memory_ms == pytest.approx(1.0) and p.bound == "memory"
    assert p.time_ms == pytest.approx(1.0)
    assert prediction.predict(w, H100, launch_us=5).time_ms == pytest.approx(1.005)
    big = prediction.predict(intensity.matmul(8192, 8192, 8192, "bf16"), H100)
    assert big.bound == "compute"
    assert big.compute_ms == pytest.approx(2 * 8192**3 / 989.4e12 * 1e3)
    tiny = prediction.predict(intensity.matmul(64, 64, 64, "bf16"), H100, launch_us=5)
    assert tiny.bound == "latency" and tiny.time_ms == pytest.approx(0.005, rel=0.01)


@pytest.mark.parametrize("op", list(prediction.CATALOGUE))
def test_predict_agrees_with_roofline_without_launch(op):
    entry = prediction.CATALOGUE[op]
    for log2 in entry.log2_range:
        w = prediction.work_for(op, 2**log2, "bf16")
        p = prediction.predict(w, H100)
        assert p.bound == roofline.bound(w.intensity, H100, w.peak_dtype)
        assert p.time_ms == pytest.approx(
            roofline.predicted_time_ms(w.flops, w.nbytes, H100, w.peak_dtype))
        assert p.tflops <= H100.peak(w.peak_dtype) * (1 + 1e-9)


def test_table_is_deterministic():
    text = intensity.table([intensity.vector_add(2**20, "fp32"), intensity.matmul(8, 8, 8)])
    assert "vector add" in text and "0.0833" in text and text == intensity.table(
        [intensity.vector_add(2**20, "fp32"), intensity.matmul(8, 8, 8)])


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_bad_sizes(bad):
    with pytest.raises(ValueError, match="positive whole number"):
        intensity.vector_add(bad)


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="unknown data type"):
        intensity.vector_add(4, "int8")
    with pytest.raises(ValueError, match="both block_m and block_n"):
        intensity.matmul(4, 4, 4, block_m=2)
    with pytest.raises(ValueError, match="intensity is undefined"):
        _ = intensity.Work("x", "-", "fp32", 0, 0, "fp32", "").intensity
    with pytest.raises(KeyError, match="choose one of"):
        prediction.work_for("convolution", 8)
    with pytest.raises(ValueError, match="launch_us"):
        prediction.predict(intensity.vector_add(4), H100, launch_us=-1)
    with pytest.raises(ValueError, match="no fp8 peak|tensor cores do not support"):
        prediction.predict(intensity.matmul(4, 4, 4, "fp8"), hardware.GPUS["A100-80GB"])


def test_element_bytes():
    assert [intensity.element_bytes(d) for d in ("fp32", "tf32", "fp16", "bf16", "fp8")] == \
        [4, 4, 2, 2, 1]
    import torch

    assert intensity.element_bytes(torch.bfloat16) == 2
    assert math.isclose(intensity.vector_add(3, torch.float16).intensity, 1 / 6)


def test_work_intensity_is_flops_per_byte():
    # What bench.intensity(1e9, 6e9) used to compute: one home for the ratio now.
    assert intensity.Work("x", "-", "fp32", 10**9, 6 * 10**9, "fp32", "").intensity == \
        pytest.approx(1 / 6)


def test_every_version_has_the_same_flops():
    for op, versions in ((intensity.softmax, intensity.SOFTMAX_VERSIONS),
                         (intensity.bias_gelu, intensity.ELEMENTWISE_VERSIONS),
                         (intensity.swiglu, intensity.ELEMENTWISE_VERSIONS),
                         (intensity.residual_rmsnorm, intensity.RMSNORM_VERSIONS)):
        works = [op(64, 128, "bf16", version=v) for v in versions]
        assert len({w.flops for w in works}) == 1, op.__name__
        assert min(w.nbytes for w in works) == op(64, 128, "bf16").nbytes, "fused moves least"


# --------------------------------------------------------------------------------------
# Lesson 06: intensity.attention, per pass, as the field counts it
# --------------------------------------------------------------------------------------


def test_attention_flops_are_the_fields_convention():
    b, h, n, d = 4, 16, 4096, 128
    fwd = intensity.attention(b, h, n, n, d, "bf16")
    # FlashAttention's benchmark: 4 * batch * seqlen^2 * nheads * headdim // (2 if causal)
    assert fwd.flops == 4 * b * n * n * h * d
    assert intensity.attention(b, h, n, n, d, "bf16", causal=True).flops == fwd.flops // 2
    bwd = intensity.attention(b, h, n, n, d, "bf16", pass_="backward")
    assert bwd.flops == 2.5 * fwd.flops                     # five matmuls to the forward's two
    assert intensity.attention(b, h, n, n, d, "bf16", True, pass_="backward").flops == \
        bwd.flops // 2
    for pass_ in intensity.ATTENTION_PASSES:                # one count for every version
        assert len({intensity.attention(2, 3, 64, 96, 32, "fp16", version=v, pass_=pass_).flops
                    for v in intensity.ATTENTION_VERSIONS}) == 1
    assert fwd.peak_dtype == "bf16"                         # matmuls: the tensor-core roof


def test_attention_causal_halving_is_within_one_over_n_of_the_exact_count():
    for n in (512, 1024, 16384):
        exact = sum(min(i + 1, n) for i in range(n))        # key j <= query i
        assert exact == n * (n + 1) // 2
        half = intensity.attention(1, 1, n, n, 1, "fp32", causal=True).flops
        assert half / (4 * exact) == pytest.approx(1 - 1 / (n + 1))


def test_attention_flash_bytes_by_hand():
    # B=1, H=2, N=4, d=8, fp16: Q, K, V, O are 2*4*8 = 64 elements of 2 bytes; lse 8 rows.
    fwd = intensity.attention(1, 2, 4, 4, 8, "fp16")
    assert fwd.nbytes == 4 * 64 * 2 + 8 * 4
    bwd = intensity.attention(1, 2, 4, 4, 8, "fp16", pass_="backward")
    # read Q, K, V, O, dO and lse; write dQ, dK, dV; delta written and read back
    assert bwd.nbytes == 8 * 64 * 2 + 8 * 4 + 2 * 8 * 4
    assert intensity.attention(1, 2, 4, 4, 8, "fp16", causal=True).nbytes == fwd.nbytes
    gqa = intensity.attention(1, 2, 4, 4, 8, "fp16", kv_heads=1)   # K, V of one head
    assert gqa.nbytes == fwd.nbytes - 2 * 32 * 2


def test_attention_intensity_grows_with_n_when_fused_and_stalls_when_not():
    flash = [intensity.attention(4, 16, n, n, 128, "bf16").intensity for n in (1024, 16384)]
    naive = [intensity.attention(4, 16, n, n, 128, "bf16", version="naive").intensity
             for n in (1024, 16384)]
    assert flash[1] / flash[0] == pytest.approx(16, rel=0.01)      # ~N/2 FLOP per byte
    assert naive[1] / naive[0] < 1.1 and naive[1] < 4 * 128 / 28 * 1.01  # 28 B per score


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_naive_bytes_are_what_naive_attention_launches(dtype, causal, kv_heads):
    """The hand count against every aten op naive attention and its autograd backward
    dispatch (helpers.launches.trace). ``aten._unsafe_view`` is a view that moves nothing,
    but its schema does not say so and the tracer counts it: it is left out here."""
    from helpers.kernels.attention import naive_attention

    b, h, nq, nk, d = 2, 4, 8, 6, 16
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, nq, d, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(b, kv_heads, nk, d, generator=g).to(dtype).requires_grad_()
            for _ in range(2))

    def moved(tr):
        return sum(c.read + c.written for c in tr if c.op != "aten._unsafe_view")

    fwd = launches.trace(naive_attention, q, k, v, causal=causal)
    do = torch.randn_like(fwd.result)
    bwd = launches.trace(torch.autograd.grad, fwd.result, (q, k, v), do)
    for pass_, tr in (("forward", fwd), ("backward", bwd)):
        want = intensity.attention(b, h, nq, nk, d, dtype, causal, "naive", pass_, kv_heads)
        assert moved(tr) == want.nbytes, f"{pass_}:\n{tr.table()}\n{want.describe()}"


def test_attention_bad_inputs():
    with pytest.raises(ValueError, match="unknown version"):
        intensity.attention(1, 1, 4, 4, 8, version="tiled")
    with pytest.raises(ValueError, match="unknown version"):
        intensity.attention(1, 1, 4, 4, 8, pass_="sideways")
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        intensity.attention(1, 6, 4, 4, 8, kv_heads=4)
    with pytest.raises(ValueError, match="positive whole number"):
        intensity.attention(1, 1, 0, 4, 8)


# --------------------------------------------------------------------------------------
# Lesson 08: a Mixture-of-Experts layer (helpers.intensity.moe)
# --------------------------------------------------------------------------------------


def test_expert_flops_and_the_active_fraction_by_hand():
    # 3 copies through H = 4 -> I = 5 twice (gate, up) and back once: 3 x 4 x 5 MACs each.
    assert intensity.expert_flops(3, 4, 5) == 3 * 2 * (3 * 4 * 5) == 360
    assert intensity.expert_flops(0, 4096, 14336) == 0, "no copies, no work"
    # Mixtral: 2 of 8 experts per token; Qwen3-30B-A3B: 8 of 128.
    assert intensity.active_fraction(8, 2) == 0.25
    assert intensity.active_fraction(128, 8) == 1 / 16
    with pytest.raises(ValueError, match="cannot exceed"):
        intensity.active_fraction(4, 8)
    with pytest.raises(ValueError, match="positive whole number"):
        intensity.expert_flops(1, 0, 8)


@pytest.mark.parametrize("counts,block_m,padding", [
    ([0, 5, 16, 17], 16, 0 + 11 + 0 + 15),
    ([1, 1, 1, 1], 64, 4 * 63),
    ([128, 256], 128, 0),
    ([0, 0, 0], 32, 0),
    ([300], 128, 84),                   # three tiles, the last 44 rows full
])
def test_padding_rows_rounds_each_expert_up_to_whole_tiles(counts, block_m, padding):
    assert intensity.padding_rows(counts, block_m) == padding
    assert intensity.padding_rows(torch.tensor(counts, dtype=torch.int32), block_m) == padding
    tiles = intensity.tiles_per_expert(counts, block_m)
    assert sum(tiles) * block_m - sum(counts) == padding
    assert all(t == 0 for t, c in zip(tiles, counts) if c == 0), "no rows, no tile"


def test_padding_counts_refuse_what_is_not_a_count_of_rows():
    with pytest.raises(ValueError, match="whole number of rows"):
        intensity.padding_rows([3, 2.5], 16)
    with pytest.raises(ValueError, match=r"counts\[1\] must be >= 0"):
        intensity.tiles_per_expert([3, -1], 16)
    with pytest.raises(ValueError, match="block_m must be a positive"):
        intensity.padding_rows([3], 0)


def test_bytes_sent_per_rank_counts_copies_that_leave():
    # 1000 tokens x 2 copies, 3 in 4 leave, 32 fp16 numbers (2 bytes) each.
    assert intensity.bytes_sent_per_rank(1000, 2, 32, 4, "fp16") == 1000 * 2 * 0.75 * 32 * 2
    assert intensity.bytes_sent_per_rank(1000, 2, 32, 1, torch.float32) == 0, \
        "one rank sends nothing"
    assert intensity.bytes_sent_per_rank(10, 8, 2048, 8, torch.bfloat16) * 2 == \
        intensity.bytes_sent_per_rank(10, 8, 2048, 8, torch.float32)
    # 16384 tokens, top-8 of 128, H = 2048 bf16, 8 ranks: 470 MB each way, ~1 ms at 450 GB/s.
    ms = intensity.exchange_ms(16384, 8, 2048, 8, "bf16", link_gb_per_s=450)
    assert ms == pytest.approx(16384 * 8 * 7 / 8 * 2048 * 2 / 450e9 * 1e3)
    with pytest.raises(ValueError, match="positive GB/s"):
        intensity.exchange_ms(1, 1, 1, 2, "bf16", link_gb_per_s=0)
    with pytest.raises(ValueError, match="at least 1 rank"):
        intensity.bytes_sent_per_rank(1, 1, 1, 0, "bf16")

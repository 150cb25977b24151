"""The drawn matmul sweep (helpers/experiments/matmul_shapes.py): the generator is seeded
and covers what it promises, the padded cuBLAS baseline computes the same product, the
summary keeps aligned and unaligned rows apart. A tiny draw runs compiled on a GPU."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.experiments import matmul_shapes as ms

SEEDS = range(12)
SM_COUNTS = (132, 114, 78)        # H100 SXM, H100 PCIe, a smaller part


def test_the_same_seed_draws_the_same_shapes_and_another_seed_others():
    assert ms.draw(5, 132) == ms.draw(5, 132)
    assert ms.draw(5, 132) != ms.draw(6, 132)


def test_every_family_and_dtype_in_equal_shares():
    shapes = ms.draw(0, 132)
    assert len(shapes) == ms.COUNT >= 40
    for family in ms.FAMILIES:
        mine = [s for s in shapes if s.family == family]
        assert len(mine) == ms.COUNT // len(ms.FAMILIES)
        assert {s.dtype for s in mine} == {"fp16", "bf16"}
    assert sum(s.dtype == "fp16" for s in shapes) == ms.COUNT // 2


@pytest.mark.parametrize("seed", SEEDS)
def test_shapes_stay_within_their_families_bounds(seed):
    for s in ms.draw(seed, 132):
        assert min(s.M, s.N, s.K) >= 1
        assert s.flops <= ms.MAX_FLOPS and s.M * s.N <= ms.MAX_OUTPUT, s
        if s.family == "llm":
            assert 1 <= s.M <= ms.MAX_TOKENS
            widths = {w for m in ms.MODELS for w in m[1:]}
            assert s.K in widths and s.N in widths, s
        elif s.family == "square":
            assert s.M == s.N == s.K and 512 - ms.TILE < s.M <= 8192
        elif s.family == "random":
            assert all(64 <= d <= 12288 for d in (s.M, s.N, s.K))


@pytest.mark.parametrize("sms", SM_COUNTS)
@pytest.mark.parametrize("seed", SEEDS)
def test_tail_shapes_land_just_past_a_whole_wave(seed, sms):
    for s in ms.draw(seed, sms):
        if s.family != "tail":
            continue
        tiles = math.ceil(s.M / ms.TILE) * math.ceil(s.N / ms.TILE)
        waves, past = divmod(tiles, sms)
        assert 1 <= waves <= 3 and 1 <= past <= max(1, sms // 8), (s, tiles)


def test_draws_hold_aligned_and_unaligned_rows_and_squares_off_the_tile_grid():
    shapes = [s for seed in SEEDS for s in ms.draw(seed, 132)]
    assert any(s.aligned for s in shapes) and any(not s.aligned for s in shapes)
    squares = [s.M for s in shapes if s.family == "square"]
    assert any(n % ms.TILE for n in squares) and any(n % ms.TILE == 0 for n in squares)
    tokens = {s.M for s in shapes if s.family == "llm"}
    assert 1 in tokens or min(tokens) < 8
    assert any(t & (t - 1) for t in tokens), "token counts that are not powers of two"


def test_a_shape_is_aligned_when_every_dimension_is_a_multiple_of_8():
    assert ms.Shape("x", "x", 64, 128, 4096, "fp16").aligned
    assert not ms.Shape("x", "x", 1, 128, 4096, "fp16").aligned
    assert not ms.Shape("x", "x", 64, 128, 1999, "fp16").aligned


def test_draw_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="at least"):
        ms.draw(0, 132, count=2)
    with pytest.raises(ValueError, match="SM"):
        ms.draw(0, 0)


@pytest.mark.parametrize("M,N,K", [(5, 7, 9), (16, 24, 32), (3, 1, 13)])
def test_padded_operands_give_the_same_product(M, N, K):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    a_p, b_p = ms.padded_operands(a, b)
    assert a_p.shape == (M, ms.up(K)) and b_p.shape == (ms.up(K), ms.up(N))
    assert a_p.shape[1] % ms.ALIGN == 0 and b_p.shape[1] % ms.ALIGN == 0
    torch.testing.assert_close((a_p @ b_p)[:, :N], a @ b)


def test_summary_keeps_aligned_and_unaligned_apart():
    rows = [{"label": "a", "dtype": "fp16", "aligned": True, "vs_cublas": 1.0},
            {"label": "b", "dtype": "bf16", "aligned": True, "vs_cublas": 0.81},
            {"label": "c", "dtype": "fp16", "aligned": False, "vs_cublas": 1.2}]
    out = ms.summary(rows)
    assert out["all"]["rows"] == 3 and out["aligned"]["rows"] == 2
    assert out["aligned"]["geomean"] == pytest.approx(math.sqrt(0.81))
    assert out["aligned"]["worst"] == 0.81 and out["aligned"]["worst_label"] == "b (bf16)"
    assert out["aligned"]["below_0.85"] == 1 and out["unaligned"]["below_0.85"] == 0
    assert ms.summary([])["aligned"] == {"rows": 0}


@pytest.mark.gpu
def test_a_small_draw_runs_and_checks_its_outputs():
    out = ms.matmul_shapes(seed=3, count=4)
    assert out["seed"] == 3 and len(out["rows"]) == 4
    for row in out["rows"]:
        assert row["error"] < 2e-2 and row["linear_error"] < 2e-2, row
        assert row["ours_ms"] > 0 and row["vs_cublas"] > 0
    assert {r["M"] for r in out["back_to_back"]} == {m for m, _, _ in ms.LOOP_SHAPES}


HERE = {"gpu": "NVIDIA H200", "sms": 132, "git_commit": "abc123", "git_dirty": False,
        "torch": "2.11.0", "triton": "3.6.0"}


@pytest.fixture
def stand_in_rows(monkeypatch):
    """The experiment without a GPU: this machine is ``HERE``, a row is its shape and seed."""
    timed = []

    def time_row(shape, ours, seed):
        timed.append(seed)
        return {"label": shape.label, "dtype": shape.dtype, "aligned": shape.aligned,
                "seed": seed, "vs_cublas": 1.0, "linear_vs_f_linear": 1.0}

    monkeypatch.setattr(ms, "_here", lambda: dict(HERE))
    monkeypatch.setattr(ms, "_time_row", time_row)
    monkeypatch.setattr(ms, "back_to_back", lambda ours: [{"M": 1000}])
    return timed


def _written(results, tmp_path, **provenance):
    from helpers import records

    made = {k: v for k, v in HERE.items() if k != "sms"}
    rec = records.Record("matmul_shapes", {**made, "gpu_key": "H200", **provenance}, results)
    return str(records.write(rec, tmp_path))


def test_parts_measure_the_draw_in_turn_and_only_the_last_is_complete(stand_in_rows, tmp_path):
    first = ms.matmul_shapes(count=10, part="1/3")
    assert first["part"] == "1/3" and len(first["rows"]) == 3 and "summary" not in first
    assert "part=2/3" in first["note"]
    second = ms.matmul_shapes(count=10, part="2/3", earlier=_written(first, tmp_path))
    assert second["seed"] == first["seed"] and len(second["rows"]) == 6
    last = ms.matmul_shapes(count=10, part="3/3", earlier=_written(second, tmp_path))
    assert "summary" in last and last["back_to_back"] == [{"M": 1000}]
    whole = ms.matmul_shapes(seed=first["seed"], count=10)
    assert last["rows"] == whole["rows"], "three parts measure what one run would"
    assert stand_in_rows[-10:] == [first["seed"] + i for i in range(10)]


@pytest.mark.parametrize("part, earlier, match", [
    ("3/2", None, "1 <= k <= n"),
    ("two of three", None, "k/n"),
    ("2/2", None, "pass earlier="),
    ("2/2", {"part": "1/3"}, "holds part 1/3, not part 1/2"),
    ("2/2", {"count": 12}, "its count is 12"),
    ("2/2", {"sms": 114}, "its SM count is 114"),
    ("2/2", {"rows": []}, "holds 0 rows"),
    ("2/2", {"gpu": "NVIDIA H100 80GB HBM3"}, "its GPU is 'NVIDIA H100"),
    ("2/2", {"git_commit": "def456"}, "its git_commit is 'def456'"),
    ("2/2", {"git_dirty": True}, "its git_dirty is True"),
    ("2/2", {"triton": "3.5.0"}, "its triton is '3.5.0'"),
    ("2/2", {"seed": 5}, "its seed is 5, this run's 4"),
    ("2/2", {"rows": "reversed"}, "not the first 5 shapes of seed 4's draw"),
    ("1/2", {}, "continues no earlier part"),
])
def test_a_part_that_cannot_continue_says_why(stand_in_rows, tmp_path, part, earlier, match):
    path = None
    if earlier is not None:
        first = {**ms.matmul_shapes(seed=4, count=10, part="1/2")}
        if earlier.get("rows") == "reversed":
            earlier["rows"] = first["rows"][::-1]
        where = {k: earlier.pop(k) for k in ("gpu", *HERE) if k in earlier and k != "sms"}
        path = _written({**first, **earlier}, tmp_path, **where)
    with pytest.raises(ValueError, match=match):
        ms.matmul_shapes(seed=4, count=10, part=part, earlier=path)


def test_a_committed_record_is_the_whole_draw():
    """Parts before the last write their record where the last one will: only a whole
    draw, with its summaries, is kept."""
    from helpers import records

    for gpu in records.available("matmul_shapes"):
        got = records.load("matmul_shapes", gpu).results
        k, n = got.get("part", "1/1").split("/")
        assert k == n and "summary" in got, f"{gpu}: part {k} of {n}, not the whole draw"
        assert len(got["rows"]) == got.get("count", len(got["rows"]))


def test_a_committed_record_is_the_draw_of_its_seed_and_its_summaries_are_its_rows():
    """A committed record's shapes are the ones its printed seed draws on its GPU (the
    tuner could not have known them), every output was right, each row's ratio is the
    faster cuBLAS over ours, and the summaries the report judges are the rows' own."""
    from helpers import records
    from helpers.performance import extract

    for gpu in records.available("matmul_shapes"):
        rec = records.load("matmul_shapes", gpu)
        got = rec.results
        drawn = ms.draw(got["seed"], got["sms"], got["count"])
        assert [(s.M, s.N, s.K, s.dtype) for s in drawn] == \
            [(r["M"], r["N"], r["K"], r["dtype"]) for r in got["rows"]], gpu
        for r in got["rows"]:
            assert r["error"] < 2e-2 and r["linear_error"] < 2e-2, (gpu, r["label"])
            best = min(r["cublas_ms"], r.get("cublas_padded_ms", math.inf))
            assert r["vs_cublas"] == pytest.approx(best / r["ours_ms"]), (gpu, r["label"])
        for field, key in (("summary", "vs_cublas"), ("linear_summary", "linear_vs_f_linear")):
            again = ms.summary(got["rows"], key)
            for part, kept in got[field].items():
                assert kept == {k: pytest.approx(v) if isinstance(v, float) else v
                                for k, v in again[part].items()}, (gpu, field, part)
        rows = extract(rec)
        geomean = next(r for r in rows if r.shape.startswith(f"{len(got['rows'])} all"))
        assert geomean.ratio == pytest.approx(got["summary"]["all"]["geomean"])

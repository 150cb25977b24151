"""Lesson 08 (moe): the experiment's sizes and helpers, the tables and figures drawn from a
record, and (once committed) the GPU record itself: complete, internally consistent, every
version correct, and the lesson's targets met.

The figures are first drawn from ``tests/moe_fixture.py``: a record-shaped fixture with
made-up times, never written to helpers/records."""

import math

import matplotlib
import pytest
import torch

import moe_fixture
from helpers import intensity
from helpers.experiments import moe as experiment
from helpers.kernels import moe
from helpers.plots import moe as plots
from helpers.plots import moe_routing

from support import committed_record  # tests/support.py

matplotlib.use("Agg")

OURS, LOOP = experiment.OURS, experiment.LOOP


# --------------------------------------------------------------------------------------
# The experiment, without a GPU
# --------------------------------------------------------------------------------------


def test_sizes_are_the_lessons():
    cfg = experiment.sizes()
    assert cfg["dtype"] == "bf16" and not cfg["smoke"]
    assert experiment.shape_of(cfg, "few_large") == moe.FEW_LARGE
    assert experiment.shape_of(cfg, "many_small") == moe.MANY_SMALL
    assert cfg["shapes"]["few_large"]["tokens"] == [1024, 4096, 8192]
    assert cfg["shapes"]["many_small"]["tokens"] == [1024, 4096, 8192, 16384]
    im = cfg["imbalance"]
    assert im["shape"] == "many_small" and im["tokens"] == 8192
    assert im["tokens"] in cfg["shapes"]["many_small"]["tokens"], "the loop's model needs it"
    assert im["capacity_factors"] == [1.0, 1.25, 2.0] and im["strengths"][0] == 0.0
    for key in cfg["shapes"]:
        assert cfg["profile_tokens"] in cfg["shapes"][key]["tokens"]
    assert set(experiment.VS_GROUPED_MM) == set(experiment.LAYER_VS_LOOP) == set(cfg["shapes"])
    assert set(experiment.TARGET_TOKENS) == set(cfg["shapes"])
    for key, tokens in experiment.TARGET_TOKENS.items():
        assert tokens in cfg["shapes"][key]["tokens"], "a target holds at a measured count"


def test_smoke_sizes_are_tiny_and_shaped_like_the_full_run():
    full, smoke = experiment.sizes(), experiment.sizes(smoke=True)
    assert set(full) == set(smoke) and smoke["smoke"]
    assert set(full["shapes"]) == set(smoke["shapes"])
    for s in smoke["shapes"].values():
        assert s["experts"] * s["hidden"] * s["width"] <= 1 << 20
        assert max(s["tokens"]) <= 256
    for key in smoke["shapes"]:
        assert smoke["profile_tokens"] in smoke["shapes"][key]["tokens"]


class _Event:
    def __init__(self, key, device_type, count=3, cpu=300.0, device=30.0):
        self.key, self.device_type, self.count = key, device_type, count
        self.cpu_time_total, self.device_time_total = cpu, device


def test_stage_times_read_the_host_rows_per_call():
    events = [_Event(experiment.STAGES[0], "DeviceType.CPU"),
              _Event(experiment.STAGES[0], "DeviceType.CUDA", device=999.0),
              _Event("aten::mm", "DeviceType.CPU")]
    rows = experiment.stage_times(events)
    assert [r["stage"] for r in rows] == list(experiment.STAGES)
    assert rows[0] == {"stage": experiment.STAGES[0], "cpu_us": 100.0, "cuda_us": 10.0}
    assert rows[1] == {"stage": experiment.STAGES[1]}


def _small(dtype=torch.float32, E=4, top_k=2, H=32, I=48, T=40):
    w = moe.make_weights(E, H, I, dtype=dtype, seed=1)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(2)).to(dtype)
    return x, w, top_k


def test_staged_forward_is_moe_forward():
    x, w, k = _small()
    assert torch.equal(experiment.staged_forward(x, w, k), moe.moe_forward(x, w, k))


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
@pytest.mark.parametrize("layout", experiment.GMM_LAYOUTS)
def test_grouped_mm_version_computes_the_experts(layout):
    x, w, k = _small()
    _, ids = moe.route(x @ w.router, k)
    d = moe.dispatch(ids, w.experts)
    xs = x[d.rows.long()]
    gate_up, down = experiment.gmm_weights(w, layout)
    assert gate_up.shape == (w.experts, 32, 96) and down.shape == w.down.shape
    if layout == "column-major":
        assert gate_up.stride(1) == 1 and down.stride(1) == 1
    got = experiment.grouped_mm_experts(xs, d.offsets[1:].to(torch.int32), gate_up, down)
    torch.testing.assert_close(got, moe.experts_loop(xs, d.offsets, w), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="layout"):
        experiment.gmm_weights(w, "diagonal")


# --------------------------------------------------------------------------------------
# Tables and figures, from the fixture (made-up times)
# --------------------------------------------------------------------------------------


def _drawn_with_the_course_minimum(ax, rec, measured="y"):
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    label = ax.get_ylabel() if measured == "y" else ax.get_xlabel()
    assert "(" in label, "the measured axis names its unit"
    assert any(rec.label in t.get_text() for t in ax.texts), "every figure names its source"


def test_experts_and_layer_tables_and_figures():
    rec = moe_fixture.record()
    rows = plots.experts_rows(rec)
    assert len(rows) == 7 and rows[0]["_grouped_mm TFLOP/s"] == moe_fixture.GMM_RATE
    assert rows[0]["vs _grouped_mm"] == pytest.approx(560 / 430)
    assert rows[-1]["vs loop"] == pytest.approx(450 / 40)
    layer = plots.layer_rows(rec)
    assert [r["speed-up"] for r in layer] == pytest.approx([1.1] * 3 + [6.0] * 4)
    fig = plots.plot_experts_grid(rec)
    for ax in fig.axes:
        _drawn_with_the_course_minimum(ax, rec)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("faster layout" in t for t in legend)
    matplotlib.pyplot.close(fig)
    ax = plots.plot_layer(rec)
    _drawn_with_the_course_minimum(ax, rec)
    assert ax.get_legend() is not None
    matplotlib.pyplot.close(ax.figure)


def test_profile_tables_and_stage_shares():
    rec = moe_fixture.record()
    rows = plots.stage_rows(rec, "many_small")
    assert [r["stage"] for r in rows] == list(experiment.STAGES)
    assert sum(r["share %"] for r in rows) == pytest.approx(100.0)
    assert rows[3]["alone us"] == pytest.approx(770.0) and rows[3]["profiler GPU us"] == 700.0
    text = plots.format_profile(rec, "many_small")
    assert "grouped_gemm_kernel" in text and "1,280 launches" in text and rec.label in text
    assert "each stage timed alone: 1,304 us in all; the layer, timed whole: 859 us" in text
    # A record whose stages were not timed alone falls back on the profiler's ranges.
    for stage in rec.results["profile"]["many_small"]["stages"]:
        del stage["ms"]
    times, how = plots.stage_times_us(rec, "many_small")
    assert how == "torch.profiler" and times[3] == ("grouped SwiGLU", 700.0)
    ax = plots.plot_stages(rec)
    _drawn_with_the_course_minimum(ax, rec, measured="x")
    assert len(ax.get_legend().get_texts()) == len(experiment.STAGES)
    matplotlib.pyplot.close(ax.figure)


def test_imbalance_tables_and_figure():
    rec = moe_fixture.record()
    rows = plots.imbalance_rows(rec)
    assert [r["strength"] for r in rows] == list(experiment.STRENGTHS)
    loads = [r["max/mean"] for r in rows]
    assert loads == sorted(loads) and loads[0] < 1.3
    assert set(rows[0]) >= {"dropped @1", "dropped @1.25", "dropped @2"}
    assert len(plots.capacity_rows(rec)) == len(rows) * 3
    fig = plots.plot_imbalance(rec)
    for ax in fig.axes:
        _drawn_with_the_course_minimum(ax, rec)
    matplotlib.pyplot.close(fig)


def test_routing_pictures_count_padding_and_drops():
    fig, (a, b) = matplotlib.pyplot.subplots(1, 2)
    drawn = moe_routing.draw_tokens_per_expert(a, [100, 0, 28, 9], 32, capacity=50,
                                               source="a test")
    assert drawn == {"kept": 87, "padding": 14 + 4 + 23, "dropped": 50, "max": 100,
                     "mean": 34.25}
    assert moe_routing.draw_tiles(b, [100, 0, 28, 9], 32, source="a test") == 4 + 0 + 1 + 1
    assert "6 row tiles of 32 rows for 137 sorted rows" == b.get_title()
    matplotlib.pyplot.close(fig)


def test_targets_name_the_shortfall():
    rows = plots.targets(moe_fixture.record())
    missed = [t["target"] for t in rows if not t["met"]]
    assert missed == ["experts vs dense, E=128, 8k tokens"]
    # Each goal is held at the token count it was set for, and at no other.
    assert all(t["target"].endswith(("E=128, 8k tokens", "E=8, 4k tokens")) for t in rows), rows
    assert "NOT met" in plots.format_targets(rows)


# --------------------------------------------------------------------------------------
# The committed record (skipped until it is recorded on a GPU)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rec():
    return committed_record("moe")


def test_record_is_complete(rec):
    r = rec.results
    assert rec.provenance["git_commit"], "records carry the commit they measured"
    assert r["config"] == experiment.sizes(), "the record was made with other sizes (smoke?)"
    want = {(k, t) for k, s in r["config"]["shapes"].items() for t in s["tokens"]}
    for part, names in (("experts", experiment.EXPERT_VERSIONS),
                        ("layer", experiment.LAYER_VERSIONS)):
        have = {(e["shape"], e["tokens"]): e for e in r[part] if "error" not in e}
        assert set(have) == want, f"{part}: {[e for e in r[part] if 'error' in e]}"
        for key, e in have.items():
            assert [v["name"] for v in e["versions"]] == list(names)
            for v in e["versions"]:
                assert "ms" in v or "unavailable" in v, (part, key, v)
                if v["name"] in (OURS, LOOP, experiment.DENSE):
                    assert "ms" in v, (part, key, v)
    for key in r["config"]["shapes"]:
        assert "stages" in r["profile"][key], r["profile"][key]
        assert "kernels" in r["profile"][key][OURS] and "kernels" in r["profile"][key][LOOP]
    assert "levels" in r["imbalance"], r["imbalance"]


def test_record_is_internally_consistent(rec):
    cfg = rec.results["config"]
    for e in rec.results["experts"] + rec.results["layer"]:
        s = experiment.shape_of(cfg, e["shape"])
        assert e["copies"] == e["tokens"] * s.top_k
        assert e["flops"] == intensity.expert_flops(e["copies"], s.hidden, s.width)
        for v in e["versions"]:
            if "tflops" in v:
                assert v["tflops"] == pytest.approx(e["flops"] / v["ms"] / 1e9)
        if "counts" in e:
            assert sum(e["counts"]) == e["copies"] and len(e["counts"]) == s.experts
            assert e["padding_rows"] == intensity.padding_rows(e["counts"], e["block_m"])
    im = rec.results["imbalance"]
    s = experiment.shape_of(cfg, im["shape"])
    for lv in im["levels"]:
        counts = torch.tensor(lv["counts"])
        assert int(counts.sum()) == im["copies"] == im["tokens"] * s.top_k
        assert lv["padding_rows"] == intensity.padding_rows(counts, lv["block_m"]) and \
            lv["block_m"] == im["block_m"]
        assert lv["max_over_mean"] == pytest.approx(float(counts.max()) * s.experts / im["copies"])
        for c in lv["capacity"]:
            assert c["capacity"] == moe.capacity(im["tokens"], s.top_k, s.experts, c["factor"])
            assert c["dropped"] == int((counts - c["capacity"]).clamp(min=0).sum())
    loads = [lv["max_over_mean"] for lv in sorted(im["levels"], key=lambda lv: lv["strength"])]
    assert loads == sorted(loads), "a stronger skew loads the busiest expert more"


def test_record_shows_every_version_correct(rec):
    checks = rec.results["checks"]
    assert [c.get("shape") for c in checks] == list(rec.results["config"]["shapes"])
    for c in checks:
        assert "error" not in c, c
        for part in ("experts", "layer"):
            for row in c[part]:
                assert row.get("ok") is True and math.isfinite(row["max_error"]), (c["shape"], row)


def test_record_profile_shows_the_loop_launching_per_expert(rec):
    """Ours launches the same few kernels at any E (router, dispatch, two grouped GEMMs,
    combine); the loop launches several per expert."""
    for key, p in rec.results["profile"].items():
        E = rec.results["config"]["shapes"][key]["experts"]
        assert p[OURS]["launches"] < 60 and p[LOOP]["launches"] > 2 * E, (key, p)
        assert any("grouped_gemm_kernel" in k["name"] for k in p[OURS]["kernels"])


def _assert_met(rec, prefix: str) -> None:
    rows = [t for t in plots.targets(rec) if t["target"].startswith(prefix)]
    assert rows, f"the record has no target {prefix!r}"
    missed = [t for t in rows if not t["met"]]
    assert not missed, (f"TARGET MISSED on {rec.gpu}: " + "; ".join(
        f"{t['target']} {t['measured']:.3g}x" if t["measured"] else t["target"] for t in missed)
        + f"\n{plots.format_targets(rows)}\n({rec.label})")


# The targets, one test per goal. A goal the committed H100 record misses gets a strict
# xfail (a record that meets it fails here until the mark goes), saying by how much.

def test_target_experts_vs_grouped_mm_at_128_experts(rec):
    _assert_met(rec, "experts vs _grouped_mm, E=128")


def test_target_experts_vs_grouped_mm_at_8_experts(rec):
    _assert_met(rec, "experts vs _grouped_mm, E=8")


def test_target_experts_vs_dense(rec):
    _assert_met(rec, "experts vs dense")


def test_target_layer_vs_loop_at_128_experts(rec):
    _assert_met(rec, "layer vs loop, E=128")


def test_target_layer_vs_loop_at_8_experts(rec):
    _assert_met(rec, "layer vs loop, E=8")


# --------------------------------------------------------------------------------------
# The experiment's parts on a tiny shape, in CPU mode (a stand-in timer), and on a GPU
# --------------------------------------------------------------------------------------

TINY = moe.Shape("tiny", experts=4, top_k=2, hidden=32, width=48)


@pytest.fixture
def stand_in_timer(monkeypatch):
    """``bench.time_ms`` that runs the function once and says 1 ms (no GPU here)."""
    monkeypatch.setattr(experiment.bench, "time_ms", lambda fn, **_: (fn(), 1.0)[1])


def test_parts_run_on_a_tiny_shape(stand_in_timer):
    dtype = torch.float32
    w = experiment._weights(TINY, dtype, seed=1)
    gmm = experiment._prepare_gmm(w)
    check = experiment._check("tiny", TINY, w, gmm, dtype, 24)
    for part in ("experts", "layer"):
        for row in check[part]:
            assert row.get("ok") is True, (part, row)
    b = experiment._batch(TINY, w, 24, dtype, seed=5)
    entry = experiment._experts_entry("tiny", TINY, b, w, gmm, dtype, 24)
    assert [v["name"] for v in entry["versions"]] == list(experiment.EXPERT_VERSIONS)
    assert all(v.get("ms") == 1.0 for v in entry["versions"]), entry["versions"]
    assert entry["copies"] == 48 and entry["block_m"] == 16 and sum(entry["counts"]) == 48
    layer = experiment._layer_entry("tiny", TINY, b, w, 24)
    assert [v["name"] for v in layer["versions"]] == list(experiment.LAYER_VERSIONS)


def test_imbalance_part_on_a_tiny_shape(stand_in_timer):
    cfg = experiment.sizes(smoke=True)
    cfg["shapes"]["many_small"].update(experts=4, top_k=2, hidden=32, width=48)
    # one capacity factor: each is another interpreted forward, and 1.0 already drops copies
    cfg["imbalance"].update(tokens=32, hot=1, strengths=[0.0, 4.0], capacity_factors=[1.0])
    w = experiment._weights(experiment.shape_of(cfg, "many_small"), torch.float32, seed=1)
    out = experiment._imbalance(cfg, w, torch.float32)
    low, high = out["levels"]
    assert high["max_over_mean"] > low["max_over_mean"]
    assert [c["factor"] for c in high["capacity"]] == cfg["imbalance"]["capacity_factors"]
    assert high["capacity"][0]["dropped"] > 0 and out["block_m"] == 16


class _Tuner:
    def __init__(self, best=None):
        import triton

        cfg = triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
                            num_warps=4, num_stages=3)
        self.cache = {("key",): cfg}
        if best:
            self.best_config = triton.Config({**cfg.kwargs, "BLOCK_M": best}, num_warps=4,
                                             num_stages=3)


def test_tuned_block_m_reads_the_last_launch_or_the_cache():
    assert experiment._tuned_block_m(_Tuner(best=32)) == 32
    assert experiment._tuned_block_m(_Tuner()) == 64


@pytest.mark.gpu
def test_experiment_smoke_on_a_gpu():
    r = experiment.moe_experiment(smoke=True)
    for c in r["checks"]:
        for part in ("experts", "layer"):
            assert all(row.get("ok") for row in c[part]), c
    for e in r["experts"] + r["layer"]:
        assert "error" not in e and all("ms" in v or "unavailable" in v for v in e["versions"]), e
    assert all("stages" in p for p in r["profile"].values()), r["profile"]
    assert "levels" in r["imbalance"], r["imbalance"]

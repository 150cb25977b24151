"""Lesson 06 (attention): the experiment's sizes and napkin math, the tables and figures
drawn from a record, and (once committed) the GPU record itself: complete, every version
correct, and the lesson's targets met.

The figures are first drawn from a small record built here, in the test: a fixture with
made-up numbers shaped like a record, never written to helpers/records."""

import math

import matplotlib
import pytest

from helpers import hardware, intensity, launches, records
from helpers.experiments import attention as experiment
from helpers.plots import attention as plots

from support import committed_record  # tests/support.py

matplotlib.use("Agg")

NAIVE, OURS = experiment.NAIVE, experiment.OURS


# --------------------------------------------------------------------------------------
# The experiment, without a GPU
# --------------------------------------------------------------------------------------


def test_sizes_are_the_lessons():
    cfg = experiment.sizes()
    assert (cfg["dtype"], cfg["batch"], cfg["heads"]) == ("bf16", 4, 16)
    assert cfg["naive_seqs"] == [512, 1024, 2048, 4096, 8192, 16384]
    assert cfg["flash_seqs"] == cfg["naive_seqs"] + [32768], "ours goes on where naive stops"
    assert cfg["tflops_seqs"] == [1024, 2048, 4096, 8192, 16384]
    assert cfg["head_dims"] == [64, 128] and cfg["profile_seq"] == 4096
    assert not cfg["smoke"]
    # Every length the targets name is measured.
    for _, start in (experiment.FORWARD_VS_FLASH, experiment.BACKWARD_VS_FLASH,
                     experiment.FORWARD_TFLOPS):
        assert start in cfg["tflops_seqs"]
    assert experiment.TARGET_HEAD_DIM in cfg["head_dims"]
    assert experiment.TARGET_DTYPE == cfg["dtype"]


def test_smoke_sizes_are_tiny_and_shaped_like_the_full_run():
    full, smoke = experiment.sizes(), experiment.sizes(smoke=True)
    assert set(full) == set(smoke) and smoke["smoke"]
    assert max(smoke["flash_seqs"] + smoke["tflops_seqs"] + [smoke["profile_seq"]]) <= 1024
    assert smoke["batch"] * smoke["heads"] <= 4


def test_cases_cover_both_masks_both_head_sizes_and_one_fp16_size():
    cases = experiment.cases(experiment.sizes())
    bf16 = {(c["head_dim"], c["causal"]) for c in cases if c["dtype"] == "bf16"}
    assert bf16 == {(d, m) for d in (64, 128) for m in (False, True)}
    fp16 = [c for c in cases if c["dtype"] == "fp16"]
    assert fp16 and all(c["seqs"] == [experiment.FP16_SEQ] for c in fp16)
    # Smoke: the fp16 case falls back to a head size the smoke run has.
    smoke = experiment.sizes(smoke=True)
    assert {c["head_dim"] for c in experiment.cases(smoke)} <= set(smoke["head_dims"])


def test_every_version_is_credited_with_the_same_flops():
    b, h, n, d = 4, 16, 8192, 128
    fwd = experiment.work(b, h, n, d, "bf16")
    assert fwd["flops"] == 4 * b * h * n * n * d
    assert experiment.work(b, h, n, d, "bf16", causal=True)["flops"] == fwd["flops"] // 2
    assert experiment.work(b, h, n, d, "bf16", pass_="backward")["flops"] == 2.5 * fwd["flops"]
    naive = experiment.work(b, h, n, d, "bf16", version="naive")
    assert naive["flops"] == fwd["flops"] and naive["bytes"] > 50 * fwd["bytes"]


class _Event:
    def __init__(self, key, count, us, device_type="DeviceType.CUDA"):
        self.key, self.count, self.self_device_time_total = key, count, us
        self.device_type = device_type


def test_kernel_table_keeps_gpu_rows_longest_first():
    events = [_Event("elementwise_kernel", 3, 30.0), _Event("cudaLaunchKernel", 9, 95.0, "CPU"),
              _Event("gemm", 2, 60.0), _Event("memset", 1, 0.0)]
    table = experiment.kernel_table(events, top=1)
    assert table["kernels"] == [{"name": "gemm", "calls": 2, "cuda_us": 60.0}]
    assert (table["kernel_count"], table["launches"], table["total_us"]) == (2, 5, 90.0)


def test_sdpa_refusals_are_told_from_failures():
    assert experiment._refusal(RuntimeError("No available kernel. Aborting execution.")) == \
        "unavailable"
    assert experiment._refusal(RuntimeError("CUDA error: illegal memory access")) == "error"


# --------------------------------------------------------------------------------------
# Tables and figures, from a fixture shaped like a record (made-up numbers)
# --------------------------------------------------------------------------------------


def _fixture() -> records.Record:
    """A record-shaped fixture: ours 1.1x SDPA flash everywhere but the causal backward at
    4096 (0.9x), cuDNN refusing d = 64, naive out of memory at 16k."""
    cfg = experiment.sizes()
    b, h, d = cfg["batch"], cfg["heads"], cfg["memory_head_dim"]
    rows = []
    for name, seqs in ((NAIVE, cfg["naive_seqs"]), (OURS, cfg["flash_seqs"])):
        for n in seqs:
            row = {"name": name, "seq": n,
                   **experiment.work(b, h, n, d, "bf16", version="naive" if name == NAIVE
                                     else "flash")}
            if name == NAIVE and n >= 16384:
                row.update(oom=True, error="peak memory: OutOfMemoryError: (fixture)")
            else:
                row.update(ms=row["bytes"] / 2e9 if name == NAIVE else row["flops"] / 4e11,
                           peak_bytes=(30 * b * h * n * n) if name == NAIVE else b * h * n * 260)
            rows.append(row)
    tflops = []
    for case in experiment.cases(cfg):
        for n in case["seqs"]:
            for pass_ in experiment.PASSES:
                e = {"pass": pass_, "dtype": case["dtype"], "head_dim": case["head_dim"],
                     "causal": case["causal"], "seq": n, "batch": b, "heads": h,
                     **experiment.work(b, h, n, case["head_dim"], case["dtype"], case["causal"],
                                       pass_=pass_), "rows": []}
                slow = pass_ == "backward" and case["causal"] and n == 4096
                for name, speed in ((OURS, 500), ("SDPA flash", 500 / (0.9 if slow else 1.1)),
                                    ("SDPA efficient", 300), ("SDPA cuDNN", 520)):
                    if name == "SDPA cuDNN" and case["head_dim"] == 64:
                        e["rows"].append({"name": name, "unavailable": "No available kernel"})
                        continue
                    ms = e["flops"] / (speed * 1e9)
                    e["rows"].append({"name": name, "ms": ms, "tflops": speed})
                tflops.append(e)
    kernels = [{"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "calls": 2, "cuda_us": 900.0},
               {"name": "cunn_SoftMaxForward", "calls": 1, "cuda_us": 2500.0},
               {"name": "elementwise_kernel<bf16 to float>", "calls": 3, "cuda_us": 3000.0}]
    profile = {"batch": b, "heads": h, "seq": 4096, "head_dim": d, "dtype": "bf16",
               "causal": False,
               NAIVE: {"kernels": kernels, "kernel_count": 3, "launches": 6, "total_us": 6400.0},
               OURS: {"kernels": [{"name": "attention_fwd_kernel", "calls": 1, "cuda_us": 600.0}],
                      "kernel_count": 1, "launches": 1, "total_us": 600.0}}
    results = {"config": cfg, "memory": {"batch": b, "heads": h, "head_dim": d, "dtype": "bf16",
                                         "causal": False, "rows": rows, "device_bytes": 80 << 30},
               "checks": [], "tflops": tflops, "profile": profile}
    provenance = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_key": "H100-SXM", "date": "test fixture",
                  "torch": "-", "triton": "-"}
    return records.Record("attention", provenance, results)


def _drawn_with_the_course_minimum(ax, rec):
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    assert "(" in ax.get_ylabel() or "TFLOP" in ax.get_ylabel(), "the y axis names its unit"
    assert ax.get_legend() is not None
    assert any(rec.label in t.get_text() for t in ax.texts), "every figure names its source"


def test_time_and_memory_figures_mark_where_naive_ran_out_of_memory():
    rec = _fixture()
    for draw in (plots.plot_time, plots.plot_memory):
        ax = draw(rec)
        _drawn_with_the_course_minimum(ax, rec)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("out of memory at N = 16k" in t for t in legend), legend
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        matplotlib.pyplot.close(ax.figure)
    table = plots.memory_rows(rec)
    assert [r["N"] for r in table] == list(experiment.FLASH_SEQS)
    assert table[-2]["naive ms"] == "out of memory" and table[-1]["naive ms"] == "-"
    assert plots.growth_exponent(rec, OURS) == pytest.approx(1.0)
    assert plots.growth_exponent(rec, NAIVE) == pytest.approx(2.0)


def test_tflops_table_and_figures_compare_with_every_backend():
    rec = _fixture()
    rows = plots.tflops_rows(rec, "forward", "bf16")
    assert len(rows) == 4 * len(experiment.TFLOPS_SEQS)
    d128 = next(r for r in rows if r["d"] == 128)
    assert d128["vs flash"] == pytest.approx(1.1) and d128["vs cuDNN"] == pytest.approx(500 / 520)
    d64 = next(r for r in rows if r["d"] == 64)
    assert d64["SDPA cuDNN"] == "n/a" and d64["vs cuDNN"] == "-"
    ax = plots.plot_tflops(rec, "backward", 64, True)
    _drawn_with_the_course_minimum(ax, rec)
    assert any("SDPA cuDNN: unavailable" == t.get_text()
               for t in ax.get_legend().get_texts())
    matplotlib.pyplot.close(ax.figure)
    fig = plots.plot_tflops_grid(rec)
    assert len(fig.axes) == 8
    for ax in fig.axes:
        _drawn_with_the_course_minimum(ax, rec)
    matplotlib.pyplot.close(fig)


def test_profile_table_and_roofline():
    rec = _fixture()
    text = plots.format_profile(rec)
    assert "cunn_SoftMaxForward" in text and "attention_fwd_kernel" in text and rec.label in text
    assert plots.profile_rows(rec)[0]["share %"] == pytest.approx(900 / 64)
    points = plots.roofline_points(rec)
    gpu = hardware.lookup(rec.gpu)
    at_4k = {p.label.split(",")[0]: p for p in points if p.label.endswith("N=4k")}
    assert at_4k["naive"].intensity < gpu.ridge_point("bf16") < at_4k["ours"].intensity
    ax = plots.plot_roofline(rec)
    _drawn_with_the_course_minimum(ax, rec)
    matplotlib.pyplot.close(ax.figure)


def test_targets_name_the_shortfall():
    rec = _fixture()
    rows = plots.targets(rec)
    missed = [t["target"] for t in rows if t["met"] is False]
    assert missed == ["backward vs SDPA flash, N=4k, causal"], plots.format_targets(rows)
    tflops = next(t for t in rows if t["target"].startswith("forward TFLOP/s"))
    assert tflops["measured"] == 500 and tflops["met"]
    text = plots.format_targets(rows)
    assert "NOT met" in text and "0.9x" in text


# --------------------------------------------------------------------------------------
# The committed record (skipped until ./course record attention has run on a GPU)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rec():
    return committed_record("attention")


def test_record_is_complete(rec):
    r = rec.results
    assert rec.provenance["git_commit"], "records carry the commit they measured"
    assert r["config"] == experiment.sizes(), "the record was made with other sizes (smoke?)"
    mem = {(x["name"], x["seq"]): x for x in r["memory"]["rows"]}
    for n in experiment.FLASH_SEQS:
        assert "ms" in mem[OURS, n] and "peak_bytes" in mem[OURS, n], mem[OURS, n]
    for n in experiment.NAIVE_SEQS:
        assert "ms" in mem[NAIVE, n] or mem[NAIVE, n].get("oom"), mem[NAIVE, n]
    want = {(c["dtype"], c["head_dim"], c["causal"], n, p) for c in experiment.cases(r["config"])
            for n in c["seqs"] for p in experiment.PASSES}
    have = {(e["dtype"], e["head_dim"], e["causal"], e["seq"], e["pass"]): e for e in r["tflops"]}
    assert set(have) == want
    for key, e in have.items():
        for row in e["rows"]:
            assert "ms" in row or "unavailable" in row, (key, row)
            if row["name"] in (OURS, "SDPA flash"):
                assert "ms" in row, (key, row)
    for name in (NAIVE, OURS):
        assert "kernels" in r["profile"][name], r["profile"][name]


def test_record_names_the_backend_sdpas_default_ran_at_each_point(rec):
    """Each timed point says which backend SDPA runs with none pinned (its default, what
    a practitioner gets), profiled from its kernels' names."""
    entries = rec.results["tflops"]
    named = [e for e in entries if "sdpa_default" in e]
    if not named:
        pytest.skip("the committed record predates the field")
    assert len(named) == len(entries), "every point or none"
    for e in named:
        assert e["sdpa_default"] in ("cuDNN", "flash", "efficient", "math"), e["sdpa_default"]


def test_record_shows_every_version_correct(rec):
    assert len(rec.results["checks"]) == len(experiment.cases(rec.results["config"]))
    for check in rec.results["checks"]:
        assert "error" not in check, check
        for row in check["rows"]:
            if "unavailable" in row and row["name"].startswith("SDPA"):
                continue                                   # a backend that refused the case
            assert row.get("forward_ok") is True, (check["dtype"], check["head_dim"], row)
            if row["name"] != NAIVE:
                assert row.get("backward_ok") is True, (check["dtype"], check["head_dim"], row)


def test_record_meets_the_lessons_targets(rec):
    rows = plots.targets(rec)
    missed = [t for t in rows if t["met"] is False]
    assert not missed, (f"{len(missed)} target(s) missed: "
                        + "; ".join(t["target"] for t in missed)
                        + f"\n{plots.format_targets(rows)}\n({rec.label})")


def test_record_matches_the_napkin_math(rec):
    for e in rec.results["tflops"]:
        w = intensity.attention(e["batch"], e["heads"], e["seq"], e["seq"], e["head_dim"],
                                e["dtype"], e["causal"], pass_=e["pass"])
        assert e["flops"] == w.flops
    p = rec.results["profile"]
    calls = launches.Trace.from_list(p["naive_trace"])
    moved = sum(c.read + c.written for c in calls if c.op != "aten._unsafe_view")
    assert moved == intensity.attention(p["batch"], p["heads"], p["seq"], p["seq"],
                                        p["head_dim"], p["dtype"], version="naive").nbytes


def test_record_profile_shows_one_fused_launch(rec):
    p = rec.results["profile"]
    assert p[OURS]["launches"] == 1, p[OURS]
    assert "attention_fwd_kernel" in p[OURS]["kernels"][0]["name"]
    assert p[NAIVE]["launches"] >= 5, p[NAIVE]


def test_record_memory_grows_linearly_for_ours_and_quadratically_for_naive(rec):
    assert plots.growth_exponent(rec, OURS) <= plots.MEMORY_EXPONENT[0]
    naive = plots.growth_exponent(rec, NAIVE)
    assert naive is None or naive > 1.8
    assert math.isfinite(plots.growth_exponent(rec, OURS))

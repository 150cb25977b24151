"""Lesson 01's memory levels: the kernels of helpers.kernels.memory_levels against their
references (CPU: Triton's interpreter), the experiment's arithmetic and checks, and the
structure of its committed GPU record (skipped until one is committed)."""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest
import torch

from helpers.experiments import memory_levels as experiment
from helpers.kernels import memory_levels as ml
from helpers.runtime import NeedsGPUError
from support import committed_record

DEV = helpers.device()


# --------------------------------------------------------------------------------------
# The kernels
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("numel, programs, passes, block", [
    (1, 1, 1, 16), (10007, 5, 3, 1024), (4096, 7, 2, 512), (3000, 64, 1, 64)])
def test_read_loop_sums_each_programs_blocks_passes_times(numel, programs, passes, block):
    x = torch.rand(numel, generator=torch.Generator().manual_seed(numel)).to(DEV)
    got = ml.read_loop(x, passes, programs, block=block).double()
    want = ml.read_loop_reference(x, programs, passes, block=block)
    assert got.shape == (programs,)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (got, want)


def test_read_loop_reference_counts_every_element_once_per_pass():
    x = torch.arange(10, dtype=torch.float32)
    ref = ml.read_loop_reference(x, programs=3, passes=2, block=4)   # blocks 0-3, 4-7, 8-9
    assert ref.tolist() == [2 * 6, 2 * 22, 2 * 17]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (37, 45), (64, 16), (3, 1030)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(ml.ORDERS))
def test_copies_and_transposes_are_exact(name, shape, dtype):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEV)
    option = {"tile": 16} if name == "transpose_tiles" else {"block": 16}
    got = ml.ORDERS[name](x, **option)
    want = x if name.startswith("copy") else ml.transpose_reference(x)
    assert got.is_contiguous() and torch.equal(got, want), name


def test_out_argument_is_written_in_place():
    x = torch.randn(20, 30).to(DEV)
    out = torch.empty(30, 20, device=DEV)
    assert ml.transpose_tiles(x, tile=16, out=out) is out and torch.equal(out, x.t())


def test_bytes_moved_counts_a_read_and_a_write():
    assert ml.bytes_moved(8192, 8192, torch.float32) == 2 * 8192 * 8192 * 4


@pytest.mark.parametrize("call, error, words", [
    (lambda: ml.copy_rows(torch.randn(4, 6).t()), ValueError, "not contiguous"),
    (lambda: ml.copy_cols(torch.randn(6)), ValueError, "2 dimension"),
    (lambda: ml.copy_rows(torch.randn(4, 6), block=12), ValueError, "power of two"),
    (lambda: ml.transpose_tiles(torch.randn(4, 6), tile=24), ValueError, "power of two"),
    (lambda: ml.copy_cols(torch.randn(2, 70000)), ValueError, "grid axis 1"),
    (lambda: ml.read_loop(torch.rand(8), 0, 1), ValueError, "passes"),
    (lambda: ml.read_loop(torch.rand(8), 1, 0), ValueError, "programs"),
    (lambda: ml.read_loop(torch.rand(8), 1, 1, num_warps=3), ValueError, "num_warps"),
])
def test_launchers_refuse_bad_arguments(call, error, words):
    if helpers.is_gpu():
        pytest.skip("the inputs above are CPU tensors")
    with pytest.raises(error, match=words):
        call()


# --------------------------------------------------------------------------------------
# The experiment's arithmetic
# --------------------------------------------------------------------------------------


def test_pass_counts_read_about_the_same_bytes_at_every_size():
    for mib in experiment.SIZES_MIB:
        lo, hi = experiment.passes_for(mib * 2**20)
        assert hi == 4 * lo and lo >= 1
        assert hi * mib * 2**20 <= experiment.READ_BYTES
    assert experiment.passes_for(2**40) == (1, 4), "a buffer larger than the budget: 1 and 4"


def test_slope_cancels_what_both_runs_share():
    # 4 MiB; 10 and 40 passes; a 5 us floor under both; 2 GB/ms (2,000 GB/s) of passes
    nbytes, lo, hi = 4 * 2**20, 10, 40
    ms = [0.005 + p * nbytes / 2e9 for p in (lo, hi)]
    assert experiment.slope_gbps(nbytes, lo, hi, *ms) == pytest.approx(2000)
    assert experiment.slope_gbps(nbytes, lo, hi, 1.0, 0.9) is None


def _row(mib, slope, one_launch):
    return {"bytes": mib * 2**20, "slope_gbps": slope, "slope_gbps_min": slope * 0.98,
            "slope_gbps_max": slope * 1.01, "one_launch_gbps": one_launch}


def test_summary_takes_l2_from_buffers_that_fit_half_of_it():
    results = {"device": {"L2_cache_size": 50 * 2**20},
               "read_loop": {"rows": [_row(8, 9000, 8000), _row(16, 10000, 9000),
                                      _row(32, 6000, 5800), _row(512, 3100, 3090)]}}
    s = experiment.summary(results)
    assert s["l2_gbps"] == 10000 and s["l2_buffer_bytes"] == 16 * 2**20
    assert s["l2_gbps_min"] == pytest.approx(9800)
    assert s["hbm_read_gbps"] == 3100 and s["one_launch_gbps"] == 9000
    results["read_loop"]["rows"] = [_row(512, 3100, 3090)]
    with pytest.raises(ValueError, match="half of L2"):
        experiment.summary(results)


@pytest.mark.skipif(helpers.is_gpu(), reason="on a GPU the smoke run times, see below")
def test_smoke_run_checks_everything_then_needs_a_gpu():
    with pytest.raises(NeedsGPUError):
        experiment.memory_levels(smoke=True)


@pytest.mark.gpu
def test_smoke_run_on_a_gpu_has_the_records_structure():
    _check_structure(experiment.memory_levels(smoke=True), smoke=True)


# --------------------------------------------------------------------------------------
# The committed record
# --------------------------------------------------------------------------------------


def _check_structure(r, smoke=False):
    sizes = experiment.SMOKE["sizes"] if smoke else [m * 2**20 for m in experiment.SIZES_MIB]
    rows = r["read_loop"]["rows"]
    assert [x["bytes"] for x in rows] == list(sizes)
    for x in rows:
        for part in ("lo", "hi"):
            assert x[part]["ms_min"] <= x[part]["ms"] <= x[part]["ms_max"]
            assert len(x[part]["runs"]) == r["repeats"]
        assert x["passes_hi"] == 4 * x["passes_lo"]
    names = [x["name"] for x in r["coalescing"]["rows"]]
    assert r["coalescing"]["baseline"] in names and len(names) == 6
    assert all(x["ms"] > 0 and x["gbps"] > 0 for x in r["coalescing"]["rows"])


@pytest.fixture(scope="module")
def rec():
    return committed_record("memory_levels")


def test_record_is_complete(rec):
    assert rec.provenance["git_commit"], "records carry the commit they measured"
    _check_structure(rec.results)


def test_record_l2_is_faster_than_hbm_and_than_the_one_launch_copy(rec):
    s = experiment.summary(rec.results)
    assert s["l2_gbps"] > 1.5 * s["hbm_read_gbps"], s
    assert s["l2_gbps_min"] <= s["l2_gbps"] <= s["l2_gbps_max"]


def test_record_strided_copy_is_slower_than_the_coalesced_one(rec):
    by = {x["name"]: x for x in rec.results["coalescing"]["rows"]}
    assert by["copy, strips of columns (strided)"]["ms"] > \
        1.5 * by["copy, strips of rows (coalesced)"]["ms"]


def test_record_tables_and_figure_draw(rec):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.plots import memory_levels as plots

    rows = plots.read_sweep_rows(rec.results)
    assert [r["buffer MiB"] for r in rows] == list(experiment.SIZES_MIB)
    table = plots.coalescing_rows(rec.results)
    base = next(r for r in table if r["version"] == rec.results["coalescing"]["baseline"])
    assert base["time vs rows"] == 1.0
    fig, ax = plt.subplots()
    plots.draw_read_sweep(ax, rec.results, 3350.0, source=rec.label)
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)

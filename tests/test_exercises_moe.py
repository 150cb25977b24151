"""The exercise checks and the imbalance explorer of lesson 08 (Mixture-of-Experts): right
answers pass, each classic slip is named, unanswered exercises say so, and the explorer
draws without a browser.

The napkin answers are written out here from first principles; the record-based ones use
``tests/moe_fixture.py`` (made-up times)."""

import base64

import matplotlib
import pytest
import torch

import helpers
import moe_fixture
from helpers import intensity
from helpers.exercises import moe as ex
from helpers.kernels import moe
from support import assert_unanswered

matplotlib.use("Agg")


def test_active_fraction():
    # Mixtral: 2 of 8 experts, a quarter; Qwen3-30B-A3B: 8 of 128, a sixteenth.
    assert ex.check_active_fraction(0.25, 8, 2)
    assert ex.check_active_fraction(1 / 16, 128, 8)
    assert "inverted" in ex.check_active_fraction(4, 8, 2).message
    assert "one expert" in ex.check_active_fraction(1 / 8, 8, 2).message
    assert "percentage" in ex.check_active_fraction(25, 8, 2).message
    assert not ex.check_active_fraction(0.3, 8, 2)
    assert_unanswered(ex.check_active_fraction(None, 8, 2))


def test_padding_rows():
    # 100 rows in 64-row tiles: 28 rows of padding; 0 rows: no tile; 64 rows: none.
    counts = [100, 0, 64, 65]
    assert intensity.padding_rows(counts, 64) == 28 + 0 + 0 + 63
    assert ex.check_padding_rows(91, counts, 64)
    assert ex.check_padding_rows(80, counts, 64), "an estimate within 25% is close enough"
    assert "whole tile" in ex.check_padding_rows(4 * 64, counts, 64).message
    assert "separately" in ex.check_padding_rows(-229 % 64, counts, 64).message
    assert_unanswered(ex.check_padding_rows(..., counts, 64))


def test_all_to_all_bytes():
    # 8 ranks, 8192 tokens a rank, top-8, H = 2048, bf16: 65,536 copies of 4 KiB, 7/8 leave.
    want = 8192 * 8 * 2048 * 2 * 7 / 8
    assert ex.check_all_to_all_bytes(want, 8192, 8, 2048, 8)
    msg = lambda got: ex.check_all_to_all_bytes(got, 8192, 8, 2048, 8).message  # noqa: E731
    assert "stay home" in msg(8192 * 8 * 2048 * 2)
    assert "top-k copies" in msg(want / 8)
    assert "dispatch and the combine" in msg(2 * want)
    assert "bits" in msg(8 * want)
    assert "elements" in msg(want / 2)
    assert_unanswered(ex.check_all_to_all_bytes(None, 8192, 8, 2048, 8))


def test_links_cite_their_sources():
    for name, (gbps, source) in ex.LINKS.items():
        assert gbps > 0 and "http" in source, name
    assert ex.LINKS["NVLink 4 (H100 SXM)"][0] == 900 / 2, "the datasheet's 900 GB/s is both ways"


def test_predictions_read_from_a_record():
    rec = moe_fixture.record()
    # The fixture: the layer 6x the loop at E=128; the loop launches 10 kernels an expert;
    # ours 1.0 ms unskewed and 1.04 ms at s = 4 (under the 15% that counts as slower).
    assert ex.check_layer_speedup("5-20x", rec, "many_small", 8192)
    assert not ex.check_layer_speedup("<2x", rec, "many_small", 8192)
    assert "6x" in ex.check_layer_speedup(">20x", rec, "many_small", 8192).message
    assert ex.check_layer_speedup("<2x", rec, "few_large", 1024)
    assert [ex.speedup_bin(v) for v in (1.5, 2, 19.9, 20)] == ["<2x", "2-5x", "5-20x", ">20x"]
    assert ex.check_loop_launches("10", rec, "many_small")
    assert ex.check_loop_launches(10, rec, "many_small")
    assert not ex.check_loop_launches("1", rec, "many_small")
    assert ex.check_skew_slows("no", rec) and not ex.check_skew_slows("yes", rec)
    assert_unanswered(ex.check_skew_slows(None, rec))
    with pytest.raises(KeyError, match="no layer timing"):
        ex.check_layer_speedup("<2x", rec, "many_small", 3)


def test_prediction_is_calibrated_on_the_unskewed_run():
    rec = moe_fixture.record()
    base = rec.results["imbalance"]["levels"][0]
    pred = ex.predicted_ms(rec, base["counts"], base["block_m"])
    assert pred["ours"] == pytest.approx(1.0)             # the recorded unskewed time
    assert pred["loop"] == pytest.approx(6.0)
    fewer = ex.predicted_ms(rec, [c // 2 for c in base["counts"]], base["block_m"])
    assert fewer["ours"] < pred["ours"] and fewer["loop"] < pred["loop"]


def test_busiest_rank():
    assert ex.busiest_rank([10] * 8, 4) == 1.0
    assert ex.busiest_rank([30, 10, 0, 0], 2) == 2.0


def test_explorer_draws_a_static_picture_and_follows_its_controls():
    rec = moe_fixture.record()
    im = rec.results["imbalance"]
    logits = torch.randn(im["tokens"], 128, generator=torch.Generator().manual_seed(0))
    e = ex.ImbalanceExplorer(rec, logits=logits, strength=0.0)
    bundle = e._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "recorded 1 ms" in e.readout and "dropped" not in e.readout
    e.controls["strength"].value = 4.0
    busiest = float(e.readout.split("= ")[1].split("x")[0])
    assert busiest > 10, e.readout
    e.controls["capacity"].value = 1.0
    assert "copies dropped" in e.readout and "recorded 0.9 ms" in e.readout
    e.controls["block_m"].value = 16
    assert "padding at BLOCK_M 16" in e.readout and "only at BLOCK_M 64" in e.readout
    assert e.values == {"strength": 4.0, "block_m": 16, "capacity": 1.0}


@pytest.mark.skipif(helpers.is_gpu() and torch.cuda.device_count() < 2,
                    reason="two ranks in GPU mode need two GPUs")
def test_two_rank_demo_matches_one_process():
    from helpers import parallel

    out = parallel.launch(ex.ep_demo_rank, 2, timeout_s=120)
    copies = ex.EP_DEMO["tokens_per_rank"] * ex.EP_DEMO["top_k"]
    tol = helpers.pick_size(gpu=moe.TOLERANCES[torch.float32][0], cpu=1e-5)   # TF32 on a GPU
    for r in out:
        assert r["sequential max error"] <= tol and r["overlapped max error"] <= tol, r
        assert sum(r["rows sent to each rank"]) == copies
    assert [r["experts held"] for r in out] == [[0, 1], [2, 3]]


def _parallel_record():
    """A made-up expert-parallel record: once per rank sends a quarter of the bytes."""
    from types import SimpleNamespace

    case = {"experts": 128, "top_k": 8, "tokens_per_rank": 16384, "sequential_ms": 8.0,
            "overlapped_ms": 7.5, "overlapped_ms_by_chunks": {"2": 7.0, "4": 7.5},
            "dedup_ms": 5.0, "bytes_sent_per_rank": 400e6, "bytes_sent_per_rank_dedup": 100e6,
            "all_to_all_ms": 2.0, "all_to_all_gb_per_s": 200.0}
    return SimpleNamespace(gpu="Some GPU", label="made up", results={"world": 2,
                                                                      "cases": [case]})


def test_fastest_parallel_version_and_what_the_exchange_explains():
    from helpers.plots import moe_parallel as parallel_plots

    rec = _parallel_record()
    assert ex.check_fastest_parallel("once per rank", rec, 128, 16384)
    wrong = ex.check_fastest_parallel("overlapped", rec, 128, 16384)
    assert not wrong and "overlapped 7 ms" in wrong.message      # its best chunk count
    assert_unanswered(ex.check_fastest_parallel(None, rec, 128, 16384))
    with pytest.raises(KeyError, match="no case with 8 experts"):
        ex.check_fastest_parallel("sequential", rec, 8, 16384)
    lines = "\n".join(parallel_plots.once_per_rank_lines(rec, 128, 16384))
    # A quarter of the bytes at the same GB/s: 0.5 ms each way instead of 2; there and
    # back that saves 3 of the 3 ms between the versions, leaving nothing outside.
    assert "(1.60x)" in lines and "(25%)" in lines and ": 0.50 ms" in lines
    assert "saves 3.00 ms of the 3.00 ms; the other 0.00 ms" in lines

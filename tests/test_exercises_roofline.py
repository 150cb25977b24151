"""The exercise checks of lesson 02 (the roofline): right answers pass, the classic slips
are named, unanswered exercises say so, and nonsense never crashes a check."""

import pytest

from helpers import hardware, intensity, prediction
from helpers.exercises import roofline as ex
from support import assert_unanswered

H100 = hardware.GPUS["H100-SXM"]


def test_vector_add_intensity():
    assert ex.check_vector_add_intensity(1 / 6, "fp16")
    assert ex.check_vector_add_intensity(1 / 12, "fp32")
    assert "write of c" in ex.check_vector_add_intensity(1 / 4, "fp16").message
    assert "inverted" in ex.check_vector_add_intensity(6, "fp16").message
    assert_unanswered(ex.check_vector_add_intensity(...))


def test_matmul_intensity():
    assert ex.check_matmul_intensity(4096 / 3, 4096, "bf16")
    assert "write of C" in ex.check_matmul_intensity(4096 / 2, 4096, "bf16").message
    assert "multiply-add is 2" in ex.check_matmul_intensity(4096 / 6, 4096, "bf16").message


def _right_answers(launch_us):
    return {label: prediction.predict(w, H100, launch_us=launch_us).bound
            for label, w in ex.classification_cases().items()}


def test_classification_cases_cover_all_three_bounds():
    assert set(_right_answers(5.0).values()) == set(prediction.BOUNDS)


def test_classification():
    answers = _right_answers(5.0)
    assert ex.check_classification(answers, launch_us=5.0)
    wrong = dict(answers, **{"matmul 64^3 bf16": "compute"})
    fb = ex.check_classification(wrong, launch_us=5.0)
    assert not fb and f"{len(answers) - 1} of {len(answers)} right" in fb.message
    assert "matmul 64^3 bf16: you said compute" in fb.message and "latency-bound" in fb.message
    partial = {k: (v if i < 2 else ...) for i, (k, v) in enumerate(answers.items())}
    assert "not answered yet" in ex.check_classification(partial, launch_us=5.0).message
    fb = ex.check_classification(dict(answers, typo="memory"), launch_us=5.0)
    assert not fb and "spelling" in fb.message
    assert "is not one of" in ex.check_classification(
        dict(answers, **{"matmul 64^3 bf16": 3}), launch_us=5.0).message
    assert_unanswered(ex.check_classification(..., launch_us=5.0))
    assert "expected a dict" in ex.check_classification(["memory"], launch_us=5.0).message


def test_predicted_time():
    work = intensity.vector_add(2**20, "fp32")
    pred = prediction.predict(work, H100, launch_us=5.0)
    assert ex.check_predicted_time(pred.time_ms * 1e3, work, launch_us=5.0)
    fb = ex.check_predicted_time(pred.memory_ms * 1e3, work, launch_us=5.0)
    assert not fb and "launch cost" in fb.message
    big = intensity.matmul(8192, 8192, 8192, "bf16")
    p = prediction.predict(big, H100, launch_us=5.0)
    fb = ex.check_predicted_time((p.memory_ms + p.compute_ms + p.launch_ms) * 1e3 * 1.2, big,
                                  launch_us=5.0)
    assert not fb and "off by" in fb.message
    assert_unanswered(ex.check_predicted_time(..., work, launch_us=5.0))
    assert not ex.check_predicted_time(float("nan"), work, launch_us=5.0)


@pytest.mark.parametrize("case", list(ex.BELOW_ROOF_CASES))
def test_below_roof(case, capsys):
    c = ex.BELOW_ROOF_CASES[case]
    assert ex.check_below_roof(c["answer"], case)
    assert ex.check_below_roof(c["answer"].upper() + " ", case)
    for letter in c["options"]:
        if letter != c["answer"]:
            fb = ex.check_below_roof(letter, case)
            assert not fb and "is not it" in fb.message
    assert "one of the letters" in ex.check_below_roof("z", case).message
    assert_unanswered(ex.check_below_roof(..., case))
    ex.show_below_roof(case)
    assert c["question"] in capsys.readouterr().out
    with pytest.raises(KeyError):
        ex.check_below_roof("a", "no such case")


# --- launch floors and the predictions made before the record prints ---------------------

class _Rec:
    """A stand-in record: only what launch_floors reads."""

    def __init__(self, results, label):
        self.results, self.label = results, label


def _floors(isolated=4.5, graph=1.2):
    return ex.LaunchFloors(isolated, isolated, graph, 15.0, ("rec A", "rec B"))


def test_launch_floors_read_both_records():
    sweep = [{"cold_ms": 0.0046, "warm_ms": 0.0013, "wall_us_per_call": 16.0},
             {"cold_ms": 0.0044, "warm_ms": 0.0011, "wall_us_per_call": 15.0},
             {"cold_ms": 0.6, "warm_ms": 0.5, "wall_us_per_call": 500.0}]
    f = ex.launch_floors(_Rec({"launch_floor_us": 4.5}, "roof"), _Rec({"size_sweep": sweep}, "mw"))
    assert f.isolated_us == 4.5 and f.copy_isolated_us == pytest.approx(4.4)
    assert f.graph_us == pytest.approx(1.1) and f.host_us == 15.0
    assert f.us("graph") == f.graph_us and f.us("isolated") == 4.5
    assert "4.0x" in f.table() and "roof" in f.table() and "mw" in f.table()
    with pytest.raises(KeyError):
        f.us("host")
    no_host = ex.launch_floors(_Rec({"launch_floor_us": 4.5}, "r"),
                               _Rec({"size_sweep": [{"cold_ms": 0.004, "warm_ms": 0.001}]}, "m"))
    assert no_host.host_us is None and "Python loop" not in no_host.table()


def test_the_1024_matmul_flips_bound_with_the_floor():
    work = intensity.matmul(1024, 1024, 1024, "bf16")
    f = _floors()
    assert prediction.predict(work, H100, launch_us=f.isolated_us).bound == "latency"
    assert ex.check_floor_bound("compute", work, f, "graph", H100)
    assert ex.check_floor_bound("latency", work, f, "isolated", H100)
    fb = ex.check_floor_bound("latency", work, f, "graph", H100)
    assert not fb and "isolated floor" in fb.message and "compute" not in fb.message
    fb = ex.check_floor_bound("memory-bound", work, f, "graph", H100)
    assert not fb and "right of the bf16" in fb.message
    assert "one of" in ex.check_floor_bound("fast", work, f, "graph", H100).message
    assert_unanswered(ex.check_floor_bound(..., work, f, "graph", H100))
    table = ex.bounds_by_floor([intensity.matmul(n, n, n, "bf16") for n in (512, 1024, 2048)],
                               f, H100)
    rows = table.splitlines()
    assert rows[2].split()[-2:] == ["latency", "compute"]    # 1024^3: the floors disagree
    assert rows[1].split()[-2:] == ["latency", "latency"]    # 512^3: latency either way
    assert rows[3].split()[-2:] == ["compute", "compute"]


def _points():
    def pt(name, work, tflops):
        return {"name": name, "tflops": tflops, "work": work.as_dict()}
    return [pt("matmul 4096^3", intensity.matmul(4096, 4096, 4096, "bf16"), 720.0),
            pt("attention materialised seq=4096",
               intensity.attention_materialised(32, 4096, 128, "bf16"), 110.0),
            pt("attention tiled (flash) seq=4096",
               intensity.attention_tiled(32, 4096, 128, "bf16"), 353.0)]


def test_roof_fraction_prediction_names_the_slip_and_hides_the_value():
    pts = _points()
    frac = ex.roof_fraction(pts, "matmul 4096^3", H100)
    assert frac == pytest.approx(720.0 / 989.4)
    assert ex.check_roof_fraction(0.7, pts, "matmul 4096^3", H100)
    high = ex.check_roof_fraction(0.95, pts, "matmul 4096^3", H100)
    low = ex.check_roof_fraction(0.3, pts, "matmul 4096^3", H100)
    assert not high and "too high" in high.message and "datasheet peak" in high.message
    assert not low and "too low" in low.message
    for fb in (high, low):
        assert f"{frac:.3f}" not in fb.message and "0.72" not in fb.message
    assert "percentage" in ex.check_roof_fraction(73, pts, "matmul 4096^3", H100).message
    assert "between 0 and 1" in ex.check_roof_fraction(150, pts, "matmul 4096^3", H100).message
    assert not ex.check_roof_fraction("0.7", pts, "matmul 4096^3", H100)
    assert not ex.check_roof_fraction(float("nan"), pts, "matmul 4096^3", H100)
    assert_unanswered(ex.check_roof_fraction(..., pts, "matmul 4096^3", H100))
    flash = "attention tiled (flash) seq=4096"
    assert ex.check_roof_fraction(0.35, pts, flash, H100)
    assert "Hopper" in ex.check_roof_fraction(0.8, pts, flash, H100).message
    with pytest.raises(KeyError):
        ex.roof_fraction(pts, "no such point", H100)


def test_ridge_side_prediction():
    mat = intensity.attention_materialised(32, 4096, 128, "bf16")     # 62.7 FLOP/B, ridge 295
    right = ex.check_ridge_side("memory-bound", mat, H100)
    assert right and "62.7" in right.message, "a right answer hears the intensity and the ridge"
    fb = ex.check_ridge_side("compute", mat, H100)
    assert not fb and "matrix products" in fb.message and "memory" not in fb.message
    assert "62.7" not in fb.message, "a wrong answer is not told the intensity"
    big = intensity.matmul(4096, 4096, 4096, "bf16")
    assert ex.check_ridge_side("compute", big, H100)
    slip = ex.check_ridge_side("memory", big, H100)
    assert not slip and "stays on chip" in slip.message
    # The same op left of the ridge on one GPU may sit right of it on another.
    t4 = hardware.GPUS["T4"]
    tiled = intensity.attention_tiled(32, 512, 128, "fp16")
    assert tiled.intensity > t4.ridge_point("fp16") and tiled.intensity < H100.ridge_point("fp16")
    assert ex.check_ridge_side("compute", tiled, t4) and ex.check_ridge_side("memory", tiled, H100)
    assert "'memory' or 'compute'" in ex.check_ridge_side("latency", mat, H100).message
    assert_unanswered(ex.check_ridge_side(None, mat, H100))
    assert_unanswered(ex.check_ridge_side(..., mat, H100))    # the lesson's placeholder


def test_matmul_1024_roof_fraction_names_the_launch_floor():
    pts = [{"name": "matmul 1024^3", "tflops": 213.0,
            "work": intensity.matmul(1024, 1024, 1024, "bf16").as_dict()}]
    frac = ex.roof_fraction(pts, "matmul 1024^3", H100)           # 213 / 989.4 = 0.215
    assert ex.check_roof_fraction(0.25, pts, "matmul 1024^3", H100)
    high = ex.check_roof_fraction(0.7, pts, "matmul 1024^3", H100)   # as large products do
    assert not high and "too high" in high.message and "isolated launch" in high.message
    low = ex.check_roof_fraction(0.02, pts, "matmul 1024^3", H100)
    assert not low and "too low" in low.message and "launch floor" in low.message
    for fb in (high, low):
        assert f"{frac:.3f}" not in fb.message and "0.21" not in fb.message
    assert_unanswered(ex.check_roof_fraction(..., pts, "matmul 1024^3", H100))


def test_predictions_hold_on_the_committed_record():
    from support import committed_record

    rec = committed_record("roofline")
    spec = hardware.lookup(rec.gpu)
    pts = rec.results["points"]
    for name in ex.ROOF_FRACTION_HINTS:
        recorded = next(p["fraction_of_roof"] for p in pts if p["name"] == name)
        assert ex.roof_fraction(pts, name, spec) == pytest.approx(recorded, rel=1e-6)
    # The lesson asks the side of the ridge from the napkin math; the record's point agrees.
    mat = intensity.attention_materialised(32, 4096, 128, "bf16")
    recorded = next(p for p in pts if p["name"] == "attention materialised seq=4096")
    assert recorded["work"]["intensity"] == pytest.approx(mat.intensity, rel=1e-9)
    assert ex.check_ridge_side("memory", mat, spec)
    # 1024^3 is the one the lesson asks: the large products' share (lessons 00 and 01 print
    # one) is not its answer.
    big = next(p["fraction_of_roof"] for p in pts if p["name"] == "matmul 8192^3")
    assert not ex.check_roof_fraction(big, pts, "matmul 1024^3", spec)


def _noise(a_tflops, b_tflops):
    def entry(ts):
        return {"tflops_median": sorted(ts)[len(ts) // 2], "tflops_min": min(ts),
                "tflops_max": max(ts),
                "rounds": [{"ms": 1.0, "tflops": t, "sm_clock_mhz": None, "power_w": None}
                           for t in ts]}
    return {"identical_configs": {"config": {"label": "v5 TMA, persistent"},
                                  "a": entry(a_tflops), "b": entry(b_tflops)}}


def test_identical_gap_prediction():
    rec = _noise([700.0, 660.0, 690.0], [680.0, 672.0, 655.0])   # 700 / 655: 6.9% apart
    assert ex.check_identical_gap(5, rec) and ex.check_identical_gap(10, rec)
    assert "6.9%" in ex.check_identical_gap(7, rec).message, "a right answer hears the value"
    low, high = ex.check_identical_gap(0, rec), ex.check_identical_gap(30, rec)
    assert not low and "too low" in low.message and "clock" in low.message
    assert not high and "too high" in high.message
    for fb in (low, high):
        assert "6.9" not in fb.message, "a wrong answer is not told the recorded gap"
    assert "fraction" in ex.check_identical_gap(0.07, rec).message
    assert not ex.check_identical_gap("5", rec) and not ex.check_identical_gap(-3, rec)
    assert not ex.check_identical_gap(float("nan"), rec)
    assert_unanswered(ex.check_identical_gap(..., rec))


def test_identical_gap_prediction_on_the_committed_record():
    from support import committed_record

    from helpers.plots.noise import identical_gap

    rec = committed_record("noise")
    gap = 100 * identical_gap(rec)["rounds"]
    assert ex.check_identical_gap(gap, rec)
    assert not ex.check_identical_gap(gap * 3 + 1, rec)

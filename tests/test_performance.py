"""The performance report (helpers/performance/): the README's section is what the committed
records give, every extractor reads every committed record, a missing field is named, a
missed target shows as missed, and each GPU keeps its own table."""

from __future__ import annotations

import copy
import difflib
import re

import pytest

from helpers import performance as perf
from helpers import records
from helpers.performance import extractors as ex
from helpers.records import Record

RECORDS = perf.load()
REPORTED = [r for r in RECORDS if r.name in perf.EXTRACTORS]


def _id(rec) -> str:
    return f"{rec.name}__{rec.provenance['gpu_key']}"


def test_the_readmes_performance_section_is_what_the_committed_records_give():
    have, want = perf.section(perf.README.read_text()), perf.markdown(RECORDS)
    diff = "\n".join(list(difflib.unified_diff(have.splitlines(), want.splitlines(), "README.md",
                                               "from helpers/records/", lineterm=""))[:40])
    assert have == want, (
        "README.md's performance section is not what the records in helpers/records/ give "
        "(a record was added or re-recorded without regenerating it?). Run "
        "`./course report --no-record` (or `python -m helpers.performance --write`) and commit "
        f"README.md.\n{diff}")


def test_the_check_command_agrees(capsys):
    assert perf.main(["--check"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("rec", RECORDS, ids=_id)
def test_every_committed_record_has_an_extractor_or_a_reason(rec):
    assert rec.name in perf.EXTRACTORS or rec.name in perf.NOT_REPORTED, (
        f"{_id(rec)}: add an extractor for {rec.name!r} to helpers/performance/extractors.py, "
        "or say in NOT_REPORTED why it times no kernel beside a baseline")


@pytest.mark.parametrize("rec", REPORTED, ids=_id)
def test_every_extractor_reads_every_committed_record(rec):
    rows = perf.extract(rec)
    assert rows, f"{_id(rec)} gave no rows"
    for r in rows:
        assert r.kernel and r.shape and r.baseline, r
        assert r.ratio is None or r.ratio > 0, r
        if r.ours is not None and r.ours.number is not None:
            assert r.ours.unit in ("GB/s", "TFLOP/s", "ms", "s"), r
            assert r.peak is None or 0 < r.peak < 1.2, f"{r}: above the datasheet peak?"


def _fields(results: dict):
    """Paths to take away from a record's results: every top-level field, and every field
    of the first item of each list of dicts."""
    for key, value in results.items():
        yield (key,)
        if isinstance(value, list) and value and isinstance(value[0], dict):
            yield from ((key, 0, k) for k in value[0])


@pytest.mark.parametrize("rec", REPORTED, ids=_id)
def test_a_missing_field_is_named_with_its_record(rec):
    """Each field taken away in turn: the extractor either does not need it or stops with
    RecordFieldError naming the record file and the field; never another exception."""
    named = 0
    for path in _fields(rec.results):
        results = copy.deepcopy(rec.results)
        parent = results
        for step in path[:-1]:
            parent = parent[step]
        del parent[path[-1]]
        try:
            perf.extract(Record(rec.name, rec.provenance, results))
        except perf.RecordFieldError as err:
            named += 1
            assert f"{_id(rec)}.json: " in str(err) and "results." in str(err), (path, str(err))
    assert named, f"{_id(rec)}: no field the extractor needs?"


def test_a_missing_field_error_names_the_file_and_the_path():
    rec = next(r for r in REPORTED if r.name == "vector_add")
    results = copy.deepcopy(rec.results)
    for row in results["sizes"]:
        del row["triton_gbps"]
    with pytest.raises(perf.RecordFieldError) as err:
        perf.extract(Record(rec.name, rec.provenance, results))
    assert re.search(r"helpers/records/vector_add__[\w-]+\.json: no field "
                     r"results\.sizes\[\d+\]\.triton_gbps", str(err.value)), str(err.value)


def _slow_vector_add(times: float):
    rec = next(r for r in REPORTED if r.name == "vector_add")
    results = copy.deepcopy(rec.results)
    for row in results["sizes"]:
        row["triton_ms"] *= times
        row["triton_gbps"] /= times
    return Record(rec.name, rec.provenance, results)


def test_a_missed_target_renders_as_missed():
    rows = perf.extract(_slow_vector_add(2.0))
    assert rows and all(r.missed for r in rows)
    table = perf.markdown([_slow_vector_add(2.0)])
    missed = [line for line in table.splitlines() if line.startswith("| 03 ")]
    assert missed and all("**missed**" in line for line in missed), table
    assert "met:" not in "\n".join(missed)
    assert not any(r.missed for r in perf.extract(_slow_vector_add(1.0)))


def test_a_version_that_failed_is_shown_and_misses_its_target():
    rec = next(r for r in REPORTED if r.name == "fusion")
    results = copy.deepcopy(rec.results)
    row = next(r for r in results["rmsnorm"]["rows"] if r["name"] == "fused Triton")
    del row["ms"]
    row["error"] = "CompilationError: out of resources"
    rows = [r for r in perf.extract(Record(rec.name, rec.provenance, results))
            if r.kernel.startswith("residual add + RMSNorm")]
    assert rows and all(str(r.ours) == "failed" and r.ratio is None for r in rows)
    assert any(r.missed for r in rows)


def test_a_kernel_its_check_found_wrong_is_not_credited():
    rec = next(r for r in REPORTED if r.name == "attention")
    results = copy.deepcopy(rec.results)
    for check in results["checks"]:
        for row in check["rows"]:
            if row["name"] == "ours (Triton)":
                row["forward_ok"] = False
    rows = [r for r in perf.extract(Record(rec.name, rec.provenance, results))
            if r.kernel.startswith("attention forward")]
    assert rows and all(str(r.ours) == "wrong result" and r.ratio is None for r in rows)
    assert all(r.missed for r in rows if r.baseline == "SDPA flash")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^### ", text, flags=re.M)[1:]
    return {re.search(r"\(`([^`]+)`\)", p.splitlines()[0])[1]: p for p in parts}


def test_h100_and_h200_never_share_a_table():
    sections = _sections(perf.markdown(RECORDS))
    assert {"H100-SXM", "H200"} <= set(sections), list(sections)
    assert list(sections)[0] == "H100-SXM", "the course's reference GPU comes first"
    for gpu, text in sections.items():
        mine = [r for r in RECORDS if r.provenance["gpu_key"] == gpu]
        assert perf.gpu_section(gpu, perf.by_gpu(mine)[gpu]) in "### " + text, gpu
        listed = re.findall(r"^\| `(\w+)` \| \d\d \|", text, flags=re.M)
        assert listed == [r.name for r in perf.by_gpu(mine)[gpu] if perf.extract(r)], gpu


def test_records_of_one_kind_on_two_gpus_land_in_two_tables():
    rec = next(r for r in REPORTED if r.name == "vector_add")
    other = Record(rec.name, {**rec.provenance, "gpu_key": "H200", "gpu": "NVIDIA H200"},
                   _slow_vector_add(2.0).results)
    sections = _sections(perf.markdown([rec, other]))
    assert set(sections) == {rec.provenance["gpu_key"], "H200"}
    assert "**missed**" in sections["H200"] and "**missed**" not in sections["H100-SXM"]


def test_an_unknown_record_kind_is_refused_not_skipped():
    with pytest.raises(perf.RecordFieldError, match="no extractor for the 'newkind' record"):
        perf.extract(Record("newkind", RECORDS[0].provenance, {}))


def test_the_section_is_replaced_and_the_rest_of_the_readme_kept():
    readme = f"# Title\n\nbefore\n{perf.BEGIN}\nold\n{perf.END}\nafter\n"
    want = f"# Title\n\nbefore\n{perf.BEGIN}\nnew\n{perf.END}\nafter\n"
    assert perf.replaced(readme, "new") == want
    with pytest.raises(ValueError, match="once"):
        perf.section("no markers here")


def _lesson_targets(rec) -> list[dict]:
    """The lesson's own targets() for a record, those with a goal, memory's left out."""
    from helpers.plots import attention, autotuning, fusion

    module = {"fusion": fusion, "attention": attention, "autotuning": autotuning}[rec.name]
    return [t for t in module.targets(rec)
            if t["goal"] is not None and "peak memory" not in t["target"]]


@pytest.mark.parametrize("rec", [r for r in REPORTED if r.name in ("fusion", "attention",
                                                                     "autotuning")], ids=_id)
def test_the_reports_verdicts_agree_with_the_lessons_own_targets(rec):
    if rec.name == "autotuning" and rec.provenance["gpu_key"] != "H100-SXM":
        pytest.skip("lesson 07's targets are judged on the H100 only")
    lesson = _lesson_targets(rec)
    verdicts = [v for r in perf.extract(rec) for v in r.verdicts]
    missed_here = sorted({v.target for v in verdicts if not v.met})
    missed_there = [t["target"] for t in lesson if not t["met"]]
    assert bool(missed_here) == bool(missed_there), (missed_here, missed_there)
    if rec.name == "fusion":       # the same five goals, in the same order
        keys = ["softmax_vs_torch", "softmax_vs_naive", "rmsnorm_vs_eager", "rmsnorm_vs_copy",
                "bias_gelu_vs_eager"]
        mine = {v.target: v for v in verdicts}
        for key, t in zip(keys, lesson):
            assert mine[key].measured == pytest.approx(t["measured"]), (key, t)
            assert perf.TARGETS[key].goal == t["goal"], (key, t)


def test_the_course_script_and_the_readme_offer_the_command():
    course = (perf.README.parent / "course").read_text()
    assert re.search(r"^\s*(\w+\|)*report(\|[\w-]+)*\)", course, re.M)
    assert "-m helpers.performance --write" in course and "--no-record" in course
    readme = perf.README.read_text()
    if "## For instructors" in readme:        # the student release leaves that part out
        assert "`./course report`" in readme and "`./course report --no-record`" in readme


def test_the_moe_extractor_reads_the_experiments_fields():
    moe = pytest.importorskip("helpers.experiments.moe")
    cfg = moe.sizes(smoke=True)

    def versions(tokens, gmm_ok):
        out = [{"name": n, "ms": 1.0 + i, "tflops": 100.0 / (1 + i)}
               for i, n in enumerate(moe.EXPERT_VERSIONS)]
        if not gmm_ok:
            for v in out:
                if v["name"] in moe.GMM.values():
                    v.clear()
                    v.update(name=v.get("name", moe.GMM["row-major"]), unavailable="refused")
        return out

    experts, layer, checks = [], [], []
    for key, s in cfg["shapes"].items():
        checks.append({"shape": key, **{part: [{"name": moe.OURS, "max_error": 0.01, "ok": True}]
                                        for part in ("experts", "layer")}})
        for T in sorted({*s["tokens"], moe.TARGET_TOKENS[key]}):   # and the held count
            experts.append({"shape": key, "tokens": T, "versions": versions(T, key != "few_large")})
            layer.append({"shape": key, "tokens": T, "versions": [
                {"name": moe.OURS, "ms": 1.0, "tflops": 50.0},
                {"name": moe.LOOP, "ms": 2.0, "tflops": 25.0}]})
    results = {"config": cfg, "checks": checks, "experts": experts, "layer": layer}
    rec = Record("moe", RECORDS[0].provenance, results)
    rows = perf.extract(rec)
    ratios = {moe.LOOP: 3.0, moe.DENSE: 6.0, moe.GMM[moe.GMM_LAYOUTS[0]]: 4.0}  # ms 1 vs 3, 6, 4
    for key, s in cfg["shapes"].items():
        mine = [r for r in rows if r.shape.startswith(key) and r.kernel.startswith("MoE experts")]
        for T in (min(s["tokens"]), moe.TARGET_TOKENS[key]):   # smallest, held (largest)
            shown = {r.baseline: r for r in mine if f"T={T} " in r.shape}
            assert shown[moe.LOOP].ratio == 3.0 and shown[moe.DENSE].ratio == 6.0, shown
    experts = [r for r in rows if r.kernel.startswith("MoE experts")]
    assert all(r.ratio == ratios[r.baseline] for r in experts if r.ratio is not None)
    refused = [r for r in experts if r.baseline in moe.GMM.values() and r.ratio is None]
    assert refused and all("few_large" in r.shape and str(r.base) == "unavailable"
                           for r in refused)
    layer = [r for r in rows if r.kernel.startswith("MoE layer")]
    assert layer and all(r.ratio == 2.0 for r in layer)
    if "moe_layer_many_small" in perf.TARGETS:          # lesson 08's goals are in
        def held(r):                                    # at the token count a goal holds at
            key = "few_large" if "few_large" in r.shape else "many_small"
            return f"T={moe.TARGET_TOKENS[key]} " in r.shape

        assert any(held(r) for r in refused) and all(r.missed for r in refused if held(r))
        goal = perf.TARGETS["moe_layer_many_small"].goal
        assert all(r.missed == (2.0 < goal) for r in layer if "many_small" in r.shape and held(r))
        assert not any(r.missed for r in layer if not held(r))   # shown, not held to a goal
    wrong = copy.deepcopy(results)
    wrong["checks"][0]["experts"][0]["ok"] = False
    rows = [r for r in perf.extract(Record("moe", RECORDS[0].provenance, wrong))
            if r.kernel.startswith("MoE experts") and wrong["checks"][0]["shape"] in r.shape]
    assert rows and all(str(r.ours) == "wrong result" and r.ratio is None for r in rows)
    broken = copy.deepcopy(results)
    del broken["experts"][0]["versions"]
    with pytest.raises(perf.RecordFieldError, match=r"results\.experts\[0\]\.versions"):
        perf.extract(Record("moe", RECORDS[0].provenance, broken))


def test_record_files_are_named_by_kind_and_gpu():
    for rec in RECORDS:
        assert records.path_for(rec.name, rec.provenance["gpu_key"]).exists(), _id(rec)
    assert set(ex.EXTRACTORS).isdisjoint(ex.NOT_REPORTED)


def test_the_version_names_the_extractors_read_are_the_experiments_own():
    import inspect

    from helpers.experiments import fusion, fusion_more, memory_levels, tf32

    wanted = {fusion: [ex.FUSED_SOFTMAX, ex.ONLINE_SOFTMAX, ex.V1_SOFTMAX, ex.NAIVE_SOFTMAX,
                       ex.COMPILED_SOFTMAX, ex.COMPILED, *(f[2] for f in ex.FUSIONS)],
              memory_levels: [name for pair in ex.COALESCING for name in pair],
              tf32: [ex.TORCH_TF32, ex.TORCH_FP32], fusion_more: list(ex.EPILOGUE)}
    for module, names in wanted.items():
        source = inspect.getsource(module)
        missing = [n for n in names if f'"{n}"' not in source]
        assert not missing, f"{module.__name__} no longer names {missing}: update the extractor"


def _rounds(name: str, ms: float, **extra) -> dict:
    """A version timed in rounds, as helpers.bench.time_rounds records it."""
    return {"name": name, "ms": ms, "ms_min": 0.9 * ms, "ms_max": 1.2 * ms,
            "runs": [0.9 * ms, ms, 1.2 * ms], **extra}


def test_the_second_experiments_extractors_read_their_fields():
    from helpers.experiments.fusion_more import SPELLINGS

    prov = RECORDS[0].provenance
    levels = {"coalescing": {"n": 8192, "dtype": "fp32", "bytes": 2**29, "rows": [
        _rounds(name, 1.0 if name.startswith("PyTorch") else 2.0)
        for name in dict.fromkeys(n for pair in ex.COALESCING for n in pair)]}}
    rows = perf.extract(Record("memory_levels", prov, levels))
    assert [r.ratio for r in rows] == [0.5] * 4
    assert str(rows[0].ours) == "268 GB/s (224 to 298)"      # 2^29 B in 2 ms, rounds 1.8-2.4

    tf = {"n": 4096, "rows": [
        _rounds(ex.TORCH_TF32, 1.0, kind="torch", tflops=100.0),
        _rounds(ex.TORCH_FP32, 4.0, kind="torch", tflops=25.0),
        _rounds("tl.dot true fp32 (ieee)", 5.0, kind="triton ieee", tflops=20.0),
        _rounds("tl.dot TF32, a", 2.0, kind="triton tf32", tflops=50.0),
        _rounds("tl.dot TF32, b", 0.5, kind="triton tf32", tflops=200.0)]}
    rows = perf.extract(Record("tf32", prov, tf))
    assert [(r.baseline, r.ratio) for r in rows] == [(ex.TORCH_TF32, 2.0), (ex.TORCH_FP32, 0.8)]
    assert rows[0].kernel.startswith("tl.dot TF32, b") and rows[0].peak_of == "tf32"

    more = {"epilogue": [{"n": 4096, "dtype": "fp16", "rows": [
        _rounds(ex.EPILOGUE[0], 1.0, tflops=100.0), _rounds(ex.EPILOGUE[1], 1.5, tflops=66.7)]}],
        "spellings": [{"m": 4096, "n": n, "dtype": "fp16", "compulsory_bytes": 2**25,
                       "code": {k: {"error": "boom"} if n == 1024 else {} for k in SPELLINGS},
                       "rows": [_rounds("fused Triton", 0.02)] + [
                           _rounds(name, 0.03) for name in SPELLINGS if n != 1024]}
                      for n in (1024, 4096, 16384)]}
    rows = perf.extract(Record("fusion_more", prov, more))
    assert rows[0].ratio == 1.5
    failed = [r for r in rows if "x 1024 " in r.shape]
    assert len(failed) == len(SPELLINGS)
    assert all(str(r.base) == "failed to compile" for r in failed)
    assert all(r.ratio == pytest.approx(1.5) for r in rows[1:] if r not in failed)
    assert not any("x 4096 " in r.shape for r in rows)       # the smallest and largest N only

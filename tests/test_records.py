"""Reference records: written with provenance, read back, found or explained."""

import json

import pytest

from helpers import records, runtime
from helpers.records import Record

PROV = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_key": "H100-SXM", "date": "2026-11-26",
        "torch": "2.11.0", "triton": "3.6.0", "driver": "580.159.04", "git_commit": "abc"}


def test_round_trip(tmp_path):
    rec = Record("demo", PROV, {"copy": {"gbps": 3000.5}})
    path = records.write(rec, tmp_path)
    assert path.name == "demo__H100-SXM.json"
    back = records.load("demo", directory=tmp_path)
    assert back.results == rec.results and back.provenance == PROV
    assert back.label.startswith("recorded on NVIDIA H100 80GB HBM3, 2026-11-26")


def test_h100_is_preferred_when_several_gpus_were_recorded(tmp_path):
    for key in ("A10G", "H100-SXM", "H200"):
        records.write(Record("demo", {**PROV, "gpu_key": key, "gpu": key}, {}), tmp_path)
    assert records.available("demo", tmp_path) == ["A10G", "H100-SXM", "H200"]
    assert records.load("demo", directory=tmp_path).gpu == "H100-SXM"
    assert records.load("demo", gpu="A10G", directory=tmp_path).gpu == "A10G"


def test_every_gpu_puts_the_given_record_first_and_each_other_gpu_once(tmp_path):
    for key in ("A10G", "H100-SXM", "H200"):
        records.write(Record("demo", {**PROV, "gpu_key": key, "gpu": key}, {"on": key}), tmp_path)
    now = Record("demo", {**PROV, "gpu_key": "H200", "gpu": "H200"}, {"on": "measured now"})
    assert [r.results["on"] for r in records.every_gpu(now, tmp_path)] == [
        "measured now", "A10G", "H100-SXM"]
    only = Record("demo", {**PROV, "gpu_key": "B200", "gpu": "B200"}, {"on": "B200"})
    assert len(records.every_gpu(only, tmp_path)) == 4     # a GPU not recorded yet, then all


def test_missing_record_says_how_to_make_it(tmp_path):
    with pytest.raises(records.RecordNotFoundError, match="./course record demo"):
        records.load("demo", directory=tmp_path)


def test_other_schema_is_refused(tmp_path):
    (tmp_path / "demo__H100-SXM.json").write_text(json.dumps(
        {"name": "demo", "schema": 99, "provenance": PROV, "results": {}}))
    with pytest.raises(ValueError, match="re-record"):
        records.load("demo", directory=tmp_path)


def test_committed_records_carry_full_provenance():
    paths = sorted(records.RECORDS_DIR.glob("*.json"))
    assert paths, "no reference records are committed in helpers/records"
    for path in paths:
        rec = records.read(path)
        for field in ("gpu", "gpu_key", "driver", "cuda", "torch", "triton", "date", "git_commit"):
            assert rec.provenance.get(field), f"{path.name}: provenance lacks {field}"


def test_cpu_mode_reads_the_committed_probe_record():
    if runtime.is_gpu():
        pytest.skip("running on a GPU")
    rec = records.get("probes")
    assert not rec.live and rec.results["copy"]["gbps"] > 0

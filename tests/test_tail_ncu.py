"""The tail_ncu experiment (Nsight Compute on one of lesson 07's tail shapes): every kernel's
launch checked in CPU mode, the drawn shape a tail on 16-byte rows, ncu's output read through
tiling_ncu's collect with this experiment's driver and kernels, and the table with cuBLAS's
tile read from its kernel name."""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest

from helpers.experiments import matmul_shapes as ms
from helpers.experiments import tail_ncu as experiment
from helpers.experiments import tiling_ncu
from helpers.plots import tail_ncu as plots
from helpers.runtime import NeedsGPUError

SAMPLE = '''\
==PROF== Connected to process 4242 (/usr/bin/python3.12)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",\
"Grid Size","Device","CC","dram__bytes_read.sum","gpu__time_duration.sum",\
"launch__grid_size","lts__t_bytes.sum",\
"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","Mbyte","usecond","","Mbyte","%"
"0","4242","python3.12","127.0.0.1","nvjet_sm90_tst_128x160_64x5_4x1_v_bz_NNT","1","7",\
"(384, 1, 1)","(116, 1, 1)","0","9.0","58.55","39.26","116","262.21","90.02"
'''


def test_the_drawn_shape_is_a_tail_on_16_byte_rows():
    for seed in (1882377512, 465964975, 7):
        M, N, K, dtype = experiment.tail_shape(seed, 132)
        assert N % 8 == 0 and K % 8 == 0 and dtype in ("fp16", "bf16")
        assert (M, N, K) in [(s.M, s.N, s.K) for s in ms.draw(seed, 132) if s.family == "tail"]


def test_tiles_of_each_rung():
    tiles = experiment.tiles_of((448, 4632, 5760))
    assert tiles["persistent_wide"] == tiles["streamk_wide"] == 4 * 19      # 76: 0.58 wave
    assert tiles["persistent_narrow"] == 4 * 37 and tiles["cublas"] is None


@pytest.mark.skipif(helpers.is_gpu(), reason="on a GPU the smoke run profiles")
def test_smoke_run_checks_every_kernel_then_needs_a_gpu():
    with pytest.raises(NeedsGPUError):
        experiment.tail_ncu(smoke=True)


def test_collect_runs_this_experiments_driver_and_kernels(tmp_path):
    seen = []

    def run(cmd, env):
        if "--version" in cmd:
            return 0, "Version 2025.3.1.0"
        seen.append(cmd)
        return 0, SAMPLE

    steps = [(k, label, None, {}) for k, label, _, _ in experiment.RUNGS]
    got = tiling_ncu.collect("ncu", steps, "448x4632x5760", "bf16", run=run,
                             workdir=str(tmp_path), driver_source=experiment.DRIVER,
                             kernels={k: kern for k, _, kern, _ in experiment.RUNGS},
                             metrics=experiment.METRICS, shape=[448, 4632, 5760])
    assert got["available"] and got["shape"] == [448, 4632, 5760]
    assert [r["rung"] for r in got["rows"]] == [r[0] for r in experiment.RUNGS]
    streamk = next(c for c in seen if "streamk_wide" in c)
    assert "regex:matmul_kernel_streamk" in streamk and streamk[-2:] == ["448x4632x5760", "bf16"]
    assert "-k" not in next(c for c in seen if "cublas" in c), "cuBLAS: its first kernel"
    row = got["rows"][-1]["metrics"]
    assert row["lts__t_bytes.sum"] == pytest.approx(262.21e6) and row["launch__grid_size"] == 116


def _record(rows, available=True, reason=None):
    return {"available": available, "reason": reason, "ncu_version": "Version 2025.3.1.0",
            "shape": [448, 4632, 5760], "dtype": "bf16", "sms": 132, "seed": 1, "rows": rows}


def test_the_table_reads_cublas_tile_from_its_kernel_name():
    m = {"gpu__time_duration.sum": 39264.0, "dram__bytes_read.sum": 58.5e6,
         "lts__t_bytes.sum": 262.2e6, "launch__grid_size": 116.0,
         "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": 90.0}
    rows = [{"rung": "streamk_wide", "label": "stream-K, 128 x 256", "tiles": 76,
             "kernel": "matmul_kernel_streamk", "metrics": {**m, "launch__grid_size": 132.0}},
            {"rung": "cublas", "label": "torch.matmul (cuBLAS)", "tiles": None,
             "kernel": "nvjet_sm90_tst_128x160_64x5_4x1_v_bz_NNT", "metrics": m}]
    rec = _record(rows)
    assert plots.cublas_tile(rec) == (128, 160)
    table = {r["kernel"]: r for r in plots.tail_rows(rec)}
    assert table["torch.matmul (cuBLAS)"]["us"] == pytest.approx(39.264)
    assert table["torch.matmul (cuBLAS)"]["L2 MB"] == pytest.approx(262.2)
    assert table["torch.matmul (cuBLAS)"]["tiles"] == "-" and table["stream-K, 128 x 256"][
        "programs"] == 132
    assert "448x4632x5760 bf16 on 132 SMs" in plots.tail_table(rec)
    assert plots.cublas_tile(_record([{**rows[1], "kernel": "sm90_gemm"}])) is None
    assert plots.tail_table(_record([], False, "ncu not found")).endswith("ncu not found")

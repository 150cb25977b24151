"""helpers.kernels.matmul.config: the one tile-setting type of every matmul kernel.

A TileConfig is checked when it is made, converts both ways to the dicts the committed
records and the tuned path's saved decisions hold and to the triton.Config its kernels'
tuners take, counts its shared memory by the napkin formula (which the compiled kernels of
lesson 04's record match) and its accumulator registers, and fits or does not fit a GPU
by the GPU table's per-program limit. The expected numbers are written out here from the
hardware: a change to the arithmetic that breaks them fails this test.
"""

import helpers  # noqa: I001 - first: it sets CPU mode before triton defines any kernel
import pytest
import torch

from helpers import hardware, intensity, tile_plan
from helpers.kernels import matmul as mm
from helpers.kernels.matmul import persistent as mp
from helpers.kernels.matmul import tuned as mt
from helpers.kernels.matmul.config import TileConfig, gpu_in_use, shared_memory_limit
from helpers.kernels.moe import grouped as mg
from support import committed_record

BIG = TileConfig(128, 256, 64, num_warps=8, num_stages=3)      # lesson 04's best rung


# --------------------------------------------------------------------------------------
# The type: fields, defaults, checks.
# --------------------------------------------------------------------------------------

def test_blocks_by_position_the_rest_by_name_with_group_8_and_no_split():
    assert (BIG.block_m, BIG.block_n, BIG.block_k) == (128, 256, 64)
    assert (BIG.num_warps, BIG.num_stages, BIG.group_m, BIG.split_k) == (8, 3, 8, 1)
    assert BIG.options == ()
    with pytest.raises(TypeError):
        TileConfig(128, 256, 64, 8, 3)          # warps and stages: never by position
    with pytest.raises(TypeError):
        TileConfig(128, 256, 64, num_warps=8)   # stages: no default to guess


@pytest.mark.parametrize("bad, words", [
    (dict(block_m=48), "block_m = 48: a block must be a power of two"),
    (dict(block_n=96), "the nearest are 64 and 128"),
    (dict(block_k=8), "at least 16"),
    (dict(block_k=64.0), "block_k = 64.0"),
    (dict(num_warps=3), "num_warps = 3: a program has a power of two from 1 to 32"),
    (dict(num_warps=64), "num_warps = 64"),
    (dict(num_warps=True), "num_warps = True"),
    (dict(num_stages=0), "num_stages = 0: it must be a whole number of at least 1"),
    (dict(split_k=0), "split_k = 0: it must be a whole number of at least 1"),
    (dict(group_m=0), "group_m = 0"),
    (dict(options={"BLOCK_M": 64}), "BLOCK_M is a field of TileConfig, not an option"),
])
def test_bad_settings_are_refused_with_what_is_wrong(bad, words):
    fields = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3) | bad
    with pytest.raises(ValueError, match=words):
        TileConfig(**fields)


def test_options_are_kept_sorted_and_hashable():
    a = BIG.with_options(SPLIT_EPILOGUE=True, FLATTEN=False)
    b = TileConfig(128, 256, 64, num_warps=8, num_stages=3,
                   options={"FLATTEN": False, "SPLIT_EPILOGUE": True})
    assert a == b and hash(a) == hash(b) and a.options == (("FLATTEN", False),
                                                           ("SPLIT_EPILOGUE", True))
    assert a != BIG and a.option("FLATTEN") is False and BIG.option("FLATTEN") is None
    assert len({a, b, BIG}) == 2
    with pytest.raises(TypeError, match="options must be a dict"):
        TileConfig(16, 16, 16, num_warps=1, num_stages=1, options={"X": [1]})


# --------------------------------------------------------------------------------------
# Conversions: records, saved decisions, triton.Config.
# --------------------------------------------------------------------------------------

def test_it_reads_like_the_dict_a_record_holds():
    assert dict(BIG) == {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
                         "SPLIT_K": 1, "num_warps": 8, "num_stages": 3}
    assert BIG["BLOCK_N"] == BIG["block_n"] == 256 and BIG.get("FLATTEN", "-") == "-"
    assert {**BIG, "ms": 1.0}["num_stages"] == 3
    assert BIG != dict(BIG), "a TileConfig is not a dict: compare TileConfigs"
    with pytest.raises(KeyError, match="neither a field"):
        BIG["EPILOGUE_SPLIT"]


def test_record_dicts_both_ways():
    persistent = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "FLATTEN": True,
                  "SPLIT_EPILOGUE": False, "num_warps": 4, "num_stages": 4}
    c = TileConfig.from_dict(persistent)
    assert c.group_m == 8 and c.split_k == 1 and c.option("FLATTEN") is True
    assert c.as_dict(mp.KEYS) == persistent
    assert TileConfig.from_dict(dict(c)) == c
    # The launchers' keyword names (the tiling and tf32 records) read as the same setting.
    lower = {"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_stages": 3,
             "num_warps": 8}
    assert TileConfig.from_dict(lower) == BIG and BIG.as_dict(tuple(lower)) == lower
    row = {**dict(BIG), "ms": 1.5, "tflops": 600.0, "error": None}
    assert TileConfig.of(row) == BIG, "a record's row: its other fields are skipped"
    with pytest.raises(ValueError, match="'ms', which is neither a field"):
        TileConfig.from_dict(row)
    with pytest.raises(ValueError, match="lacks BLOCK_K, num_stages"):
        TileConfig.from_dict({"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4})
    with pytest.raises(TypeError, match="write TileConfig"):
        TileConfig.of((128, 256, 64, 8, 3, 8))    # which was warps, which stages?
    # A bad value is named by the key the dict holds, as the learner wrote it.
    with pytest.raises(ValueError, match=r"^BLOCK_M = 96: a block must be a power of two"):
        TileConfig.from_dict({**dict(BIG), "BLOCK_M": 96})
    with pytest.raises(ValueError, match=r"^block_n = 24: a block"):
        TileConfig.from_dict({**lower, "block_n": 24})


def test_the_committed_records_read_as_settings_and_back():
    rec = committed_record("autotuning", "H100-SXM").results
    space = [TileConfig.from_dict(c) for c in rec["space"]]
    assert [c.as_dict(mt.KEYS) for c in space] == rec["space"]
    assert TileConfig.from_dict(rec["fixed"]) == BIG
    for s in rec["shapes"]:
        kept = TileConfig.from_dict({**s["tuned_config"], **s["tuned_options"]})
        assert kept.as_dict(mt.KEYS) == s["tuned_config"], s["label"]
        assert dict(kept.options) == s["tuned_options"], s["label"]
    tiling = committed_record("tiling", "H100-SXM").results
    assert TileConfig.of(tiling["tf32"]["config"]) == TileConfig(128, 128, 32, num_warps=4,
                                                                 num_stages=3)
    v5 = [TileConfig.of(r["config"]) for r in tiling["ladder"] if r["step"] == "v5"]
    assert v5 and all(c.option("EPILOGUE_SPLIT") is not None for c in v5)


def test_saved_decisions_keep_their_keys():
    # A decision on disk is found by a key that holds the spaces as dicts in these keys'
    # order: decisions saved before the settings were TileConfigs are found again.
    v6 = [{"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k,
           "GROUP_M": c.group_m, "SPLIT_K": c.split_k, "num_warps": c.num_warps,
           "num_stages": c.num_stages} for c in mt.CONFIG_SPACE]
    persistent = [{"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k,
                   "FLATTEN": c.option("FLATTEN"), "SPLIT_EPILOGUE": c.option("SPLIT_EPILOGUE"),
                   "num_warps": c.num_warps, "num_stages": c.num_stages}
                  for c in mp.PERSISTENT_SPACE]
    assert mt._space_keys() == (repr(v6), repr(persistent))


def test_triton_configs_as_the_kernels_take_them():
    got = BIG.triton_config()
    assert got.kwargs == {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}
    assert (got.num_warps, got.num_stages, got.pre_hook) == (8, 3, None)
    assert TileConfig.from_triton(got) == BIG
    # v6 takes SPLIT_K too; the persistent kernel its switches and no GROUP_M.
    v6 = mt.triton_configs([TileConfig(64, 64, 128, split_k=8, num_warps=4, num_stages=4)])[0]
    assert list(v6.kwargs) == ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K"]
    tuned = mp.matmul_kernel_persistent_tuned.configs[0]
    assert list(tuned.kwargs) == ["BLOCK_M", "BLOCK_N", "BLOCK_K", "FLATTEN", "SPLIT_EPILOGUE"]
    assert tuned.pre_hook is mp._set_boxes
    assert mp.setting(tuned) == mp.PERSISTENT_SPACE[0]
    # Every space's tuner holds exactly its TileConfigs.
    for space, tuner in ((mm.CONFIGS, mm.matmul_kernel_v4),
                         (mt.CONFIG_SPACE, mt.matmul_kernel_v6_tuned),
                         (mp.PERSISTENT_SPACE, mp.matmul_kernel_persistent_tuned),
                         (mg.MATMUL_SPACE, mg.grouped_matmul_tuned),
                         (mg.SWIGLU_SPACE, mg.grouped_swiglu_tuned)):
        assert [TileConfig.from_triton(c) for c in tuner.configs] == list(space)
    v5 = mm.matmul_kernel_v5_tuned[torch.float16].configs
    assert [TileConfig.from_triton(c) for c in v5] == list(mm.TMA_CONFIGS)


# --------------------------------------------------------------------------------------
# What it costs on chip.
# --------------------------------------------------------------------------------------

def test_shared_memory_is_the_napkin_formula():
    # 3 stages x (128 x 64 of A + 64 x 256 of B) x 2 bytes; fp32 twice; one stage a third.
    assert BIG.shared_memory_bytes() == 3 * (128 * 64 + 64 * 256) * 2 == 147_456
    assert BIG.shared_memory_bytes(torch.float32) == 294_912
    assert BIG.shared_memory_bytes("bf16", stages=1) == 49_152
    assert BIG.shared_memory_bytes() == intensity.sram_bytes(128, 256, 64, torch.float16, 3)
    # A TMA store stages C in shared memory: all of it, or one half at a time.
    four = TileConfig(128, 256, 64, num_warps=8, num_stages=4)
    assert four.shared_memory_bytes(staged_c=1) == (4 * (128 * 64 + 64 * 256) + 128 * 256) * 2
    assert four.shared_memory_bytes(staged_c=0.5) == (4 * (128 * 64 + 64 * 256) + 64 * 256) * 2
    with pytest.raises(ValueError, match="staged_c"):
        four.shared_memory_bytes(staged_c=2)


def test_shared_memory_matches_the_compiled_kernels_of_the_record():
    # Lesson 04's knob sweep on an H100: v3 compiled with each setting, the shared memory
    # its compiler reported, or the error when it did not fit.
    rec = committed_record("tiling", "H100-SXM").results
    compiled = [r for r in rec["knobs"] if "shared_bytes" in r]
    refused = [r for r in rec["knobs"] if "error" in r]
    assert compiled and refused
    for r in compiled:
        assert TileConfig.of(r).shared_memory_bytes(r["dtype"]) == r["shared_bytes"], r
        assert r["shared_bytes"] <= shared_memory_limit("H100-SXM"), r
    for r in refused:
        ok, why = TileConfig.of(r).fits("H100-SXM", r["dtype"])
        limit = f"Hardware limit: {shared_memory_limit('H100-SXM')}"
        assert not ok and "shared memory" in why and limit in r["error"], (why, r["error"])


def test_accumulator_registers_per_thread():
    assert BIG.accumulator_registers() == 128 * 256 // (32 * 8) == 128
    assert TileConfig(128, 256, 64, num_warps=4, num_stages=3).accumulator_registers() == 256
    # A tile smaller than the threads: each thread still holds one.
    assert TileConfig(16, 16, 16, num_warps=16, num_stages=1).accumulator_registers() == 1


# --------------------------------------------------------------------------------------
# What fits a GPU: the table's per-program limit.
# --------------------------------------------------------------------------------------

def test_the_table_gives_each_gpu_its_per_program_shared_memory():
    h100, a100, t4 = (hardware.GPUS[k] for k in ("H100-SXM", "A100-80GB", "T4"))
    assert h100.smem_per_program_bytes == 227 * 1024 == 232_448
    assert a100.smem_per_program_bytes == 163 * 1024
    assert t4.smem_per_program_bytes == 64 * 1024        # compute capability 7.5 keeps none back
    for spec in hardware.GPUS.values():
        assert tile_plan.smem_per_program(spec) == spec.smem_per_program_bytes
        assert shared_memory_limit(spec) == shared_memory_limit(spec.key) \
            == spec.smem_per_program_bytes
    assert shared_memory_limit("NVIDIA H100 80GB HBM3") == 232_448     # as the driver names it
    assert shared_memory_limit(100_000) == 100_000                     # the driver's figure
    with pytest.raises(TypeError, match="gpu is a row"):
        shared_memory_limit(None)


def test_fit_on_the_h100_and_a100_rows():
    four = TileConfig(128, 256, 64, num_warps=8, num_stages=4)   # 196,608 bytes in fp16
    assert BIG.fits("H100-SXM") == (True, "fits") and BIG.fits("A100-80GB")[0]
    assert four.fits(hardware.GPUS["H100-SXM"])[0]
    assert four.fits("A100-80GB") == (False, "needs 196,608 bytes of shared memory, over the "
                                      "166,912 here")
    assert BIG.fits("H100-SXM", torch.float32) == (
        False, "needs 294,912 bytes of shared memory, over the 232,448 here")
    assert TileConfig(128, 256, 64, num_warps=4, num_stages=2).fits() == (
        False, "its accumulator needs 256 registers a thread, over the 128 budgeted")
    # The persistent kernel's whole-tile store tips 4 stages of 128 x 256 over an H100.
    whole = TileConfig(128, 256, 64, num_warps=8, num_stages=4, options=mp.NEITHER)
    assert not mp.fits(whole, "H100-SXM")[0]
    assert mp.fits(whole.with_options(SPLIT_EPILOGUE=True), "H100-SXM")[0]


@pytest.mark.skipif(helpers.is_gpu(), reason="CPU mode's stand-in GPU")
def test_tuners_in_cpu_mode_check_against_the_reference_h100():
    gpu, sms = gpu_in_use()
    assert gpu is hardware.GPUS["H100-SXM"] and sms == 132


def test_describe_keeps_the_lessons_names():
    assert BIG.describe() == "128x256x64 w8 s3"
    split = TileConfig(64, 64, 128, split_k=8, group_m=4, num_warps=4, num_stages=4)
    assert split.describe() == "64x64x128 w4 s4 split-K 8 G4"
    flat = TileConfig(128, 128, 64, num_warps=4, num_stages=4, options=mp.FLAT)
    assert flat.describe() == "128x128x64 w4 s4 flatten"
    assert BIG.describe(spelled_out=True) == "128x256x64 (GROUP_M 8, 8 warps, 3 stages)"
    assert mm.TMA_CONFIGS[0].describe() == "128x256x64 w8 s3 epilogue split"

"""helpers.compiled: a kernel compiled for an H100 on a machine without a GPU.

The course's matmul v3 at two tiles: the shared memory the compiler asks for is the tile
formula of helpers.intensity (stages x (BLOCK_M x BLOCK_K + BLOCK_K x BLOCK_N) x 2 bytes,
which the tiling record's ``sram_model`` and ``shared_bytes`` columns also show equal),
registers are counted, a tile too large for 228 KiB fails with the compiler's words; the
occupancy arithmetic on made-up resources.
"""

from __future__ import annotations

import pytest
import torch

import helpers  # noqa: F401 - CPU mode first, as in the notebooks
from helpers import compiled, hardware, intensity
from helpers.kernels.matmul import ladder as ml

from support import committed_record  # tests/support.py

H100 = hardware.GPUS["H100-SXM"]
N = 4096
SIGNATURE = dict(a_ptr="*fp16", b_ptr="*fp16", c_ptr="*fp16", M=N, N=N, K=N, stride_am=N,
                 stride_ak=1, stride_bk=N, stride_bn=1, stride_cm=N, stride_cn=1)


def v3(bm, bn, bk, stages, warps):
    return compiled.resources(
        ml.matmul_kernel_v3, signature=SIGNATURE, num_warps=warps, num_stages=stages,
        constexprs=dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, PRECISION="ieee"))


@pytest.mark.parametrize("tile", [(128, 128, 64, 3, 4), (128, 256, 64, 4, 8)])
def test_shared_memory_is_the_tile_formula_and_registers_are_read(tile):
    bm, bn, bk, stages, warps = tile
    r = v3(*tile)
    assert r.ok, r.error
    assert r.shared_bytes == intensity.sram_bytes(bm, bn, bk, torch.float16, stages), \
        f"{tile}: the compiler asks for {r.shared_bytes} B, the model says otherwise"
    assert 0 < r.registers_per_thread <= compiled.MAX_REGISTERS_PER_THREAD
    assert r.spilled_bytes == 0 and not r.spills
    assert (r.capability, r.num_warps, r.num_stages) == (90, warps, stages)
    assert compiled.occupancy(r, H100).programs_per_sm >= 1


def test_a_tile_beyond_the_shared_memory_of_an_h100_fails_clearly():
    r = v3(128, 256, 64, 5, 8)       # 5 x 48 KiB = 240 KiB > 227 KiB per program
    assert not r.ok
    assert "shared memory" in r.error and "245760" in r.error and "num_stages" in r.error
    with pytest.raises(ValueError, match="did not compile"):
        compiled.occupancy(r, H100)


def test_four_warps_for_a_128x256_tile_spill_registers():
    r = v3(128, 256, 64, 3, 4)       # 128 x 256 fp32 accumulator over 128 threads
    assert r.ok and r.registers_per_thread == compiled.MAX_REGISTERS_PER_THREAD
    assert r.spills and r.spilled_bytes > 0


def test_results_are_cached():
    assert v3(128, 128, 64, 3, 4) is v3(128, 128, 64, 3, 4)


def test_clear_errors_for_what_cannot_be_compiled():
    with pytest.raises(compiled.CompileToolError, match="not a Triton kernel"):
        compiled.resources(lambda x: x, signature={}, constexprs={})
    with pytest.raises(compiled.CompileToolError, match="missing constexpr BLOCK_K"):
        compiled.resources(ml.matmul_kernel_v3, signature=SIGNATURE,
                           constexprs=dict(BLOCK_M=64, BLOCK_N=64, GROUP_M=8, PRECISION="ieee"))
    with pytest.raises(compiled.CompileToolError, match="missing argument stride_cn"):
        compiled.resources(ml.matmul_kernel_v3,
                           signature={k: v for k, v in SIGNATURE.items() if k != "stride_cn"},
                           constexprs=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8,
                                           PRECISION="ieee"))


def test_a_kernel_that_does_not_compile_comes_back_with_the_compilers_words():
    r = compiled.resources(ml.matmul_kernel_v3, signature=SIGNATURE, num_warps=4, num_stages=2,
                           constexprs=dict(BLOCK_M=48, BLOCK_N=64, BLOCK_K=32, GROUP_M=8,
                                           PRECISION="ieee"))
    assert not r.ok and "power of 2" in r.error


def test_a_matmul_launch_is_specialized_as_on_a_gpu():
    # The same compile as test_shared_memory_... through the course's matmul signature.
    r = compiled.matmul_resources(ml.matmul_kernel_v3, dict(BLOCK_M=128, BLOCK_N=128,
                                  BLOCK_K=64, num_stages=3, num_warps=4),
                                  constexprs=dict(GROUP_M=8, PRECISION="ieee"), n=N)
    assert r is v3(128, 128, 64, 3, 4)
    # lesson 04's prediction: registers and shared memory both allow two programs per SM
    occ = compiled.occupancy(r, H100)
    assert (occ.programs_per_sm, occ.limited_by) == (2, "registers and shared memory"), occ


def made_up(regs, shared, warps):
    return compiled.Resources("k", 90, warps, 3, shared_bytes=shared, registers_per_thread=regs,
                              spilled_bytes=0)


@pytest.mark.parametrize("regs, shared, warps, per_sm, limit", [
    (128, 64 * 1024, 4, 3, "shared memory"),      # 233472 // (65536 + 1024) = 3
    (255, 16 * 1024, 8, 1, "registers"),          # 65536 // (255 x 256) = 1
    (16, 1024, 4, 16, "warps"),                    # 64 warps // 4 (registers: 32)
    (16, 1024, 1, 32, "blocks"),                   # 64 warps would allow 64: 32 blocks
    (168, 100 * 1024, 4, 2, "shared memory"),     # registers: 65536 // 21504 = 3
    (213, 192 * 1024, 8, 1, "registers and shared memory"),   # a tie names both
])
def test_occupancy_is_the_least_of_the_limits(regs, shared, warps, per_sm, limit):
    occ = compiled.occupancy(made_up(regs, shared, warps), H100)
    assert occ.programs_per_sm == per_sm and occ.limited_by == limit, occ


def test_the_compile_without_a_gpu_agrees_with_the_h100_record():
    # The tiling record's knob sweep launched v3 on an H100 (Triton 3.6) and kept what the
    # compiler made of each setting: the same shared memory, the same settings that do not
    # fit and the same that spill; registers within 15 % (its Triton, 3.6, is not ours).
    # All of them compiled in one process (compiled.resources_many): one process each would
    # start the compiler twenty times, half of this test's time.
    rec = committed_record("tiling", "H100-SXM")
    rows = [r for r in rec.results["knobs"] if not r.get("cublas")]
    configs = [{k: row[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")}
               for row in rows]
    calls = [compiled.matmul_call(ml.matmul_kernel_v3, config, n=row["n"],
                                  constexprs=dict(GROUP_M=8, PRECISION="tf32"))
             for config, row in zip(configs, rows)]
    for row, config, ours in zip(rows, configs,
                                 compiled.resources_many(ml.matmul_kernel_v3, calls)):
        assert ours.ok == ("error" not in row), (config, ours.error, row.get("error"))
        assert ours.shared_bytes == row.get("shared_bytes", row["sram_model"]), config
        if ours.ok:     # ptxas ran for each one, and its log (the spills) was read
            assert ours.spilled_bytes is not None, (config, ours)
            assert ours.spills == (row["spills"] > 0), (config, ours, row)
            assert abs(ours.registers_per_thread - row["registers"]) <= 0.15 * row["registers"]

"""Lesson 05's experiment module: the kernel tracer, the Inductor-code parser, and the
committed GPU record the notebook draws from (complete, correct, and meeting the targets)."""

import matplotlib
import pytest
import torch

import helpers
from helpers import intensity, records
from helpers.experiments import fusion as fx
from helpers.kernels import gelu, rmsnorm, softmax

matplotlib.use("Agg")
needs_gpu = pytest.mark.skipif(not helpers.is_gpu(), reason="needs a CUDA GPU")


# --------------------------------------------------------------------------------------
# trace
# --------------------------------------------------------------------------------------


def test_trace_skips_views_and_counts_in_place_ops():
    x = torch.randn(4, 6)

    def f(t):
        v = t.view(6, 4).t()          # views: no kernel
        u = v.unsqueeze(0)
        w = u * 2.0                   # one kernel: read 96 bytes, write 96
        w.add_(1.0)                   # in place: read w, write w
        return w

    calls = fx.trace(f, x)
    assert [c.op for c in calls] == ["aten.mul", "aten.add_"]
    assert [(c.read, c.written) for c in calls] == [(96, 96), (96, 96)]
    assert calls.bytes == 384
    assert torch.equal(calls.result, f(x))


def test_trace_counts_broadcast_inputs_by_their_memory():
    x, b = torch.randn(8, 16), torch.randn(16)
    (call,) = fx.trace(lambda: x + b.expand(8, 16))
    assert call.read == (8 * 16 + 16) * 4, "an expanded view reads only the memory behind it"


def test_trace_works_on_meta_tensors_and_round_trips():
    x = torch.empty(4096, 8192, device="meta", dtype=torch.bfloat16)
    w = torch.empty(8192, device="meta", dtype=torch.bfloat16)
    calls = fx.trace(rmsnorm.residual_rmsnorm_eager, x, x, w)
    assert calls.bytes == intensity.residual_rmsnorm(4096, 8192, torch.bfloat16, "eager").nbytes
    again = fx.Trace.from_list(calls.as_list())
    assert again.bytes == calls.bytes and "9 kernels" in again.table()


# --------------------------------------------------------------------------------------
# Inductor's code
# --------------------------------------------------------------------------------------

TRITON_WRAPPER = """
triton_poi_fused_add_gelu_0 = async_compile.triton('triton_poi_fused_add_gelu_0', '''
import triton
@triton.jit
def triton_poi_fused_add_gelu_0(in_ptr0, XBLOCK : tl.constexpr):
    pass
''', device_str='cuda')
"""
CPP_WRAPPER = """
cpp_fused_add_gelu_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r'''
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
''')
"""


def test_parse_inductor_code_finds_triton_and_cpp_kernels():
    t = fx.parse_inductor_code([TRITON_WRAPPER])
    assert t["backend"] == "triton"
    assert [k["name"] for k in t["kernels"]] == ["triton_poi_fused_add_gelu_0"]
    assert t["kernels"][0]["source"].startswith("import triton")
    c = fx.parse_inductor_code([CPP_WRAPPER])
    assert c["backend"] == "cpp" and c["kernels"][0]["name"] == "cpp_fused_add_gelu_0"
    none = fx.parse_inductor_code(["def call(args): pass"])
    assert none["kernels"] == [] and "def call" in none["wrapper"]


@needs_gpu
@pytest.mark.gpu
def test_inductor_fuses_bias_gelu_into_one_triton_kernel():
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    code = fx.inductor_code(gelu.bias_gelu_eager, x, b)
    assert code["backend"] == "triton" and len(code["kernels"]) == 1
    assert "@triton.jit" in code["kernels"][0]["source"]


# --------------------------------------------------------------------------------------
# The committed record
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rec():
    if not records.available("fusion"):
        pytest.skip("no fusion record committed yet: run ./course record fusion on a GPU")
    return records.load("fusion")


def _comparisons(rec):
    r = rec.results
    return r["softmax"] + r["softmax_long_rows"] + [r["bias_gelu"], r["swiglu"], r["rmsnorm"]]


def test_record_is_complete_and_every_version_ran(rec):
    r = rec.results
    assert rec.provenance["git_commit"], "records carry the commit they measured"
    assert {(e["dtype"], e["n"]) for e in r["softmax"]} == {
        (d, n) for d in fx.SOFTMAX_DTYPES for n in fx.SOFTMAX_NS}
    assert [e["n"] for e in r["softmax_long_rows"]] == list(fx.LONG_ROW_NS)
    for entry in _comparisons(rec):
        for row in entry["rows"]:
            assert "error" not in row and row["ms"] > 0, (entry["title"], row)


def test_record_shows_our_kernels_correct_on_the_gpu(rec):
    for entry in _comparisons(rec):
        for row in entry["rows"]:
            if "Triton" in row["name"] or "registers" in row["name"] or "online" in row["name"]:
                assert row["within_tolerance"], (entry["title"], row)


def test_record_meets_the_lessons_targets(rec):
    for t in fx.targets(rec):
        assert t["met"] in (True, None), f"{t['target']}: {t['measured']:.3g} < {t['goal']}"


def test_record_matches_the_napkin_math_it_was_made_with(rec):
    r = rec.results
    e = next(e for e in r["softmax"] if e["n"] == 4096 and e["dtype"] == "fp16")
    naive = next(x for x in e["rows"] if x["name"].startswith("naive"))
    assert naive["bytes"] == intensity.softmax(e["m"], e["n"], torch.float16, "naive").nbytes
    traced = fx.Trace.from_list(r["traces"]["residual_rmsnorm_eager"]["calls"])
    assert traced.bytes == intensity.residual_rmsnorm(*fx.RMSNORM_SHAPE, torch.bfloat16, "eager").nbytes
    ops = [c["op"] for c in r["traces"]["residual_rmsnorm_torch"]["calls"]]
    assert ops == ["aten.add", "aten._fused_rms_norm"], "F.rms_norm is one kernel on a GPU"


def test_record_long_rows_justify_the_switch_to_the_online_kernel(rec):
    by_n = {e["n"]: e for e in rec.results["softmax_long_rows"]}

    def ms(n, name):
        return next(x["ms"] for x in by_n[n]["rows"] if x["name"] == name)

    # The longest row kept in registers is still faster than reading it twice; the next
    # length spills; twice that, spilling has made the row-in-registers kernel the slower.
    fits, spills = softmax.MAX_FUSED_BLOCK, 2 * softmax.MAX_FUSED_BLOCK
    assert ms(fits, "row in registers (v1)") < ms(fits, "online, two passes")
    assert by_n[fits]["v1_compiled"].get("n_spills") == 0
    assert by_n[spills]["v1_compiled"].get("n_spills", 0) > 0
    assert ms(2 * spills, "row in registers (v1)") > ms(2 * spills, "online, two passes")


def test_tables_and_plots_say_where_their_numbers_come_from(rec):
    text = fx.comparison(rec, "rmsnorm").to_text()
    assert "fused Triton" in text and rec.label in text
    assert len(fx.softmax_rows(rec)) == len(rec.results["softmax"])
    for draw in (fx.plot_softmax, fx.plot_long_rows, fx.plot_roofline):
        ax = draw(rec)
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert any(rec.label in t.get_text() for t in ax.texts), f"{draw.__name__} has no source"
        assert ax.get_legend() is not None
        matplotlib.pyplot.close(ax.figure)


def test_fusion_moves_every_op_right_and_up_on_the_roofline(rec):
    points = fx.roofline_points(rec)
    for before, after in zip(points[::2], points[1::2]):
        assert after.intensity > before.intensity and after.tflops > before.tflops, (before, after)

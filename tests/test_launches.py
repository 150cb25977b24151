"""What a PyTorch call launches (helpers.launches): the kernel tracer counts what eager
PyTorch moves, views excluded, and the Inductor-code parser finds both backends' kernels."""

import pytest
import torch

from helpers import intensity, launches
from helpers.kernels import gelu, rmsnorm


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

    calls = launches.trace(f, x)
    assert [c.op for c in calls] == ["aten.mul", "aten.add_"]
    assert [(c.read, c.written) for c in calls] == [(96, 96), (96, 96)]
    assert calls.bytes == 384
    assert torch.equal(calls.result, f(x))


def test_trace_counts_broadcast_inputs_by_their_memory():
    x, b = torch.randn(8, 16), torch.randn(16)
    (call,) = launches.trace(lambda: x + b.expand(8, 16))
    assert call.read == (8 * 16 + 16) * 4, "an expanded view reads only the memory behind it"


def test_trace_works_on_meta_tensors_and_round_trips():
    x = torch.empty(4096, 8192, device="meta", dtype=torch.bfloat16)
    w = torch.empty(8192, device="meta", dtype=torch.bfloat16)
    calls = launches.trace(rmsnorm.residual_rmsnorm_eager, x, x, w)
    assert calls.bytes == intensity.residual_rmsnorm(4096, 8192, torch.bfloat16, "eager").nbytes
    again = launches.Trace.from_list(calls.as_list())
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
    t = launches.parse_inductor_code([TRITON_WRAPPER])
    assert t["backend"] == "triton"
    assert [k["name"] for k in t["kernels"]] == ["triton_poi_fused_add_gelu_0"]
    assert t["kernels"][0]["source"].startswith("import triton")
    c = launches.parse_inductor_code([CPP_WRAPPER])
    assert c["backend"] == "cpp" and c["kernels"][0]["name"] == "cpp_fused_add_gelu_0"
    none = launches.parse_inductor_code(["def call(args): pass"])
    assert none["kernels"] == [] and "def call" in none["wrapper"]


@pytest.mark.gpu
def test_inductor_fuses_bias_gelu_into_one_triton_kernel():
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    code = launches.inductor_code(gelu.bias_gelu_eager, x, b)
    assert code["backend"] == "triton" and len(code["kernels"]) == 1
    assert "@triton.jit" in code["kernels"][0]["source"]

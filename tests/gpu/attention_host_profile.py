"""Probe: where the host time of one attention forward call goes (cProfile, 300 calls at 4 x 16 x 1,024 x 64 bf16, causal).

    PYTHONPATH=$PWD python3 tests/gpu/attention_host_profile.py
"""
import cProfile, pstats, io, torch, time

from helpers.kernels import attention as A
from helpers.kernels.attention import forward as F_
q, k, v = (torch.randn(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    A.flash_attention_forward(q, k, v, causal=True)
torch.cuda.synchronize()
print("kept", len(F_._launch_forward.kept))
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    A.flash_attention_forward(q, k, v, causal=True)
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
print(s.getvalue()[:6000])
t = time.perf_counter()
for _ in range(300):
    A.flash_attention_forward(q, k, v, causal=True)
print("host us/call", (time.perf_counter() - t) / 300 * 1e6)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(300):
    torch.empty_like(q)
print("empty_like us", (time.perf_counter() - t) / 300 * 1e6)

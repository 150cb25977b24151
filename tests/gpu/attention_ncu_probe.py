"""Probe, under Nsight Compute: what holds the attention forward back at d = 128? One
launch each of the course forward with descriptor tiles (128 x 64, 4 warps, 2 stages) and
with pointer tiles (128 x 128, 8 warps, 3 stages), after a warm-up; bf16, batch 4, 16
heads, 8,192 tokens, not causal. The pipes' shares (tensor cores, FMA, ALU, the MUFU's
``xu`` that runs ``exp2``) and the warps' stall reasons say whether the softmax's
instructions or the tensor cores set the pace.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section WarpStateStats --section InstructionStats \\
        python3 tests/gpu/attention_ncu_probe.py

Read on an H200 (``--clock-control none``: 1.78-1.81 GHz; counters readable there), the
descriptor setting / the pointer setting: 3.89 / 4.07 ms; compute (SM) throughput 58.5 /
55.3%; tensor pipe active (``sm__pipe_tensor_op_hmma_cycles_active``) 59.4 / 56.9%;
``xu`` (MUFU) 31.6 / 29.4%; FMA 16.8 / 12.9%; ALU 17.8 / 16.2%; 5.3 / 6.5 cycles per issued
instruction a warp; 434M non-fused against 143M fused FP32 instructions (the descriptor
setting). ``sm__pipe_tensor_op_gmma_cycles_active`` is not a metric there.
"""
import torch

from helpers.kernels import attention as ak

SETTINGS = {"tma 128x64 w4 s2": dict(block_m=128, block_n=64, num_warps=4, num_stages=2,
                                     tma=True),
            "pointers 128x128 w8 s3": dict(block_m=128, block_n=128, num_warps=8,
                                           num_stages=3)}

q, k, v = (torch.randn(4, 16, 8192, 128, device="cuda", dtype=torch.bfloat16)
           for _ in range(3))
for config in SETTINGS.values():
    ak.flash_attention_forward(q, k, v, False, **config)
torch.cuda.synchronize()
torch.cuda.profiler.start()         # ncu --profile-from-start off: these launches only
for name, config in SETTINGS.items():
    print(name, flush=True)
    ak.flash_attention_forward(q, k, v, False, **config)
    torch.cuda.synchronize()
torch.cuda.profiler.stop()

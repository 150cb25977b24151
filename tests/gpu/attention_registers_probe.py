"""Probe, without a GPU: registers, spills and shared memory of every setting the attention
tuner times, at d = 128 (bf16, 16 heads of 8,192 tokens), each pass causal and not.

The kernels are compiled for sm_90 (an H100 or H200) by :mod:`helpers.compiled`, which runs
``triton.compile`` in a fresh process and reads ``ptxas -v`` and ``cuobjdump -res-usage``;
it needs no GPU, so this runs on the course's CPU machine too:

    COURSE_MODE=cpu python tests/gpu/attention_registers_probe.py

Read on the CPU machine with Triton 3.7.1 (the GPU machine has 3.6; its numbers may differ
a little), bytes of spill stores a thread, non-causal / causal:

* forward: the tuner's pick at 8k and 16k, 128 x 64 tiles with 4 warps, 2 stages, through
  descriptors, spills 88 / 104 (255 registers); with 8 warps none (146 / 140 registers),
  but the probes timed it 17% slower (tests/gpu/attention_pipeline_probe.py). The 64 x 64
  pointer setting: 168 / 186 registers, no spill.
* dK/dV: the pick at every length, 64 x 64 with 4 warps, 2 stages, descriptors: 44 / 116
  (pointers: 92 / 240); 32-row settings do not spill (227-254 registers). Two accumulators
  (dK, dV: 64 x 128 fp32, 64 registers each a thread at 4 warps) and two score tiles (P^T,
  dP^T) are live at once. The causal version spills more, and the causal backward is the
  one furthest behind cuDNN (0.71-0.73x at d = 128, against 0.81-0.84x).
* dQ: 128 x 64 with 8 warps: 179-238 registers, no spill; with 4 warps 568 / 592.
"""
from helpers import compiled
from helpers.kernels.attention import backward, forward, tuning

N, D, HEADS = 8192, 128, 16
TILE = "*bf16"
STRIDES = dict(stride_qb=HEADS * N * D, stride_qh=N * D, stride_qm=D, stride_kb=HEADS * N * D,
               stride_kh=N * D, stride_kn=D)
SIGNATURES = {
    "forward": (forward.attention_fwd_kernel,
                dict(Q=TILE, K=TILE, V=TILE, O=TILE, LSE="*fp32", sm_scale=0.1, **STRIDES,
                     stride_vb=HEADS * N * D, stride_vh=N * D, stride_vn=D,
                     stride_ob=HEADS * N * D, stride_oh=N * D, stride_om=D, heads=HEADS,
                     seq_q=N, seq_k=N, diag=0)),
    "dkdv": (backward.attention_bwd_dkdv_kernel,
             dict(Q=TILE, K=TILE, V=TILE, DO=TILE, LSE="*fp32", DELTA="*fp32", DK=TILE, DV=TILE,
                  sm_scale=0.1, **STRIDES, heads=HEADS, seq_q=N, seq_k=N, diag=0)),
    "dq": (backward.attention_bwd_dq_kernel,
           dict(Q=TILE, K=TILE, V=TILE, DO=TILE, LSE="*fp32", DELTA="*fp32", DQ=TILE,
                sm_scale=0.1, **STRIDES, heads=HEADS, seq_q=N, seq_k=N, diag=0)),
}


def main():
    for pass_name, (kernel, signature) in SIGNATURES.items():
        calls, labels = [], []
        for setting in tuning.SPACES[pass_name]:
            tiles = tuning._tiles(setting)
            for causal in (False, True):
                calls.append(dict(signature=signature, num_warps=tiles["num_warps"],
                                  num_stages=tiles["num_stages"],
                                  constexprs=dict(GROUP=1, HEAD_DIM=D, BLOCK_D=D,
                                                  BLOCK_M=tiles["block_m"],
                                                  BLOCK_N=tiles["block_n"], CAUSAL=causal,
                                                  TMA=bool(tiles.get("tma")))))
                labels.append(f"{pass_name} {tuning.name_of(tiles)}"
                              + (" causal" if causal else ""))
        for label, got in zip(labels, compiled.resources_many(kernel, calls)):
            print(f"{label:34s} registers {got.registers_per_thread} spill "
                  f"{got.spilled_bytes} shared {got.shared_bytes} {got.error or ''}", flush=True)


if __name__ == "__main__":
    main()

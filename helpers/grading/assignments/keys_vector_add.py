"""The answer key of assignment 03 (vector add): every graded number, from the formulas.

Instructor's side only: ``./course release`` leaves this module out and ships the values
sealed (:mod:`helpers.grading.answers`), so the student release holds no answer. Every
value comes from the course's own napkin math (:mod:`helpers.intensity`; part 5's fused
step, which the course does not have, from its bytes and FLOPs per element here) and GPU
table (:mod:`helpers.hardware`), never typed in. The GPU is the table's H100 SXM;
elementwise arithmetic runs on the CUDA cores, so its compute roof is the fp32 peak.
"""

from __future__ import annotations

import math

import torch

from ... import hardware, intensity, records, roofline
from ...dtypes import element_size

GPU = hardware.GPUS["H100-SXM"]
COMPUTE_ROOF = "fp32"          # elementwise arithmetic: CUDA cores
N = 10**9
FP16, FP32 = torch.float16, torch.float32
TOLERANCE = 0.02               # relative, for every napkin-math number
RIDGE = GPU.ridge_point(COMPUTE_ROOF)
VARIANTS = ("fp16", "fp32", "in-place", "three inputs", "fma chain")


def _smallest_k(ridge: float, flops_per_fma: int = 2, write: bool = True) -> int:
    bytes_per_element = intensity.vector_add(1, FP32).nbytes - (0 if write else element_size(FP32))
    return math.ceil((ridge * bytes_per_element - 1) / flops_per_fma)


FLOPS = intensity.vector_add(N, FP16).flops
BYTES = intensity.vector_add(N, FP16).nbytes
INTENSITY = FLOPS / BYTES
FP32_INTENSITY = intensity.vector_add(N, FP32).intensity
# A += B: still read A, read B, write A
INPLACE_INTENSITY = intensity.vector_add(N, FP16).intensity
THREE_INPUT_INTENSITY = intensity.vector_add(N, FP16, n_inputs=3).intensity
FMA_K = _smallest_k(RIDGE)
# Only the FMA chain adds FLOPs without bytes: it alone can cross the ridge.
COULD_CROSS = {"fma chain"}

# Part 5, the fused momentum step: read w, m (fp32) and g (fp16), write w_new and m_new
# (fp32); m_new = BETA * m + g and w_new = w - LR * m_new, a multiply-add each.
G, W = element_size(FP16), element_size(FP32)
STEP_FLOPS = 2 * 2 * N
STEP_BYTES = N * (W + W + G + W + W)
STEP_INTENSITY = STEP_FLOPS / STEP_BYTES
PRED_N = 2**22                 # 5e: the size of the predicted time
PRED_TOLERANCE = 0.03          # 5e: relative, around lesson 02's model
RECORD_GPU = "H100-SXM"        # the GPU of the table the prediction uses


def launch_floor_us() -> float:
    """The model's launch floor on the reference GPU: lesson 02's record."""
    return records.load("roofline", RECORD_GPU).results["launch_floor_us"]


def model_us(nbytes: float, floor_us: float) -> float:
    """Lesson 02's model of a memory-bound kernel: the launch floor, then bytes / bandwidth."""
    return roofline.predicted_time_ms(0, nbytes, GPU, COMPUTE_ROOF, launch_us=floor_us) * 1e3


def prediction_entry(floor_us: float, n: int = PRED_N) -> tuple:
    """5e: the model's time of the fused step at ``n`` elements, and what each known
    mistake predicts instead."""
    nbytes = STEP_BYTES // N * n
    right = model_us(nbytes, floor_us)
    return (right, PRED_TOLERANCE, [
        (model_us(8 * nbytes, floor_us), "you count bits, not bytes"),
        (model_us(n * (W + W + G), floor_us), "you forget the writes: w_new and m_new cross "
                                              "the bus too"),
        (model_us(nbytes + 2 * n * W, floor_us),
         "you count the cast as a pass of its own (g.float() written and read back); fused, "
         "g becomes fp32 in registers"),
        (nbytes / (GPU.hbm_bandwidth_gbs * 1e9) * 1e6,
         "you leave out the launch floor: at this size a launch costs as much as a good part "
         "of the transfer"),
        (right / 1e3, "you give milliseconds; the answer is in microseconds"),
        (right / 1e6, "you give seconds; the answer is in microseconds")])


def answer_key() -> dict:
    """``{part: (value, relative tolerance, [(value of a known mistake, what it means)])}``;
    a choice is a word, and 2e one word per variant ("can" or "cannot" cross)."""
    values = {}
    values["1a"] = (FLOPS, TOLERANCE, [
                            (2 * FLOPS, "you count 2 FLOPs per element: an addition is one "
                                        "FLOP (a fused multiply-add is the one that counts two)"),
                            (3 * FLOPS, "you count a FLOP per value moved: there is one "
                                        "addition per element of C")])
    e = element_size(FP16)
    values["1b"] = (BYTES, TOLERANCE, [
                            (2 * N * e, "you forget the write of C: C crosses the bus too, "
                                        "on its way back to DRAM"),
                            (8 * BYTES, "you count bits, not bytes (an fp16 value is 2 bytes)"),
                            (intensity.vector_add(N, FP32).nbytes,
                             "you use 4 bytes per element: that is "
                                                      "fp32; fp16 is 2 bytes"),
                            (N * e, "you count one array only: A and B are read, C written"),
                            (BYTES / 1e9, "you give gigabytes; the answer is in bytes"),
                            (BYTES / 2**30, "you give GiB; the answer is in bytes")])
    values["1c"] = (INTENSITY, TOLERANCE, [
                            (FLOPS / (2 * N * 2), "you forget the write of C (1 FLOP per "
                                                  "4 bytes instead of 6)"),
                            (1 / INTENSITY, "you divide bytes by FLOPs: intensity is FLOPs "
                                            "per byte"),
                            (INTENSITY / 8, "you count bits, not bytes"),
                            (FP32_INTENSITY, "you use 4 bytes per element (fp32)")])
    values["2a"] = (FP32_INTENSITY, TOLERANCE, [
                            (INTENSITY, "that is fp16: an fp32 value is 4 bytes"),
                            (FLOPS / (2 * N * 4), "you forget the write of C")])
    values["2b"] = (INPLACE_INTENSITY, TOLERANCE, [
                            (FLOPS / (2 * N * 2), "in place still writes A back: read A, "
                                                  "read B, write A is three trips per element; "
                                                  "in-place saves a buffer, not traffic")])
    values["2c"] = (THREE_INPUT_INTENSITY, TOLERANCE, [
                            (N / (4 * N * 2), "A + B + C is two additions per element"),
                            (2 * N / (3 * N * 2), "you forget the write of the result"),
                            (INTENSITY, "a third input adds a FLOP and a read")])
    tensor_ridge = GPU.ridge_point("fp16")
    values["2d"] = (FMA_K, 0.005, [
                            (_smallest_k(RIDGE, flops_per_fma=1), "you count an FMA as one "
                                                                  "FLOP: it is a multiply and "
                                                                  "an add, two FLOPs"),
                            (_smallest_k(tensor_ridge), "you use the fp16 tensor-core ridge "
                                                        f"({tensor_ridge:.0f} FLOP/byte); "
                                                        "elementwise FMAs run on the CUDA "
                                                        f"cores, whose ridge is {RIDGE:.0f}"),
                            (_smallest_k(RIDGE, write=False), "you forget the write of D")])
    values["5a"] = (STEP_BYTES, TOLERANCE, [
                            (N * (W + W + G), "you forget the writes: w_new and m_new cross "
                                              "the bus on their way back to DRAM"),
                            (N * (W + W + G + W), "you write one output only: the step writes "
                                                  "w_new and m_new"),
                            (N * 5 * W, "you count g at 4 bytes: it is read as fp16 (2 bytes) "
                                        "and converted in registers"),
                            (STEP_BYTES + 2 * N * W, "you count the cast as a pass of its own "
                                                     "(g.float() written and read back); "
                                                     "fused, g becomes fp32 in registers"),
                            (8 * STEP_BYTES, "you count bits, not bytes")])
    values["5b"] = (STEP_INTENSITY, TOLERANCE, [
                            (STEP_FLOPS / (N * (W + W + G)), "you forget the writes"),
                            (STEP_FLOPS / 2 / STEP_BYTES, "you count 2 FLOPs per element: the "
                                                          "step does two multiply-adds (m_new, "
                                                          "then w_new), 2 FLOPs each"),
                            (STEP_BYTES / STEP_FLOPS, "you divide bytes by FLOPs: intensity "
                                                      "is FLOPs per byte"),
                            (STEP_INTENSITY / 8, "you count bits, not bytes")])
    values["5e"] = prediction_entry(launch_floor_us())
    for v in VARIANTS:
        values[f"2e.{v}"] = ("can" if v in COULD_CROSS else "cannot", 0, [])
    return values

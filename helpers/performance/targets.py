"""What the course asks of each comparison the performance report shows, and where it says so.

A goal stated in a lesson's notebook or held by a record test is written down here once,
with its source; a goal that already lives in code (lessons 05 to 08, beside each
experiment in :mod:`helpers.experiments`, where the lesson's plots, its record tests and
this report all read it) is taken from there, so they cannot drift apart. Each source
names the module that holds the goal and, where one does, the function that judges a
record against it (a plots module's ``targets()``).
``tests/test_performance.py`` also checks that the report's verdicts agree with each
lesson's own ``targets()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import hardware
from ..experiments import attention as _AP
from ..experiments import attention_decode as _AD
from ..experiments import autotuning as _AT
from ..experiments import fp8 as _FP8
from ..experiments import fusion as _FU
from ..experiments import matmul_shapes as _MS
from ..experiments import moe as _MOE
from ..experiments import moe_training as _MOE_TRAINING


def number(v: float) -> str:
    """A figure for a table: whole numbers from 100 up, three significant digits below."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


@dataclass(frozen=True)
class Target:
    goal: float
    unit: str          # "x": times the baseline's speed; "%": a fraction; else a rate's unit
    what: str          # the comparison, with "{goal}" where the goal goes
    source: str        # where the course states it
    at_most: bool = False
    gpus: tuple = ()   # the GPUs the course holds to it (empty: every GPU)

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        return value <= self.goal if self.at_most else value >= self.goal

    def show(self, value: float) -> str:
        """A measured value in the target's unit."""
        if self.unit == "%":
            return f"{100 * value:.0f}%"
        return f"{value:.2f}x" if self.unit == "x" else f"{number(value)}{self.unit}"

    @property
    def text(self) -> str:
        """The goal: ``≥ 0.95x``, ``≥ 85%``, ``≤ 1.1x``, ``≥ 450 TFLOP/s``."""
        goal = f"{100 * self.goal:g}%" if self.unit == "%" else f"{self.goal:g}{self.unit}"
        return f"{'≤' if self.at_most else '≥'} {goal}"

    @property
    def described(self) -> str:
        return self.what.format(goal=self.text)


_H100 = ("H100-SXM",)
_HOPPER = tuple(k for k, gpu in hardware.GPUS.items() if gpu.architecture == "Hopper")
_AT_TESTS = "tests/test_autotuning.py::test_target_"
_FUSION = "helpers/experiments/fusion.py; helpers/plots/fusion.py, targets(); tests/test_fusion.py"
TARGETS = {
    "copy": Target(0.85, "%", "lesson 01's copy kernel: {goal} of the datasheet HBM bandwidth",
                   "notebooks/01_memory_wall.ipynb, 'The target'; tests/test_memory_wall.py::"
                   "test_recorded_copy_reaches_85_percent_of_peak"),
    "vector_add": Target(0.85, "%", "lesson 03's vector add at 2^28 elements: {goal} of the "
                         "datasheet HBM bandwidth", "notebooks/03_vector_add_intensity.ipynb, "
                         "'The target'; tests/test_vector_add.py::"
                         "test_bandwidth_at_2_28_is_near_the_datasheet_peak"),
    "matmul_4096": Target(0.90, "x", "matmul() (lesson 04's entry point, lesson 07's kernels) at "
                          "4096^3, fp16 and bf16: {goal} the speed of torch.matmul",
                          "notebooks/04_tiling.ipynb, 'The target'",
                          gpus=_HOPPER),
    "matmul_8192": Target(0.95, "x", "matmul() (lesson 04's entry point, lesson 07's kernels) at "
                          "8192^3, fp16 and bf16: {goal} the speed of torch.matmul",
                          "notebooks/04_tiling.ipynb, 'The target'",
                          gpus=_HOPPER),
    "softmax_vs_torch": Target(_FU.SOFTMAX_VS_TORCH, "x", "lesson 05's fused softmax: {goal} "
                               "the speed of torch.softmax, geometric mean over the sweep",
                               _FUSION),
    "softmax_vs_naive": Target(_FU.SOFTMAX_VS_NAIVE, "x", "lesson 05's fused softmax: {goal} "
                               "the speed of the naive 5-op softmax, geometric mean over the "
                               "sweep", _FUSION),
    "rmsnorm_vs_eager": Target(_FU.RMSNORM_VS_EAGER, "x", "lesson 05's fused residual add + "
                               "RMSNorm: {goal} the speed of eager PyTorch", _FUSION),
    "rmsnorm_vs_copy": Target(_FU.RMSNORM_OF_COPY, "%", "lesson 05's fused residual add + "
                              "RMSNorm: {goal} of the copy bandwidth recorded beside it",
                              _FUSION),
    "bias_gelu_vs_eager": Target(_FU.BIAS_GELU_VS_EAGER, "x", "lesson 05's fused bias + GELU: "
                                 "{goal} the speed of eager PyTorch", _FUSION),
    "attention_forward": Target(
        _AP.FORWARD_VS_FLASH[0], "x", f"lesson 06's forward, {_AP.TARGET_DTYPE}, d = "
        f"{_AP.TARGET_HEAD_DIM}, from N = {_AP.FORWARD_VS_FLASH[1]}, causal or not: {{goal}} "
        "the speed of SDPA flash", "helpers/experiments/attention.py, FORWARD_VS_FLASH; "
        "tests/test_attention_record.py::test_record_meets_the_lessons_targets"),
    "attention_backward": Target(
        _AP.BACKWARD_VS_FLASH[0], "x", f"lesson 06's backward, {_AP.TARGET_DTYPE}, d = "
        f"{_AP.TARGET_HEAD_DIM}, from N = {_AP.BACKWARD_VS_FLASH[1]}, causal or not: {{goal}} "
        "the speed of SDPA flash", "helpers/experiments/attention.py, BACKWARD_VS_FLASH; "
        "tests/test_attention_record.py::test_record_meets_the_lessons_targets"),
    "attention_tflops": Target(
        _AP.FORWARD_TFLOPS[0], " TFLOP/s", f"lesson 06's forward at N = {_AP.FORWARD_TFLOPS[1]}"
        ", non-causal: {goal}", "helpers/experiments/attention.py, FORWARD_TFLOPS; "
        "tests/test_attention_record.py::test_record_meets_the_lessons_targets"),
    "decode_vs_sdpa": Target(
        _AD.DECODE_VS_SDPA, "x", "lesson 06's kernels decoding one query against 8k-128k keys "
        "(bf16, GQA 32/8, d = 128): {goal} the speed of SDPA's default, call against call",
        "helpers/experiments/attention_decode.py, DECODE_VS_SDPA"),
    "decode_hbm": Target(
        _AD.DECODE_HBM[0], "%", f"lesson 06's split-KV kernels, one query, from "
        f"{_AD.DECODE_HBM[1]:,} keys: {{goal}} of HBM bandwidth over their kernel time",
        "helpers/experiments/attention_decode.py, DECODE_HBM"),
    "head_dims_vs_sdpa": Target(
        _AD.HEAD_DIMS_VS_SDPA, "x", "lesson 06's forward at d = 80, 96, 192 and 256, 4,096 "
        "tokens: {goal} the speed of SDPA's default",
        "helpers/experiments/attention_decode.py, HEAD_DIMS_VS_SDPA"),
    "tuned_geomean": Target(_AT.GEOMEAN_VS_TORCH, "x", "lesson 07's tuned matmul over its "
                            "sweep: {goal} the speed of torch.matmul, geometric mean",
                            f"helpers/experiments/autotuning.py, GEOMEAN_VS_TORCH; {_AT_TESTS}"
                            "geomean_vs_torch", gpus=_H100),
    "tuned_floor": Target(_AT.FLOOR_VS_TORCH, "x", "lesson 07's tuned matmul on every shape of "
                          "its sweep: {goal} the speed of torch.matmul",
                          f"helpers/experiments/autotuning.py, FLOOR_VS_TORCH; {_AT_TESTS}"
                          "no_shape_below_the_floor", gpus=_H100),
    "tuned_8192": Target(_AT.SQUARE_8192_VS_TORCH, "x", "lesson 07's tuned matmul at 8192^3, "
                         "each dtype: {goal} the speed of torch.matmul",
                         f"helpers/experiments/autotuning.py, SQUARE_8192_VS_TORCH; {_AT_TESTS}"
                         "8192_cubed", gpus=_H100),
    "tuned_vs_fixed": Target(_AT.GEOMEAN_VS_FIXED, "x", "lesson 07's tuned matmul over its "
                             "sweep: {goal} the speed of lesson 04's single setting, geometric "
                             "mean",
                             f"helpers/experiments/autotuning.py, GEOMEAN_VS_FIXED; {_AT_TESTS}"
                             "geomean_vs_lesson_04s_setting", gpus=_H100),
    "tuning_cache": Target(_AT.CACHED_OVER_UNTUNED, "x", "lesson 07's sweep in a fresh process "
                           "that reads the tuning cache: {goal} the time of one that never tunes",
                           f"helpers/experiments/autotuning.py, CACHED_OVER_UNTUNED; {_AT_TESTS}"
                           "cached_run_within_10_percent_of_untuned", at_most=True, gpus=_H100),
}


def _lesson_08() -> dict:
    """Lesson 08's goals, per shape, each held at the token count the lesson set it for."""
    src = "helpers/experiments/moe.py, {}; helpers/plots/moe.py, targets()"
    tokens = _MOE.TARGET_TOKENS
    out = {f"moe_vs_grouped_mm_{k}": Target(
        goal, "x", f"lesson 08's experts, {k} shape, {tokens[k]} tokens: {{goal}} the speed "
        "of torch._grouped_mm (its faster weight layout)", src.format("VS_GROUPED_MM"))
        for k, goal in _MOE.VS_GROUPED_MM.items()}
    out.update({f"moe_vs_dense_{k}": Target(
        _MOE.VS_DENSE, "x", f"lesson 08's experts, {k} shape, {n} tokens: {{goal}} the "
        "speed of a dense matmul of the same FLOPs", src.format("VS_DENSE"))
        for k, n in tokens.items()})
    train = "helpers/experiments/moe_training.py, VS_GROUPED_MM; helpers/plots/moe.py, " \
        "training_targets()"
    out.update({f"moe_training_{k}": Target(
        goal, "x", f"lesson 08's trainable layer, {k} shape, {tokens[k]} tokens: forward + "
        "backward at {goal} the speed of autograd through torch._grouped_mm", train)
        for k, goal in _MOE_TRAINING.VS_GROUPED_MM.items()})
    out.update({f"moe_layer_{k}": Target(
        goal, "x", f"lesson 08's layer, {k} shape, {tokens[k]} tokens: {{goal}} the speed of "
        "the per-expert loop", src.format("LAYER_VS_LOOP"))
        for k, goal in _MOE.LAYER_VS_LOOP.items()})
    return out


TARGETS.update(_lesson_08())
_MS_SRC = "helpers/experiments/matmul_shapes.py, {}; tests/test_matmul_shapes.py"
_DRAWN = "matmul() on shapes drawn at record time, fp16 and bf16"
TARGETS.update({
    "drawn_geomean": Target(_MS.GEOMEAN_VS_CUBLAS, "x", f"{_DRAWN}: {{goal}} the speed of "
                            "cuBLAS (on padded operands where faster), geometric mean",
                            _MS_SRC.format("GEOMEAN_VS_CUBLAS"), gpus=_HOPPER),
    "drawn_floor": Target(_MS.FLOOR_VS_CUBLAS, "x", f"{_DRAWN}, every shape: {{goal}} the "
                          "speed of cuBLAS (padded where faster)",
                          _MS_SRC.format("FLOOR_VS_CUBLAS"), gpus=_HOPPER),
    "drawn_aligned": Target(_MS.ALIGNED_GEOMEAN_VS_CUBLAS, "x", f"{_DRAWN}, every dimension a "
                            "multiple of 8: {goal} the speed of cuBLAS, geometric mean",
                            _MS_SRC.format("ALIGNED_GEOMEAN_VS_CUBLAS"), gpus=_HOPPER),
    "linear_geomean": Target(_MS.LINEAR_GEOMEAN_VS_F_LINEAR, "x", "x @ W.T (nn.Linear's "
                             "layout) on the drawn shapes: {goal} the speed of F.linear, "
                             "geometric mean", _MS_SRC.format("LINEAR_GEOMEAN_VS_F_LINEAR"),
                             gpus=_HOPPER),
    "linear_floor": Target(_MS.LINEAR_FLOOR_VS_F_LINEAR, "x", "x @ W.T on every drawn shape: "
                           "{goal} the speed of F.linear",
                           _MS_SRC.format("LINEAR_FLOOR_VS_F_LINEAR"), gpus=_HOPPER),
    "back_to_back": Target(_MS.BACK_TO_BACK_VS_TORCH, "x", "matmul() called back to back "
                           "(500 calls, bf16, no L2 flush): {goal} torch.matmul's calls per "
                           "second", _MS_SRC.format("BACK_TO_BACK_VS_TORCH"), gpus=_HOPPER),
})
_FP8_SRC = "helpers/experiments/fp8.py, {}; tests/test_fp8_record.py"
TARGETS.update({
    "fp8_vs_scaled_mm": Target(_FP8.TENSOR_VS_SCALED_MM, "x", "lesson 09's FP8 matmul, "
                               "per-tensor scales, every shape: {goal} the speed of "
                               "torch._scaled_mm", _FP8_SRC.format("TENSOR_VS_SCALED_MM"),
                               gpus=_HOPPER),
    "fp8_vs_bf16": Target(_FP8.VS_BF16, "x", "lesson 09's FP8 matmul, per-tensor scales, every "
                          "shape: {goal} the speed of the course's bf16 matmul",
                          _FP8_SRC.format("VS_BF16"), gpus=_HOPPER),
    "fp8_block_vs_tensor": Target(_FP8.BLOCK_VS_TENSOR[0], "x", "lesson 09's block-scaled FP8 "
                                  "matmul at {}^3: {{goal}} the speed of its per-tensor one"
                                  .format(_FP8.BLOCK_VS_TENSOR[1][0]),
                                  _FP8_SRC.format("BLOCK_VS_TENSOR"), gpus=_HOPPER),
    "fp8_quantize": Target(_FP8.QUANTIZE_OF_COPY[0], "%", "lesson 09's quantisation kernel, "
                           f"{_FP8.QUANTIZE_OF_COPY[1]} groups: {{goal}} of a copy's bandwidth",
                           _FP8_SRC.format("QUANTIZE_OF_COPY"), gpus=_HOPPER),
})

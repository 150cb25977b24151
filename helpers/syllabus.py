"""The lessons, in order: notebook 00 and the README list them from here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Lesson:
    number: str
    file: str
    title: str
    question: str

    @property
    def graded(self) -> bool:
        """Has a graded assignment: :mod:`helpers.grading.registry` found one of this name."""
        from .grading import registry   # the syllabus is read by notebook 00, grading rarely

        return Path(self.file).stem in registry.modules()

    @property
    def path(self) -> Path:
        return ROOT / "notebooks" / self.file

    @property
    def available(self) -> bool:
        return self.path.exists()


LESSONS = [
    Lesson("00", "00_start_here.ipynb", "Start here",
           "How does the course work, and what does a Triton kernel look like?"),
    Lesson("01", "01_memory_wall.ipynb", "The memory wall",
           "Why do most kernels wait for memory, not arithmetic?"),
    Lesson("02", "02_roofline.ipynb", "The roofline model",
           "How fast can an op possibly run on a given GPU?"),
    Lesson("03", "03_vector_add_intensity.ipynb", "Vector add and arithmetic intensity",
           "Can a vector add reach the hardware's bandwidth?"),
    Lesson("04", "04_tiling.ipynb", "Tiling",
           "How does a matmul reach tensor-core speed by reusing tiles in SRAM?"),
    Lesson("05", "05_fusion.ipynb", "Kernel fusion",
           "How many bytes never need to touch HBM?"),
    Lesson("06", "06_flash_attention.ipynb", "FlashAttention",
           "How does an online softmax make attention memory-efficient?"),
    Lesson("07", "07_autotuning.ipynb", "Autotuning",
           "Which block sizes, warps and stages suit this GPU?"),
    Lesson("08", "08_moe.ipynb", "Mixture-of-Experts",
           "How do grouped matmuls route tokens to experts?"),
    Lesson("09", "09_fp8.ipynb", "Eight-bit floats",
           "How much faster is a matmul in FP8, and what do its scales cost in accuracy?"),
]


def markdown(relative_to: str = "notebooks") -> str:
    """A Markdown table of the lessons, linking those that exist and marking the graded."""
    rows = ["| # | Lesson | The question |", "|---|---|---|"]
    for lesson in LESSONS:
        link = lesson.file if relative_to == "notebooks" else f"notebooks/{lesson.file}"
        title = f"[{lesson.title}]({link})" if lesson.available else f"{lesson.title} (in preparation)"
        question = lesson.question + (" (graded)" if lesson.graded else "")
        rows.append(f"| {lesson.number} | {title} | {question} |")
    return "\n".join(rows)

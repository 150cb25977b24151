"""The course's helpers: ``import helpers`` first in every notebook.

Importing decides GPU or CPU mode (:mod:`helpers.runtime`) before any kernel exists.
"""

from . import runtime  # noqa: I001  -- must run before anything that defines a kernel
from .runtime import MODE, device, is_cpu, is_gpu, pick_size, report
from .show import show
from .trying import OutOfBounds, guarded

__all__ = ["MODE", "OutOfBounds", "device", "guarded", "is_cpu", "is_gpu", "pick_size", "report",
           "show", "runtime"]

"""Running a notebook's compiled kernels in Triton's interpreter, for a while (GPU mode).

On a GPU, :mod:`helpers.bounds` can watch a kernel's loads and stores only where the
interpreter runs it. :func:`interpreted` swaps the ``@triton.jit`` kernels a notebook
defined for interpreted twins while its block runs, lets those twins call Triton's own
compiled helpers (``tl.sum``, ...), and undoes every change afterwards. In CPU mode the
kernels are interpreted already and nothing changes.
"""

from __future__ import annotations

import contextlib

from . import runtime


def notebook_kernels(namespace: dict) -> dict:
    """The ``@triton.jit`` kernels defined in ``namespace`` (a notebook's globals), by name."""
    from triton.runtime.jit import JITFunction

    found = {}
    for name, value in list(namespace.items()):
        if isinstance(value, JITFunction) and getattr(value.fn, "__globals__", None) is namespace:
            found[name] = value
    return found


@contextlib.contextmanager
def interpreted(namespace: dict):
    """Swap the notebook's compiled kernels for interpreted twins (GPU mode) while in the block.

    A launcher finds its kernel by name in the notebook's globals, so replacing the
    global is enough for it to launch the interpreted twin: same Python function, run by
    the interpreter, where :func:`watch` can bounds-check every access. In CPU mode the
    kernels are interpreted already and nothing changes.
    """
    swapped = {}
    snapshot = None
    helpers_interpreted = contextlib.ExitStack()
    if runtime.is_gpu():
        from triton.runtime.interpreter import InterpretedFunction

        index_scalars_like_triton_3_7()
        for name, kernel in notebook_kernels(namespace).items():
            swapped[name] = kernel
            namespace[name] = InterpretedFunction(kernel.fn)
        snapshot = _language_snapshot() if swapped else None
        if swapped:
            helpers_interpreted.enter_context(_device_functions_interpreted())
    try:
        with helpers_interpreted:
            yield sorted(swapped)
    finally:
        for name, kernel in swapped.items():
            namespace[name] = kernel
        if snapshot is not None:
            _language_restore(snapshot)


def index_scalars_like_triton_3_7() -> None:
    """Let Triton 3.6's interpreter run loops under NumPy >= 2.4, as Triton 3.7's does.

    The interpreter holds a scalar (``K`` in ``range(0, K, BLOCK_K)``) as a one-element
    array, and Triton 3.6 turns it into a Python int with ``int(array)``, which NumPy 2.4
    refuses for an array with a dimension ("only 0-dimensional arrays can be converted
    to Python scalars"); 3.7 squeezes the array first. A GPU machine with Triton 3.6 and
    a new NumPy can run compiled kernels but could not watch a kernel with a loop. This
    makes 3.6 squeeze too; on a Triton that already does, it changes nothing.
    """
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "squeezes_scalars", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor.squeezes_scalars = True
    interpreter._patch_lang_tensor = patch_lang_tensor


@contextlib.contextmanager
def _device_functions_interpreted():
    """Let an interpreted twin call Triton's own ``@triton.jit`` helpers, in GPU mode.

    On a GPU, helpers of ``triton.language`` such as ``tl.sum``, ``tl.zeros`` or
    ``tl.cdiv`` are compiled-kernel functions (``JITFunction``), which refuse a call from
    Python ("Cannot call @triton.jit'd outside of the scope of a kernel"). While this block
    runs, such a call goes to the helper's interpreted twin instead, as in CPU mode.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    twins: dict = {}
    had_own = "__call__" in vars(JITFunction)
    original = vars(JITFunction).get("__call__")

    def call(self, *args, **kwargs):
        twin = twins.get(id(self))      # by id: hashing a JITFunction parses its source
        if twin is None:
            twin = twins[id(self)] = InterpretedFunction(self.fn)
        return twin(*args, **kwargs)

    JITFunction.__call__ = call
    try:
        yield
    finally:
        if had_own:
            JITFunction.__call__ = original
        else:
            del JITFunction.__call__


def _language_objects():
    import triton.language as tl

    objs = [tl, tl.core, tl.tensor, tl.core.tensor]
    for extra in ("math", "standard", "semantic", "random", "extra"):
        mod = getattr(tl, extra, None)
        if mod is not None:
            objs.append(mod)
    return list({id(o): o for o in objs}.values())


def _language_snapshot():
    """The attributes of triton.language, to undo the interpreter's patches exactly.

    Running a kernel in the interpreter swaps ``tl.load`` and friends for interpreted
    versions. Recent Triton puts them back afterwards; older ones leave them in place,
    and the next *compiled* kernel would then be built by the interpreter's functions.
    Restoring a snapshot is correct either way.
    """
    return [(obj, dict(vars(obj))) for obj in _language_objects()]


def _language_restore(snapshot) -> None:
    # The interpreter copies its own module globals (``interpreter_semantic``, ...) into
    # the globals of every function it rewrites, e.g. ``tl.cumsum``'s module, and caches
    # the rewritten function for the process. Deleting them would break the next
    # interpreted call of that cached function (NameError: interpreter_semantic); they
    # name interpreter objects only, which no compiled kernel reads, so they stay.
    from triton.runtime import interpreter

    injected = set(vars(interpreter))
    for obj, saved in snapshot:
        for name in list(vars(obj)):
            if name not in saved and name not in injected:
                try:
                    delattr(obj, name)
                except (AttributeError, TypeError):
                    pass
        for name, value in saved.items():
            if vars(obj).get(name, _MISSING) is not value:
                try:
                    setattr(obj, name, value)
                except (AttributeError, TypeError):
                    pass


_MISSING = object()

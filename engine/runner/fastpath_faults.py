"""Which fast-path exceptions leave the fast path, and which are our own bugs.

A fault says the device or its results cannot be trusted: non-finite logits, an
injected failure, a CUDA error (torch raises those as RuntimeError: an illegal address,
out of memory, a launch failure), a tensor-parallel peer's failure. The engine then
switches to the fallback path until the mode is set back.

A launch bug is an exception our own host code raises before the device runs anything
wrong: the argument checks of the kernels' launch arithmetic (ValueError), an
assertion, an index or type error, or Triton refusing to compile or fit a kernel. It
says that one step's shape met a bug in our code, not that the device failed, so it
does not demote the engine: that step runs on the portable path, the bug is logged
with its traceback and counted, and the next step tries the fast path again.

With INFERD_FASTPATH_STRICT=1 (the fast-path tests set it) any exception on the fast
path other than a deliberate FastPathError propagates instead, so a bug fails the test
that met it rather than being absorbed by the portable path.
"""

from __future__ import annotations

import os

STRICT_ENV = "INFERD_FASTPATH_STRICT"
LAUNCH_BUG_TYPES: tuple[type[Exception], ...] = (
    ValueError,
    AssertionError,
    IndexError,
    KeyError,
    TypeError,
    AttributeError,
    NotImplementedError,
)
# Triton's own exception classes, by name: importing Triton here would load it on machines
# without a GPU. CompilationError: a kernel that does not compile for the launch's
# constants; OutOfResources: a launch shape needing more shared memory or registers.
TRITON_LAUNCH_BUGS = frozenset({"CompilationError", "OutOfResources"})


def is_launch_bug(exc: BaseException) -> bool:
    """Whether `exc` is a bug in our launch code rather than a device fault."""
    return isinstance(exc, LAUNCH_BUG_TYPES) or type(exc).__name__ in TRITON_LAUNCH_BUGS


def is_strict() -> bool:
    """Whether fast-path exceptions propagate (tests) instead of being recovered from."""
    return os.environ.get(STRICT_ENV, "") == "1"

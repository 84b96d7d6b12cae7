"""The agent's C heap: fewer glibc malloc arenas, and freed startup memory handed back.

glibc gives each thread that contends for the heap an arena of its own, up to 8 per
core; the agent runs about 30 threads (a guarded-read worker per device, the HTTP,
intake, stream and gRPC threads), and each arena keeps its own free lists and
partly-used pages.  Two arenas are plenty for a process whose threads mostly wait:
``limit_arenas`` sets ``M_ARENA_MAX`` before the first thread starts.  Startup
(compiling and importing the modules, reading the config, the first poll and the
stream's hello) frees far more than the steady state keeps; ``release_free`` asks
glibc to return the free pages at the top and in the middle of its heaps
(``malloc_trim``), once startup is over.

Both are best effort: on a C library other than glibc (musl in an Alpine image)
or without ctypes they do nothing and say so by returning False; the agent runs
the same, only with the allocator's defaults.
"""

from __future__ import annotations

import os
from typing import Any

M_ARENA_MAX = -8  # glibc malloc.h
AGENT_ARENAS = 2

_libc: Any = None


def _glibc() -> Any:
    """glibc's handle, or None when the C library is not glibc or ctypes is missing."""
    global _libc
    if _libc is None:
        try:
            if not os.confstr("CS_GNU_LIBC_VERSION"):
                raise OSError("not glibc")
            import ctypes

            lib = ctypes.CDLL(None)
            lib.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            lib.malloc_trim.argtypes = (ctypes.c_size_t,)
            _libc = lib
        except (ValueError, OSError, AttributeError, ImportError):
            _libc = False
    return _libc or None


def limit_arenas(arenas: int = AGENT_ARENAS) -> bool:
    """Caps glibc's malloc arenas (call before the first thread starts); False where not applied,
    and where the operator set the cap already (``MALLOC_ARENA_MAX``, or ``glibc.malloc.arena_max``
    in ``GLIBC_TUNABLES``): theirs stands."""
    if "MALLOC_ARENA_MAX" in os.environ or "glibc.malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    lib = _glibc()
    return bool(lib is not None and lib.mallopt(M_ARENA_MAX, arenas) == 1)


def release_free() -> bool:
    """Hands the C heap's free pages back to the kernel; False where not glibc."""
    lib = _glibc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True

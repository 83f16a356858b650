"""The library's init code: the verbs' entry points (:mod:`.bridge`) and the librdmacm
half's (:mod:`.cmbridge`), which is imported at a program's first ``rdma_*`` call.

A program that never calls librdmacm (``ibv_devices``, ``ibv_rc_pingpong``, perftest
without ``-R``) then never imports the rdma_cm and iWARP layers: about 45 ms of its
embedded interpreter's start-up, a fifth of ``softrdma run -- ibv_devices``. Each
``sr_py_cm_*`` entry point is a stub that imports :mod:`.cmbridge` and calls its function
(:data:`ENTRY_POINTS`: their names, from the C declarations; ``cmbridge.FUNCTIONS`` has
the same ones). The stub costs a connection manager call one Python call more, no data
path's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from . import bridge, cdefs

__all__ = ["install", "ENTRY_POINTS", "RETURNS_HANDLE", "stubs"]

#: the librdmacm entry points that return a handle (errors are negative); the others
#: return 0 or an errno
RETURNS_HANDLE = frozenset({"sr_py_cm_channel", "sr_py_cm_create_id", "sr_py_cm_create_qp",
                            "sr_py_cm_get_event"})
#: each librdmacm entry point that ``cdefs.PY_EXPORTS`` declares -> returns a handle;
#: ``cmbridge.FUNCTIONS`` maps the same names to their functions
ENTRY_POINTS: dict[str, bool] = {
    name: name in RETURNS_HANDLE for name in re.findall(r"\b(sr_py_cm_\w+)\(", cdefs.PY_EXPORTS)}


def _stub(name: str) -> Callable[..., int]:
    def call(*args: Any) -> int:
        from . import cmbridge  # the first call imports it (and the rdma_cm layer)

        return cmbridge.FUNCTIONS[name](*args)

    call.__name__ = call.__qualname__ = name
    return call


def stubs() -> dict[str, tuple[Callable[..., int], bool]]:
    """Each librdmacm entry point as (its stub, returns a handle)."""
    return {name: (_stub(name), negative) for name, negative in ENTRY_POINTS.items()}


def install(ffi: Any, lib: Any) -> None:
    """Register the verbs' entry points and the librdmacm stubs (the library's init code)."""
    bridge.install(ffi, lib, stubs())

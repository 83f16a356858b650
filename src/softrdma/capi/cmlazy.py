"""The library's init code: the verbs' entry points (:mod:`.bridge`) and the librdmacm
half's (:mod:`.cmbridge`), which is imported at a program's first ``rdma_*`` call.

A program that never calls librdmacm (``ibv_devices``, ``ibv_rc_pingpong``, perftest
without ``-R``) then never imports the rdma_cm and iWARP layers: about 45 ms of its
embedded interpreter's start-up, a fifth of ``softrdma run -- ibv_devices``. Each
``sr_py_cm_*`` entry point is a stub that imports :mod:`.cmbridge` and calls its function
(:data:`ENTRY_POINTS` holds their names; ``cmbridge.FUNCTIONS`` has the same ones). The
stub costs a connection manager call one Python call more, no data path's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import bridge

__all__ = ["install", "ENTRY_POINTS", "stubs"]

#: name in cdefs.PY_EXPORTS of each librdmacm entry point -> returns a handle (errors are
#: negative); ``cmbridge.FUNCTIONS`` maps the same names to their functions
ENTRY_POINTS: dict[str, bool] = {
    "sr_py_cm_channel": True,
    "sr_py_cm_create_id": True,
    "sr_py_cm_set_wrapper": False,
    "sr_py_cm_destroy_id": False,
    "sr_py_cm_info": False,
    "sr_py_cm_bind": False,
    "sr_py_cm_resolve_addr": False,
    "sr_py_cm_resolve_route": False,
    "sr_py_cm_listen": False,
    "sr_py_cm_create_qp": True,
    "sr_py_cm_drop_qp": False,
    "sr_py_cm_connect": False,
    "sr_py_cm_accept": False,
    "sr_py_cm_reject": False,
    "sr_py_cm_disconnect": False,
    "sr_py_cm_migrate": False,
    "sr_py_cm_set_option": False,
    "sr_py_cm_get_event": True,
    "sr_py_cm_device": False,
    "sr_py_cm_mcast": False,
    "sr_py_cm_init_qp_attr": False,
    "sr_py_cm_establish": False,
    "sr_py_cm_notify": False,
}


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

"""The handle table of :mod:`softrdma.capi` and the rules of its ``extern "Python"`` calls.

C names a softrdma object (context, PD, CQ, QP, rdma_cm id...) by a handle, a positive
int; an object that C wraps in a struct of its own (QP, CQ, SRQ, context, cm id) also has
that wrapper, the element of its events. :func:`_onerror` is the rule every entry point
runs under: no exception ever escapes into C, a softrdma error becomes its errno
(``SoftRdmaError.errno``) and anything else EIO, logged to stderr when
``SOFTRDMA_CAPI_DEBUG`` is set. :func:`register` installs the entry points into the
embedded library (:func:`softrdma.capi.bridge.install`).
"""

from __future__ import annotations

import errno
import itertools
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ..errors import SoftRdmaError
from ..verbs import SGE

__all__ = ["register"]

#: the library's cffi ``ffi`` and ``lib`` (set by :func:`register`)
_ffi: Any = None
_lib: Any = None
_objs: dict[int, object] = {}
_ids = itertools.count(1)
_lock = threading.Lock()
_debug = bool(os.environ.get("SOFTRDMA_CAPI_DEBUG"))
#: handle -> the C wrapper of a QP, CQ or SRQ (the element of its events)
_wrappers: dict[int, Any] = {}
#: id(verbs object) -> its handle, for the objects that have a wrapper
_handles: dict[int, int] = {}


def _add(obj: object, wrapper: Any = None) -> int:
    """A new handle for ``obj`` (and its C wrapper, if C made it first)."""
    with _lock:
        h = next(_ids)
        _objs[h] = obj
        if wrapper is not None:
            _wrappers[h] = wrapper
            _handles[id(obj)] = h
    return h


def _get(h: int, kind: type[Any]) -> Any:
    """The object of handle ``h``, which must be a ``kind`` (EINVAL otherwise)."""
    obj = _objs.get(h)
    if not isinstance(obj, kind):
        raise SoftRdmaError(f"handle {h} is not a {kind.__name__}", errno=errno.EINVAL)
    return obj


def _set_wrapper(h: int, wrapper: Any) -> None:
    """Give the object of ``h`` its C wrapper (made by C after the object)."""
    with _lock:
        obj = _objs.get(h)
        if obj is None:
            raise SoftRdmaError(f"handle {h} is unknown", errno=errno.EINVAL)
        _wrappers[h] = wrapper
        _handles[id(obj)] = h


def _handle_of(obj: object) -> int:
    """The handle of an object that has a wrapper, or 0."""
    with _lock:
        return _handles.get(id(obj), 0)


def _wrapper_of(h: int) -> Any:
    """The C wrapper of handle ``h``, or None."""
    with _lock:
        return _wrappers.get(h) if h else None


def _forget(h: int) -> object:
    """Drop ``h`` from the tables; its object."""
    with _lock:
        obj = _objs.pop(h, None)
        if _wrappers.pop(h, None) is not None:
            _handles.pop(id(obj), None)
    if obj is None:
        raise SoftRdmaError(f"handle {h} is unknown", errno=errno.EINVAL)
    return obj


# ---- the program's memory ---------------------------------------------------------------
def _mem(addr: int, length: int) -> Any:
    """The program's memory at ``addr`` as a writable buffer."""
    return _ffi.buffer(_ffi.cast("char *", addr), length)


def _sges(ptr: int, n: int) -> list[SGE]:
    """The ``n`` entries of the C ``struct ibv_sge`` array at ``ptr``."""
    if n > 0xFFFF:
        raise SoftRdmaError(f"num_sge {n} is negative or too large", errno=errno.EINVAL)
    if n and not ptr:
        raise SoftRdmaError("sg_list is NULL", errno=errno.EINVAL)
    arr = _ffi.cast("struct ibv_sge *", ptr)
    return [SGE(int(arr[i].addr), int(arr[i].length), int(arr[i].lkey)) for i in range(n)]


# ---- errors -----------------------------------------------------------------------------
def _errno_of(exc: BaseException) -> int:
    if isinstance(exc, SoftRdmaError):
        return int(exc.errno) or errno.EINVAL
    if isinstance(exc, OSError) and exc.errno:
        return int(exc.errno)
    if isinstance(exc, MemoryError):
        return errno.ENOMEM
    if isinstance(exc, (ValueError, TypeError)):
        return errno.EINVAL
    return errno.EIO


def _onerror(negative: bool) -> Callable[[Any, BaseException, Any], int]:
    """cffi's ``onerror`` of an entry point: an exception the verb raised (or its result's
    conversion) becomes ``-errno`` (object verbs, ``negative``) or ``errno`` (int verbs),
    and cffi returns that to C instead of printing a traceback. The verb itself runs with
    no wrapper frame around it: one Python call less per entry from C (``ibv_post_send``,
    the busy poll's receive step)."""

    def onerror(exc_type: Any, exc: BaseException, tb: Any) -> int:
        if _debug:
            traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
        err = _errno_of(exc)
        return -err if negative else err
    return onerror


def register(ffi: Any, lib: Any, exports: dict[str, tuple[Callable[..., int], bool]]) -> None:
    """Keep ``ffi`` and ``lib``, and make each of ``exports`` (name in
    ``cdefs.PY_EXPORTS`` -> (function, returns a handle: errors are negative)) the body of
    its ``extern "Python"`` entry point, its exceptions turned into errnos by
    :func:`_onerror`."""
    global _ffi, _lib
    _ffi, _lib = ffi, lib
    for name, (fn, negative) in exports.items():
        err = -errno.EIO if negative else errno.EIO
        ffi.def_extern(name=name, error=err, onerror=_onerror(negative))(fn)

"""pyverbs base classes and helpers (rdma-core ``pyverbs/base.pyx`` API).

* :class:`PyverbsObject`: every pyverbs object; has a logger and ``set_log_level``.
* :class:`PyverbsCM`: objects with a ``close()`` (context managers).
* :func:`PyverbsRDMAErrno`: a :class:`PyverbsRDMAError` carrying the C ``errno``.
* :func:`inc_rkey`: ``ibv_inc_rkey`` (IBA 10.6.7.2: the low 8 bits of an R_Key are the
  consumer-owned key, incremented on each bind).
* :class:`Forward`: a flat view of a field of an inner struct (``ah_attr.flow_label`` is
  ``ah_attr.gr.flow_label``), as pyverbs's classes offer them.
* :class:`Copied`: a struct member copied in and out (``qp_attr.cap``), as in C.
* :class:`Alias`: another name of an attribute, checked on write (``send_cq``/``scq``).
* :func:`translate`: turns a :class:`softrdma.errors.SoftRdmaError` raised inside its
  block into the :class:`PyverbsRDMAError` libibverbs's return code would give, keeping
  the errno (EINVAL, EOPNOTSUPP, ENOMEM ...).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Generic, Self, TypeVar, cast, overload

from softrdma.errors import SoftRdmaError
from softrdma.verbs._object import Closing

from .pyverbs_error import PyverbsRDMAError

__all__ = ["PyverbsObject", "PyverbsCM", "PyverbsRDMAErrno", "PyverbsRDMAError", "inc_rkey",
           "translate", "rdma_error", "Forward", "Copied", "Alias", "LOG_LEVEL",
           "LOG_FORMAT"]

_T = TypeVar("_T")

LOG_LEVEL = logging.INFO
LOG_FORMAT = "[%(levelname)s] %(asctime)s %(filename)s:%(lineno)s: %(message)s"


def PyverbsRDMAErrno(msg: str) -> PyverbsRDMAError:  # noqa: N802 - pyverbs's name
    """A :class:`PyverbsRDMAError` with the current C ``errno`` (pyverbs ``PyverbsRDMAErrno``)."""
    return PyverbsRDMAError(msg, ctypes.get_errno() or _errno.EINVAL)


def inc_rkey(rkey: int) -> int:
    """``ibv_inc_rkey``: the key with its low byte incremented (modulo 256)."""
    return (rkey & 0xFFFFFF00) | ((rkey + 1) & 0xFF)


def rdma_error(msg: str, exc: BaseException) -> PyverbsRDMAError:
    """The :class:`PyverbsRDMAError` for a softrdma exception (its errno)."""
    code = getattr(exc, "errno", None)
    if not isinstance(code, int) or code <= 0:
        code = _errno.EINVAL
    err = PyverbsRDMAError(f"{msg} ({exc})" if str(exc) else msg, code)
    return err


class translate:  # noqa: N801 - used as ``with translate(msg):``, like a function
    """Re-raise softrdma errors inside the block as :class:`PyverbsRDMAError` (same errno).

    A class rather than a generator context manager: it wraps data-path calls (poll,
    post), where it costs less than half as much."""

    __slots__ = ("msg",)

    def __init__(self, msg: str) -> None:
        self.msg = msg

    def __enter__(self) -> None:
        return None

    def __exit__(self, etype: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, SoftRdmaError):
            raise rdma_error(self.msg, exc) from exc


class PyverbsObject:
    """Base of all pyverbs objects: a logger whose level ``set_log_level`` changes."""

    @property
    def logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__name__)

    def set_log_level(self, val: int) -> None:
        self.logger.setLevel(val)


class PyverbsCM(PyverbsObject, Closing):
    """A pyverbs object with resources: ``close()`` and the context-manager protocol."""


class _Member(Generic[_T]):
    """A data descriptor standing for a struct member: named as the attribute it is
    assigned to; a read on the class gives the descriptor itself."""

    _name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> _T: ...

    def __get__(self, obj: object | None, objtype: type | None = None) -> Self | _T:
        if obj is None:
            return self
        return self._read(obj)

    def _read(self, obj: object) -> _T:
        raise NotImplementedError


class Forward(_Member[_T]):
    """A flat view, read and written, of the field of the same name of the struct in
    attribute ``inner``: ``flow_label = Forward[int]("gr")`` makes ``attr.flow_label``
    ``attr.gr.flow_label``."""

    def __init__(self, inner: str) -> None:
        self._inner = inner

    def _read(self, obj: object) -> _T:
        return cast(_T, getattr(getattr(obj, self._inner), self._name))

    def __set__(self, obj: object, val: _T) -> None:
        setattr(getattr(obj, self._inner), self._name, val)


class Copied(_Member[_T]):
    """A struct member copied in and out, as C assigns one (``attr.cap``,
    ``attr.ah_attr``): the object holds its own copy in ``_<name>``, a read returns a new
    copy, and setting None leaves the member as it is."""

    def __init__(self, copy: Callable[[_T], _T]) -> None:
        self._copy = copy

    def _read(self, obj: object) -> _T:
        return self._copy(cast(_T, getattr(obj, f"_{self._name}")))

    def __set__(self, obj: object, val: _T | None) -> None:
        if val is not None:
            setattr(obj, f"_{self._name}", self._copy(val))


class Alias(_Member[_T]):
    """Another name of attribute ``target``, whose writes go through ``check`` (which
    returns the value to store or raises): ``send_cq = Alias[Any]("scq", check_cq)``."""

    def __init__(self, target: str, check: Callable[[_T], _T]) -> None:
        self._target = target
        self._check = check

    def _read(self, obj: object) -> _T:
        return cast(_T, getattr(obj, self._target))

    def __set__(self, obj: object, val: _T) -> None:
        setattr(obj, self._target, self._check(val))

"""The lifetime rules every verbs object follows (pyverbs ``PyverbsCM``).

* Every object is a context manager; ``close()`` is idempotent.
* A parent tracks its dependents in a weak set and closes them before itself
  (pyverbs ``close_weakrefs``): Context -> PDs, CQs, completion channels; PD -> QPs,
  AHs, MRs, SRQs; CQ/SRQ -> the QPs that use them; CompChannel -> its CQs.
* A dependent keeps its parents alive (strong references), so an object is never
  collected while something built on it is usable.
* Using a closed object raises :class:`~softrdma.errors.ClosedError`.
* An object of a type the device limits (PD, CQ, QP, SRQ, AH, MR, MW; :mod:`.limits`)
  counts against its device from creation until it is closed or collected.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from operator import attrgetter
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Self, TypeVar, overload

from ..errors import ClosedError
from .limits import ObjectCounts

if TYPE_CHECKING:
    from ..drivers.runtime.progress import DeviceRuntime

__all__ = ["Closing", "VerbsObject", "EngineView", "release_on"]

_T = TypeVar("_T")


def release_on(runtime: DeviceRuntime, fn: Callable[..., object], *args: object) -> None:
    """Run the engine teardown ``fn(*args)`` of a closing object: through
    ``runtime.call`` (under the engine lock), or directly once the runtime is closed
    (nothing else runs on the engine then)."""
    if runtime.closed:
        fn(*args)
    else:
        runtime.call(fn, *args)


class Closing:
    """The context-manager protocol of an object with an idempotent ``close()``: leaving
    the ``with`` block closes it (pyverbs ``PyverbsCM``)."""

    def close(self) -> None:
        """Release the object (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class VerbsObject(Closing):
    """Base of Context, PD, MR, CQ, CompChannel, QP, SRQ, AH."""

    #: dependents close in rank order: QPs, then AHs, MRs, SRQs, CQs, PDs, channels
    #: (pyverbs PD.close: qps, ahs, mws, mrs, srqs).
    _close_rank = 9

    def __init__(self) -> None:
        self._closed = False
        self._dependents: weakref.WeakSet[VerbsObject] = weakref.WeakSet()
        self._parents: list[VerbsObject] = []
        self._counted: tuple[ObjectCounts, str] | None = None

    def _count_on(self, counts: ObjectCounts, limit: str) -> None:
        """Count this object against the device's ``limit`` ("max_qp" ...); ResourceError
        (EINVAL) when the device holds that many already. Given back when the object is
        closed, or collected, or by :meth:`_count_undo` when its creation fails."""
        counts.take(limit)
        self._counted = (counts, limit)

    @contextmanager
    def _counting(self, counts: ObjectCounts, limit: str) -> Iterator[None]:
        """:meth:`_count_on` for the block that creates this object's engine side: the
        count is given back if the block raises."""
        self._count_on(counts, limit)
        try:
            yield
        except BaseException:
            self._count_undo()
            raise

    def _count_undo(self) -> None:
        counted = self.__dict__.pop("_counted", None)
        if counted is not None:
            counted[0].give(counted[1])

    def __del__(self) -> None:
        # collected without close(): give the count back (a finalizer per object would
        # cost more at creation than this costs at collection)
        try:
            self._count_undo()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing to give back to
            pass

    def _depend_on(self, *parents: VerbsObject) -> None:
        """Register ``self`` as a dependent of each parent (closed when they close)."""
        for p in parents:
            p._check()
            p._dependents.add(self)
            self._parents.append(p)

    def _move(self, old: VerbsObject, new: VerbsObject) -> None:
        """Make ``self`` a dependent of ``new`` instead of ``old`` (an MR re-registered
        into another PD, ``ibv_rereg_mr(IBV_REREG_MR_CHANGE_PD)``)."""
        if new is old:
            return
        old._dependents.discard(self)
        self._parents.remove(old)
        self._depend_on(new)

    def _check(self) -> None:
        if self._closed:
            raise ClosedError(f"{type(self).__name__} is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the dependents, then release this object. Idempotent."""
        if self._closed:
            return
        for dep in sorted(self._dependents, key=_rank):
            dep.close()
        try:
            self._release()
        finally:
            self._closed = True
            self._count_undo()
            for p in self._parents:
                p._dependents.discard(self)

    def _release(self) -> None:
        """Free this object's own resources (subclasses)."""


def _rank(obj: VerbsObject) -> int:
    return obj._close_rank


class EngineView(property, Generic[_T]):
    """A read-only attribute of a verbs object that is an attribute of its engine-side
    object: ``lkey = EngineView[int]("engine_mr.lkey")`` makes ``mr.lkey``
    ``mr.engine_mr.lkey`` (a property whose getter is an ``attrgetter``: no Python-level
    call on the data path)."""

    def __init__(self, path: str, doc: str | None = None) -> None:
        super().__init__(attrgetter(path), doc=doc)

    if TYPE_CHECKING:
        @overload
        def __get__(self, obj: None, objtype: type | None = None) -> Self: ...

        @overload
        def __get__(self, obj: object, objtype: type | None = None) -> _T: ...

        def __get__(self, obj: object | None, objtype: type | None = None) -> Self | _T: ...

"""The I/O under the rdma_cm device list (:mod:`softrdma.cm.rdma_devices`): the kernel's
route lookup, the watch on interface and address changes, and the process-wide tables
of devices, each behind its lock.

* :func:`route_source`: the source address the kernel's routing picks for a destination
  (:mod:`softrdma.drivers.host.route`: a UDP ``connect`` sends nothing), as Linux's
  ``rdma_resolve_addr`` asks the routing table (``addr_resolve``).
* :class:`~softrdma.drivers.host.ifwatch.ChangeWatch` (re-exported): an rtnetlink socket
  subscribed to the link and address groups; a change (``ip addr add``) has its message
  queued by the time the command returns.
* :class:`KeptList`: a list read once and kept until an interface changes (the watch) or
  the registry file is replaced (:func:`registry_key`: it is replaced, never rewritten
  in place, so a new inode); without rtnetlink nothing is kept. A forked child reads it
  again.
* :class:`OpenTable`: the devices a process opened, by name, each opened once.

What the entries are and how they are read or opened is the caller's (``cm`` builds the
verbs contexts and the CM bindings; this layer may not import verbs).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ...wire.ipcm import IpAddress
from ..host import registry
from ..host.ifwatch import ChangeWatch
from ..host.route import route_source as host_route_source

__all__ = ["route_source", "ChangeWatch", "registry_key", "KeptList", "OpenTable"]

T = TypeVar("T")


def route_source(dst: IpAddress) -> bytes | int:
    """The source address (packed) the kernel's routing picks for ``dst``; the route
    lookup's errno if there is no route (:func:`softrdma.drivers.host.route.route_source`)."""
    return host_route_source(dst.packed)


def registry_key() -> tuple[Any, ...]:
    """What the registry's contents depend on: the state directory (its path, owner and
    mode, and who reads it: :func:`~.registry.check_state_dir`) and its ``devices.json``
    (replaced on every change: inode, size, mtime)."""
    d = os.fspath(registry.state_dir())  # plain strings: pathlib costs more than the lstat
    out: list[Any] = [d, os.geteuid()]
    for p in (d, os.path.join(d, registry.Registry.FILE)):
        try:
            st = os.lstat(p)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns))
    return tuple(out)


class KeptList(Generic[T]):
    """The list ``read()`` returns, kept until an interface or address changes or the
    registry is replaced (see the module docstring). Thread-safe; :meth:`get` returns a
    copy."""

    def __init__(self, read: Callable[[], list[T]]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._watch: ChangeWatch | None = None
        self._key: tuple[Any, ...] | None = None
        self._list: list[T] = []
        ref = weakref.ref(self)

        def forget() -> None:
            kept = ref()
            if kept is not None:
                kept.forget()
        os.register_at_fork(after_in_child=forget)

    def get(self) -> list[T]:
        with self._lock:
            if self._watch is None:
                try:
                    self._watch = ChangeWatch()
                except OSError:
                    return self._read()
                self._key = None
            if self._watch.changed():
                self._key = None
            key = registry_key()
            if key != self._key:
                self._list[:] = self._read()
                self._key = key
            return list(self._list)

    def forget(self) -> None:
        """Read the list again next time, on a new watch (after ``fork()``: the child
        watches on its own)."""
        if self._watch is not None:
            self._watch.close()
        self._watch, self._key = None, None
        self._list.clear()
        self._lock = threading.Lock()  # a fork may have copied it held


class OpenTable(Generic[T]):
    """What a process opened, by name: each opened once (under the table's lock, so two
    threads asking together get the same one) and kept until :meth:`pop` ped.

    The lock is re-entrant and every walk is over a copy: a garbage collection may run a
    finalizer in the middle of any method, in the thread that holds the lock, and a
    context's finalizer reads the table (a shared device's last report lists its rdma_cm
    ids, ``rdma_res``). With a plain lock that thread waited for itself, and every other
    thread that reads the table after it (rdma-core's suite hung so, beside busy loops)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._open: dict[str, T] = {}

    def get_or_open(self, name: str, open_: Callable[[], T]) -> T:
        """The entry ``name``, opened by ``open_()`` if there is none yet (an exception
        from it leaves none)."""
        with self._lock:
            got = self._open.get(name)
            if got is None:
                got = self._open[name] = open_()
            return got

    def pop(self, name: str | None = None) -> list[T]:
        """Remove and return every entry (``name`` None) or the one named."""
        with self._lock:
            names = [n for n in list(self._open) if name is None or n == name]
            return [got for n in names if (got := self._open.pop(n, None)) is not None]

    def values(self) -> list[T]:
        """The entries now (a copy)."""
        with self._lock:
            return list(self._open.values())

    def each(self, fn: Callable[[T], None]) -> None:
        """Call ``fn`` on every entry now, no other thread opening or removing one
        meanwhile (a finalizer in this thread may: the walk is over a copy)."""
        with self._lock:
            for v in list(self._open.values()):
                fn(v)

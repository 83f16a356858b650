"""What the contexts of one opened device share: the "uverbs file" (``ibv_import_device``).

In Linux every verbs object belongs to the uverbs file that ``ibv_open_device`` opened;
the command FD refers to that file, and ``ibv_import_device(dup(cmd_fd))`` gives a second
``ibv_context`` on the *same* file. Objects are named by per-file handles
(``ibv_import_pd(pd_handle)``, ``ibv_import_mr(mr_handle)``), and the file (with every
object still on it) lives until the last descriptor that refers to it is closed.

softrdma keeps the same model within one process: a :class:`DeviceFile` holds the engine
runtime, the async-event queue and the handle tables of an opened device; the command FD
of a context is the read end of the file's event pipe, so ``os.dup`` of it names the same
pipe, which :func:`lookup` finds again by its ``fstat`` identity (device, inode). Each
context that refers to the file counts as one user; the runtime stops when the last
closes. A descriptor received from another process names no file of this process: verbs
objects (an MR is this process's memory, the QPs' transport runs in its engine) cannot be
imported there (see docs/design.md, "Not shared").
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import Any, Generic, TypeVar

from ..drivers.runtime.progress import DeviceRuntime
from ..errors import InvalidArgument, NotSupported

#: what the event queue holds (the device's engine and async events)
Ev = TypeVar("Ev")

__all__ = ["DeviceFile", "lookup", "FD_IDENTITY"]

#: the ``fstat`` fields that identify an open pipe whatever descriptor names it
FD_IDENTITY = ("st_dev", "st_ino")

# the registry holds files of any event type (each context knows its own)
_files: dict[tuple[int, int], weakref.ref[DeviceFile[Any]]] = {}
_files_lock = threading.RLock()  # re-entrant: a GC may run a release (below) in a holder


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return int(st.st_dev), int(st.st_ino)


class DeviceFile(Generic[Ev]):
    """One opened device, shared by the context that opened it and those imported from
    its command FD. ``events``/``owners`` are mutated in place, never rebound, since every
    context refers to the same objects."""

    def __init__(self, runtime: DeviceRuntime, ev_r: int, ev_w: int) -> None:
        self.runtime = runtime
        self.ev_w = ev_w
        self.events: deque[Ev] = deque()
        self.ev_lock = threading.Lock()
        self.owners: dict[int, weakref.ref[object]] = {}
        self.users = 1
        #: the opened context's attributes an imported context takes (name, port, runtime ...)
        self.attrs: dict[str, object] = {}
        self.closed = False
        self._lock = threading.RLock()  # re-entrant: a collection may run release in a holder
        self._handles: dict[str, dict[int, weakref.ref[object]]] = {}
        self._next_handle: dict[str, int] = {}
        self.key = _identity(ev_r)
        with _files_lock:
            _files[self.key] = weakref.ref(self)

    # ---- handles (the kernel's per-file IDR of each object type) --------------------------
    def new_handle(self, kind: str, obj: object) -> int:
        """A handle for ``obj`` among this file's objects of ``kind`` ("pd", "mr", "dm")."""
        with self._lock:
            handle = self._next_handle.get(kind, 0)
            self._next_handle[kind] = handle + 1
            self._handles.setdefault(kind, {})[handle] = weakref.ref(obj)
            return handle

    def drop_handle(self, kind: str, handle: int) -> None:
        with self._lock:
            self._handles.get(kind, {}).pop(handle, None)

    def resolve(self, kind: str, handle: object) -> object:
        """The live object of ``kind`` named ``handle``; EINVAL for an unknown handle, as
        the kernel's ``uobj_get_read`` answers (``ib_uverbs`` ``UVERBS_METHOD_QUERY_*``)."""
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise InvalidArgument("handle", f"must be an int, got {handle!r}")
        with self._lock:
            ref = self._handles.get(kind, {}).get(handle)
        obj = ref() if ref is not None else None
        if obj is None or getattr(obj, "closed", False):
            raise InvalidArgument("handle", f"no {kind.upper()} with handle {handle} on this "
                                  "device context")
        return obj

    # ---- events -------------------------------------------------------------------------------
    def post(self, ev: Ev) -> None:
        with self.ev_lock:
            self.events.append(ev)
        try:
            os.write(self.ev_w, b"\0")
        except OSError:
            pass

    # ---- lifetime -----------------------------------------------------------------------------
    def add_user(self) -> None:
        with self._lock:
            if self.closed:
                raise InvalidArgument("cmd_fd", "the device context was closed")
            self.users += 1

    def release(self, ev_r: int) -> None:
        """One context is done: close its command FD; the last stops the runtime."""
        try:
            os.close(ev_r)
        except OSError:
            pass
        with self._lock:
            if self.closed:
                return
            self.users -= 1
            last = self.users <= 0
            if last:
                self.closed = True
        if not last:
            return
        with _files_lock:
            if _files.get(self.key) is not None and _files[self.key]() in (self, None):
                del _files[self.key]
        self.runtime.close()
        tap = getattr(self.runtime, "tap", None)
        if tap is not None:  # an iWARP runtime's stream tap (a RoCE runtime closes its own)
            tap.close()
        try:
            os.close(self.ev_w)
        except OSError:
            pass


def lookup(cmd_fd: object) -> DeviceFile[Any]:
    """The open :class:`DeviceFile` that ``cmd_fd`` (a descriptor of this process) refers
    to. EBADF for a descriptor that is not open; EOPNOTSUPP, with the reason, for one that
    is no softrdma command FD of this process (for example one passed from another
    process: its objects live there)."""
    if not isinstance(cmd_fd, int) or isinstance(cmd_fd, bool) or cmd_fd < 0:
        raise InvalidArgument("cmd_fd", f"must be a file descriptor, got {cmd_fd!r}")
    try:
        key = _identity(cmd_fd)
    except OSError as exc:
        raise InvalidArgument("cmd_fd", f"descriptor {cmd_fd} is not open ({exc.strerror})",
                              errno=exc.errno) from None
    with _files_lock:
        ref = _files.get(key)
    file = ref() if ref is not None else None
    if file is None or file.closed:
        raise NotSupported(
            f"cmd_fd {cmd_fd} is not the command FD of a softrdma device context open in this "
            "process; softrdma imports contexts only within the process that opened them "
            "(its verbs objects and registered memory live in that process)")
    return file

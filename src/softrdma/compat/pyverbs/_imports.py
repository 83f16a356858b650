"""Shared objects: ``ibv_import_device``, ``ibv_import_pd``, ``ibv_import_mr``,
``ibv_import_dm`` and their ``unimport`` (rdma-core ``verbs.h``; pyverbs ``Context(cmd_fd=)``,
``PD(ctx, handle=)``, ``MR(pd, handle=, address=)``, ``DM(ctx, handle=)``).

A context imported from ``os.dup(ctx.cmd_fd)`` refers to the same opened device (see
:mod:`softrdma.verbs.context_file`): a PD, MR or DM created through either context has a
per-device handle, and importing that handle gives a second pyverbs object that *aliases*
the first (the same protection domain for the engine's checks, the same registered
memory and keys). As in the kernel:

* an unknown (or destroyed) handle fails with EINVAL;
* ``unimport()`` forgets the imported object and destroys nothing (the original, and what
  was created through the import, stay usable);
* ``close()`` of an imported MR or DM destroys the shared object (``ibv_dereg_mr`` /
  ``ibv_free_dm`` on the imported handle), which the original then sees closed; closing
  an imported PD closes what was created through it and leaves the original PD;
* closing the original context leaves an imported context working: the device stays
  open until its last context is closed, as a uverbs file does.

Within one process only; a command FD from another process gives EOPNOTSUPP with the
reason (rdma-core's tests then skip).
"""

from __future__ import annotations

import errno
from typing import Protocol

from softrdma import verbs as _v
from softrdma.verbs._object import VerbsObject

from .base import translate
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

__all__ = ["import_context", "resolve", "file_handle", "unimport"]


class Importable(Protocol):
    """A PD, MR or DM: its handle (None until asked for)."""

    _handle: int | None


def import_context(ctx: _v.Context, cmd_fd: object) -> None:
    """Initialise ``ctx`` as a context imported from ``cmd_fd`` (``ibv_import_device``)."""
    if not isinstance(cmd_fd, int) or isinstance(cmd_fd, bool):
        raise PyverbsUserError(f"Context: cmd_fd must be an int, got {cmd_fd!r}")
    VerbsObject.__init__(ctx)
    with translate("Failed to import device"):
        ctx._init_import(cmd_fd)


def resolve(ctx: object, kind: str, handle: object, cls: type[object]) -> object:
    """The live ``kind`` object named ``handle`` on ``ctx``'s device (an instance of
    ``cls``); EINVAL otherwise (``ibv_import_pd``/``mr``/``dm`` on an unknown handle)."""
    what = f"Failed to import {kind.upper()}"
    if not isinstance(ctx, _v.Context) or ctx.closed:
        raise PyverbsRDMAError(f"{what}: no open context", errno.EINVAL)
    with translate(what):
        obj = ctx._file.resolve(kind, handle)
    if not isinstance(obj, cls):
        raise PyverbsRDMAError(f"{what}: handle {handle} is not a {cls.__name__}", errno.EINVAL)
    return obj


def file_handle(obj: Importable, ctx: _v.Context, kind: str) -> int:
    """``obj``'s handle on its device (allocated when first asked for; an imported
    object has the handle it was imported by)."""
    if obj._handle is None:
        obj._handle = ctx._file.new_handle(kind, obj)
    return obj._handle


def unimport(obj: VerbsObject, what: str) -> None:
    """``ibv_unimport_*``: forget ``obj`` without destroying the shared object, and leave
    what was created through it alone. Only imported objects can be unimported here."""
    if getattr(obj, "_origin", None) is None:
        raise PyverbsRDMAError(f"Failed to unimport {what}: not an imported {what}",
                               errno.EINVAL)
    if obj.closed:
        return
    obj._closed = True
    for parent in obj._parents:
        parent._dependents.discard(obj)

"""The exceptions softrdma raises.

Every error a caller can provoke is a :class:`SoftRdmaError`. Bad arguments raise
:class:`InvalidArgument`, which names the argument; the ``errno`` attribute carries the
value libibverbs would return for the same mistake (EINVAL, EOPNOTSUPP, ENOMEM, ...), so
that the pyverbs compatibility layer can translate without guessing.
"""

from __future__ import annotations

import errno as _errno


class SoftRdmaError(Exception):
    """Base class of every softrdma error."""

    errno: int = _errno.EINVAL

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        if errno is not None:
            self.errno = errno


class InvalidArgument(SoftRdmaError, ValueError):
    """An argument is out of range, of the wrong type, or not allowed here.

    ``argument`` names the offending argument (``"qp_attr.path_mtu"``, ``"wr.sg_list"``).
    """

    def __init__(self, argument: str, message: str, *, errno: int | None = None) -> None:
        super().__init__(f"{argument}: {message}", errno=errno)
        self.argument = argument


class StateError(SoftRdmaError):
    """The object is in a state where this operation is not allowed."""


class ClosedError(StateError):
    """The object (or an object it depends on) has been closed."""

    errno = _errno.EBADF


class ResourceError(SoftRdmaError):
    """A queue or table is full (send queue, CQ, QP table ...)."""

    errno = _errno.ENOMEM


class NotSupported(SoftRdmaError):
    """The operation is valid in libibverbs but not supported by this device or transport."""

    errno = _errno.EOPNOTSUPP


class DecodeError(SoftRdmaError):
    """A packet or frame could not be decoded: truncated, bad length, unknown opcode ..."""


class DeviceError(SoftRdmaError):
    """A device cannot be found, created, or reached."""

    errno = _errno.ENODEV

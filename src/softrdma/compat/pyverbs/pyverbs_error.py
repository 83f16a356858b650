"""pyverbs exceptions (rdma-core ``pyverbs/pyverbs_error.py`` API).

:class:`PyverbsRDMAError` carries the errno libibverbs returned in ``error_code`` and
formats the message as pyverbs does: ``"<msg>. Errno: <n>, <strerror>"``.
"""

from __future__ import annotations

import os

__all__ = ["PyverbsError", "PyverbsRDMAError", "PyverbsUserError"]


def _format(msg: str, error_code: int) -> str:
    if error_code == -1:
        return msg
    return f"{msg}. Errno: {error_code}, {os.strerror(abs(error_code))}"


class PyverbsError(Exception):
    """Base of the pyverbs exceptions."""

    def __init__(self, msg: str, error_code: int = -1) -> None:
        super().__init__(_format(msg, error_code))
        self._error_code = error_code

    @property
    def error_code(self) -> int:
        return self._error_code


class PyverbsRDMAError(PyverbsError):
    """An rdma-core (here: softrdma) call failed; ``error_code`` is its errno."""


class PyverbsUserError(PyverbsError):
    """A mistake pyverbs catches before calling the library (bad argument types ...)."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)

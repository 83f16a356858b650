"""The rule of every ``extern "Python"`` entry point of ``softrdma.capi``
(``handles._onerror``, cffi's ``onerror``): an exception of the verb never reaches C and
prints nothing; C gets the errno (``-errno`` for a verb that returns a handle), EIO for
anything that names none. Checked through a cffi callback, the same call path as an
entry point's, so that the installed cffi's ``onerror`` contract is what is tested."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

import cffi
import pytest

from softrdma.capi import handles as hd
from softrdma.errors import InvalidArgument, SoftRdmaError


def _entry(fn: Callable[[int], int], negative: bool) -> Any:
    ffi = cffi.FFI()
    err = -errno.EIO if negative else errno.EIO
    return ffi.callback("int(int)", fn, error=err, onerror=hd._onerror(negative))


def _verb(x: int) -> int:
    if x == 1:
        raise SoftRdmaError("no such handle", errno=errno.EINVAL)
    if x == 2:
        raise InvalidArgument("num_entries", "must be >= 0")
    if x == 3:
        raise OSError(errno.ENOSPC, "full")
    if x == 4:
        raise RuntimeError("a bug")
    if x == 5:
        raise MemoryError()
    return x + 100


@pytest.mark.parametrize(("arg", "want"), [
    (0, 100), (1, errno.EINVAL), (2, errno.EINVAL), (3, errno.ENOSPC), (4, errno.EIO),
    (5, errno.ENOMEM)])
def test_exceptions_become_errnos_silently(arg: int, want: int,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    assert _entry(_verb, False)(arg) == want
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_handle_verbs_return_minus_errno() -> None:
    call = _entry(_verb, True)
    assert call(0) == 100
    assert call(1) == -errno.EINVAL
    assert call(4) == -errno.EIO


def test_a_result_c_cannot_take_is_an_error_too(capfd: pytest.CaptureFixture[str]) -> None:
    """A verb that returns something that is not an int (a bug) gives C an errno, not a
    traceback."""
    assert _entry(lambda x: None, False)(0) == errno.EINVAL  # type: ignore[arg-type,return-value]
    assert capfd.readouterr().err == ""


def test_debug_prints_the_traceback(monkeypatch: pytest.MonkeyPatch,
                                    capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(hd, "_debug", True)
    assert _entry(_verb, False)(4) == errno.EIO
    assert "RuntimeError: a bug" in capfd.readouterr().err

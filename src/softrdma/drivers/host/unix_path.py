"""Unix-domain socket paths of any length.

A socket address holds at most 107 octets of path (``sun_path`` is 108 with its NUL,
unix(7)), and softrdma puts its sockets in the state directory (devd's
``<state>/<name>.sock``, IPoIB's ``<state>/ipoib/<netns>/<ifname>.sock``), which a user
or a test runner may place deep (pytest's ``/tmp/pytest-of-root/pytest-1234/popen-gw1/...``).
A longer path is reached through its directory: the directory is opened (``O_PATH``) and
the socket named ``/proc/self/fd/N/<name>``, which Linux resolves to the same file for
``bind`` and ``connect``. Shorter paths are used as they are.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SUN_PATH_MAX = 107  # octets of path in a sockaddr_un (108 with the terminating NUL)

__all__ = ["SUN_PATH_MAX", "bind_unix", "connect_unix", "unix_address"]


@contextmanager
def unix_address(path: Path | str) -> Iterator[str]:
    """An address that names ``path`` for ``bind``/``connect`` while the block runs."""
    text = os.fspath(path)
    if len(os.fsencode(text)) <= SUN_PATH_MAX:
        yield text
        return
    parent, name = os.path.split(text)
    fd = os.open(parent or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        short = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(short)) > SUN_PATH_MAX:
            raise OSError(errno.ENAMETOOLONG, "socket name too long", text)
        yield short
    finally:
        os.close(fd)


def bind_unix(sock: socket.socket, path: Path | str) -> None:
    """``sock.bind(path)`` for a path of any length (module docstring)."""
    with unix_address(path) as address:
        sock.bind(address)


def connect_unix(sock: socket.socket, path: Path | str) -> None:
    """``sock.connect(path)`` for a path of any length (module docstring)."""
    with unix_address(path) as address:
        sock.connect(address)

"""The control channel of a running ``softrdma ipoib up`` process (``show``, ``down``),
and its wait for an IPv6 address (:func:`wait_for_ipv6`).

A Unix stream socket ``<state dir>/ipoib/<netns inode>/<NAME>.sock`` (interface names are
per network namespace): a client sends one JSON line
(``{"cmd": "show"}`` or ``{"cmd": "down"}``) and reads one JSON line back. A socket left
by a process that died is replaced; a live one means the interface is already running.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softrdma.drivers.host.unix_path import bind_unix, connect_unix

from ...errors import DeviceError
from . import netdev as _netdev
from .registry import check_state_dir, ensure_state_dir, state_dir

__all__ = ["ControlServer", "control_dir", "control_path", "control_request", "running",
           "CONTROL_TIMEOUT_S", "IPV6_WAIT_S", "usable_ipv6", "wait_for_ipv6"]

CONTROL_TIMEOUT_S = 5.0
#: how long ``ipoib up`` waits for its netdev's first usable IPv6 address: right after an
#: interface comes up its addresses are tentative while duplicate address detection runs
#: (RFC 4862 §5.4; Linux: about 1-2 s with the default ``dad_transmits`` 1)
IPV6_WAIT_S = 10.0
_IPV6_POLL_S = 0.1
_IFA_F_TENTATIVE = 0x40  # linux/if_addr.h: DAD still running
_IFA_F_DADFAILED = 0x08  # DAD found a duplicate: the address stays unusable
NETNS_PATH = "/proc/self/ns/net"
MAX_REQUEST = 4096


def _netns_id() -> str:
    """The current network namespace's inode: interface names are per namespace."""
    try:
        return str(os.stat(NETNS_PATH).st_ino)
    except OSError:
        return "0"


def control_dir(directory: Path | None = None) -> Path:
    """Where the control sockets of this network namespace's interfaces are."""
    return (directory or state_dir()) / "ipoib" / _netns_id()


def control_path(name: str, directory: Path | None = None) -> Path:
    """Where the ``up`` process of interface ``name`` (in this namespace) listens."""
    return control_dir(directory) / f"{name}.sock"


def _trusted(d: Path) -> bool:
    """Whether control directory ``d`` exists, after the checks a writer makes on it and on
    the directories above it (:func:`~softrdma.drivers.host.registry.check_state_dir`: ours, not
    a symbolic link, not writable by others; a planted one raises :class:`DeviceError`
    naming it), so a reader never talks to a socket another user put there."""
    base = d.parent.parent
    return all(check_state_dir(p) for p in (base, base / "ipoib", d))


def running(directory: Path | None = None) -> list[str]:
    """The names of the interfaces with a control socket in this namespace."""
    d = control_dir(directory)
    return sorted(p.stem for p in d.glob("*.sock")) if _trusted(d) else []


def control_request(name: str, cmd: str, *, directory: Path | None = None,
                    timeout: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
    """Send ``cmd`` to the running interface ``name`` and return its JSON answer."""
    path = control_path(name, directory)
    if not _trusted(path.parent):
        raise DeviceError(f"no IPoIB interface {name!r} is running here ({path.parent} "
                          "does not exist)")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            connect_unix(s, path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DeviceError(f"no IPoIB interface {name!r} is running here "
                              f"({path} is not answering)") from exc
        s.sendall(json.dumps({"cmd": cmd}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise DeviceError(f"IPoIB interface {name!r}: {exc}") from exc
    finally:
        s.close()
    try:
        answer = json.loads(data)
    except ValueError as exc:
        raise DeviceError(f"IPoIB interface {name!r} gave no answer") from exc
    if not isinstance(answer, dict):
        raise DeviceError(f"IPoIB interface {name!r} gave a malformed answer")
    return answer


class ControlServer:
    """The listening side, polled by the runtime's loop (:meth:`fileno`, :meth:`serve`)."""

    def __init__(self, path: Path) -> None:
        ensure_state_dir(path.parent)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connect_unix(probe, path)
                raise DeviceError(f"IPoIB interface {path.stem!r} is already running")
            except (FileNotFoundError, ConnectionRefusedError):
                path.unlink(missing_ok=True)
            finally:
                probe.close()
            bind_unix(s, path)
            s.listen(8)
            s.setblocking(False)
        except BaseException:
            s.close()
            raise
        self.sock: socket.socket | None = s
        self.path = path

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def serve(self, handler: Callable[[str], dict[str, Any]]) -> None:
        """Answer every waiting client: ``handler(cmd)`` gives the JSON answer."""
        if self.sock is None:
            return
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            with conn:
                conn.settimeout(CONTROL_TIMEOUT_S)
                try:
                    data = b""
                    while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
                        chunk = conn.recv(MAX_REQUEST)
                        if not chunk:
                            break
                        data += chunk
                    try:
                        cmd = str(json.loads(data).get("cmd"))
                    except (ValueError, AttributeError):
                        cmd = ""
                    conn.sendall(json.dumps(handler(cmd)).encode() + b"\n")
                except OSError:
                    pass

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            self.path.unlink(missing_ok=True)


def usable_ipv6(netdev: str) -> list[str]:
    """``netdev``'s IPv6 addresses that are usable now (DAD done, RFC 4862 §5.4); empty
    when there are none or the interface is gone."""
    try:
        return [str(a) for a in _netdev.ipv6_addresses(netdev) if a.usable]
    except DeviceError:
        return []


def wait_for_ipv6(netdev: str, timeout: float | None = None,
                  note: Callable[[str], None] | None = None) -> bool:
    """Wait until ``netdev`` has a usable IPv6 address and none still tentative (duplicate
    address detection done, RFC 4862 §5.4: the global address often finishes after the
    link-local one, and a device's GIDs are read once), at most ``timeout`` seconds
    (default :data:`IPV6_WAIT_S`). True if a usable address is there by then. ``note``
    gets one line saying what is awaited when the wait is not over at once."""
    if timeout is None:
        timeout = IPV6_WAIT_S
    deadline = time.monotonic() + timeout
    said = False
    while True:
        addrs = _netdev.ipv6_addresses(netdev)
        usable = any(a.usable for a in addrs)
        pending = any(a.flags & _IFA_F_TENTATIVE and not a.flags & _IFA_F_DADFAILED
                      for a in addrs)
        if usable and not pending:
            return True
        if time.monotonic() >= deadline:
            return usable
        if not said and note is not None:
            why = ("its IPv6 addresses are tentative: duplicate address detection is running"
                   if addrs else "it has no IPv6 address yet")
            note(f"waiting up to {timeout:g} s for an IPv6 address on {netdev} ({why}; "
                 "IPoIB needs an IPv6 GID)")
            said = True
        time.sleep(min(_IPV6_POLL_S, max(0.0, deadline - time.monotonic())))

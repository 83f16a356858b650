"""Starting ``devd`` on first use: :func:`ensure_devd` (design.md "Devices shared by
processes"; the files are listed in :mod:`softrdma.drivers.devd.daemon`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from softrdma.drivers.devd.proto import socket_path
from softrdma.drivers.host.registry import DeviceRecord, ensure_state_dir, open_state_file
from softrdma.drivers.host.registry import state_dir as default_state_dir
from softrdma.drivers.host.unix_path import connect_unix
from softrdma.errors import DeviceError, SoftRdmaError

__all__ = ["DEVD_START_TIMEOUT", "Daemon", "DevdVanished", "daemonize", "ensure_devd", "flock",
           "install_signals"]


class Daemon(Protocol):
    """What :func:`daemonize` needs of a :class:`softrdma.drivers.devd.daemon.Devd`."""

    directory: Path
    record: DeviceRecord

    def start(self) -> None: ...

    def serve_forever(self) -> None: ...

    def shutdown(self) -> None: ...


@contextlib.contextmanager
def flock(path: Path, timeout: float, what: str) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path``, waiting at most ``timeout`` seconds."""
    fd = open_state_file(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise DeviceError(f"{what}: {path} is locked by another process") from None
                time.sleep(0.01)
        yield fd
    finally:
        os.close(fd)



class DevdVanished(DeviceError):
    """The daemon was started (or found) but accepts no connection any more: it exited
    (idle) in between; the caller starts another one."""


def _probe(path: Path) -> bool:
    """True if a daemon accepts connections on ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        connect_unix(s, path)
    except OSError:
        return False
    finally:
        s.close()
    return True


# how long a client waits for a daemon it starts (or that another client is starting) to
# answer: a daemon that cannot start says so at once; this bounds a slow start on a busy host
DEVD_START_TIMEOUT = 20.0


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[3])


def ensure_devd(
    record: DeviceRecord,
    *,
    state_dir: Path | str | None = None,
    idle_timeout: float | None = None,
    timeout: float = DEVD_START_TIMEOUT,
) -> str:
    """Start the device's daemon as a detached process unless one runs; its socket path.

    A lock file keeps two concurrent starts from racing. :class:`DeviceError` if the
    daemon cannot start (UDP port taken, netdev gone ...) or is not ready in ``timeout``.
    """
    if record.type != "roce":
        raise DeviceError(f"device {record.name!r}: devd serves roce devices only")
    directory = ensure_state_dir(
        Path(state_dir) if state_dir is not None else default_state_dir()
    )
    path = socket_path(record.name, directory)
    if _probe(path):
        return str(path)
    with flock(directory / f"{record.name}.spawn.lock", timeout, f"devd {record.name}"):
        if _probe(path):
            return str(path)
        cmd = [
            sys.executable, "-m", "softrdma.drivers.devd.daemon", record.name,
            "--state-dir", str(directory), "--netdev", record.netdev,
            "--port", str(record.udp_port), "--roce-ver", record.roce_ver, "--daemonize",
        ]  # fmt: skip
        if record.vlan is not None:
            cmd += ["--vlan", str(record.vlan)]
        if idle_timeout is not None:
            cmd += ["--idle-timeout", repr(float(idle_timeout))]
        # the daemon waits for its first client as long as we wait for it to start: with
        # a short idle timeout on a busy host, it would otherwise exit before we connect
        cmd += ["--first-client-wait", repr(float(timeout))]
        env = dict(os.environ)
        root = _package_root()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DeviceError(
                f"devd {record.name}: did not start within {timeout:g} s"
            ) from None
        except OSError as exc:
            raise DeviceError(f"devd {record.name}: cannot run {sys.executable}: {exc}") from exc
        if proc.returncode != 0:
            lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            why = why.removeprefix(f"devd {record.name}: ")
            # the daemon's own errno is in its last line (cannot bind ...: strerror)
            code = errno.EADDRINUSE if os.strerror(errno.EADDRINUSE) in why else None
            raise DeviceError(f"cannot start devd {record.name}: {why}", errno=code)
        # not _probe(): a connection would be the daemon's first client, and its first-client
        # wait would end before the client that started it connects
        if not path.exists():
            raise DevdVanished(f"devd {record.name}: started but {path} accepts no connection")
    return str(path)


def daemonize(devd: Daemon) -> int:
    """Fork; the child starts ``devd`` and reports readiness through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(r)
        code = 0
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            try:
                log = open_state_file(
                    devd.directory / f"{devd.record.name}.log",
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                )
                devd.start()
            except (SoftRdmaError, OSError) as exc:
                os.write(w, f"E{exc}".encode())
                os._exit(1)
            os.write(w, b"OK")
            os.close(w)
            os.dup2(log, 2)
            install_signals(devd)
            devd.serve_forever()
        except BaseException as exc:  # noqa: BLE001 - the daemon reports and exits
            with contextlib.suppress(OSError):
                os.write(2, f"devd {devd.record.name}: {exc!r}\n".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    answer = b"".join(chunks).decode("utf-8", "replace")
    if answer == "OK":
        return 0
    print(answer[1:] if answer.startswith("E") else f"devd {devd.record.name}: died", file=sys.stderr)
    return 1


def install_signals(devd: Daemon) -> None:
    def stop(signum: int, frame: object) -> None:
        devd.shutdown()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

"""Port counters that outlive the processes counting them, as the kernel's do.

A RoCE device's counters are summed by its devd (:mod:`softrdma.drivers.devd.daemon`, "Port counters of a
shared device") and saved in ``<state_dir>/NAME.counters.json`` when devd exits; the next
devd adds them back (:func:`saved_counters`). An iWARP device has no devd (each TCP
connection belongs to the process that owns the QP), so each process publishes its own
counters in ``NAME.iw.PID.counters.json`` (:func:`publish`, at most every
:data:`PUBLISH_INTERVAL` seconds) and adds them to ``NAME.counters.json`` when it closes
the device (:func:`retire`); :func:`device_totals` is the saved total plus every live
process's last publication (the file of a process that died without retiring is folded
into the total). Read-modify-writes of ``NAME.counters.json`` hold
``NAME.counters.lock`` (``flock``); writes are atomic (rename). Counters never go
backwards and last until the device is deleted (:meth:`.registry.Registry.delete`
removes the file).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from ...errors import DeviceError
from .registry import ensure_state_dir, open_state_file
from .registry import state_dir as default_state_dir

__all__ = ["PUBLISH_INTERVAL", "counters_path", "saved_counters", "write_counters",
           "publish", "retire", "device_totals"]

PUBLISH_INTERVAL = 0.5  # seconds between an iWARP process's publications (as REPORT_INTERVAL)


def _dir(directory: Path | str | None) -> Path:
    return Path(directory) if directory is not None else default_state_dir()


def counters_path(name: str, directory: Path | str | None = None) -> Path:
    """``<state_dir>/<name>.counters.json``: the device's saved port counters."""
    return _dir(directory) / f"{name}.counters.json"


def _pid_path(name: str, pid: int, directory: Path | str | None) -> Path:
    return _dir(directory) / f"{name}.iw.{pid}.counters.json"


def _read(path: Path) -> dict[str, int]:
    """Counters from a JSON file: empty if missing, unreadable or not counters (the
    device then counts from zero: better than a traceback)."""
    try:
        got = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(got, dict):
        return {}
    return {k: v for k, v in got.items()
            if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def saved_counters(name: str, directory: Path | str | None = None) -> dict[str, int]:
    """The port counters saved for device ``name`` (module docstring); empty if none."""
    return _read(counters_path(name, directory))


def write_counters(path: Path, values: dict[str, int]) -> None:
    """Write ``values`` to ``path`` atomically. Best effort: a full disk loses the write."""
    body = json.dumps(values, separators=(",", ":")).encode()
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        fd = open_state_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


@contextlib.contextmanager
def _locked(name: str, directory: Path | str | None) -> Iterator[None]:
    fd = open_state_file(_dir(directory) / f"{name}.counters.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _add(total: dict[str, int], values: dict[str, int]) -> None:
    for k, v in values.items():
        total[k] = total.get(k, 0) + v


def publish(name: str, values: dict[str, int], directory: Path | str | None = None) -> None:
    """This process's current counters of iWARP device ``name`` (cumulative)."""
    try:
        ensure_state_dir(_dir(directory))
    except DeviceError:
        return  # no usable state directory: nothing outlives the process
    write_counters(_pid_path(name, os.getpid(), directory), values)


def retire(name: str, values: dict[str, int], directory: Path | str | None = None) -> None:
    """This process is done with device ``name``: its final counters join the saved
    total and its publication goes, in one step (under the lock)."""
    with contextlib.suppress(OSError), _locked(name, directory):
        total = saved_counters(name, directory)
        _add(total, values)
        write_counters(counters_path(name, directory), total)
        with contextlib.suppress(FileNotFoundError):
            _pid_path(name, os.getpid(), directory).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def device_totals(name: str, directory: Path | str | None = None) -> dict[str, int]:
    """Device ``name``'s counters: the saved total plus every live process's last
    publication (a dead process's is folded into the saved total)."""
    d = _dir(directory)
    prefix = f"{name}.iw."
    try:
        with _locked(name, directory):
            total = saved_counters(name, directory)
            folded = False
            live: dict[str, int] = {}
            for path in d.glob(f"{prefix}*.counters.json"):
                pid_text = path.name[len(prefix):-len(".counters.json")]
                if not pid_text.isdigit():
                    continue
                values = _read(path)
                if _alive(int(pid_text)):
                    _add(live, values)
                else:
                    _add(total, values)
                    folded = True
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
            if folded:
                write_counters(counters_path(name, directory), total)
    except OSError:
        return saved_counters(name, directory)
    _add(total, live)
    return total

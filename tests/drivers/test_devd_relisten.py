"""A killed listener's port is free again at once (issue 22, the perftest ``-R`` re-listen
race): devd routes a CM service ID to the one client that listens on it, and a listen
by another client while the first's process has exited, but before devd has read that
end-of-file (both in one select batch, or devd not scheduled yet on a busy host), was
refused with EADDRINUSE. devd now looks whether the holder's control channel has hung
up before refusing."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.devd import state  # noqa: F401  (fixture)
from harness.ports import free_port

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.proto import OP_CM_LISTEN, REP, REQ, with_seq
from softrdma.drivers.devd.spawn import ensure_devd
from softrdma.drivers.host.registry import DeviceRecord

SERVICE_ID = 0x0106000000004E21  # RDMA_PS_TCP, port 20001 (IBA A11.2)
MASK = (1 << 64) - 1
PKG = str(Path(__file__).resolve().parents[2] / "src")

_LISTENER = """
import sys, time
from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.host.registry import DeviceRecord
rec = DeviceRecord("rl0", "lo", "roce", int(sys.argv[2]))
link = DevdLink(rec, state_dir=sys.argv[1], spawn=False)
link.cm_slot()
link.cm_listen(int(sys.argv[3]), int(sys.argv[4]))
print("listening", flush=True)
time.sleep(600)
"""


def _wait_stopped(pid: int) -> None:
    """Until the process is stopped (a signal is delivered asynchronously)."""
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "devd did not stop"
        time.sleep(0.005)


@pytest.fixture
def devd(state: Path) -> Iterator[tuple[DeviceRecord, int]]:  # noqa: F811
    rec = DeviceRecord("rl0", "lo", "roce", free_port())
    ensure_devd(rec, state_dir=state, idle_timeout=60.0)
    pid = int((state / "rl0.pid").read_text())
    try:
        yield rec, pid
    finally:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def test_listen_of_a_killed_process_is_free_at_once(state: Path,  # noqa: F811
                                                    devd: tuple[DeviceRecord, int]) -> None:
    rec, pid = devd
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (PKG, os.environ.get("PYTHONPATH")) if p))
    first = subprocess.Popen([sys.executable, "-c", _LISTENER, str(state), str(rec.udp_port),
                              str(SERVICE_ID), str(MASK)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert first.stdout is not None and first.stderr is not None
        line = first.stdout.readline()
        assert line == "listening\n", (line, first.stderr.read() if first.poll() else "")
        with DevdLink(rec, state_dir=state, spawn=False) as link:
            link.cm_slot()
            with pytest.raises(Exception) as busy:  # the first one is alive: refused
                link.cm_listen(SERVICE_ID, MASK)
            assert getattr(busy.value, "errno", None) == errno.EADDRINUSE
            # devd stopped: the first process dies and our listen waits in devd's queue,
            # so devd meets both (its end-of-file and our request) in one select batch
            os.kill(pid, signal.SIGSTOP)
            try:
                _wait_stopped(pid)
                first.kill()
                first.wait()
                raw = SERVICE_ID.to_bytes(8, "big") + MASK.to_bytes(8, "big")
                link._ctrl.send(with_seq(REQ.pack(OP_CM_LISTEN, 0, raw), 0x42))
            finally:
                os.kill(pid, signal.SIGCONT)
            link._ctrl.settimeout(60.0)
            rep = link._ctrl.recv(4096)
            op, err, _ = REP.unpack_from(rep)
            assert (op, rep[1], err) == (OP_CM_LISTEN, 0x42, 0), os.strerror(err)
            link.cm_listen(SERVICE_ID, MASK, listen=False)  # it is ours: undone
    finally:
        if first.poll() is None:
            first.kill()
        first.wait()
        for f in (first.stdout, first.stderr):
            if f is not None:
                f.close()

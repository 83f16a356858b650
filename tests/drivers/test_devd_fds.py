"""devd survives descriptor exhaustion (issue 13 item 4): with a low RLIMIT_NOFILE and a
flood of idle control connections it refuses the excess clients with a reason (per-uid
cap, EMFILE/ENFILE on accept or socketpair) and keeps serving the data path of the
clients it has."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.devd import LOCAL, packet, recv_one
from harness.ports import free_port

from softrdma.drivers.devd.admission import FD_RESERVE, FDS_PER_CLIENT, per_uid_cap, refusal_reason
from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.proto import socket_path
from softrdma.drivers.host.registry import DeviceRecord, ensure_state_dir
from softrdma.errors import DeviceError

NOFILE = 128  # soft = hard: the daemon cannot raise it
FLOOD = 200  # idle control connections: far more than 128 descriptors can serve

# A devd in its own process; the per-uid cap is given on the command line (argv[3]).
_DAEMON = """
import sys
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.host.registry import DeviceRecord
d = Devd(DeviceRecord("fd0", "lo", "roce", int(sys.argv[2])), sys.argv[1], idle_timeout=60,
         ips=["127.0.0.1"], max_clients_per_uid=int(sys.argv[3]))
d.serve_forever()
"""


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture(params=["uid-cap", "emfile"])
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[DeviceRecord, Path,
                                                                             subprocess.Popen[bytes]]]:
    state = ensure_state_dir(tmp_path / "state")
    rec = DeviceRecord("fd0", "lo", "roce", free_port())
    cap = "1024" if request.param == "uid-cap" else "100000"
    p = subprocess.Popen([sys.executable, "-c", _DAEMON, str(state), str(rec.udp_port), cap],
                         preexec_fn=_low_nofile, stderr=subprocess.PIPE)  # noqa: PLW1509
    try:
        deadline = time.monotonic() + 20
        while not socket_path("fd0", state).exists():
            assert p.poll() is None, p.stderr.read() if p.stderr else b""
            assert time.monotonic() < deadline, "devd did not start"
            time.sleep(0.02)
        yield rec, state, p
    finally:
        p.kill()
        p.wait(10)
        if p.stderr:
            p.stderr.close()


def _connect(s: socket.socket, path: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            s.connect(path)
            return
        except BlockingIOError:  # the listen backlog is full for a moment
            assert time.monotonic() < deadline
            time.sleep(0.005)


def test_flood_of_idle_clients_leaves_the_data_path_working(daemon) -> None:
    rec, state, proc = daemon
    path = str(socket_path("fd0", state))
    client = DevdLink(rec, state_dir=state, spawn=False)
    idle: list[socket.socket] = []
    channels: list[int] = []
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        qpn = client.alloc_qpn()
        answers = []
        for _ in range(FLOOD):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.settimeout(10)
            idle.append(s)
            _connect(s, path)
            # every connection gets an answer: a HELLO (with the data channel) or a refusal
            answers.append(socket.recv_fds(s, 4096, 1))
        refused = [refusal_reason(msg) for msg, _, _, _ in answers]
        channels = [fd for _, fds, _, _ in answers for fd in fds]  # held open: idle clients
        reasons = [r for r in refused if r is not None]
        assert proc.poll() is None, "devd died"
        assert len(reasons) >= FLOOD - (NOFILE - FD_RESERVE) // FDS_PER_CLIENT
        assert all(("too many clients" in r) or ("descriptors" in r) or ("data channel" in r)
                   for r in reasons), set(reasons)
        # the existing client's data path still works
        data = packet(qpn, b"still here")
        sender.sendto(data, (LOCAL, rec.udp_port))
        assert bytes(recv_one(client, timeout=5).data) == data
        assert client.stats()["clients_refused"] == len(reasons)
        # a new client is refused with a clear error while the flood holds its descriptors
        with pytest.raises(DeviceError, match="refused"):
            DevdLink(rec, state_dir=state, spawn=False, timeout=5)
        for s in idle:
            s.close()
        idle.clear()
        for fd in channels:
            os.close(fd)
        channels.clear()
        deadline = time.monotonic() + 10
        while True:  # once the flood is gone, new clients are served again
            try:
                with DevdLink(rec, state_dir=state, spawn=False, timeout=5) as late:
                    q2 = late.alloc_qpn()
                    sender.sendto(packet(q2, b"late"), (LOCAL, rec.udp_port))
                    assert bytes(recv_one(late, timeout=5).data) == packet(q2, b"late")
                break
            except DeviceError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert proc.poll() is None
    finally:
        for s in idle:
            s.close()
        for fd in channels:
            os.close(fd)
        sender.close()
        client.close()


def test_per_uid_cap_is_half_the_budget() -> None:
    assert per_uid_cap(128) == (128 - FD_RESERVE) // FDS_PER_CLIENT // 2
    assert per_uid_cap(1 << 20) == 1024
    assert per_uid_cap(10) == 1

"""devd against hostile or stuck clients (issue 21 items 3-5): a malformed control message
or a wrong passed descriptor drops that client only; a client whose timeout ran out while
devd was stalled is not answered the previous request's reply afterwards; a client stuck
between JOIN and JOINED does not hold up every other one. All traffic is on 127.0.0.1."""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.devd import Running
from harness.ports import free_port

from softrdma.drivers.devd import proto
from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.devd.proto import socket_path
from softrdma.drivers.host.registry import DeviceRecord, ensure_state_dir
from softrdma.errors import DeviceError

LOCAL = "127.0.0.1"


def _start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, join_timeout: float) -> Running:
    state = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    monkeypatch.delenv("SOFTRDMA_DEVD_DIRECT", raising=False)  # the direct path: JOIN/JOINED
    d = Devd(DeviceRecord("hd0", "lo", "roce", 0), state, idle_timeout=30.0, ips=[LOCAL],
             join_timeout=join_timeout)
    d.start()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    return Running(d, t, state)


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    r = _start(tmp_path, monkeypatch, join_timeout=1.0)
    try:
        yield r
    finally:
        r.devd.shutdown()
        r.thread.join(5)
        assert not r.thread.is_alive()


_DATA: dict[int, socket.socket] = {}  # id(control connection) -> its data channel


def raw_client(r: Running) -> socket.socket:
    """A control connection that speaks the protocol by hand (its data channel is kept
    open until :func:`close_raw`)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    s.connect(str(socket_path("hd0", r.state)))
    msg, fds, _, _ = socket.recv_fds(s, 4096, 1)
    assert msg[:4] == proto.MAGIC and len(fds) == 1
    _DATA[id(s)] = socket.socket(fileno=fds[0])
    return s


def close_raw(s: socket.socket) -> None:
    data = _DATA.pop(id(s), None)
    if data is not None:
        data.close()
    s.close()


def req(op: int, arg: int = 0, seq: int = 7) -> bytes:
    return proto.with_seq(proto.REQ.pack(op, arg, bytes(16)), seq)


def answer(s: socket.socket) -> bytes:
    """The next reply; b"" once devd closed the connection."""
    try:
        return s.recv(4096)
    except ConnectionResetError:
        return b""


def reuseport_socket(port: int) -> socket.socket:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    u.bind((LOCAL, port))
    return u


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- item 3: malformed control messages ------------------------------------------------------


def test_malformed_control_messages_drop_only_their_client(running: Running) -> None:
    devd = running.devd
    port = devd.udp_port
    before = open_fds()
    dropped = 0

    def expect_dropped(s: socket.socket) -> None:
        nonlocal dropped
        assert answer(s) == b"", "devd should have closed this client"
        close_raw(s)
        dropped += 1
        assert running.thread.is_alive()

    # the reported case: JOIN, then JOINED 2 with two pipes
    s = raw_client(running)
    s.send(req(proto.OP_JOIN))
    rop, err, slot = proto.REP.unpack(answer(s))
    assert (rop, err) == (proto.OP_JOIN, 0) and slot
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    socket.send_fds(s, [req(proto.OP_JOINED, 2)], [r1, w2])
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    expect_dropped(s)

    others: list[socket.socket] = []
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    other_port = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other_port.bind((LOCAL, 0))
    no_reuse = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    right = reuseport_socket(port)
    others += [a, b, tcp, other_port, no_reuse, right]
    bad_fd_cases: list[tuple[int, list[int]]] = [
        (1, [a.fileno()]),  # a Unix socket
        (1, [tcp.fileno()]),  # TCP
        (1, [other_port.fileno()]),  # UDP on another port
        (1, [no_reuse.fileno()]),  # UDP, not bound
        (2, [right.fileno()]),  # count and descriptors disagree
        (0, [right.fileno()]),
    ]
    for n, fds in bad_fd_cases:
        s = raw_client(running)
        s.send(req(proto.OP_JOIN))
        assert proto.REP.unpack(answer(s))[1] == 0
        socket.send_fds(s, [req(proto.OP_JOINED, n)], fds)
        expect_dropped(s)
    # descriptors with any other request; more descriptors than a JOINED may carry
    for op, fds in ((proto.OP_ALLOC_QPN, [right.fileno()]), (proto.OP_STATS, [a.fileno()]),
                    (proto.OP_JOINED, [right.fileno()] * 6)):
        s = raw_client(running)
        socket.send_fds(s, [req(op, len(fds))], fds)
        expect_dropped(s)
    # bad op, bad lengths, bad REPORT: an error answer, the connection stays usable
    s = raw_client(running)
    for msg, want in ((req(200), (200, errno.EOPNOTSUPP)), (b"\x01\x07\x00", (1, errno.EINVAL)),
                      (b"\x05", (5, errno.EINVAL)), (req(proto.OP_ALLOC_QPN) + b"x",
                                                     (1, errno.EINVAL)),
                      (req(proto.OP_REPORT) + b"{not json", (proto.OP_REPORT, errno.EINVAL)),
                      (req(proto.OP_REPORT) + b'{"a": -1}', (proto.OP_REPORT, errno.EINVAL)),
                      (req(proto.OP_REPORT) + b'{"rcvd_pkts": 18446744073709551616}',
                       (proto.OP_REPORT, errno.EINVAL)),
                      (req(proto.OP_REPORT) + b'{"rcvd_pkts": true}',
                       (proto.OP_REPORT, errno.EINVAL))):
        s.send(msg)
        rep = answer(s)
        assert proto.REP.unpack_from(rep)[:2] == want
    s.send(req(proto.OP_ALLOC_QPN, seq=9))
    rep = answer(s)
    assert rep[proto.SEQ_OFFSET] == 9 and proto.REP.unpack(rep)[:2] == (proto.OP_ALLOC_QPN, 0)
    close_raw(s)
    for o in others:
        o.close()

    assert running.thread.is_alive()
    assert devd.counters["ctrl_malformed"] == dropped == 10
    # devd kept none of the descriptors it was passed (it runs in this process)
    deadline = time.monotonic() + 10
    while open_fds() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert open_fds() <= before
    # and still serves a good client, on the direct path
    with running.client(direct=True) as link:
        assert link.direct
        qpn = link.alloc_qpn()
        link.free_qpn(qpn)
        assert link.stats()["ctrl_malformed"] == dropped


# -- item 4: a stalled devd ------------------------------------------------------------------

_DAEMON = """
import sys
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.host.registry import DeviceRecord
Devd(DeviceRecord("hd1", "lo", "roce", int(sys.argv[2])), sys.argv[1], idle_timeout=60,
     ips=["127.0.0.1"]).serve_forever()
"""


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[tuple[DeviceRecord, Path, subprocess.Popen[bytes]]]:
    state = ensure_state_dir(tmp_path / "state")
    rec = DeviceRecord("hd1", "lo", "roce", free_port())
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    p = subprocess.Popen([sys.executable, "-c", _DAEMON, str(state), str(rec.udp_port)])
    try:
        deadline = time.monotonic() + 20
        while not socket_path("hd1", state).exists():
            assert p.poll() is None and time.monotonic() < deadline, "devd did not start"
            time.sleep(0.02)
        yield rec, state, p
    finally:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait(10)


def test_requests_after_a_stall_get_their_own_answers(daemon) -> None:
    rec, state, proc = daemon
    with DevdLink(rec, state_dir=state, spawn=False, direct=False) as link:
        first = link.alloc_qpn()
        link.ctrl_timeout = 0.3  # the knob: a short wait for each answer
        proc.send_signal(signal.SIGSTOP)
        _wait_stopped(proc.pid)
        try:
            with pytest.raises(DeviceError) as info:
                link.stats()  # devd is stopped: no answer in time
            assert info.value.errno == errno.ETIMEDOUT and "did not answer" in str(info.value)
            with pytest.raises(DeviceError):
                link.report_counters({"rcvd_pkts": 3})
            link.free_qpn(first)  # sent: devd frees it when it resumes (a QP destroy works)
        finally:
            proc.send_signal(signal.SIGCONT)
        link.ctrl_timeout = 20.0
        assert not link.daemon_gone  # stalled, not gone
        # the late STATS and REPORT answers arrive now, and are not taken for these
        qpns = [link.alloc_qpn() for _ in range(3)]
        assert len(set(qpns)) == 3
        for q in qpns:
            link.free_qpn(q)
        assert link.stats()["clients"] == 1
        assert link.stale_replies == 3
        with pytest.raises(DeviceError) as info:
            link.free_qpn(first)  # the stalled FREE did free it
        assert info.value.errno == errno.ENOENT


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError("devd did not stop")


# -- item 5: a client stuck between JOIN and JOINED --------------------------------------------


def test_a_stuck_join_does_not_block_other_clients(running: Running) -> None:
    stuck = raw_client(running)
    stuck.send(req(proto.OP_JOIN, seq=3))
    rep = answer(stuck)
    assert rep[proto.SEQ_OFFSET] == 3 and proto.REP.unpack(rep)[1] == 0
    # it never sends JOINED; the next client is served once its turn expires
    t0 = time.monotonic()
    other = DevdLink(running.record, state_dir=running.state, spawn=False, direct=True,
                     timeout=8.0)
    try:
        assert time.monotonic() - t0 < 8.0
        assert other.direct  # the stuck client bound nothing: the group is as mirrored
        assert running.devd.counters["join_timeouts"] == 1
        # its late JOINED gets slot 0 (the forwarded path), the other client is unharmed
        late = reuseport_socket(running.devd.udp_port)
        socket.send_fds(stuck, [req(proto.OP_JOINED, 1, seq=4)], [late.fileno()])
        rep = answer(stuck)
        assert rep[proto.SEQ_OFFSET] == 4 and proto.REP.unpack(rep) == (proto.OP_JOINED, 0, 0)
        late.close()
        stuck.send(req(proto.OP_JOIN, seq=5))  # and it gets no second turn
        rep = answer(stuck)
        assert rep[proto.SEQ_OFFSET] == 5
        assert proto.REP.unpack(rep) == (proto.OP_JOIN, errno.EOPNOTSUPP, 0)
        qpn = other.alloc_qpn()
        _send_and_receive(other, qpn, running.devd.udp_port)
        assert other.counters["rx_direct"] >= 1
    finally:
        other.close()
        close_raw(stuck)


def test_a_stuck_join_that_bound_leaves_the_others_forwarded(running: Running) -> None:
    stuck = raw_client(running)
    stuck.send(req(proto.OP_JOIN))
    assert proto.REP.unpack(answer(stuck))[1] == 0
    squatter = reuseport_socket(running.devd.udp_port)  # bound, never announced
    squatter.setblocking(False)
    try:
        with DevdLink(running.record, state_dir=running.state, spawn=False, direct=True,
                      timeout=8.0) as other:
            # the kernel's group holds a socket devd does not know of: its order is not
            # the mirror's, so the new client stays on the forwarded path
            assert not other.direct
            assert running.devd.counters["direct_refused"] == 1
            qpn = other.alloc_qpn()
            _send_and_receive(other, qpn, running.devd.udp_port)
            with pytest.raises(BlockingIOError):
                squatter.recv(4096)  # nothing of the other client's went to it
    finally:
        squatter.close()
        close_raw(stuck)


def _send_and_receive(link: DevdLink, qpn: int, port: int) -> None:
    pkt = struct.pack("!BBHII", 0x04, 0, 0xFFFF, qpn, 0) + b"payload" + bytes(4)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            tx.sendto(pkt, (LOCAL, port))
            end = time.monotonic() + 0.5
            while not got and time.monotonic() < end:
                got = [bytes(d.data) for d in link.recv_batch(8)]
                if not got:
                    time.sleep(0.005)
        assert got and got[0] == pkt
    finally:
        tx.close()

"""The per-device demultiplexer (devd) and its client link (design.md "Devices shared by
processes"). All traffic is on 127.0.0.1."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import statistics
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.devd import (  # noqa: F401  (fixtures)
    LOCAL,
    Running,
    packet,
    recv_one,
    running,
    start_devd,
    state,
    wait_for,
)
from harness.ports import free_port

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.devd.proto import QPN_FIRST, QPN_LAST, socket_path
from softrdma.drivers.devd.spawn import ensure_devd
from softrdma.drivers.host.registry import DeviceRecord
from softrdma.drivers.links.udp import UdpLink
from softrdma.errors import ClosedError, DeviceError, InvalidArgument

LOCAL_B = socket.inet_aton(LOCAL)
V4_MAPPED = bytes(10) + b"\xff\xff"


@pytest.fixture
def sender() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((LOCAL, 0))
    yield s
    s.close()


# -- QPN allocation -------------------------------------------------------------------------


@pytest.mark.iba("10.2.4")
def test_two_clients_get_distinct_qpns(running: Running) -> None:  # noqa: F811
    with running.client() as a, running.client() as b:
        qa = [a.alloc_qpn() for _ in range(3)]
        qb = [b.alloc_qpn() for _ in range(3)]
        assert qa + qb == [QPN_FIRST + i for i in range(6)]
        assert a.local_ips == (LOCAL_B,)
        assert a.udp_port == running.devd.udp_port
        assert a.daemon_pid == os.getpid()
        # a freed QPN is not handed out again at once (allocation moves upwards)
        a.free_qpn(qa[0])
        assert b.alloc_qpn() == QPN_FIRST + 6
        with pytest.raises(DeviceError) as ei:
            a.free_qpn(qb[0])  # not a's
        assert ei.value.errno == errno.ENOENT
        with pytest.raises(DeviceError) as ei:
            a.alloc_qpn(qb[1])  # a specific QPN in use
        assert ei.value.errno == errno.EBUSY
        assert a.alloc_qpn(0x123456) == 0x123456
        with pytest.raises(InvalidArgument):
            a.alloc_qpn(0x1000000)


def test_no_descriptor_of_a_client_is_inherited(running: Running) -> None:  # noqa: F811
    """A client's descriptors are close-on-exec (PEP 446), the data socket devd hands over
    with SCM_RIGHTS too: it was inheritable, so every program a softrdma process ran (a
    test runner's children, ``softrdma run``'s program's) kept the client's data socket."""
    before = set(os.listdir("/proc/self/fd"))
    with running.client() as a:
        a.alloc_qpn()
        mine = set(os.listdir("/proc/self/fd")) - before
        assert mine, "the client opened no descriptor"
        for fd in mine:
            with contextlib.suppress(OSError):  # (one closed meanwhile)
                assert not os.get_inheritable(int(fd)), os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.iba("10.2.4")
def test_qpn_wraps_and_skips_used(running: Running) -> None:  # noqa: F811
    with running.client() as a:
        first = a.alloc_qpn()
        assert first == QPN_FIRST
        running.devd._next_qpn = QPN_LAST  # jump to the end of the space
        assert a.alloc_qpn() == QPN_LAST
        assert a.alloc_qpn() == QPN_FIRST + 1  # wrapped, skipped QPN_FIRST (in use)


# -- forwarding ------------------------------------------------------------------------------


def test_datagram_reaches_owner_only(running: Running, sender: socket.socket) -> None:  # noqa: F811
    sender.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x0A)
    port = running.devd.udp_port
    with running.client() as a, running.client() as b:
        qa, qb = a.alloc_qpn(), b.alloc_qpn()
        to_a = packet(qa, b"for A" * 10)
        to_b = packet(qb, b"for B")
        sender.sendto(to_a, (LOCAL, port))
        sender.sendto(to_b, (LOCAL, port))
        got_a = recv_one(a)
        assert bytes(got_a.data) == to_a  # forwarded unmodified
        assert got_a.src_ip == LOCAL_B and got_a.dst_ip == LOCAL_B
        assert got_a.sport == sender.getsockname()[1]
        assert got_a.dport == port
        assert got_a.tos == 0x0A and got_a.ttl == 64
        # b's first datagram is its own: a's was not copied to b (the daemon keeps order)
        assert bytes(recv_one(b).data) == to_b
        assert a.recv_batch() == [] and b.recv_batch() == []
        st = a.stats()
        assert st["rx"] == 2 and st["forwarded"] == 2 and st["unknown_qpn"] == 0


def test_batch_and_ring_reuse(running: Running, sender: socket.socket) -> None:  # noqa: F811
    with running.client() as a:
        q = a.alloc_qpn()
        pkts = [packet(q, bytes([i]) * (i + 1)) for i in range(10)]
        for p in pkts:
            sender.sendto(p, (LOCAL, running.devd.udp_port))
        wait_for(lambda: running.devd.counters["forwarded"] == 10)
        first = a.recv_batch(4)
        assert [bytes(d.data) for d in first] == pkts[:4]
        rest = a.recv_batch(64)
        assert [bytes(d.data) for d in rest] == pkts[4:]


@pytest.mark.iba("9.6.1.4")
def test_unknown_qpn_and_short_datagrams_dropped(running: Running, sender: socket.socket) -> None:  # noqa: F811
    with running.client() as a:
        q = a.alloc_qpn()
        port = running.devd.udp_port
        sender.sendto(packet(q + 100), (LOCAL, port))
        sender.sendto(b"\x04\x00\xff\xff\x00\x00\x00", (LOCAL, port))  # shorter than a BTH
        sender.sendto(packet(q, b"ok"), (LOCAL, port))
        assert bytes(recv_one(a).data) == packet(q, b"ok")
        st = a.stats()
        assert st["unknown_qpn"] == 1 and st["malformed"] == 1 and st["forwarded"] == 1
        assert st["rx"] == 3


@pytest.mark.iba("9.6.1.4")
def test_late_packets_of_destroyed_qps_count_closed_qpn(
    running: Running, sender: socket.socket, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """A peer's packets still in flight when the application destroyed its QPs, or left
    (ibv_srq_pingpong against rxe: sends beyond -n arrive after the server exited), are
    dropped and counted ``closed_qpn``, apart from QPNs nobody ever had (``unknown_qpn``,
    what the interop suite reads as a routing fault); both are ``rcvd_unknown_qp``."""
    monkeypatch.setattr("softrdma.drivers.devd.qpn.CLOSED_KEPT", 3)
    port = running.devd.udp_port
    with running.client() as a, running.client() as b:
        freed = a.alloc_qpn()
        kept = a.alloc_qpn()
        gone = b.alloc_qpn()
        a.free_qpn(freed)  # ibv_destroy_qp
        b.close()  # a process that exits
        wait_for(lambda: len(running.devd._clients) == 1)
        for q in (freed, gone, gone, QPN_LAST):  # QPN_LAST: never allocated
            sender.sendto(packet(q), (LOCAL, port))
        sender.sendto(packet(kept, b"ok"), (LOCAL, port))
        assert bytes(recv_one(a).data) == packet(kept, b"ok")
        st = a.stats()
        assert (st["closed_qpn"], st["unknown_qpn"], st["forwarded"]) == (3, 1, 1)
        assert a.device_counters()["rcvd_unknown_qp"] == 4
        # allocated again by number: its packets are forwarded, not dropped
        assert a.alloc_qpn(freed) == freed
        sender.sendto(packet(freed, b"again"), (LOCAL, port))
        assert bytes(recv_one(a).data) == packet(freed, b"again")
        # the memory is bounded (CLOSED_KEPT): the oldest closed QPN is forgotten
        extra = [a.alloc_qpn() for _ in range(3)]
        for q in extra:
            a.free_qpn(q)
        sender.sendto(packet(gone), (LOCAL, port))
        sender.sendto(packet(extra[0]), (LOCAL, port))
        wait_for(lambda: a.stats()["rx"] == 8)
        st = a.stats()
        assert (st["closed_qpn"], st["unknown_qpn"]) == (4, 2)


def test_qp1_delivered_to_every_registered_client(
    running: Running, sender: socket.socket  # noqa: F811
) -> None:
    port = running.devd.udp_port
    with running.client() as a, running.client() as b, running.client() as c:
        assert a.alloc_qpn(1) == 1 and b.alloc_qpn(1) == 1
        qc = c.alloc_qpn()
        mad = packet(1, bytes(8) + b"M" * 256, opcode=0x64)
        sender.sendto(mad, (LOCAL, port))
        sender.sendto(packet(qc), (LOCAL, port))
        assert bytes(recv_one(a).data) == mad
        assert bytes(recv_one(b).data) == mad
        assert bytes(recv_one(c).data) == packet(qc)  # c did not get the MAD
        a.free_qpn(1)
        sender.sendto(mad, (LOCAL, port))
        sender.sendto(packet(qc), (LOCAL, port))
        assert bytes(recv_one(b).data) == mad
        recv_one(c)
        assert a.recv_batch() == []
        with pytest.raises(DeviceError):
            a.free_qpn(1)


def _group(n: int) -> bytes:
    """A 239/8 group private to this test run (Annex A17; ../shared/specs/roce.md §4: MGID ::ffff:a.b.c.d)."""
    return bytes((239, 77 + n, (os.getpid() >> 8) & 0xFF, os.getpid() & 0xFF))


@pytest.mark.iba("10.5", "10.5.2")
def test_multicast_to_attached_clients(running: Running, sender: socket.socket) -> None:  # noqa: F811
    port = running.devd.udp_port
    # Annex A17; ../shared/specs/roce.md §4: the MGID of an IPv4 group is ::ffff:a.b.c.d; the first attachment makes
    # devd join the IP group on its socket, and devd matches the datagram's destination
    group, other_group = _group(0), _group(1)
    mgid, other = V4_MAPPED + group, V4_MAPPED + other_group
    link = running.devd._links[0]
    sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, LOCAL_B)
    with running.client() as a, running.client() as b:
        qb = b.alloc_qpn()
        a.attach_mcast(mgid)
        a.attach_mcast(mgid)  # a second QP of the same process
        b.attach_mcast(other)
        assert set(link.mcast_groups) == {mgid, other}
        mc = packet(0xFFFFFF, b"group")
        sender.sendto(mc, (socket.inet_ntoa(group), port))
        sender.sendto(packet(qb), (LOCAL, port))
        got = recv_one(a)
        assert bytes(got.data) == mc and got.dst_ip == group
        assert bytes(recv_one(b).data) == packet(qb)
        a.detach_mcast(mgid)  # one attachment left
        sender.sendto(mc, (socket.inet_ntoa(group), port))
        assert bytes(recv_one(a).data) == mc
        a.detach_mcast(mgid)
        assert link.mcast_groups == (other,)  # the last detachment left the IP group
        with pytest.raises(DeviceError) as ei:
            a.detach_mcast(mgid)
        assert ei.value.errno == errno.ENOENT
        before = running.devd.counters["rx"]
        sender.sendto(mc, (socket.inet_ntoa(group), port))
        sender.sendto(packet(qb), (LOCAL, port))  # a marker behind it
        assert bytes(recv_one(b).data) == packet(qb)
        assert running.devd.counters["rx"] == before + 1  # the group datagram never came
        assert a.recv_batch() == []
        with pytest.raises(InvalidArgument):
            a.attach_mcast(b"short")
        with pytest.raises(DeviceError) as ei:
            a.attach_mcast(V4_MAPPED + LOCAL_B)  # a unicast GID is no group
        assert ei.value.errno == errno.EINVAL
        with pytest.raises(DeviceError) as ei:
            a.attach_mcast(bytes.fromhex("ff0e" + "00" * 13 + "01"))  # no IPv6 address
        assert ei.value.errno == errno.EAFNOSUPPORT


def test_disconnect_frees_qpns(running: Running, sender: socket.socket) -> None:  # noqa: F811
    b = running.client()
    a = running.client()
    qa = a.alloc_qpn()
    a.alloc_qpn(1)
    a.attach_mcast(V4_MAPPED + _group(2))
    assert running.devd._links[0].mcast_groups == (V4_MAPPED + _group(2),)
    a.close()
    wait_for(lambda: len(running.devd._clients) == 1)
    assert qa not in running.devd._owners
    assert running.devd._qp1 == [] and running.devd._groups == {}
    assert running.devd._links[0].mcast_groups == ()  # the group was left
    assert b.alloc_qpn(qa) == qa  # free again
    b.close()


def test_client_send_goes_out_directly(running: Running) -> None:  # noqa: F811
    with running.client() as a, UdpLink(LOCAL, 0) as peer:
        assert peer.port is not None
        sport = a.effective_sport(0xC123)
        a.send(peer.local_ips[0], peer.port, sport, [b"\x04\x00", memoryview(b"abc")])
        got = recv_one(peer)
        assert bytes(got.data) == b"\x04\x00abc"
        assert got.sport == sport and got.src_ip == LOCAL_B
        with pytest.raises(InvalidArgument):
            a.send(bytes(16), peer.port, sport, [b"x"])  # the device has no IPv6 here


def test_protocol_errors(running: Running) -> None:  # noqa: F811
    path = socket_path("t0", running.state)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(2)
    s.connect(str(path))
    msg, fds, _, _ = socket.recv_fds(s, 4096, 1)
    assert msg[:4] == b"SRDV" and len(fds) == 1
    s.send(b"\x01\x02")  # wrong size
    assert struct.unpack("!BxHI", s.recv(64)) == (1, errno.EINVAL, 0)
    s.send(struct.pack("!BxxxI16s", 99, 0, bytes(16)))  # unknown op
    assert struct.unpack("!BxHI", s.recv(64)) == (99, errno.EOPNOTSUPP, 0)
    os.close(fds[0])  # closing the data channel ends the session
    wait_for(lambda: not running.devd._clients)
    s.close()


def test_closed_link(running: Running) -> None:  # noqa: F811
    a = running.client()
    a.close()
    a.close()
    assert a.fileno() is None
    with pytest.raises(ClosedError):
        a.recv_batch()
    with pytest.raises(ClosedError):
        a.alloc_qpn()


def test_daemon_gone_is_reported(state: Path) -> None:  # noqa: F811
    r = start_devd(state, name="gone")
    a = r.client()
    r.devd.shutdown()
    r.thread.join(5)
    fd = a.fileno()
    assert fd is not None
    select.select([fd], [], [], 2)
    with pytest.raises(DeviceError, match=r"its devd \(pid \d+\) is gone"):
        a.recv_batch()
    with pytest.raises(DeviceError):
        a.alloc_qpn()
    a.close()


# -- lifetime ----------------------------------------------------------------------------------


def test_idle_exit(state: Path) -> None:  # noqa: F811
    r = start_devd(state, name="idle", idle_timeout=0.3)
    path = socket_path("idle", state)
    a = r.client()
    time.sleep(0.5)  # a client is connected: no exit
    assert r.thread.is_alive()
    a.close()
    t0 = time.monotonic()
    r.thread.join(5)
    assert not r.thread.is_alive()
    assert 0.2 <= time.monotonic() - t0 < 3
    assert not path.exists()
    assert not (state / "idle.pid").exists()


def test_no_client_at_all_exits(state: Path) -> None:  # noqa: F811
    r = start_devd(state, name="never", idle_timeout=0.1)
    r.thread.join(5)
    assert not r.thread.is_alive()


def test_stale_socket_replaced(state: Path) -> None:  # noqa: F811
    state.mkdir(parents=True)
    path = socket_path("stale", state)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(path))  # a daemon that died without removing its socket
    dead.close()
    assert path.exists()
    with pytest.raises(DeviceError):
        DevdLink(DeviceRecord("stale", "lo", "roce", 1), state_dir=state, spawn=False)
    r = start_devd(state, name="stale")
    try:
        with r.client() as a:
            assert a.alloc_qpn() == QPN_FIRST
    finally:
        r.devd.shutdown()
        r.thread.join(5)


def test_second_daemon_refused(running: Running) -> None:  # noqa: F811
    d2 = Devd(
        DeviceRecord("t0", "lo", "roce", 0), running.state, ips=[LOCAL], lock_wait=0.05
    )
    with pytest.raises(DeviceError, match="another devd"):
        d2.start()
    with running.client() as a:  # the first one is untouched
        assert a.alloc_qpn() == QPN_FIRST


def test_port_in_use_in_process(state: Path, sender: socket.socket) -> None:  # noqa: F811
    port = sender.getsockname()[1]
    d = Devd(DeviceRecord("busy", "lo", "roce", port), state, ips=[LOCAL])
    with pytest.raises(DeviceError, match="Address already in use"):
        d.start()
    assert not socket_path("busy", state).exists()
    d2 = Devd(DeviceRecord("busy", "lo", "roce", 0), state, ips=[LOCAL])
    d2.start()  # the failed one released the device lock
    d2.shutdown()
    d2.serve_forever()


def test_iwarp_device_refused(state: Path) -> None:  # noqa: F811
    with pytest.raises(DeviceError, match="roce"):
        Devd(DeviceRecord("iw", "lo", "iwarp", 4791), state)
    with pytest.raises(DeviceError, match="roce"):
        ensure_devd(DeviceRecord("iw", "lo", "iwarp", 4791), state_dir=state)


# -- spawned daemon ----------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def spawned(state: Path) -> Iterator[DeviceRecord]:  # noqa: F811
    """A device whose daemon is spawned by the test; always killed at the end."""
    rec = DeviceRecord("sp0", "lo", "roce", free_port())
    try:
        yield rec
    finally:
        pidfile = state / "sp0.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text())
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# A spawned daemon with no client leaves after its idle timeout: long enough that the
# spawner (whose `devd --daemonize` child must exit first) still finds it on a loaded host
SPAWN_IDLE = 3.0


def test_spawned_daemon(state: Path, spawned: DeviceRecord, sender: socket.socket) -> None:  # noqa: F811
    path = ensure_devd(spawned, state_dir=state, idle_timeout=SPAWN_IDLE)
    assert path == str(socket_path("sp0", state))
    pid = int((state / "sp0.pid").read_text())
    assert pid != os.getpid() and _alive(pid)
    assert ensure_devd(spawned, state_dir=state) == path  # already running: same daemon
    assert int((state / "sp0.pid").read_text()) == pid
    with DevdLink(spawned, state_dir=state) as a, DevdLink(spawned, state_dir=state) as b:
        assert a.daemon_pid == pid == b.daemon_pid
        qa, qb = a.alloc_qpn(), b.alloc_qpn()
        assert qa != qb
        sender.sendto(packet(qa, b"spawned"), (LOCAL, spawned.udp_port))
        got = recv_one(a)
        assert bytes(got.data) == packet(qa, b"spawned")
        assert got.sport == sender.getsockname()[1] and got.dport == spawned.udp_port
    # idle: the daemon leaves by itself and removes its socket
    deadline = time.monotonic() + 120
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid)
    assert not Path(path).exists()


def test_spawn_races_start_one_daemon(state: Path, spawned: DeviceRecord) -> None:  # noqa: F811
    paths: list[str] = []
    errors: list[BaseException] = []

    def go() -> None:
        try:
            paths.append(ensure_devd(spawned, state_dir=state, idle_timeout=SPAWN_IDLE))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(paths) == 3 and len(set(paths)) == 1
    log = (state / "sp0.log").read_text() if (state / "sp0.log").exists() else ""
    assert "another devd" not in log


def test_spawn_failure_is_clear(state: Path, sender: socket.socket) -> None:  # noqa: F811
    rec = DeviceRecord("busy", "lo", "roce", sender.getsockname()[1])
    with pytest.raises(DeviceError, match="cannot start devd busy: .*Address already in use"):
        ensure_devd(rec, state_dir=state)
    assert not (state / "busy.pid").exists()
    rec2 = DeviceRecord("nonet", "nosuchif0", "roce", 4791)
    with pytest.raises(DeviceError, match="no such network interface"):
        ensure_devd(rec2, state_dir=state)


def test_spawn_replaces_stale_socket(state: Path, spawned: DeviceRecord) -> None:  # noqa: F811
    state.mkdir(parents=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(socket_path("sp0", state)))
    dead.close()
    with DevdLink(spawned, state_dir=state, idle_timeout=0.5) as a:
        assert a.alloc_qpn() == QPN_FIRST


# -- the cost of the extra hop -------------------------------------------------------------------


def _latency(send: socket.socket, dst: tuple[str, int], link: DevdLink | UdpLink,
             pkt: bytes, n: int, spin: bool) -> float:
    """Median send-to-receive time in microseconds; ``spin`` busy-polls the receiver
    instead of sleeping in select (so the receiver's own wake-up is not counted)."""
    samples = []
    deadline = time.monotonic() + 10
    for _ in range(n):
        t0 = time.perf_counter()
        send.sendto(pkt, dst)
        if spin:
            while not link.recv_batch(1):
                assert time.monotonic() < deadline
        else:
            recv_one(link)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def test_measure_extra_hop(
    state: Path, spawned: DeviceRecord, sender: socket.socket, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    """UDP -> devd -> client versus UDP -> client; printed, not asserted."""
    n = 300
    results = {}
    with DevdLink(spawned, state_dir=state, idle_timeout=0.5) as a, UdpLink(LOCAL, 0) as direct:
        q = a.alloc_qpn()
        pkt = packet(q, bytes(64))
        assert direct.port is not None
        for spin in (False, True):
            via = _latency(sender, (LOCAL, spawned.udp_port), a, pkt, n, spin)
            plain = _latency(sender, (LOCAL, direct.port), direct, pkt, n, spin)
            results[spin] = (plain, via)
    with capsys.disabled():
        for spin, (plain, via) in results.items():
            print(
                f"\n[devd] median latency, {n} datagrams, receiver {'spinning' if spin else 'in select'}: "
                f"direct UDP {plain:.1f} us, via devd {via:.1f} us, extra hop {via - plain:.1f} us",
                end="",
            )
        print()
    assert a.counters["rx"] == 2 * n


def test_socket_path_appears_only_once_it_listens(
        state: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A stress run saw a client that found devd's socket path get ECONNREFUSED: the path
    appeared at bind, before listen(). Now the socket is bound under a temporary name and
    renamed onto the path once it listens: right after bind, the path is not there yet."""
    from softrdma.drivers.devd import daemon as daemon_mod
    from softrdma.drivers.host.unix_path import bind_unix as real_bind

    seen: list[bool] = []
    path = socket_path("lsn", state)

    def bind_and_look(sock: socket.socket, where: Path | str) -> None:
        real_bind(sock, where)
        seen.append(path.exists())

    monkeypatch.setattr(daemon_mod, "bind_unix", bind_and_look)
    d = Devd(DeviceRecord("lsn", "lo", "roce", 0), state, ips=[LOCAL])
    d.start()
    try:
        assert seen == [False]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(str(path))  # the path, once there, accepts
        finally:
            s.close()
        assert [p.name for p in state.iterdir() if p.name.startswith(".lsn")] == []
    finally:
        d.shutdown()
        d.serve_forever()

"""The direct receive path of a shared device (drivers/devd/reuseport.py, design.md "Devices
shared by processes"): the classic BPF program, its attachment to a real reuseport group,
the daemon's mirror of the kernel's socket array through joins, leaves and deaths, and
datagrams reaching the owner of their DestQP without devd forwarding them. All traffic is
on 127.0.0.1, on ephemeral ports."""

from __future__ import annotations

import errno
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.devd import Running
from harness.reuseport import LOCAL, packet, qpns_of, recv_all
from harness.wait import wait_until

from softrdma.drivers.devd import client as devd_client
from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.daemon import Devd
from softrdma.drivers.devd.reuseport import (
    BPF_MAXINSNS,
    SLOT_LAST,
    Group,
    assemble,
    attach,
    run_program,
    slot_of,
    slot_range,
)
from softrdma.drivers.host.registry import DeviceRecord
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.links.udp import UdpLink
from softrdma.errors import DeviceError, InvalidArgument

V4_MAPPED = bytes(10) + b"\xff\xff"


# -- the program ----------------------------------------------------------------------------


def test_program_routes_slots_and_exceptions() -> None:
    prog = assemble({1: 2, 3: 1}, {0x010005: 1})
    assert run_program(prog, packet(0x010000)) == 2
    assert run_program(prog, packet(0x01FFFF)) == 2
    assert run_program(prog, packet(0x010005)) == 1  # an exception wins over its range
    assert run_program(prog, packet(0x030042)) == 1
    assert run_program(prog, packet(0x020001)) == 0  # no live slot: devd
    assert run_program(prog, packet(1)) == 0  # QP1 (IBA 3.5.8): devd
    assert run_program(prog, packet(0x11)) == 0  # devd's own range
    assert run_program(prog, packet(0xFFFFFF)) == 0  # multicast (IBA 10.5): devd
    assert run_program(prog, b"\x04\x00\xff\xff\x00\x00") == 0  # too short to load DestQP
    # the reserved byte in front of DestQP is masked off
    assert run_program(prog, struct.pack("!BBHBBH", 4, 0, 0xFFFF, 0xAB, 3, 7) + bytes(8)) == 1


def test_program_size_and_slot_ranges() -> None:
    assert len(assemble({})) == 4 * 8  # ld, and, rsh, ret
    with pytest.raises(InvalidArgument, match="exceptions"):
        assemble({}, {q: 1 for q in range(BPF_MAXINSNS)})
    assert slot_range(1) == (0x010000, 0x01FFFF)
    assert slot_of(slot_range(SLOT_LAST)[1]) == SLOT_LAST and SLOT_LAST < 0xFF
    for bad in (0, SLOT_LAST + 1):
        with pytest.raises(InvalidArgument, match="slot"):
            slot_range(bad)


# -- a real reuseport group ------------------------------------------------------------------


def _bound(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((LOCAL, port))
    s.setblocking(False)
    return s


def _probe(tx: socket.socket, port: int, socks: dict[str, socket.socket],
           qpns: dict[str, int]) -> dict[str, str]:
    """Send one datagram per QPN; which socket got each (by name)."""
    for q in qpns.values():
        tx.sendto(packet(q), (LOCAL, port))
    got: dict[str, str] = {}
    deadline = time.monotonic() + 2.0
    names = {q: n for n, q in qpns.items()}
    while len(got) < len(qpns) and time.monotonic() < deadline:
        ready, _, _ = select.select(list(socks.values()), [], [], 0.1)
        for s in ready:
            who = next(n for n, x in socks.items() if x is s)
            data = s.recv(100)
            got[names[int.from_bytes(data[5:8], "big")]] = who
    return got


def test_kernel_group_follows_the_mirror_through_close() -> None:
    devd = _bound(0)
    port = devd.getsockname()[1]
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    group = Group()
    attach(devd, assemble({}))
    socks = {"devd": devd}
    clients = {name: _bound(port) for name in ("a", "b", "c")}
    slots = {"a": 1, "b": 2, "c": 3}
    try:
        for name, s in clients.items():
            group.join(name, s.dup())  # devd's copy, as JOINED passes it
        socks.update(clients)
        attach(devd, assemble(group.routes(slots)))
        qpns = {n: slot_range(s)[0] + 5 for n, s in slots.items()} | {"qp1": 1}
        assert _probe(tx, port, socks, qpns) == {"a": "a", "b": "b", "c": "c", "qp1": "devd"}
        # a leaves: the kernel moves c (the last) into a's index; the mirror does too
        clients["a"].close()
        del socks["a"]
        group.leave("a")
        assert group.members == [None, "c", "b"]
        del slots["a"]
        attach(devd, assemble(group.routes(slots)))
        qpns.pop("a")
        assert _probe(tx, port, socks, qpns) == {"b": "b", "c": "c", "qp1": "devd"}
        # a new member is appended
        clients["d"] = socks["d"] = _bound(port)
        group.join("d", clients["d"].dup())
        slots["d"] = 9
        attach(devd, assemble(group.routes(slots)))
        qpns["d"] = slot_range(9)[0]
        assert _probe(tx, port, socks, qpns) == {"b": "b", "c": "c", "d": "d", "qp1": "devd"}
    finally:
        group.close()
        for s in socks.values():
            s.close()
        tx.close()


# -- devd with clients on the direct path ------------------------------------------------------


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    state = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    monkeypatch.delenv("SOFTRDMA_DEVD_DIRECT", raising=False)
    d = Devd(DeviceRecord("rp0", "lo", "roce", 0), state, idle_timeout=30.0, ips=[LOCAL])
    d.start()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    try:
        yield Running(d, t, state)
    finally:
        d.shutdown()
        t.join(5)
        assert not t.is_alive()


@pytest.fixture
def sender() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((LOCAL, 0))
    yield s
    s.close()


def test_data_reaches_owners_without_devd(running: Running, sender: socket.socket) -> None:
    port = running.devd.udp_port
    with running.client() as a, running.client() as b:
        assert a.direct and b.direct and a.slot != b.slot
        qa = [a.alloc_qpn() for _ in range(3)]
        qb = [b.alloc_qpn() for _ in range(3)]
        assert {slot_of(q) for q in qa} == {a.slot} and {slot_of(q) for q in qb} == {b.slot}
        for i in range(50):
            sender.sendto(packet(qa[i % 3], b"A"), (LOCAL, port))
            sender.sendto(packet(qb[i % 3], b"B"), (LOCAL, port))
        got_a, got_b = recv_all(a, 50), recv_all(b, 50)
        assert set(qpns_of(got_a)) == set(qa) and set(qpns_of(got_b)) == set(qb)
        assert got_a[0].src_ip == socket.inet_aton(LOCAL) and got_a[0].dport == port
        st = a.stats()
        assert st["forwarded"] == 0 and st["rx"] == 0  # devd never saw them
        assert st["direct_clients"] == 2
        assert a.counters["rx_direct"] == 50 and b.counters["rx_direct"] == 50
        # QP1 MADs and unknown QPNs still go to devd's socket
        assert a.alloc_qpn(1) == 1
        sender.sendto(packet(1, bytes(8) + bytes(256), opcode=0x64), (LOCAL, port))
        sender.sendto(packet(0x11), (LOCAL, port))  # devd's range, nobody's
        assert qpns_of(recv_all(a, 1)) == [1]
        st = a.stats()
        assert st["forwarded"] == 1 and st["unknown_qpn"] == 1


class _CountingEpoll:
    """An epoll whose ``poll`` calls are counted."""

    def __init__(self, ep: select.epoll) -> None:
        self.ep = ep
        self.polls = 0

    def poll(self, timeout: float = -1) -> list[tuple[int, int]]:
        self.polls += 1
        return self.ep.poll(timeout)

    def fileno(self) -> int:
        return self.ep.fileno()

    def close(self) -> None:
        self.ep.close()


def test_an_empty_poll_of_the_direct_path_is_one_epoll_question(
        running: Running, sender: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy poll, most often empty, asks one epoll of every socket (the direct path's
    socket of each address family and the data channel) whether any has input: one
    system call, no read; a datagram is then read from the socket that has it."""
    port = running.devd.udp_port
    with running.client() as a:
        assert a.direct
        assert a._ep is not None
        counting = _CountingEpoll(a._ep)
        monkeypatch.setattr(a, "_ep", counting)
        reads: list[int] = []
        for link in a._direct:

            def counted(n: int = 64, readable: bool = False,
                        real: Any = link.recv_batch) -> list[Datagram]:
                reads.append(n)
                assert readable  # the client's epoll said so: the link asks no second one
                got: list[Datagram] = real(n, readable)
                return got

            monkeypatch.setattr(link, "recv_batch", counted)
        monkeypatch.setattr(a, "_recv_forwarded",
                            lambda n: pytest.fail("an empty poll read the data channel"))
        for _ in range(20):
            assert a.recv_batch(1) == []
        assert counting.polls == 20 and reads == []
        q = a.alloc_qpn()
        sender.sendto(packet(q, b"D"), (LOCAL, port))
        assert qpns_of(recv_all(a, 1)) == [q]
        assert len(reads) >= 1 and a.counters["rx_direct"] == 1


def test_multicast_still_through_devd(running: Running, sender: socket.socket) -> None:
    port = running.devd.udp_port
    group = bytes([239, 1, 2, 99])
    sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(LOCAL))
    with running.client() as a:
        assert a.direct
        a.attach_mcast(V4_MAPPED + group)
        sender.sendto(packet(0xFFFFFF, b"group"), (socket.inet_ntoa(group), port))
        got = recv_all(a, 1)
        assert qpns_of(got) == [0xFFFFFF] and got[0].dst_ip == group
        assert a.stats()["forwarded"] == 1


def test_forwarded_client_beside_direct_ones(running: Running, sender: socket.socket) -> None:
    """A client on the forwarded path (refused, or SOFTRDMA_DEVD_DIRECT=0) gets QPNs outside
    the live slots' ranges; one asked for by number inside a slot's range is an exception
    of the program, so it still reaches its owner."""
    port = running.devd.udp_port
    with running.client() as a, running.client(direct=False) as f:
        assert a.direct and not f.direct and f.slot == 0
        qf = f.alloc_qpn()
        assert slot_of(qf) not in (a.slot, 0xFF)
        inside = slot_range(a.slot)[0] + 0x42
        assert f.alloc_qpn(inside) == inside
        qa = a.alloc_qpn()
        assert qa != inside
        sender.sendto(packet(inside, b"F"), (LOCAL, port))
        sender.sendto(packet(qf, b"F"), (LOCAL, port))
        sender.sendto(packet(qa, b"A"), (LOCAL, port))
        assert sorted(qpns_of(recv_all(f, 2))) == sorted([inside, qf])
        assert qpns_of(recv_all(a, 1)) == [qa]
        assert a.stats()["forwarded"] == 2
        f.free_qpn(inside)
        sender.sendto(packet(inside), (LOCAL, port))  # back in a's range: a's socket
        assert qpns_of(recv_all(a, 1)) == [inside]


def test_leave_and_join_keep_every_mapping(running: Running, sender: socket.socket) -> None:
    port = running.devd.udp_port
    links = {n: running.client() for n in "abcd"}
    try:
        qpns = {n: link.alloc_qpn() for n, link in links.items()}
        links.pop("b").close()  # the middle one: the kernel moves d into its index
        wait_until(lambda: len(running.devd._slot_clients) == 3, what="b's leave seen",
                   interval=0.01)
        links["e"] = running.client()
        qpns["e"] = links["e"].alloc_qpn()
        links.pop("a").close()  # the first one
        links["f"] = running.client()
        qpns["f"] = links["f"].alloc_qpn()
        del qpns["a"], qpns["b"]
        # devd has seen a's leave and the joins (c, d, e, f hold the group's slots)
        wait_until(lambda: len(running.devd._slot_clients) == 4, what="a's leave seen",
                   interval=0.01)
        for _ in range(20):
            for q in qpns.values():
                sender.sendto(packet(q), (LOCAL, port))
        for n, link in links.items():
            assert set(qpns_of(recv_all(link, 20))) == {qpns[n]}, n
        st = links["c"].stats()
        assert st["forwarded"] == 0 and st["unknown_qpn"] == 0
    finally:
        for link in links.values():
            link.close()


def test_join_refused_without_reuseport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon started with SOFTRDMA_DEVD_DIRECT=0 has no group: JOIN is refused
    (EOPNOTSUPP) and the client stays on the forwarded path."""
    state = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_DEVD_DIRECT", "0")
    d = Devd(DeviceRecord("rp1", "lo", "roce", 0), state, idle_timeout=30.0, ips=[LOCAL])
    d.start()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    try:
        rec = DeviceRecord("rp1", "lo", "roce", d.udp_port)
        with DevdLink(rec, state_dir=state, spawn=False, direct=True) as a:
            assert not a.direct and a.slot == 0
            assert a.alloc_qpn() == 0x11
            assert a.stats()["direct_clients"] == 0
            with pytest.raises(DeviceError) as ei:
                a._request(12, 0)  # JOINED without a JOIN
            assert ei.value.errno == errno.EPROTO
    finally:
        d.shutdown()
        t.join(5)


def test_client_that_cannot_bind_stays_forwarded(
        running: Running, sender: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose reuseport bind fails (another uid's group, a kernel without
    SO_REUSEPORT) tells devd (JOINED with no socket, counted ``direct_refused``) and gets
    its datagrams forwarded; the next client still joins, at the right index."""
    def refused(*a: Any, **kw: Any) -> UdpLink:
        if kw.get("reuseport"):
            raise OSError(errno.EADDRINUSE, "Address already in use")
        return UdpLink(*a, **kw)

    monkeypatch.setattr(devd_client, "UdpLink", refused)
    port = running.devd.udp_port
    with running.client() as f:
        assert not f.direct
        monkeypatch.setattr(devd_client, "UdpLink", UdpLink)
        with running.client() as a:
            assert a.direct
            qf, qa = f.alloc_qpn(), a.alloc_qpn()
            assert slot_of(qf) == 0 and slot_of(qa) == a.slot
            sender.sendto(packet(qf), (LOCAL, port))
            sender.sendto(packet(qa), (LOCAL, port))
            assert qpns_of(recv_all(f, 1)) == [qf]
            assert qpns_of(recv_all(a, 1)) == [qa]
            st = a.stats()
            assert st["direct_refused"] == 1 and st["direct_clients"] == 1
            assert st["forwarded"] == 1


def test_forwarded_gro_segments_keep_their_index(running: Running) -> None:
    """A UDP GSO batch reaches devd's socket coalesced (UDP GRO); devd forwards each
    segment with its index in the data channel header, so the client's ICRC check can
    try the IPv4 ID the sender gave it (Datagram.ident), as on the direct path."""
    port = running.devd.udp_port
    with running.client(direct=False) as f, UdpLink(LOCAL, 0) as tx:
        if not (tx.gso and running.devd._links[0].gro):
            pytest.skip("the kernel refused UDP GSO or GRO")
        q = f.alloc_qpn()
        segs = [packet(q, bytes([i]) * 20) for i in range(3)]
        sport = tx.effective_sport(0xC123)
        assert tx.send_gso(socket.inet_aton(LOCAL), port, sport, segs, len(segs[0]), 3)
        fd = f.fileno()
        assert fd is not None
        got: list[Datagram] = []
        deadline = time.monotonic() + 3
        while len(got) < 3 and time.monotonic() < deadline:
            got += [Datagram(memoryview(bytes(d.data)), d.src_ip, d.dst_ip, d.sport, d.dport,
                             d.tos, d.ttl, ident=d.ident) for d in f.recv_batch(64)]
            select.select([fd], [], [], 0.1)
        assert [bytes(d.data) for d in got] == segs
        assert [d.ident for d in got] == [0, 1, 2]


def test_sockets_devd_cannot_use_are_refused(
        running: Running, sender: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    """JOINED with more sockets than devd has groups: devd closes its copies and answers
    slot 0 (``direct_refused``); the client closes its own and stays forwarded, and the
    group's order is intact for the next client (the refused sockets were the last)."""
    port = running.devd.udp_port
    with running.client() as a:
        with monkeypatch.context() as m:
            m.setattr(DevdLink, "_first_of_family", lambda self: [socket.inet_aton(LOCAL)] * 2)
            f = running.client()
        with f:
            assert not f.direct and f.slot == 0
            with running.client() as b:
                assert b.direct
                qa, qb, qf = a.alloc_qpn(), b.alloc_qpn(), f.alloc_qpn()
                for q in (qa, qb, qf):
                    sender.sendto(packet(q), (LOCAL, port))
                assert qpns_of(recv_all(a, 1)) == [qa]
                assert qpns_of(recv_all(b, 1)) == [qb]
                assert qpns_of(recv_all(f, 1)) == [qf]
                st = a.stats()
                assert st["direct_refused"] == 1 and st["forwarded"] == 1

"""Tests of the RoCEv2 UDP socket link (drivers/links/udp.py), on loopback only."""

from __future__ import annotations

import ctypes
import errno
import os
import select
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from harness.ipv6 import needs_v6

from softrdma.drivers.links.link import Datagram, Link
from softrdma.drivers.links.udp import UdpLink
from softrdma.errors import ClosedError, DeviceError, InvalidArgument, StateError
from softrdma.wire import ib, roce

LO4 = socket.inet_pton(socket.AF_INET, "127.0.0.1")
LO4B = socket.inet_pton(socket.AF_INET, "127.0.0.2")
LO6 = socket.inet_pton(socket.AF_INET6, "::1")


def recv_n(link: UdpLink, n: int, timeout: float = 2.0) -> list[Datagram]:
    """Wait (poll on the link's descriptor) until ``n`` datagrams were read; copies them."""
    out: list[Datagram] = []
    fd = link.fileno()
    assert fd is not None
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        select.select([fd], [], [], left)
        for d in link.recv_batch(n - len(out)):
            d.data = memoryview(bytes(d.data))
            out.append(d)
    return out


@pytest.fixture
def v4pair() -> Iterator[tuple[UdpLink, UdpLink]]:
    a = UdpLink("127.0.0.1", 0)
    b = UdpLink("127.0.0.1", 0)
    yield a, b
    a.close()
    b.close()


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def test_round_trip_ipv4(v4pair: tuple[UdpLink, UdpLink]) -> None:
    a, b = v4pair
    assert isinstance(a, Link)
    assert a.local_ips == (LO4,) and a.port not in (None, 4791) and a.port == a.fallback_sport
    assert b.fileno() is not None
    sport = a.effective_sport(0xC000 | (b.port or 0) & 0x3FFF)
    a.send(LO4, b.port or 0, sport, [b"head", b"er", memoryview(b"--payload--")[2:-2]],
           tos=0x02, ttl=17)
    (d,) = recv_n(b, 1)
    assert bytes(d.data) == b"header" + b"payload"
    assert (d.src_ip, d.dst_ip, d.sport, d.dport, d.tos, d.ttl) == (LO4, LO4, sport, b.port, 2, 17)
    a.send(LO4, b.port or 0, sport, [b"defaults"])
    (d,) = recv_n(b, 1)
    assert (d.tos, d.ttl) == (0, 64)
    assert a.stats.sent == 2 and b.stats.received == 2


def test_tos_ttl_ancillary_data_is_built_once(v4pair: tuple[UdpLink, UdpLink]) -> None:
    """Every packet of an AH with hop_limit 1 (rdma-core's pingpongs set it) carries the
    TTL as ancillary data: it is built once per (TOS, TTL), not per send (issue 26), and
    each packet still carries its own values; a bad value is refused every time."""
    a, b = v4pair
    sport = a.fallback_sport
    for tos, ttl in ((0, 1), (0, 1), (0x02, 1), (0, 1)):
        a.send(LO4, b.port or 0, sport, [b"ping"], tos=tos, ttl=ttl)
        (d,) = recv_n(b, 1)
        assert (d.tos, d.ttl) == (tos, ttl)
    assert a._tos_ttl(0, 1) is a._tos_ttl(0, 1)
    for _ in range(2):
        with pytest.raises(InvalidArgument):
            a.send(LO4, b.port or 0, sport, [b"x"], tos=0, ttl=256)


def test_pktinfo_gives_the_destination_address() -> None:
    with UdpLink("127.0.0.2", 0) as b, UdpLink("127.0.0.1", 0) as a:
        # Make the fallback (the link's own address) wrong: dst must come from IP_PKTINFO.
        b.ip = bytes(4)
        a.send(LO4B, b.port or 0, a.fallback_sport, [b"to .2"])
        (d,) = recv_n(b, 1)
        assert d.dst_ip == LO4B and d.src_ip == LO4


@needs_v6
def test_round_trip_ipv6() -> None:
    with UdpLink("::1", 0) as a, UdpLink(LO6, 0) as b:
        assert a.local_ips == (LO6,)
        sport = a.effective_sport(0xD00D)
        a.send(LO6, b.port or 0, sport, [b"six", memoryview(bytearray(b"!!"))], tos=0x0A, ttl=5)
        (d,) = recv_n(b, 1)
        assert bytes(d.data) == b"six!!"
        assert (d.src_ip, d.dst_ip, d.sport, d.dport, d.tos, d.ttl) == (LO6, LO6, sport, b.port,
                                                                         0x0A, 5)
        with pytest.raises(InvalidArgument):
            a.send(LO4, b.port or 0, sport, [b"wrong family"])


def test_ipv4_mapped_destination(v4pair: tuple[UdpLink, UdpLink]) -> None:
    a, b = v4pair
    a.send(roce.ipv4_mapped(LO4), b.port or 0, a.fallback_sport, [b"gid"])
    (d,) = recv_n(b, 1)
    assert bytes(d.data) == b"gid"
    m = UdpLink(roce.ipv4_mapped(LO4), 0)  # a mapped GID as the local address is IPv4 too
    assert m.family == socket.AF_INET and m.local_ips == (LO4,)
    m.close()


def test_recv_batch_returns_several_and_reuses_the_ring(v4pair: tuple[UdpLink, UdpLink]) -> None:
    a, b = v4pair
    port = b.port or 0
    for i in range(10):
        a.send(LO4, port, a.fallback_sport, [bytes([i]) * (100 + i)])
    fd = b.fileno()
    assert fd is not None
    deadline = time.monotonic() + 2.0
    first: list[Datagram] = []
    while not first and time.monotonic() < deadline:
        select.select([fd], [], [], 0.1)
        first = b.recv_batch(4)
    assert len(first) == 4  # loopback delivers synchronously: all 10 are queued
    assert [bytes(d.data) for d in first] == [bytes([i]) * (100 + i) for i in range(4)]
    view = first[0].data
    rest = b.recv_batch(64)
    assert [bytes(d.data) for d in rest] == [bytes([i]) * (100 + i) for i in range(4, 10)]
    # the ring is reused: the first batch's view now shows the second batch's bytes
    assert bytes(view[:3]) == bytes([4]) * 3
    assert b.recv_batch(64) == []


def test_zero_copy_parts(v4pair: tuple[UdpLink, UdpLink]) -> None:
    a, b = v4pair
    mr = bytearray(range(256)) * 16
    mv = memoryview(mr)
    hdr = ib.encode_headers(ib.IBPacket(0x0A, psn=5, dqpn=0x11))
    parts: list[bytes | bytearray | memoryview] = [hdr, mv[1000:2024], b"", mv[0:0],
                                                   b"\x01\x02\x03\x04"]
    a.send(LO4, b.port or 0, a.fallback_sport, parts)
    (d,) = recv_n(b, 1)
    assert bytes(d.data) == bytes(hdr) + bytes(mr[1000:2024]) + b"\x01\x02\x03\x04"


def test_effective_sport_binds_free_ports_and_falls_back() -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    taken_port = taken.getsockname()[1]
    try:
        with UdpLink("127.0.0.1", 0) as a, UdpLink("127.0.0.1", 0) as b:
            want = free_port()
            assert a.effective_sport(want) == want
            assert a.effective_sport(want) == want  # reused, not bound twice
            assert a.stats.sport_binds == 1
            assert a.effective_sport(taken_port) == a.fallback_sport
            assert a.effective_sport(0) == a.fallback_sport
            assert a.stats.sport_fallbacks == 2
            with pytest.raises(InvalidArgument):
                a.effective_sport(-1)
            with pytest.raises(InvalidArgument):
                a.send(LO4, b.port or 0, taken_port, [b"x"])  # would not match the ICRC
            a.send(LO4, b.port or 0, want, [b"from want"])
            a.send(LO4, b.port or 0, a.effective_sport(taken_port), [b"from fallback"])
            got = recv_n(b, 2)
            assert [(bytes(d.data), d.sport) for d in got] == [
                (b"from want", want), (b"from fallback", a.fallback_sport)]
    finally:
        taken.close()


def test_sport_pool_does_not_thrash() -> None:
    ports = [free_port() for _ in range(3)]
    with UdpLink("127.0.0.1", 0, sport_pool=2, pool_idle=60.0) as a:
        assert a.effective_sport(ports[0]) == ports[0]
        assert a.effective_sport(ports[1]) == ports[1]
        # full of recently used sockets: the third flow shares the main socket
        assert a.effective_sport(ports[2]) == a.fallback_sport
        assert a.stats.sport_evictions == 0
    with UdpLink("127.0.0.1", 0, sport_pool=2, pool_idle=0.0) as a:
        a.effective_sport(ports[0])
        a.effective_sport(ports[1])
        a.effective_sport(ports[0])  # now ports[1] is the least recently used
        assert a.effective_sport(ports[2]) == ports[2]
        assert a.stats.sport_evictions == 1
        # the evicted port was released: another socket can bind it
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", ports[1]))
        assert a.effective_sport(ports[0]) == ports[0]  # still pooled


def test_icmp_errors_do_not_break_the_link(v4pair: tuple[UdpLink, UdpLink]) -> None:
    a, b = v4pair
    closed = free_port()
    for _ in range(5):
        a.send(LO4, closed, a.fallback_sport, [b"nobody listens"])  # port unreachable
        a.send(LO4, closed, a.effective_sport(free_port()), [b"nobody listens"])
    time.sleep(0.01)
    assert a.recv_batch() == []
    a.send(LO4, b.port or 0, a.fallback_sport, [b"still fine"])
    b.send(LO4, a.port or 0, b.fallback_sport, [b"both ways"])
    assert [bytes(d.data) for d in recv_n(b, 1)] == [b"still fine"]
    assert [bytes(d.data) for d in recv_n(a, 1)] == [b"both ways"]


def test_send_only_link(v4pair: tuple[UdpLink, UdpLink]) -> None:
    _, b = v4pair
    with UdpLink("127.0.0.1", 4791, bind_port=False) as s:
        assert s.fileno() is None and s.port is None
        assert s.fallback_sport not in (0, 4791)
        with pytest.raises(StateError):
            s.recv_batch()
        sport = s.effective_sport(free_port())
        s.send(LO4, b.port or 0, sport, [b"send only"])
        (d,) = recv_n(b, 1)
        assert bytes(d.data) == b"send only" and d.sport == sport


def test_truncated_datagrams_are_dropped_and_counted() -> None:
    with UdpLink("127.0.0.1", 0, max_datagram=64, ring=4) as small, \
            UdpLink("127.0.0.1", 0) as a:
        port = small.port or 0
        a.send(LO4, port, a.fallback_sport, [bytes(100)])
        a.send(LO4, port, a.fallback_sport, [bytes(64)])
        got = recv_n(small, 1)
        assert [len(d.data) for d in got] == [64]
        assert small.stats.truncated == 1


def test_errors_and_close() -> None:
    with pytest.raises(InvalidArgument):
        UdpLink("0.0.0.0", 0)
    with pytest.raises(InvalidArgument):
        UdpLink("not an address", 0)
    with pytest.raises(InvalidArgument):
        UdpLink("127.0.0.1", 65536)
    a = UdpLink("127.0.0.1", 0)
    with pytest.raises(DeviceError) as ei:
        UdpLink("127.0.0.1", a.port or 0)
    assert ei.value.errno == errno.EADDRINUSE
    with pytest.raises(InvalidArgument):
        a.send(LO4, 1, a.fallback_sport, [b"x"], ttl=256)
    with pytest.raises(InvalidArgument):
        a.send(b"\x7f\x00\x01", 1, a.fallback_sport, [b"x"])
    a.close()
    a.close()
    assert a.fileno() is None
    with pytest.raises(ClosedError):
        a.send(LO4, 1, a.fallback_sport, [b"x"])
    with pytest.raises(ClosedError):
        a.recv_batch()
    with pytest.raises(ClosedError):
        a.effective_sport(0xC000)


def test_buffers_are_large() -> None:
    with UdpLink("127.0.0.1", 0, rcvbuf=4 << 20, sndbuf=2 << 20) as a:
        assert a._rx is not None  # fileno() is an epoll over the receive sockets
        s = socket.socket(fileno=os.dup(a._rx.fileno()))
        try:
            # Linux reports twice the requested size; beyond rmem_max only with the FORCE
            # options (root), else capped at rmem_max.
            got = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            with open("/proc/sys/net/core/rmem_max") as f:
                rmem_max = int(f.read())
            want = 2 * (4 << 20) if os.geteuid() == 0 else min(2 * (4 << 20), 2 * rmem_max)
            assert got == want
            with open("/proc/sys/net/core/wmem_max") as f:
                wmem_max = int(f.read())
            want = 2 * (2 << 20) if os.geteuid() == 0 else min(2 * (2 << 20), 2 * wmem_max)
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == want
            assert s.getsockopt(socket.IPPROTO_IP, 10) == 2  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
        finally:
            s.close()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]  # noqa: RUF012


def _only_udp_dport(raw: socket.socket, dport: int) -> None:
    """Attach a classic BPF filter (SO_ATTACH_FILTER) to the raw IPv4/UDP socket ``raw``
    that keeps only datagrams to ``dport`` (an IPv4 header without options: port at 22)."""
    insns = [(0x28, 0, 0, 22),      # ldh [22]: the UDP destination port
             (0x15, 0, 1, dport),   # jeq #dport, keep, drop
             (0x06, 0, 0, 0xFFFF),  # ret #65535
             (0x06, 0, 0, 0)]       # ret #0
    code = b"".join(struct.pack("=HBBI", *i) for i in insns)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(insns), ctypes.addressof(buf))
    raw.setsockopt(socket.SOL_SOCKET, 26, bytes(fprog))  # SO_ATTACH_FILTER
    while True:  # what arrived before the filter was attached
        try:
            raw.recv(65535)
        except BlockingIOError:
            return


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a raw socket to see the IPv4 header")
def test_linux_sends_id0_df_and_the_icrc_checks() -> None:
    """captures README: an unconnected socket with IP_PMTUDISC_DO sends ID 0 + DF, so an
    ICRC computed before sending (IBA 7.8.1, Annex A17; ../shared/specs/roce.md §2) matches the header Linux really sent."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    raw.setblocking(False)
    try:
        with UdpLink("127.0.0.1", 0) as a, UdpLink("127.0.0.1", 0) as b:
            dport = b.port or 0
            # the raw socket sees every UDP datagram of the machine: a filter keeps only
            # those to b (on a busy machine the others filled its buffer and ours was lost)
            _only_udp_dport(raw, dport)
            pooled = a.effective_sport(0xC000 | (os.getpid() & 0x3FFF))
            body = ib.encode(ib.IBPacket(0x04, psn=9, dqpn=0x11, payload=b"hello rxe"))
            # a pooled source-port socket and the main socket, with and without a TOS cmsg
            for sport, tos in ((pooled, 0), (pooled, 0x02), (a.fallback_sport, 0x02)):
                crc = roce.udp_send_icrc(LO4, LO4, sport, dport, [body])
                a.send(LO4, dport, sport, [body, crc], tos=tos, ttl=64)
                (d,) = recv_n(b, 1)
                assert roce.icrc_ok_udp(d.src_ip, d.dst_ip, d.sport, d.dport, d.data)
                deadline = time.monotonic() + 60.0
                pkt = b""
                while time.monotonic() < deadline:
                    select.select([raw], [], [], 0.1)
                    try:
                        p = raw.recv(65535)
                    except BlockingIOError:
                        continue
                    if p[20:24] == sport.to_bytes(2, "big") + dport.to_bytes(2, "big"):
                        pkt = p
                        break
                assert pkt, "the raw socket did not see the datagram"
                ip, udp, payload = pkt[:20], pkt[20:28], pkt[28:]
                assert ip[4:6] == b"\x00\x00", "IPv4 Identification is not 0"
                assert ip[6] & 0x40, "DF is not set"
                assert ip[1] == tos
                assert payload == body + crc
                assert roce.icrc(ip, udp, [body]) == crc
    finally:
        raw.close()

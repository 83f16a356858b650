"""RoCEv2 batching through the kernel: UDP GSO sends, UDP GRO receives, the fallback.

The runtime's grouping rules and per-segment ICRCs are checked against a recording link
(deterministic); the ICRC of segment ``i`` is checked with the generic
:func:`softrdma.wire.roce.icrc` over a real IPv4 header carrying ID ``i``. The UdpLink
parts run over loopback: a GSO send to a GRO socket comes back as one coalesced buffer
(``lo`` keeps a GSO packet whole), to a plain socket as separate datagrams. Kernel
refusals are simulated with a socket whose ``sendmsg`` raises. The wire (IDs on a real
veth) is in ``test_udp_gso_netns.py``.
"""

from __future__ import annotations

import errno
import socket
import time
from typing import Any

import pytest
from harness.recording_link import SRC, RecordingLink

from softrdma.drivers.links import udp as udp_mod
from softrdma.drivers.links.link import Datagram, GsoLink
from softrdma.drivers.links.udp import UDP_MAX_SEGMENTS, UdpLink
from softrdma.drivers.runtime.roce import GSO_MAX_PAYLOAD, GSO_MAX_PAYLOAD_V6, Runtime
from softrdma.drivers.runtime.roce_tx import gso_message_limit
from softrdma.errors import DeviceError, InvalidArgument
from softrdma.ib.packet import TxPacket
from softrdma.ib.port import Port, RxMeta
from softrdma.wire import roce
from softrdma.wire.gid import ip_to_gid

DST = bytes([10, 1, 0, 2])
DST2 = bytes([10, 1, 0, 3])
DPORT = 4791
RC_WRITE_MIDDLE = 0x07
UD_SEND_ONLY = 0x64


def bth(opcode: int, psn: int, dqpn: int = 0x11) -> bytes:
    """A BTH (IBA 9.2) with P_Key 0xFFFF."""
    return bytes([opcode, 0, 0xFF, 0xFF, 0, *dqpn.to_bytes(3, "big"), 0,
                  *psn.to_bytes(3, "big")])


def pkt(n: int, size: int, *, dst: bytes = DST, sport: int = 50000, tclass: int = 0,
        hop: int = 64, opcode: int = RC_WRITE_MIDDLE, dqpn: int = 0x11,
        src: bytes = SRC) -> TxPacket:
    """Packet ``n``: a 12-byte BTH + ``size`` payload bytes (a memoryview, as the engine's)."""
    payload = memoryview(bytes([n & 0xFF]) * size)
    return TxPacket(ip_to_gid(src), ip_to_gid(dst), sport, [bth(opcode, n, dqpn), payload],
                    12 + size, tclass, hop)


def runtime(link: RecordingLink) -> Runtime:
    return Runtime(Port([ip_to_gid(link.local_ip)]), link, mode="manual")


def flush(rt: Runtime, pkts: list[TxPacket]) -> None:
    rt.port.tx = list(pkts)
    with rt.lock:
        rt._flush_tx_locked()


def segments(batch: tuple[bytes, int, list[bytes], int, int, int, int]) -> list[bytes]:
    """The datagrams of one GSO batch, cut at its segment size."""
    data = b"".join(batch[2])
    seg = batch[3]
    return [data[i:i + seg] for i in range(0, len(data), seg)]


def wire_icrc_ok(src: bytes, dst: bytes, sport: int, datagram: bytes, ident: int) -> bool:
    """The generic ICRC (IBA 7.8.1) over the IPv4 header Linux puts on segment ``ident``."""
    ulen = 8 + len(datagram)
    ip = roce.ipv4_header(src, dst, ulen, ident=ident, df=True)
    udp = roce.udp_header(sport, DPORT, ulen)
    return roce.icrc(ip, udp, [datagram[:-4]]) == datagram[-4:]


def sizes(link: RecordingLink) -> list[int]:
    return [b[4] for b in link.batches]


# ---- grouping ----------------------------------------------------------------------------
def test_equal_sizes_go_in_one_send_with_per_segment_ids() -> None:
    link = RecordingLink()
    rt = runtime(link)
    try:
        flush(rt, [pkt(i, 1024) for i in range(10)])
        assert link.singles == [] and sizes(link) == [10]
        b = link.batches[0]
        assert b[0] == DST and b[1] == 50000 and b[3] == 12 + 1024 + 4
        segs = segments(b)
        assert len(segs) == 10
        for i, s in enumerate(segs):
            assert s[11] == i  # in order
            assert wire_icrc_ok(SRC, DST, 50000, s, i)
            assert i == 0 or not wire_icrc_ok(SRC, DST, 50000, s, 0)
    finally:
        rt.close()


def test_a_packet_and_a_shorter_one_go_in_one_send() -> None:
    """A SEND and the coalesced ACK behind it (same QP, the ACK shorter; a ping-pong
    whose sides await each SEND's ACK): one GSO send, so the peer finds both in its
    socket at once rather than waking for each (issue 26: CPU per round trip -20 %, one
    context switch less; a pair sent and received: 28-30 -> 24-26.5 us of CPU)."""
    link = RecordingLink()
    rt = runtime(link)
    try:
        flush(rt, [pkt(0, 76), pkt(1, 16), pkt(2, 1024), pkt(3, 1024), pkt(4, 16)])
        assert link.singles == [] and sizes(link) == [2, 3]
        segs = segments(link.batches[0])
        assert [len(x) for x in segs] == [12 + 76 + 4, 12 + 16 + 4]
        assert all(wire_icrc_ok(SRC, DST, 50000, x, i) for i, x in enumerate(segs))
    finally:
        rt.close()


def test_a_shorter_last_packet_ends_the_run_and_a_longer_one_starts_a_new_one() -> None:
    link = RecordingLink()
    rt = runtime(link)
    try:
        # WRITE first (RETH: longer), middles, a short last; then another message
        lens = [1040, 1024, 1024, 1024, 300, 1024, 1024, 1040]
        flush(rt, [pkt(i, n) for i, n in enumerate(lens)])
        # [1040, 1024 (shorter: ends it)], [1024, 1024, 300], [1024, 1024], [1040] alone
        assert sizes(link) == [2, 3, 2]
        assert [len(s[2][0]) + len(s[2][1]) for s in link.singles] == [12 + 1040]
        assert link.singles[0][2][0][11] == 7
        for b in link.batches:
            assert b[3] == len(segments(b)[0])
            for i, s in enumerate(segments(b)):
                assert wire_icrc_ok(SRC, DST, 50000, s, i)
        assert len(segments(link.batches[1])[-1]) == 12 + 300 + 4
        # the single packet keeps ID 0
        single = b"".join(link.singles[0][2])
        assert wire_icrc_ok(SRC, DST, 50000, single, 0)
    finally:
        rt.close()


def test_segment_and_byte_limits() -> None:
    link = RecordingLink()
    rt = runtime(link)
    try:
        flush(rt, [pkt(i, 100) for i in range(150)])
        assert sizes(link) == [UDP_MAX_SEGMENTS, UDP_MAX_SEGMENTS, 150 - 2 * UDP_MAX_SEGMENTS]
        link.batches.clear()
        flush(rt, [pkt(i, 4096) for i in range(40)])
        per = GSO_MAX_PAYLOAD // (12 + 4096 + 4)  # 15 segments of 4112 bytes
        assert per == 15
        assert sizes(link) == [15, 15, 10]
        assert all(sum(len(p) for p in b[2]) <= GSO_MAX_PAYLOAD for b in link.batches)
        link.batches.clear()
        link.limit = 4  # what the link allows for this destination
        flush(rt, [pkt(i, 100) for i in range(10)])
        assert sizes(link) == [4, 4, 2]
    finally:
        rt.close()


SRC6 = bytes.fromhex("fd770000000000000000000000000001")
DST6 = bytes.fromhex("fd770000000000000000000000000002")


@pytest.mark.parametrize("src, dst, limit", [(SRC, DST, GSO_MAX_PAYLOAD),
                                             (SRC6, DST6, GSO_MAX_PAYLOAD_V6)])
def test_a_messages_shorter_last_joins_its_full_packets_when_the_bytes_allow(
        src: bytes, dst: bytes, limit: int) -> None:
    """A 16-packet message (15 of 4096 bytes and a shorter LAST, IPoIB-CM's case) is
    one GSO send when the 16 datagrams fit the byte limit, and 15 + 1 when the LAST
    does not; the receiver's GRO socket then gets it whole in one receive."""
    full = 12 + 4096 + 4
    fits = limit - 15 * full - 12 - 4  # the longest LAST payload that still fits
    link = RecordingLink(local_ip=src)
    rt = runtime(link)
    try:
        flush(rt, [pkt(i, 4096, src=src, dst=dst) for i in range(15)]
              + [pkt(15, fits, src=src, dst=dst)])
        assert link.singles == [] and sizes(link) == [16]
        assert sum(len(p) for p in link.batches[0][2]) == limit
        link.batches.clear()
        flush(rt, [pkt(i, 4096, src=src, dst=dst) for i in range(15)]
              + [pkt(15, fits + 4, src=src, dst=dst)])
        assert sizes(link) == [15] and len(link.singles) == 1
        assert all(sum(len(p) for p in b[2]) <= limit for b in link.batches)
    finally:
        rt.close()


@pytest.mark.parametrize("path_mtu", [1024, 2048, 4096])
@pytest.mark.parametrize("src, dst", [(SRC, DST), (SRC6, DST6)])
def test_gso_message_limit_is_the_longest_send_in_one_batch(path_mtu: int, src: bytes,
                                                            dst: bytes) -> None:
    """A SEND of :func:`gso_message_limit` bytes, cut at the path MTU, is one GSO send;
    4 bytes more (the next length without a pad) need a second."""
    def message(n: int) -> list[TxPacket]:
        full, last = divmod(n, path_mtu)
        return ([pkt(i, path_mtu, src=src, dst=dst) for i in range(full)]
                + ([pkt(full, last, src=src, dst=dst)] if last else []))

    n = gso_message_limit(path_mtu, len(dst) == 16)
    assert n % 4 == 0
    link = RecordingLink(local_ip=src)
    rt = runtime(link)
    try:
        flush(rt, message(n))
        assert link.singles == [] and len(link.batches) == 1
        link.batches.clear()
        flush(rt, message(n + 4))
        assert len(link.batches) + len(link.singles) == 2
    finally:
        rt.close()


def test_different_flows_are_not_mixed() -> None:
    link = RecordingLink()
    rt = runtime(link)
    try:
        pkts = ([pkt(i, 500) for i in range(3)] + [pkt(3, 500, dst=DST2)]
                + [pkt(4, 500, sport=50001), pkt(5, 500, sport=50001)]
                + [pkt(6, 500, sport=50001, tclass=0x60), pkt(7, 500, sport=50001, tclass=0x60)]
                + [pkt(8, 500, sport=50001, tclass=0x60, hop=9)])
        flush(rt, pkts)
        assert sizes(link) == [3, 2, 2]
        assert [(b[0], b[1], b[5], b[6]) for b in link.batches] == [
            (DST, 50000, 0, 64), (DST, 50001, 0, 64), (DST, 50001, 0x60, 64)]
        assert [(s[0], s[1]) for s in link.singles] == [(DST2, 50000), (DST, 50001)]
        for b in link.batches:
            for i, s in enumerate(segments(b)):
                assert wire_icrc_ok(SRC, b[0], b[1], s, i)
    finally:
        rt.close()


def test_one_destination_qp_per_batch() -> None:
    """Same flow, two QPs: a coalescing receiver hands a batch to one socket (a shared
    device's reuseport program picks it by the first packet's DestQP)."""
    link = RecordingLink()
    rt = runtime(link)
    try:
        flush(rt, [pkt(0, 300, dqpn=0x11), pkt(1, 300, dqpn=0x11), pkt(2, 300, dqpn=0x10022),
                   pkt(3, 300, dqpn=0x10022), pkt(4, 300, dqpn=0x10022)])
        assert sizes(link) == [2, 3]
        assert {s[5:8] for s in segments(link.batches[1])} == {b"\x01\x00\x22"}
    finally:
        rt.close()


def test_no_batching_when_the_link_says_so() -> None:
    link = RecordingLink(limit=0)
    rt = runtime(link)
    try:
        flush(rt, [pkt(i, 200) for i in range(5)])
        assert link.batches == [] and len(link.singles) == 5
        for _dst, sport, parts in link.singles:
            assert wire_icrc_ok(SRC, DST, sport, b"".join(parts), 0)
    finally:
        rt.close()


def test_a_refused_batch_is_resent_one_by_one_with_id_0() -> None:
    link = RecordingLink(refuse=True)
    rt = runtime(link)
    try:
        flush(rt, [pkt(i, 700) for i in range(6)])
        assert sizes(link) == [6]
        assert len(link.singles) == 6
        for i, (_dst, sport, parts) in enumerate(link.singles):
            data = b"".join(parts)
            assert data[11] == i
            assert wire_icrc_ok(SRC, DST, sport, data, 0)
    finally:
        rt.close()


def test_the_recording_link_is_a_gso_link_and_udp_link_too() -> None:
    assert isinstance(RecordingLink(), GsoLink)
    with UdpLink("127.0.0.1", 0) as link:
        assert isinstance(link, GsoLink)


# ---- receive: ID hints ----------------------------------------------------------------------
def datagram_with_id(i: int, ident: int, opcode: int = RC_WRITE_MIDDLE, size: int = 256,
                     sport: int = 50000) -> bytes:
    body = bth(opcode, i) + bytes([i]) * size
    return body + roce.udp_send_icrc(DST, SRC, sport, DPORT, [body], ident=ident)


def capture_receive(rt: Runtime) -> list[tuple[bytes, RxMeta]]:
    got: list[tuple[bytes, RxMeta]] = []
    rt.port.receive = lambda body, meta, now: got.append((bytes(body), meta))  # type: ignore[method-assign,assignment]
    return got


def test_gro_segments_pass_with_the_id_hint() -> None:
    link = RecordingLink()
    rt = runtime(link)
    got = capture_receive(rt)
    try:
        link.rx = [Datagram(memoryview(datagram_with_id(i, i)), DST, SRC, 50000, DPORT,
                            0, 64, b"", i) for i in range(8)]
        assert rt.progress() == 8
        assert len(got) == 8 and rt.port.counters.rcvd_icrc_err == 0
        assert link.notes == []
    finally:
        rt.close()


def test_other_id_sequences_are_recovered_and_counted() -> None:
    """rxe numbers from a per-destination counter: the first segment's ID is solved for
    (GF(2) recovery) and the next ones follow from it; a corrupt one is dropped."""
    link = RecordingLink()
    rt = runtime(link)
    got = capture_receive(rt)
    try:
        dgs = [datagram_with_id(i, 0x1230 + i) for i in range(6)]
        bad = bytearray(dgs[4])
        bad[40] ^= 0x10
        dgs[4] = bytes(bad)
        link.rx = [Datagram(memoryview(d), DST, SRC, 50000, DPORT, 0, 64, b"", i)
                   for i, d in enumerate(dgs)]
        rt.progress()
        assert [b[11] for b, _m in got] == [0, 1, 2, 3, 5]
        assert rt.port.counters.rcvd_icrc_err == 1
        assert link.notes == [(2, 1)]  # segment 0 (then the bias holds), the corrupt one
    finally:
        rt.close()


def test_a_ud_segment_gets_the_grh_with_its_id() -> None:
    link = RecordingLink()
    rt = runtime(link)
    got = capture_receive(rt)
    try:
        dgs = [datagram_with_id(i, i if i < 3 else 0x4000 + i, UD_SEND_ONLY, 64)
               for i in range(5)]
        link.rx = [Datagram(memoryview(d), DST, SRC, 50000, DPORT, 0, 64, b"", i)
                   for i, d in enumerate(dgs)]
        rt.progress()
        assert len(got) == 5
        ids = [int.from_bytes(m.grh[24:26], "big") for _b, m in got]
        assert ids == [0, 1, 2, 0x4003, 0x4004]
        for (_b, m), d in zip(got, dgs, strict=True):  # the header the ICRC covers
            ip = m.grh[20:40]
            assert roce.icrc(ip, roce.udp_header(50000, DPORT, 8 + len(d)),
                             [d[:-4]]) == d[-4:]
        assert link.notes == [(1, 0)]
    finally:
        rt.close()


def test_datagrams_without_hint_still_use_recovery() -> None:
    link = RecordingLink()
    rt = runtime(link)
    got = capture_receive(rt)
    try:
        link.rx = [Datagram(memoryview(datagram_with_id(i, 77 * i)), DST, SRC, 50000, DPORT)
                   for i in range(4)]
        rt.progress()
        assert len(got) == 4 and link.notes == []
    finally:
        rt.close()


# ---- UdpLink over loopback ------------------------------------------------------------------
def gso_parts(n: int, size: int, last: int | None = None) -> list[bytes]:
    out = []
    for i in range(n):
        out.append(bytes([i]) * (last if last is not None and i == n - 1 else size))
    return out


def recv_all(link: UdpLink, n: int, timeout: float = 5.0) -> list[Datagram]:
    got: list[Datagram] = []
    end = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < end:
        for d in link.recv_batch():
            got.append(Datagram(memoryview(bytes(d.data)), d.src_ip, d.dst_ip, d.sport,
                                d.dport, d.tos, d.ttl, d.grh, d.ident))
        if len(got) < n:
            time.sleep(0.002)
    return got


def test_udp_link_gso_to_a_gro_socket_comes_back_split_with_hints() -> None:
    with UdpLink("127.0.0.1", 0) as a, UdpLink("127.0.0.1", 0) as b:
        assert a.gso and b.gro
        parts = gso_parts(10, 1000, 300)
        sport = a.fallback_sport
        assert a.gso_limit(b"\x7f\x00\x00\x01") == UDP_MAX_SEGMENTS
        assert a.send_gso(b"\x7f\x00\x00\x01", b.port or 0, sport, parts, 1000, 10)
        got = recv_all(b, 10)
        assert [bytes(d.data) for d in got] == parts
        assert [d.ident for d in got] == list(range(10))
        assert a.stats.gso_sends == 1 and a.stats.gso_segments == 10 and a.stats.sent == 10
        assert b.stats.gro_receives == 1 and b.stats.gro_segments == 10
        assert b.stats.received == 10
        # a datagram alone carries no hint
        a.send(b"\x7f\x00\x00\x01", b.port or 0, sport, [b"alone" * 10])
        (d,) = recv_all(b, 1)
        assert d.ident == -1 and b.stats.gro_receives == 1


def test_udp_link_gso_to_a_plain_socket_arrives_as_datagrams(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTRDMA_GRO", "0")
    with UdpLink("127.0.0.1", 0) as a, UdpLink("127.0.0.1", 0) as b:
        assert a.gso and not b.gro
        parts = gso_parts(5, 600)
        assert a.send_gso(b"\x7f\x00\x00\x01", b.port or 0, a.fallback_sport, parts, 600, 5)
        got = recv_all(b, 5)
        assert [bytes(d.data) for d in got] == parts
        assert all(d.ident == -1 for d in got) and b.stats.gro_receives == 0


def test_gso_with_a_ttl_leaves_later_sends_with_that_ttl_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A GSO send and plain sends of one TTL (rdma-core's pingpongs send with hop limit
    1; ``-s`` above the MTU makes runs) share the TTL's ancillary data (built once per
    TOS/TTL, issue 26): the GSO send's UDP_SEGMENT must not stick to it, or each later
    plain send would be cut into segments of that size."""
    monkeypatch.setenv("SOFTRDMA_GRO", "0")
    with UdpLink("127.0.0.1", 0) as a, UdpLink("127.0.0.1", 0) as b:
        parts = gso_parts(3, 600)
        for _ in range(2):
            a.send(b"\x7f\x00\x00\x01", b.port or 0, a.fallback_sport, [b"p" * 1500],
                   ttl=1)
            assert a.send_gso(b"\x7f\x00\x00\x01", b.port or 0, a.fallback_sport, parts,
                              600, 3, ttl=1)
            got = recv_all(b, 4)
            assert [len(d.data) for d in got] == [1500, 600, 600, 600]
            assert all(d.ttl == 1 for d in got)
        a.send(b"\x7f\x00\x00\x01", b.port or 0, a.fallback_sport, [b"q" * 1500], ttl=1)
        (d,) = recv_all(b, 1)
        assert len(d.data) == 1500 and d.ttl == 1


def test_env_turns_batching_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTRDMA_GSO", "0")
    with UdpLink("127.0.0.1", 0) as a:
        assert not a.gso and not a.gro and a.gso_limit(b"\x7f\x00\x00\x01") == 0


def test_send_gso_checks_its_arguments() -> None:
    with UdpLink("127.0.0.1", 0) as a:
        with pytest.raises(InvalidArgument, match="nseg"):
            a.send_gso(b"\x7f\x00\x00\x01", 4791, a.fallback_sport, [b"x"], 1, 65)
        with pytest.raises(InvalidArgument, match="seg_size"):
            a.send_gso(b"\x7f\x00\x00\x01", 4791, a.fallback_sport, [b"x"], 0, 1)


class RefusingSocket:
    """A socket whose sendmsg fails with ``code`` (what a kernel/driver may answer)."""

    def __init__(self, real: socket.socket, code: int) -> None:
        self.real = real
        self.code = code
        self.calls = 0

    def sendmsg(self, *args: Any) -> int:
        self.calls += 1
        raise OSError(self.code, "simulated")

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP])
def test_a_link_wide_refusal_turns_gso_off(code: int) -> None:
    with UdpLink("127.0.0.1", 0) as a:
        sport = a.fallback_sport
        a._socks[sport] = RefusingSocket(a._socks[sport], code)  # type: ignore[assignment]
        assert not a.send_gso(b"\x7f\x00\x00\x02", 4791, sport, gso_parts(3, 100), 100, 3)
        assert not a.gso and a.gso_limit(b"\x7f\x00\x00\x03") == 0
        st = a.stats
        assert (st.gso_refused, st.gso_last_errno, st.gso_fallback_segments) == (1, code, 3)
        assert st.gso_sends == 0 and st.sent == 0 and st.send_dropped == 0


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EMSGSIZE])
def test_a_destination_refusal_turns_gso_off_for_that_destination(code: int) -> None:
    with UdpLink("127.0.0.1", 0) as a:
        sport = a.fallback_sport
        a._socks[sport] = RefusingSocket(a._socks[sport], code)  # type: ignore[assignment]
        assert not a.send_gso(b"\x7f\x00\x00\x02", 4791, sport, gso_parts(3, 100), 100, 3)
        assert a.gso and a.gso_limit(b"\x7f\x00\x00\x02") == 0
        assert a.gso_limit(b"\x7f\x00\x00\x03") == UDP_MAX_SEGMENTS
        assert a.stats.gso_refused == 1 and a.stats.gso_last_errno == code


def test_a_network_loss_loses_the_batch_like_the_network() -> None:
    with UdpLink("127.0.0.1", 0) as a:
        sport = a.fallback_sport
        a._socks[sport] = RefusingSocket(a._socks[sport], errno.ENOBUFS)  # type: ignore[assignment]
        assert a.send_gso(b"\x7f\x00\x00\x02", 4791, sport, gso_parts(4, 100), 100, 4)
        assert a.gso and a.stats.send_dropped == 4 and a.stats.gso_refused == 0


def test_runtime_falls_back_on_a_real_udp_link_refusal() -> None:
    """End to end: the kernel 'refuses' (EIO), the runtime resends one per call (ID 0),
    the receiver accepts every packet, later flushes do not batch."""
    with UdpLink("127.0.0.1", 0) as rx:
        tx = UdpLink("127.0.0.2", 0)
        rt = Runtime(Port([ip_to_gid(b"\x7f\x00\x00\x02")]), tx, mode="manual",
                     udp_port=rx.port or 0)
        try:
            sport = tx.fallback_sport
            real = tx._socks[sport]
            refusing = RefusingSocket(real, errno.EIO)
            tx._socks[sport] = refusing  # type: ignore[assignment]
            first = [TxPacket(ip_to_gid(b"\x7f\x00\x00\x02"), ip_to_gid(b"\x7f\x00\x00\x01"),
                              sport, [bth(RC_WRITE_MIDDLE, i), bytes(512)], 12 + 512)
                     for i in range(4)]
            rt.port.tx = first
            # the refused batch, then the single sends (which now fail too): restore the
            # real socket after the first call
            calls: list[int] = []

            def once(*args: Any) -> int:
                calls.append(1)
                if len(calls) == 1:
                    raise OSError(errno.EIO, "simulated")
                return real.sendmsg(*args)

            refusing.sendmsg = once  # type: ignore[method-assign]
            with rt.lock:
                rt._flush_tx_locked()
            assert len(calls) == 5 and not tx.gso
            got = recv_all(rx, 4)
            assert len(got) == 4
            for d in got:
                assert roce.icrc_ok_udp_id(b"\x7f\x00\x00\x02", b"\x7f\x00\x00\x01", sport,
                                           rx.port or 0, d.data, 0)
            st = tx.stats
            assert (st.gso_refused, st.gso_fallback_segments, st.sent) == (1, 4, 4)
        finally:
            rt.close()


def test_icrc_ok_udp_id_matches_the_generic_icrc() -> None:
    for ident in (0, 1, 2, 63, 0xFFFF):
        d = datagram_with_id(3, ident)
        assert roce.icrc_ok_udp_id(DST, SRC, 50000, DPORT, d, ident)
        assert not roce.icrc_ok_udp_id(DST, SRC, 50000, DPORT, d, (ident + 1) & 0xFFFF)
        assert wire_icrc_ok(DST, SRC, 50000, d, ident)
        assert roce.recover_ipv4_id(DST, SRC, 50000, DPORT, d) == (ident, True)
    assert not roce.icrc_ok_udp_id(DST, SRC, 50000, DPORT, b"short", 0)
    # IPv6 has no Identification: the same ICRC whatever the hint
    s6, d6 = socket.inet_pton(socket.AF_INET6, "fd00::1"), socket.inet_pton(socket.AF_INET6,
                                                                           "fd00::2")
    body = bth(RC_WRITE_MIDDLE, 1) + bytes(64)
    icrc = roce.udp_send_icrc(s6, d6, 50000, DPORT, [body], ident=5)
    assert icrc == roce.udp_send_icrc(s6, d6, 50000, DPORT, [body])
    assert roce.icrc_ok_udp_id(s6, d6, 50000, DPORT, body + icrc, 9)


def test_truncation_rule_holds_with_gro() -> None:
    with UdpLink("127.0.0.1", 0, max_datagram=512, ring=4) as small, \
            UdpLink("127.0.0.1", 0) as a:
        assert small.gro
        port = small.port or 0
        a.send_gso(b"\x7f\x00\x00\x01", port, a.fallback_sport, gso_parts(3, 600), 600, 3)
        a.send_gso(b"\x7f\x00\x00\x01", port, a.fallback_sport, gso_parts(3, 500), 500, 3)
        got = recv_all(small, 3)
        assert [len(d.data) for d in got] == [500, 500, 500]
        assert small.stats.truncated == 1


def test_module_constants_are_linux_values() -> None:
    assert (udp_mod.SOL_UDP, udp_mod.UDP_SEGMENT, udp_mod.UDP_GRO) == (17, 103, 104)


def test_ipv6_gso_and_gro_over_loopback() -> None:
    """IPv6 has no Identification: the batch's ICRCs are the usual ones, and the split
    works the same."""
    lo6 = socket.inet_pton(socket.AF_INET6, "::1")
    try:
        a, b = UdpLink("::1", 0), UdpLink("::1", 0)
    except DeviceError as exc:
        pytest.skip(f"no IPv6 loopback: {exc}")
    with a, b:
        sport = a.fallback_sport
        bodies = [bth(RC_WRITE_MIDDLE, i) + bytes([i]) * 500 for i in range(6)]
        parts = [x + roce.udp_send_icrc(lo6, lo6, sport, b.port or 0, [x], ident=i)
                 for i, x in enumerate(bodies)]
        assert a.send_gso(lo6, b.port or 0, sport, parts, len(parts[0]), 6)
        got = recv_all(b, 6)
        assert [bytes(d.data) for d in got] == parts
        assert [d.ident for d in got] == list(range(6)) and b.stats.gro_receives == 1
        assert all(roce.icrc_ok_udp(lo6, lo6, sport, b.port or 0, d.data) for d in got)


@pytest.mark.parametrize("host, limit", [("127.0.0.1", GSO_MAX_PAYLOAD),
                                         ("::1", GSO_MAX_PAYLOAD_V6)])
def test_a_send_at_the_byte_limit_reaches_a_gro_socket_in_one_receive(
        host: str, limit: int) -> None:
    """The runtime's byte limit is the kernel's: a GSO send of 15 full packets and a
    shorter last one that fills :data:`GSO_MAX_PAYLOAD` (IPv6: ``_V6``) comes back as one
    coalesced receive; 4 bytes more and the kernel cuts it into its datagrams before
    the socket (one receive each), which is what the limit avoids."""
    ip = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    try:
        a, b = UdpLink(host, 0), UdpLink(host, 0)
    except DeviceError as exc:
        pytest.skip(f"no {host} loopback: {exc}")
    with a, b:
        assert a.gso and b.gro
        for extra, receives in ((0, 1), (4, 16)):
            before = b.stats.gro_receives
            parts = gso_parts(16, 4112, limit - 15 * 4112 + extra)
            assert a.send_gso(ip, b.port or 0, a.fallback_sport, parts, 4112, 16)
            got = recv_all(b, 16)
            assert [bytes(d.data) for d in got] == parts
            assert (b.stats.gro_receives - before == 1) == (receives == 1)

"""The sans-I/O IPoIB core (softrdma.ipoib): codecs, neighbour table, connection table,
REQ crossing (RFC 4755 §3.3), per-destination MTU (§7.2), bad input counted and dropped."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from harness.ipoib_net import connected_net, gid, make_net, v4, v6
from hypothesis import given
from hypothesis import strategies as st

from softrdma.errors import DecodeError, InvalidArgument
from softrdma.ipoib import nd
from softrdma.ipoib.conn import IPOIB_CM_BUF_SIZE, ConnState, conn_mtu
from softrdma.ipoib.encap import ARP_LEN, ArpOp, ArpPacket, EtherType, decode_encap, encap_header
from softrdma.ipoib.events import (
    ConnClose,
    ConnOpen,
    ConnReject,
)
from softrdma.ipoib.hwaddr import (
    FLAG_RC,
    MULTICAST_QPN,
    CmData,
    HwAddr,
    ipv4_broadcast_mgid,
    ipv4_mcast_mgid,
    ipv6_mcast_mgid,
    link_local,
    service_id,
    solicited_node,
)
from softrdma.ipoib.iface import IfaceConfig, IpoibInterface
from softrdma.ipoib.ip import checksum, fragment_ipv4, icmp4_frag_needed, ipv4_header, parse
from softrdma.ipoib.neigh import NeighbourTable, NeighConfig, NudState, Probe
from softrdma.wire.cm import RejReason


# ---- codecs -------------------------------------------------------------------------
def test_hwaddr_layout_and_flags() -> None:
    hw = HwAddr(0x48, gid(1), FLAG_RC)
    raw = hw.encode()
    assert len(raw) == 20 and raw[0] == 0x80 and raw[1:4] == b"\x00\x00\x48"
    assert raw[4:] == gid(1)
    # §3.1: reserved flag bits are ignored on receive
    assert HwAddr.decode(b"\xff" + raw[1:]).flags == 0xC0
    assert hw.key == b"\0" + raw[1:]
    with pytest.raises(DecodeError):
        HwAddr.decode(raw[:19])
    with pytest.raises(InvalidArgument):
        HwAddr(1 << 24, gid(1))


@given(st.integers(0, 0xFFFFFF), st.binary(min_size=16, max_size=16), st.sampled_from([0, 0x40, 0x80, 0xC0]))
def test_hwaddr_roundtrip(qpn: int, g: bytes, flags: int) -> None:
    hw = HwAddr(qpn, g, flags)
    assert HwAddr.decode(hw.encode()) == hw


def test_mgids_match_linux() -> None:
    # RFC 4391; ../shared/specs/ipoib.md §3: Linux broadcast ff12:401b:ffff::ffff:ffff
    assert ipv4_broadcast_mgid() == bytes.fromhex("ff12401bffff000000000000ffffffff")
    assert ipv4_broadcast_mgid(0x8001) == bytes.fromhex("ff12401b8001000000000000ffffffff")
    # ip_ib_mc_map: low 28 bits of 239.1.2.3 -> 0f 01 02 03
    assert ipv4_mcast_mgid(bytes((239, 1, 2, 3))) == bytes.fromhex(
        "ff12401bffff0000000000000f010203")
    allnodes = ipaddress.IPv6Address("ff02::1").packed
    assert ipv6_mcast_mgid(allnodes) == bytes.fromhex("ff12601bffff00000000000000000001")
    sn = solicited_node(ipaddress.IPv6Address("fd00::1:2:3").packed)
    assert ipaddress.IPv6Address(sn) == ipaddress.IPv6Address("ff02::1:ff02:3")


def test_service_id_and_private_data() -> None:
    assert service_id(0x123456) == 0x1000000000123456
    d = CmData(0x11, 65524)
    raw = d.encode()
    assert raw == bytes.fromhex("00000011") + struct.pack(">I", 65524)
    # §6: the reserved octet is ignored on receive, trailing padding too
    assert CmData.decode(b"\xaa" + raw[1:] + bytes(84)) == d
    with pytest.raises(DecodeError):
        CmData.decode(raw[:7])


def test_link_local_inverts_ul_bit() -> None:
    g = bytes(8) + bytes.fromhex("0002c90300001234")
    assert str(link_local(g)) == "fe80::202:c903:0:1234"


def test_encap_and_arp() -> None:
    assert encap_header(EtherType.IPV6) == b"\x86\xdd\x00\x00"
    assert decode_encap(b"\x08\x00\x12\x34xyz") == EtherType.IPV4  # reserved ignored
    for bad in (b"\x08", b"\x12\x34\x00\x00"):
        with pytest.raises(DecodeError):
            decode_encap(bad)
    arp = ArpPacket(ArpOp.REQUEST, HwAddr(5, gid(1), FLAG_RC), bytes((10, 1, 0, 1)),
                    HwAddr(0, bytes(16)), bytes((10, 1, 0, 2)))
    raw = arp.encode()
    assert len(raw) == ARP_LEN == 56 and raw[:8] == bytes.fromhex("0020080014040001")
    assert ArpPacket.decode(raw) == arp
    for bad in (raw[:40], b"\x00\x01" + raw[2:], raw[:4] + b"\x06" + raw[5:],
                raw[:6] + b"\x00\x09" + raw[8:]):
        with pytest.raises(DecodeError):
            ArpPacket.decode(bad)


def test_nd_build_decode() -> None:
    src = ipaddress.IPv6Address("fd00::1").packed
    tgt = ipaddress.IPv6Address("fd00::2").packed
    hw = HwAddr(7, gid(1), FLAG_RC)
    pkt = nd.build(nd.NdMessage(nd.NdType.NEIGHBOR_SOLICITATION, src, solicited_node(tgt), tgt, hw))
    assert len(pkt) == 40 + 24 + 24 and pkt[7] == 255
    assert pkt[40 + 24:40 + 28] == b"\x01\x03\x00\x00"  # option type 1, length 3, 2 pad
    msg = nd.decode(pkt)
    assert msg.lladdr == hw and msg.target == tgt
    bad = bytearray(pkt)
    bad[-1] ^= 1
    with pytest.raises(DecodeError):
        nd.decode(bytes(bad))  # checksum
    bad = bytearray(pkt)
    bad[7] = 64
    with pytest.raises(DecodeError):
        nd.decode(bytes(bad))  # hop limit


def test_icmp_frag_needed_and_fragmentation() -> None:
    payload = bytes(range(256)) * 12
    pkt = ipv4_header(bytes((10, 1, 0, 1)), bytes((10, 1, 0, 2)), 17, len(payload),
                      frag=0x4000) + payload
    err = icmp4_frag_needed(pkt, bytes((10, 1, 0, 2)), 1500)
    info = parse(err)
    assert info.dst == bytes((10, 1, 0, 1)) and info.proto == 1
    assert checksum(err[:20]) == 0 and checksum(err[20:]) == 0
    assert err[20:22] == b"\x03\x04" and struct.unpack(">H", err[26:28])[0] == 1500
    nodf = ipv4_header(bytes((10, 1, 0, 1)), bytes((10, 1, 0, 2)), 17, len(payload)) + payload
    frags = fragment_ipv4(nodf, 1000)
    assert all(len(f) <= 1000 and checksum(f[:20]) == 0 for f in frags)
    assert b"".join(f[20:] for f in frags) == payload
    assert [struct.unpack(">H", f[6:8])[0] & 0x2000 for f in frags][-1] == 0


# ---- neighbour table ------------------------------------------------------------------
def test_neighbour_state_machine() -> None:
    t = NeighbourTable(NeighConfig(retrans_s=1, reachable_s=30, delay_s=5, gc_stale_s=60))
    ip = bytes((10, 1, 0, 2))
    t.use(ip, 0.0, b"pkt")
    assert t.take_output() == [Probe(ip, None)]
    t.on_timer(1.0)
    t.on_timer(2.0)
    assert [type(o) for o in t.take_output()] == [Probe, Probe]
    hw = HwAddr(9, gid(2), FLAG_RC)
    t.confirm(ip, hw, 2.5)
    out = t.take_output()
    assert t.entries[ip].state is NudState.REACHABLE and out[0].entry.queue  # type: ignore[union-attr]
    t.on_timer(33.0)
    assert t.entries[ip].state is NudState.STALE
    t.use(ip, 34.0)
    assert t.entries[ip].state is NudState.DELAY
    t.on_timer(39.5)
    assert t.entries[ip].state is NudState.PROBE and t.take_output() == [Probe(ip, hw)]
    for now in (40.5, 41.5, 42.5):
        t.on_timer(now)
    assert ip not in t.entries  # 3 unicast probes unanswered


def test_incomplete_gives_up() -> None:
    t = NeighbourTable()
    ip = bytes((10, 1, 0, 9))
    t.use(ip, 0.0, b"x")
    for now in (1.0, 2.0, 3.0):
        t.on_timer(now)
    assert ip not in t.entries
    kinds = [type(o).__name__ for o in t.take_output()]
    assert kinds == ["Probe", "Probe", "Probe", "Unresolved"]


def _to_probe(t: NeighbourTable, ip: bytes, hw: HwAddr) -> float:
    """``ip`` confirmed at 0, STALE at 30, used at 31, PROBE at 36: returns the first
    probe's deadline."""
    t.confirm(ip, hw, 0.0)
    t.on_timer(30.0)
    t.use(ip, 31.0)
    t.on_timer(36.0)
    assert t.entries[ip].state is NudState.PROBE
    t.take_output()
    return t.entries[ip].deadline


def test_late_probe_timers_do_not_count() -> None:
    """A probe timer that fires late was held up by our own process (descheduled on a
    busy machine), not by the peer: the probe goes again uncounted, and the answer that
    then comes keeps the neighbour. Timers on time still find a dead peer, and so do
    late ones after ``max_late`` of them."""
    ip, hw = bytes((10, 1, 0, 2)), HwAddr(9, gid(2), FLAG_RC)
    t = NeighbourTable()
    now = _to_probe(t, ip, hw)
    for _ in range(5):  # each timer 3 s late: the peer never had its second
        now += 3.0
        t.on_timer(now)
        assert t.entries[ip].state is NudState.PROBE
        now = t.entries[ip].deadline
    assert t.take_output() == [Probe(ip, hw)] * 5 and t.late_probes == 5
    t.confirm(ip, hw, now - 0.5)  # the answer
    assert t.entries[ip].state is NudState.REACHABLE and t.entries[ip].late == 0

    t = NeighbourTable()  # on time: three unanswered probes and it is gone
    now = _to_probe(t, ip, hw)
    for _ in range(3):
        t.on_timer(now)
        now = t.entries[ip].deadline if ip in t.entries else now
    assert ip not in t.entries

    t = NeighbourTable(NeighConfig(max_late=2))  # always late: bounded all the same
    now = _to_probe(t, ip, hw)
    fired = 0
    while ip in t.entries:
        now += 3.0
        t.on_timer(now)
        fired += 1
        now = t.entries[ip].deadline if ip in t.entries else now
    assert fired == 2 + 3


@pytest.mark.parametrize("progress", [False, True], ids=["no-progress", "rc-acks"])
def test_rc_progress_confirms_the_neighbour(progress: bool) -> None:
    """RFC 4861 §7.3.1: the peer acknowledging our RC sends is forward progress, a
    reachability confirmation. A peer whose ARP answers never come back (lost, or too
    late on a busy machine) but whose RC connection carries our traffic stays REACHABLE,
    is never probed, and keeps its connection for minutes; without that confirmation the
    same silence ends the neighbour and its connection within ReachableTime + DELAY +
    three probes (RFC 4861 §7.3.3, RFC 4755 §3.4)."""
    net = connected_net()
    a, b = net.ifs
    ip_b = bytes((10, 9, 0, 2))
    (cid,) = a.conns.conns
    net.drop_ud = lambda i, o: i == 1 and o.ethertype == EtherType.ARP  # b's answers lost
    probes = a.counters["arp_requests"]
    net.now = 0.0
    while net.now < 180.0:
        net.now += 0.5
        a.send_ip(v4(1, 2, 9000), net.now)
        net.pump()
        if progress:  # the runtime reports the successful RC send completions
            a.conn_progress(cid, net.now)
            net.pump()
        d = a.next_deadline()
        if d is not None and d <= net.now:
            a.on_timer(net.now)
            net.pump()
    if progress:
        assert list(a.conns.conns) == [cid] and a.counters["conn_closed"] == 0
        assert a.neigh.entries[ip_b].state is NudState.REACHABLE
        assert a.counters["arp_requests"] == probes
        assert net.tun[1][-1] == v4(1, 2, 9000)
    else:
        assert cid not in a.conns.conns and a.counters["conn_closed"] >= 1
        assert a.counters["neigh_failed"] + a.counters["arp_requests"] > probes


def test_conn_progress_ignores_uc_and_unknown_connections() -> None:
    """UC has no ACKs: its send completions prove nothing about the peer."""
    net = connected_net()
    a, _ = net.ifs
    (cid,) = a.conns.conns
    n = a.neigh.entries[bytes((10, 9, 0, 2))]
    a.conns.conns[cid].transport = "UC"
    a.conn_progress(cid, 20.0)
    a.conn_progress(999, 20.0)
    assert n.confirmed < 20.0
    a.conns.conns[cid].transport = "RC"
    a.conn_progress(cid, 20.0)
    assert n.confirmed == 20.0


def test_arp_resolution_then_unicast_over_ud() -> None:
    net = make_net(mode="datagram")
    a, b = net.ifs
    pkt = v4(1, 2, 100)
    a.send_ip(pkt, 0.0)
    net.pump()
    assert net.tun[1] == [pkt]
    kinds = [(i, o.ethertype, o.dest.qpn == MULTICAST_QPN) for i, o in net.ud]
    assert kinds[0] == (0, EtherType.ARP, True)           # request to the broadcast group
    assert kinds[1] == (1, EtherType.ARP, False)          # reply unicast over UD (§7)
    assert a.neigh.entries[bytes((10, 9, 0, 2))].state is NudState.REACHABLE
    assert a.neigh.entries[bytes((10, 9, 0, 2))].hw == b.hwaddr
    assert b.counters["arp_replies"] == 1 and a.counters["rx_ud"] == 0


def test_nd_resolution_ipv6() -> None:
    net = make_net()
    a, b = net.ifs
    pkt = v6(1, 2, 200)
    a.send_ip(pkt, 0.0)
    net.pump()
    assert net.tun[1] == [pkt]
    ns = [o for i, o in net.ud if i == 0 and o.ethertype == EtherType.IPV6][0]
    assert ns.dest.gid == ipv6_mcast_mgid(solicited_node(ipaddress.IPv6Address("fd09::2").packed))
    assert b.counters["na_sent"] == 1


def test_connected_mode_big_over_rc_then_small_too() -> None:
    net = make_net()
    a, b = net.ifs
    a.send_ip(v4(1, 2, 100), 0.0)  # small, no connection yet: UD at once
    net.pump()
    big = v4(1, 2, 60000)
    a.send_ip(big, 0.0)
    net.pump()
    assert net.tun[1][-1] == big
    conn = a.conns.tx_conn(b.hwaddr.key)
    assert conn is not None and conn.state is ConnState.ESTABLISHED
    assert conn.mtu == 65520 and conn.tx_packets == 1 and conn.tx_bytes == 60000
    assert a.counters["tx_conn"] == 1 and a.counters["tx_ud"] == 1
    # small, the connection up: over it too, in order with the big ones (Linux
    # ipoib_start_xmit; over UD, one TCP flow's packets would be reordered)
    a.send_ip(v4(1, 2, 1000), 0.0)
    net.pump()
    assert a.counters["tx_ud"] == 1 and a.counters["tx_conn"] == 2
    assert conn.tx_packets == 2 and net.tun[1][-1] == v4(1, 2, 1000)
    # b answers over the connection a opened (every unicast accepted on any mode, §7)
    b.send_ip(v4(2, 1, 30000), 0.0)
    net.pump()
    assert net.tun[0][-1] == v4(2, 1, 30000)
    assert len(a.conns.conns) == 1 and len(b.conns.conns) == 1


def test_too_big_gets_icmp_or_fragments() -> None:
    net = make_net(mode="datagram")
    a, _ = net.ifs
    a.send_ip(v4(1, 2, 100), 0.0)
    net.pump()
    a.send_ip(v4(1, 2, 3000, df=True), 0.0)
    net.pump()
    err = net.tun[0][-1]
    info = parse(err)
    assert info.dst == bytes((10, 9, 0, 1)) and err[20:22] == b"\x03\x04"
    assert info.src == bytes((10, 9, 0, 2))  # not a local address: no martian source
    assert struct.unpack(">H", err[26:28])[0] == 2044
    a.send_ip(v4(1, 2, 5000, df=False), 0.0)
    net.pump()
    assert a.counters["tx_fragments"] == 3 and all(len(p) <= 2044 for p in net.tun[1])
    a.send_ip(v6(1, 2, 100), 0.0)
    net.pump()
    a.send_ip(v6(1, 2, 4000), 0.0)
    net.pump()
    err6 = net.tun[0][-1]
    assert err6[40] == 2 and struct.unpack(">I", err6[44:48])[0] == 2044


@pytest.mark.parametrize(("qpns", "rejecter"), [([0x50, 0x41], 0), ([0x41, 0x50], 1),
                                                 ([0x41, 0x41], 1)])
def test_req_crossing_leaves_one_connection(qpns: list[int], rejecter: int) -> None:
    """§3.3: the side with the larger address (flags zeroed, MSB first: the QPN, then the
    GID) rejects the crossing REQ with Consumer Reject; one connection is left."""
    net = make_net(qpns=qpns)
    a, b = net.ifs
    a.send_ip(v4(1, 2, 100), 0.0)
    net.pump()
    net.hold_reqs = True
    a.send_ip(v4(1, 2, 10000), 0.0)
    b.send_ip(v4(2, 1, 10000), 0.0)
    net.pump()
    assert len(net.reqs) == 2  # the REQs cross
    net.deliver_reqs()
    net.hold_reqs = False
    net.pump()
    assert [(i, r.reason) for i, r in net.rejects] == [(rejecter, RejReason.CONSUMER_DEFINED)]
    assert CmData.decode(net.rejects[0][1].private_data).ud_qpn == qpns[rejecter]
    assert len(a.conns.conns) == 1 and len(b.conns.conns) == 1
    assert net.ifs[rejecter].counters["conn_crossing_rejects"] == 1
    assert net.ifs[1 - rejecter].counters["conn_crossing_rejects"] == 0
    assert net.tun[1][-1] == v4(1, 2, 10000) and net.tun[0][-1] == v4(2, 1, 10000)


def test_linux_style_second_connection_is_accepted() -> None:
    net = connected_net()
    a, b = net.ifs
    # a Linux peer opens its own connection although ours is up
    conn = b.conns._new(a.hwaddr, True, "RC", 0.0)
    b.out.append(ConnOpen(conn.conn_id, a.hwaddr, "RC", service_id(a.hwaddr.qpn),
                          b.conns.private_data))
    net.pump()
    assert len(a.conns.conns) == 2 and len(b.conns.conns) == 2 and not net.rejects
    b.send_ip(v4(2, 1, 9000), 0.0)
    net.pump()
    assert net.tun[0][-1] == v4(2, 1, 9000)
    assert b.conns.tx_conn(a.hwaddr.key) is conn


@pytest.mark.parametrize("pd", [b"", bytes(92), b"\x00\x00\x01", struct.pack(">II", 0x42, 10)])
def test_bad_req_private_data_rejected_with_ud_qpn(pd: bytes) -> None:
    net = connected_net()
    a, b = net.ifs
    b.conn_request(77, gid(9), pd, "RC", 0.0)
    out = b.take_output()
    assert len(out) == 1 and isinstance(out[0], ConnReject)
    assert out[0].reason == RejReason.CONSUMER_DEFINED
    assert CmData.decode(out[0].private_data) == CmData(b.hwaddr.qpn, IPOIB_CM_BUF_SIZE)
    assert b.counters["conn_bad_req"] == 1
    a.send_ip(v4(1, 2, 9000), 0.0)  # the existing connection is undisturbed
    net.pump()
    assert net.tun[1][-1] == v4(1, 2, 9000) and len(b.conns.conns) == 1


@pytest.mark.parametrize("rep", [None, b"\x00\x00\x01", CmData(0x42, 0).encode() + bytes(188),
                                 CmData(0x42, 10).encode()])
def test_bad_or_missing_rep_private_data_closes_ours(rep: bytes | None) -> None:
    """RFC 4755 §6: the REP tells the peer's receive MTU. Ours established with none, an
    unreadable one or one below the minimum is closed (counted), and no exception leaves
    the engine, whatever it held for the connection (a packet over the UD MTU once raised
    DecodeError: fragmenting it to the unknown MTU 0)."""
    net = make_net()
    a, _ = net.ifs
    a.send_ip(v4(1, 2, 100), 0.0)  # the neighbour, over UD
    net.pump()
    net.hold_reqs = True
    a.send_ip(v4(1, 2, 9000, df=False), 0.0)  # held for the connection this opens
    net.pump()
    (_, req), = net.reqs
    a.conn_established(req.conn_id, 0.0, rep_private_data=rep)
    out = a.take_output()
    assert [o.conn_id for o in out if isinstance(o, ConnClose)] == [req.conn_id]
    assert req.conn_id not in a.conns.conns and a.counters["conn_bad_req"] == 1


def test_wrong_flags_are_tolerated() -> None:
    """§8: a peer advertising RC that refuses connections costs a REJ, then UD."""
    net = make_net()
    a, b = net.ifs
    a.send_ip(v4(1, 2, 100), 0.0)
    net.pump()
    b.conns.crossing_rule = True
    real = b.conn_request

    def refuse(token: int, peer_gid: bytes, private_data: bytes, transport: str,
               now: float) -> None:
        b.out.append(ConnReject(token, RejReason.INVALID_SERVICE_ID, b"", "not listening"))
    b.conn_request = refuse  # type: ignore[method-assign]
    a.send_ip(v4(1, 2, 1500), 0.0)   # fits UD: goes at once
    a.send_ip(v4(1, 2, 8000), 0.0)   # held for the connection, refused -> ICMP
    net.pump()
    assert a.counters["conn_refused"] == 1 and net.tun[1][-1] == v4(1, 2, 1500)
    assert net.tun[0][-1][20:22] == b"\x03\x04"
    a.send_ip(v4(1, 2, 8000), 0.0)   # no new REQ during the back-off: ICMP at once
    net.pump()
    assert a.counters["conn_opened"] == 1 and a.counters["tx_icmp_too_big"] == 2
    b.conn_request = real  # type: ignore[method-assign]
    # reserved flag bits in an ARP reply are ignored (§3.1)
    arp = ArpPacket(ArpOp.REPLY, HwAddr(b.hwaddr.qpn, b.hwaddr.gid, 0xFF), bytes((10, 9, 0, 2)),
                    a.hwaddr, bytes((10, 9, 0, 1))).encode()
    raw = bytearray(arp)
    raw[8] = 0xFF
    a.receive_ud(encap_header(EtherType.ARP) + bytes(raw), b.hwaddr.gid, b.hwaddr.qpn, 0.0)
    assert a.neigh.entries[bytes((10, 9, 0, 2))].hw.flags == 0xC0  # type: ignore[union-attr]


def test_malformed_input_counted_and_dropped() -> None:
    net = connected_net()
    a, b = net.ifs
    before = len(net.tun[1])
    b.receive_ud(b"\x08", a.hwaddr.gid, a.hwaddr.qpn, 0.0)
    b.receive_ud(b"\x12\x34\x00\x00" + v4(1, 2, 100), a.hwaddr.gid, a.hwaddr.qpn, 0.0)
    b.receive_ud(encap_header(EtherType.IPV6) + v4(1, 2, 100), a.hwaddr.gid, a.hwaddr.qpn, 0.0)
    b.receive_ud(encap_header(EtherType.ARP) + bytes(30), a.hwaddr.gid, a.hwaddr.qpn, 0.0)
    b.receive_ud(encap_header(EtherType.ARP) + b"\x00\x01" + bytes(54), a.hwaddr.gid, 5, 0.0)
    b.receive_ud(encap_header(EtherType.IPV4) + b"\x45" + bytes(10), a.hwaddr.gid, 5, 0.0)
    cid = next(iter(b.conns.conns))
    b.receive_conn(cid, b"\x00", 0.0)
    b.receive_conn(cid, encap_header(EtherType.ARP) + bytes(56), 0.0)
    c = b.counters
    assert (c["rx_bad_encap"], c["rx_bad_arp"], c["rx_bad_ip"]) == (5, 2, 1)
    assert b.take_output() == [] and len(net.tun[1]) == before
    a.send_ip(v4(1, 2, 9000), 0.0)
    net.pump()
    assert net.tun[1][-1] == v4(1, 2, 9000)


def test_multicast_over_ud_and_three_hosts() -> None:
    net = make_net(3)
    a = net.ifs[0]
    assert ipv4_broadcast_mgid() in net.joined[1]
    bcast = ipv4_header(bytes((10, 9, 0, 1)), bytes((10, 9, 0, 255)), 17, 10) + bytes(10)
    a.send_ip(bcast, 0.0)
    net.pump()
    assert net.tun[1] == [bcast] and net.tun[2] == [bcast]
    for k in (2, 3):
        a.send_ip(v4(1, k, 20000), 0.0)
        net.pump()
        assert net.tun[k - 1][-1] == v4(1, k, 20000)
    assert len(a.conns.conns) == 2


def test_neighbour_expiry_tears_down_and_reconnects() -> None:
    net = connected_net()
    a, b = net.ifs
    assert len(a.conns.conns) == 1
    for t in (31.0, 92.0):  # REACHABLE -> STALE -> gone
        net.now = t
        a.on_timer(t)
        net.pump()
    assert not a.neigh.entries and not a.conns.conns and not b.conns.conns
    a.send_ip(v4(1, 2, 9000), 100.0)
    net.pump()
    assert net.tun[1][-1] == v4(1, 2, 9000) and a.counters["conn_opened"] == 2


def test_idle_neighbour_leaves_the_peers_connection_in_use() -> None:
    """The neighbour entry we only learned (the peer's ARP request) and never use goes
    after gc_stale_s, and with it the connection *we* opened (RFC 4755 §3.4, Linux's
    neighbour reaping), but not the one the peer opened and sends on: a live peer
    streaming to us keeps its connection (it goes by its own idle timer, or when the
    peer closes it)."""
    net = make_net()
    a, b = net.ifs
    b.send_ip(v4(2, 1, 100), 0.0)   # b resolves a: a learns b (STALE, unused by a)
    net.pump()
    b.send_ip(v4(2, 1, 9000), 0.0)  # b's connection to a
    net.pump()
    (cid,) = a.conns.conns
    assert not a.conns.conns[cid].active and bytes((10, 9, 0, 2)) in a.neigh.entries
    t = 0.0
    while t < 300.0:
        t += 1.0
        net.now = t
        b.send_ip(v4(2, 1, 9000), t)
        net.pump()
        b.conn_progress(next(iter(b.conns.conns)), t)  # a ACKs b's sends
        for f in (a, b):
            d = f.next_deadline()
            if d is not None and d <= t:
                f.on_timer(t)
                net.pump()
    assert bytes((10, 9, 0, 2)) not in a.neigh.entries  # a's idle entry went
    assert list(a.conns.conns) == [cid] and a.counters["conn_closed"] == 0
    assert b.counters["conn_opened"] == 1 and net.tun[0][-1] == v4(2, 1, 9000)
    a.send_ip(v4(1, 2, 9000), t)  # a talks again: resolves b, uses b's connection (§7)
    net.pump()
    assert net.tun[1][-1] == v4(1, 2, 9000) and list(a.conns.conns) == [cid]


def test_idle_passive_connection_reaped() -> None:
    net = connected_net()
    a, b = net.ifs
    assert b.next_deadline() is not None
    b.on_timer(600.0)
    net.pump()
    assert not b.conns.conns and not a.conns.conns


def test_stop_closes_everything() -> None:
    net = connected_net()
    a, b = net.ifs
    a.stop(1.0)
    net.pump()
    assert not a.conns.conns and not b.conns.conns


def test_config_validation() -> None:
    with pytest.raises(InvalidArgument, match="mtu"):
        IfaceConfig(gid=gid(1), ud_qpn=5, ud_mtu=2044, addresses=(), mode="datagram",
                    mtu=4000)
    with pytest.raises(InvalidArgument, match="mode"):
        IfaceConfig(gid=gid(1), ud_qpn=5, ud_mtu=2044, addresses=(), mode="x")  # type: ignore[arg-type]
    assert IfaceConfig(gid=gid(1), ud_qpn=5, ud_mtu=2044, addresses=()).mtu == 65520
    assert conn_mtu(65524, 2048) == 2044



def test_the_runtimes_connected_mtu_is_65520_trimmed_to_one_gso_send() -> None:
    """``ipoib up`` without ``--mtu`` in connected mode: 65520 trimmed so that a packet
    and its encapsulation are one SEND of at most ``gso_message_limit`` bytes, where
    that gives up at most 2 % (small IB MTUs keep 65520); the engine's own default
    stays Linux's 65520."""
    from softrdma.apps.ipoib_runtime import default_cm_mtu
    from softrdma.drivers.runtime.roce_tx import gso_message_limit
    assert [default_cm_mtu(m, True) for m in (256, 512, 1024, 2048, 4096)] == \
        [65520, 65520, 64460, 64956, 65212]
    assert default_cm_mtu(4096, False) == 65232  # IPv4 GIDs: 20 bytes more per send
    for m in (1024, 2048, 4096):
        for ipv6 in (True, False):
            assert default_cm_mtu(m, ipv6) + 4 == gso_message_limit(m, ipv6)

def test_restart_announces_new_address() -> None:
    """A restarted peer (new UD QPN) is learnt from its gratuitous ARP / unsolicited NA,
    and the connection to its old address goes."""
    net = make_net()
    a, b = net.ifs
    a.send_ip(v4(1, 2, 100), 0.0)
    a.send_ip(v6(1, 2, 100), 0.0)
    net.pump()
    a.send_ip(v4(1, 2, 9000), 0.0)
    net.pump()
    assert len(a.conns.conns) == 1
    b2 = IpoibInterface(IfaceConfig(gid=b.hwaddr.gid, ud_qpn=0x99, ud_mtu=2044,
                                    addresses=b.config.addresses))
    net.ifs[1] = b2
    b2.start(1.0)
    net.pump()
    assert a.neigh.entries[bytes((10, 9, 0, 2))].hw.qpn == 0x99  # type: ignore[union-attr]
    assert a.neigh.entries[ipaddress.IPv6Address("fd09::2").packed].hw.qpn == 0x99  # type: ignore[union-attr]
    assert not a.conns.conns


def test_ipv6_needs_1280() -> None:
    with pytest.raises(InvalidArgument, match="IPv6 needs"):
        IfaceConfig(gid=gid(1), ud_qpn=5, ud_mtu=1020, mode="datagram",
                    addresses=(ipaddress.IPv6Interface("fd01::1/64"),))
    f = IpoibInterface(IfaceConfig(gid=gid(1), ud_qpn=5, ud_mtu=1020, mode="datagram",
                                   addresses=(ipaddress.IPv4Interface("10.1.0.1/24"),)))
    assert all(a.version == 4 for a in f.addresses)  # no link-local below 1280


@given(st.binary(max_size=200), st.sampled_from([b"", b"\x08\x00\x00\x00", b"\x08\x06\x00\x00",
                                                 b"\x86\xdd\x00\x00"]))
def test_any_input_is_counted_never_raises(data: bytes, head: bytes) -> None:
    """Fuzz: whatever arrives on UD, on a connection or from the host, the engine counts
    and drops what it cannot use and never raises."""
    net = make_net()
    a, b = net.ifs
    a.receive_ud(head + data, gid(7), 0x77, 0.0)
    b.receive_conn(99, head + data, 0.0)
    a.send_ip(data, 0.0)
    net.pump()
    a.send_ip(v4(1, 2, 100), 0.0)
    net.pump()
    assert net.tun[1][-1] == v4(1, 2, 100)

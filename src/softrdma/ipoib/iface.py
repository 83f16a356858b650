"""One IPoIB interface, sans-I/O: IP packets in from the host, IPoIB messages in from
the UD QP and the connections, outputs (:mod:`.events`) for the driver.

RFC 4391 (IPoIB-UD) and RFC 4755 (IPoIB-CM), as docs/protocols.md §10 sums them up:

* address resolution is ours (the kernel does none on a TUN device): ARP requests to
  the broadcast group, NS to the solicited-node group, answers unicast over UD (§7),
  the neighbour table of :mod:`.neigh`;
* multicast and broadcast always go over UD (§2.1);
* in connected mode, a packet larger than the UD MTU goes over the connection to its
  neighbour, set up on demand; the rest goes over UD (per-destination MTU, §7.2); a
  packet too big for the path gets an ICMP "fragmentation needed" / "packet too big"
  back to the host, an IPv4 packet without DF is fragmented;
* every unicast packet is accepted whichever mode it arrives on (§7);
* connections go when the interface stops or the neighbour expires (§3.4).

The engine never reads a clock: ``now`` is passed in; :meth:`next_deadline` says when
:meth:`on_timer` is due; :meth:`take_output` gives the driver's outputs (the driver's
:class:`~softrdma.seam.protocols.Engine` contract). Malformed input is counted
(``counters``) and dropped.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Never, TypeVar

from ..errors import DecodeError, InvalidArgument
from . import nd
from .conn import IPOIB_CM_BUF_SIZE, IPOIB_CM_MTU, PENDING_MAX, Conn, ConnState, ConnTable, Refuse
from .encap import ArpOp, ArpPacket, EtherType, decode_encap
from .events import (
    ConnAccept,
    ConnClose,
    ConnOpen,
    ConnReject,
    ConnSend,
    McastJoin,
    McastLeave,
    Output,
    TunWrite,
    UdSend,
)
from .hwaddr import (
    DEFAULT_PKEY,
    FLAG_RC,
    FLAG_UC,
    MULTICAST_QPN,
    HwAddr,
    ipv4_broadcast_mgid,
    ipv4_mcast_mgid,
    ipv6_mcast_mgid,
    link_local,
    service_id,
    solicited_node,
)
from .ip import IPV6_MIN_MTU, IpInfo, fragment_ipv4, icmp4_frag_needed, icmp6_too_big, parse
from .neigh import Expired, NeighbourTable, NeighConfig, NudState, Probe, Resolved, Unresolved

__all__ = ["IfaceConfig", "IpoibInterface", "Counters", "ALL_NODES", "ALL_HOSTS"]

_D = TypeVar("_D")
_IPV4, _IPV6, _REACHABLE = EtherType.IPV4, EtherType.IPV6, NudState.REACHABLE  # send_ip's

Mode = Literal["connected", "datagram"]
Address = ipaddress.IPv4Interface | ipaddress.IPv6Interface
ALL_NODES = ipaddress.IPv6Address("ff02::1").packed
ALL_HOSTS = ipaddress.IPv4Address("224.0.0.1").packed
IPV4_BROADCAST = b"\xff\xff\xff\xff"
UNSPECIFIED6 = bytes(16)
ZERO_HW = HwAddr(0, bytes(16))
COUNTER_NAMES = (
    "tx_packets", "tx_bytes", "tx_ud", "tx_conn", "tx_mcast", "tx_held", "tx_dropped",
    "tx_errors", "tx_icmp_too_big", "tx_fragments", "rx_packets", "rx_bytes", "rx_ud",
    "rx_conn", "rx_bad_encap", "rx_bad_arp", "rx_bad_nd", "rx_bad_ip", "arp_requests",
    "arp_replies", "ns_sent", "na_sent", "neigh_failed", "conn_opened", "conn_accepted",
    "conn_rejected", "conn_refused", "conn_crossing_rejects", "conn_closed", "conn_bad_req",
    "neigh_late_probes",
)
CONFIRM_EVERY_S = 1.0    # RC progress confirms the neighbour at most this often per connection


class Counters(dict[str, int]):
    """The interface's counters (every name of :data:`COUNTER_NAMES`, starting at 0)."""

    def __init__(self) -> None:
        super().__init__((n, 0) for n in COUNTER_NAMES)


@dataclass(slots=True)
class IfaceConfig:
    """What ``softrdma ipoib up`` configures."""

    gid: bytes
    ud_qpn: int
    ud_mtu: int                          # IB MTU - 4 (RFC 4391 §5)
    addresses: tuple[Address, ...]
    mode: Mode = "connected"
    pkey: int = DEFAULT_PKEY
    mtu: int | None = None               # the interface MTU; default: 65520 / ud_mtu
    transport: str = "RC"                # connected mode: "RC" or "UC"
    crossing_rule: bool = True           # RFC 4755 §3.3 (False: accept every REQ)
    receive_mtu: int = IPOIB_CM_BUF_SIZE
    idle_s: float = 2 * 256.0
    neigh: NeighConfig = field(default_factory=NeighConfig)

    def __post_init__(self) -> None:
        if self.mode not in ("connected", "datagram"):
            raise InvalidArgument("mode", f"must be 'connected' or 'datagram', got {self.mode!r}")
        if self.transport not in ("RC", "UC"):
            raise InvalidArgument("transport", f"must be 'RC' or 'UC', got {self.transport!r}")
        if not 0 < self.pkey <= 0xFFFF or self.pkey & 0x7FFF == 0:
            raise InvalidArgument("pkey", f"{self.pkey:#x} is not a valid P_Key")
        limit = IPOIB_CM_MTU if self.mode == "connected" else self.ud_mtu
        if self.mtu is None:
            self.mtu = limit
        if not 68 <= self.mtu <= limit:
            raise InvalidArgument("mtu", f"must be 68..{limit} in {self.mode} mode, "
                                         f"got {self.mtu}")
        if self.mtu < IPV6_MIN_MTU and any(a.version == 6 for a in self.addresses):
            raise InvalidArgument("mtu", f"IPv6 needs an MTU of at least {IPV6_MIN_MTU}, "
                                         f"the interface has {self.mtu} (raise the underlay "
                                         "MTU or give IPv4 addresses only)")


class IpoibInterface:
    """The interface engine (see the module docstring)."""

    def __init__(self, config: IfaceConfig) -> None:
        self.config = config
        flags = 0
        if config.mode == "connected":
            flags = FLAG_RC if config.transport == "RC" else FLAG_UC
        self.hwaddr = HwAddr(config.ud_qpn, bytes(config.gid), flags)
        addrs = list(config.addresses)
        ll = ipaddress.IPv6Interface(f"{link_local(config.gid)}/64")
        if ll not in addrs and config.mtu is not None and config.mtu >= IPV6_MIN_MTU:
            addrs.append(ll)
        self.addresses: tuple[Address, ...] = tuple(addrs)
        self._local_ips = {a.ip.packed for a in self.addresses}
        self._v4_broadcasts = {a.network.broadcast_address.packed for a in self.addresses
                               if a.version == 4 and a.network.prefixlen < 31}
        self.neigh = NeighbourTable(config.neigh)
        self.conns = ConnTable(self.hwaddr, config.receive_mtu,
                               crossing_rule=config.crossing_rule, idle_s=config.idle_s)
        self.counters = Counters()
        self.out: list[Output] = []
        self.groups: list[bytes] = []
        self.broadcast = HwAddr(MULTICAST_QPN, ipv4_broadcast_mgid(config.pkey))
        self.connected = config.mode == "connected"

    # ---- lifecycle ---------------------------------------------------------------
    def start(self, now: float) -> None:
        """Join the broadcast, all-hosts, all-nodes and solicited-node groups of our
        P_Key (RFC 4391 §4; docs/protocols.md §10)."""
        pk = self.config.pkey
        groups = [ipv4_broadcast_mgid(pk), ipv4_mcast_mgid(ALL_HOSTS, pk),
                  ipv6_mcast_mgid(ALL_NODES, pk)]
        for a in self.addresses:
            if a.version == 6:
                g = ipv6_mcast_mgid(solicited_node(a.ip.packed), pk)
                if g not in groups:
                    groups.append(g)
        self.groups = groups
        self.out.extend(McastJoin(g) for g in groups)
        self.announce()

    def announce(self) -> None:
        """Gratuitous ARP and unsolicited NA for our addresses (RFC 5227 §2.4, RFC 4861
        §7.2.6), as Linux sends when an interface comes up: peers that knew an older
        link-layer address of ours (a restart gives a new UD QPN) update their entry."""
        pk = self.config.pkey
        for a in self.addresses:
            ip = a.ip.packed
            if a.version == 4:
                arp = ArpPacket(ArpOp.REQUEST, self.hwaddr, ip, ZERO_HW, ip)
                self.out.append(UdSend(self.broadcast, EtherType.ARP, arp.encode()))
            else:
                na = nd.build(nd.NdMessage(nd.NdType.NEIGHBOR_ADVERTISEMENT, ip, ALL_NODES,
                                           ip, self.hwaddr, nd.NA_OVERRIDE))
                self.out.append(UdSend(HwAddr(MULTICAST_QPN, ipv6_mcast_mgid(ALL_NODES, pk)),
                                       EtherType.IPV6, na))

    def stop(self, now: float) -> None:
        """Tear every connection down (§3.4) and leave the groups."""
        for cid in list(self.conns.conns):
            self.conns.closed(cid, now)
            self.out.append(ConnClose(cid))
        self.out.extend(McastLeave(g) for g in self.groups)
        self.groups = []

    def take_output(self) -> list[Output]:
        """The driver's outputs (:mod:`.events`), oldest first."""
        out, self.out = self.out, []
        return out

    def pop_events(self) -> list[Never]:
        """None: all the interface reports is in :meth:`take_output` and ``counters``
        (the host sees its packets through the TUN writes)."""
        return []

    def next_deadline(self) -> float | None:
        ds = [d for d in (self.neigh.next_deadline(), self.conns.next_deadline())
              if d is not None]
        return min(ds, default=None)

    def on_timer(self, now: float) -> None:
        self.neigh.on_timer(now)
        self.counters["neigh_late_probes"] = self.neigh.late_probes
        self._neigh_output(now)
        for c in self.conns.idle(now):
            self._close(c.conn_id, now)

    # ---- transmit (packets from the host) -----------------------------------------
    def send_ip(self, pkt: bytes | memoryview, now: float) -> None:
        """An IP packet from the host (the TUN device)."""
        try:
            info = parse(pkt)
        except DecodeError:
            self.counters["tx_errors"] += 1
            return
        dst = info.dst
        etype = _IPV4 if info.version == 4 else _IPV6
        if info.total_len != len(pkt):
            pkt = pkt[:info.total_len]
        if info.multicast or dst in self._v4_broadcasts:
            self._send_mcast(pkt, info, etype)
            return
        n = self.neigh.get(dst)
        if n is None or n.hw is None:
            self.neigh.use(dst, now, bytes(pkt))
            self.counters["tx_held"] += 1
            self._neigh_output(now)
            return
        hw = n.hw
        if n.state is not _REACHABLE:
            self.neigh.use(dst, now)
            self._neigh_output(now)
        self._send_to(hw, pkt, info, etype, now)

    def _send_mcast(self, pkt: bytes | memoryview, info: IpInfo, etype: int) -> None:
        pk = self.config.pkey
        if info.version == 4:
            mgid = (ipv4_broadcast_mgid(pk) if info.dst[0] & 0xF0 != 0xE0
                    else ipv4_mcast_mgid(info.dst, pk))
        else:
            mgid = ipv6_mcast_mgid(info.dst, pk)
        dest = HwAddr(MULTICAST_QPN, mgid)
        if info.total_len > self.config.ud_mtu:
            if info.version == 4 and not info.df:
                for frag in fragment_ipv4(pkt, self.config.ud_mtu):
                    self._count_tx(len(frag), "tx_mcast")
                    self.out.append(UdSend(dest, etype, frag))
                return
            self.counters["tx_dropped"] += 1  # no ICMP errors about multicast (RFC 1122)
            return
        self._count_tx(info.total_len, "tx_mcast")
        self.out.append(UdSend(dest, etype, pkt))

    def _count_tx(self, n: int, kind: str) -> None:
        c = self.counters
        c["tx_packets"] += 1
        c["tx_bytes"] += n
        c[kind] += 1

    def _send_to(self, hw: HwAddr, pkt: bytes | memoryview, info: IpInfo, etype: int,
                 now: float) -> None:
        size = info.total_len
        ud_mtu = self.config.ud_mtu
        conn = self.conns.tx_conn(hw.key)  # whoever opened it (§7)
        if size <= ud_mtu:
            # Once a connection is up, every unicast packet to the peer takes it, small
            # ones too (as Linux ipoib_start_xmit): split over UD and RC, one TCP flow's
            # packets would arrive out of order.
            if conn is not None and size <= (conn.mtu or self.config.receive_mtu - 4):
                self._send_on(conn, etype, pkt, size, now)
                return
            self._count_tx(size, "tx_ud")
            self.out.append(UdSend(hw, etype, pkt))
            return
        if conn is None and self.connected:
            conn = self.conns.connecting(hw.key)
            if conn is None and hw.flags & (FLAG_RC | FLAG_UC):
                # a connection is set up on demand, by the first packet that needs it
                conn = self._open(hw, now)
        if conn is not None and size <= (conn.mtu or self.config.receive_mtu - 4):
            if conn.state is ConnState.ESTABLISHED:
                self._send_on(conn, etype, pkt, size, now)
                return
            if len(conn.pending) < PENDING_MAX:
                conn.pending.append((etype, bytes(pkt)))
                self.counters["tx_held"] += 1
            else:
                self.counters["tx_dropped"] += 1
            return
        self._too_big(hw, pkt, info, etype, conn.mtu if conn is not None and conn.mtu
                      else ud_mtu, now)

    def _send_on(self, conn: Conn, etype: int, pkt: bytes | memoryview, size: int,
                 now: float) -> None:
        conn.tx_packets += 1
        conn.tx_bytes += size
        conn.last_used = now
        self._count_tx(size, "tx_conn")
        self.out.append(ConnSend(conn.conn_id, etype, pkt))

    def _too_big(self, hw: HwAddr, pkt: bytes | memoryview, info: IpInfo, etype: int,
                 mtu: int, now: float) -> None:
        """RFC 4755 §7.2: the path to this destination has a smaller MTU."""
        if info.version == 4 and not info.df:
            for frag in fragment_ipv4(pkt, mtu):
                self.counters["tx_fragments"] += 1
                self._send_to(hw, frag, parse(frag), etype, now)
            return
        # The error comes "from the destination": the host drops packets whose source is
        # one of its own addresses (a martian source), and the PMTU it learns is that of
        # the destination quoted in the error anyway (RFC 1191 §4, RFC 8201 §4).
        src = info.dst
        self.counters["tx_dropped"] += 1
        self.counters["tx_icmp_too_big"] += 1
        err = (icmp4_frag_needed(pkt, src, mtu) if info.version == 4
               else icmp6_too_big(pkt, src, mtu))
        self.out.append(TunWrite(err))

    def _source_for(self, peer: bytes, version: int) -> bytes | None:
        """Our address on ``peer``'s subnet, else any of that family."""
        any_ip: bytes | None = None
        for a in self.addresses:
            if a.version != version:
                continue
            if a.ip.packed[:1] == b"\xfe" and version == 6 and any_ip is not None:
                continue
            try:
                if ipaddress.ip_address(peer) in a.network:
                    return a.ip.packed
            except ValueError:
                pass
            any_ip = any_ip or a.ip.packed
        return any_ip

    # ---- connections -------------------------------------------------------------
    def _open(self, hw: HwAddr, now: float) -> Conn | None:
        c = self.conns.connect(hw, self.config.transport, now)
        if c is not None:
            self.counters["conn_opened"] += 1
            self.out.append(ConnOpen(c.conn_id, hw, c.transport, service_id(hw.qpn),
                                     self.conns.private_data))
        return c

    def conn_request(self, token: int, peer_gid: bytes, private_data: bytes,
                     transport: str, now: float) -> None:
        """A REQ arrived on our Service ID (the driver's ``token`` names it)."""
        verdict = self.conns.on_request(peer_gid, private_data, transport, now)
        if isinstance(verdict, Refuse):
            key = ("conn_crossing_rejects" if verdict.why.startswith("REQ crossing")
                   else "conn_bad_req")
            self.counters[key] += 1
            self.out.append(ConnReject(token, verdict.reason, verdict.private_data,
                                       verdict.why))
            return
        self.counters["conn_accepted"] += 1
        self.out.append(ConnAccept(token, verdict.conn.conn_id, transport,
                                   verdict.private_data))

    def conn_established(self, conn_id: int, now: float, *,
                         rep_private_data: bytes | None = None, local_qpn: int = 0,
                         remote_qpn: int = 0) -> None:
        c = self.conns.established(conn_id, now, rep_private_data=rep_private_data,
                                   local_qpn=local_qpn, remote_qpn=remote_qpn)
        if c is None:
            if conn_id in self.conns.conns:
                self.counters["conn_bad_req"] += 1
                self._close(conn_id, now)
            return
        pending, c.pending = c.pending, type(c.pending)()
        for etype, pkt in pending:
            info = parse(pkt)
            if info.total_len <= c.mtu:
                self._send_on(c, etype, pkt, info.total_len, now)
            else:
                self._too_big(c.peer, pkt, info, etype, c.mtu, now)

    def conn_progress(self, conn_id: int, now: float) -> None:
        """The peer acknowledged our sends on connection ``conn_id`` (successful RC send
        completions: IBA 9.7.5.1 -- the responder ACKed them). That is forward progress,
        which confirms the neighbour reachable (RFC 4861 §7.3.1) as an ARP/ND answer
        does: a peer with traffic flowing is neither probed nor declared dead. UC gives
        no such proof (no ACKs). Cheap enough per completion batch: one table scan per
        connection and :data:`CONFIRM_EVERY_S` at most."""
        c = self.conns.conns.get(conn_id)
        if c is None or c.transport != "RC" or now - c.confirmed < CONFIRM_EVERY_S:
            return
        c.confirmed = now
        self.neigh.confirm_progress(c.peer.key, now)
        self._neigh_output(now)

    def conn_closed(self, conn_id: int, now: float, *, refused: bool = False) -> None:
        """The driver lost connection ``conn_id`` (REJ, DREQ, timeout, QP error)."""
        c = self.conns.closed(conn_id, now, refused=refused)
        if c is None:
            return
        self.counters["conn_refused" if refused else "conn_closed"] += 1
        for etype, pkt in c.pending:  # another connection, or UD and its MTU (§8)
            self._send_to(c.peer, pkt, parse(pkt), etype, now)

    def _close(self, conn_id: int, now: float) -> None:
        if self.conns.closed(conn_id, now) is not None:
            self.counters["conn_closed"] += 1
            self.out.append(ConnClose(conn_id))

    # ---- receive -----------------------------------------------------------------
    def receive_ud(self, msg: bytes | memoryview, src_gid: bytes, src_qpn: int,
                   now: float) -> None:
        """An IPoIB message received on the UD QP (GRH already stripped)."""
        if src_qpn == self.hwaddr.qpn and src_gid == self.hwaddr.gid:
            return  # our own multicast, looped back by the underlay
        etype = self._decode(decode_encap, msg, "rx_bad_encap")
        if etype is None:
            return
        body = msg[4:]
        if etype == EtherType.ARP:
            self._receive_arp(body, now)
            return
        info = self._check_ip(etype, body)
        if info is None:
            return
        if info.version == 6 and nd.is_nd(info.proto, body[40:]):
            self._receive_nd(body[:info.total_len], now)
            return
        self._deliver(body, info, "rx_ud")

    def receive_conn(self, conn_id: int, msg: bytes | memoryview, now: float) -> None:
        """An IPoIB message received on connection ``conn_id``."""
        etype = self._decode(decode_encap, msg, "rx_bad_encap")
        if etype is None:
            return
        body = msg[4:]
        info = self._check_ip(etype, body)
        if info is None:
            return
        c = self.conns.conns.get(conn_id)
        if c is not None:
            c.rx_packets += 1
            c.rx_bytes += info.total_len
            c.last_used = now
        self._deliver(body, info, "rx_conn")

    def _decode(self, decode: Callable[[bytes | memoryview], _D], data: bytes | memoryview,
                counter: str) -> _D | None:
        """``decode(data)``, or None when it is malformed (``DecodeError``): counted under
        ``counter`` and dropped."""
        try:
            return decode(data)
        except DecodeError:
            self.counters[counter] += 1
            return None

    def _hw_refused(self, hw: HwAddr, counter: str) -> bool:
        """True (counted under ``counter``) when ``hw`` cannot be a neighbour's address:
        a multicast address, or QPN 0 or 1 (the SMI and GSI QPs, never an IPoIB UD QP)."""
        if hw.multicast or hw.qpn in (0, 1):
            self.counters[counter] += 1
            return True
        return False

    def _check_ip(self, etype: int, body: bytes | memoryview) -> IpInfo | None:
        if etype == EtherType.ARP:
            self.counters["rx_bad_encap"] += 1  # ARP never travels on a connection
            return None
        try:
            info = parse(body)
        except DecodeError:
            self.counters["rx_bad_ip"] += 1
            return None
        if (info.version == 4) != (etype == EtherType.IPV4):
            self.counters["rx_bad_encap"] += 1
            return None
        return info

    def _deliver(self, body: bytes | memoryview, info: IpInfo, kind: str) -> None:
        c = self.counters
        c["rx_packets"] += 1
        c["rx_bytes"] += info.total_len
        c[kind] += 1
        self.out.append(TunWrite(body[:info.total_len] if info.total_len != len(body) else body))

    # ---- address resolution ------------------------------------------------------
    def _receive_arp(self, body: bytes | memoryview, now: float) -> None:
        arp = self._decode(ArpPacket.decode, body, "rx_bad_arp")
        if arp is None or self._hw_refused(arp.sender_hw, "rx_bad_arp"):
            return
        ours = arp.target_ip in self._local_ips
        if arp.sender_ip != bytes(4) and arp.sender_ip not in self._local_ips:
            if arp.op == ArpOp.REPLY and ours:
                self.neigh.confirm(arp.sender_ip, arp.sender_hw, now)
            elif ours or arp.sender_ip in self.neigh.entries:
                self.neigh.learn(arp.sender_ip, arp.sender_hw, now)
        if arp.op == ArpOp.REQUEST and ours:
            reply = ArpPacket(ArpOp.REPLY, self.hwaddr, arp.target_ip, arp.sender_hw,
                              arp.sender_ip)
            self.counters["arp_replies"] += 1
            self.out.append(UdSend(arp.sender_hw, EtherType.ARP, reply.encode()))
        self._neigh_output(now)

    def _receive_nd(self, pkt: bytes | memoryview, now: float) -> None:
        msg = self._decode(nd.decode, pkt, "rx_bad_nd")
        if msg is None or msg.lladdr is not None and self._hw_refused(msg.lladdr, "rx_bad_nd"):
            return
        if msg.type == nd.NdType.NEIGHBOR_SOLICITATION:
            if msg.target not in self._local_ips:
                return
            if msg.src != UNSPECIFIED6 and msg.lladdr is not None:
                self.neigh.learn(msg.src, msg.lladdr, now)
            dst = msg.src if msg.src != UNSPECIFIED6 else ALL_NODES
            flags = nd.NA_OVERRIDE | (nd.NA_SOLICITED if msg.src != UNSPECIFIED6 else 0)
            na = nd.build(nd.NdMessage(nd.NdType.NEIGHBOR_ADVERTISEMENT, msg.target, dst,
                                       msg.target, self.hwaddr, flags))
            n = self.neigh.get(msg.src)
            hw = (n.hw if n is not None and n.hw is not None else msg.lladdr)
            if dst == ALL_NODES or hw is None:
                hw = HwAddr(MULTICAST_QPN, ipv6_mcast_mgid(ALL_NODES, self.config.pkey))
            self.counters["na_sent"] += 1
            self.out.append(UdSend(hw, EtherType.IPV6, na))
        elif msg.lladdr is not None and msg.target not in self._local_ips:
            if msg.flags & nd.NA_SOLICITED:
                self.neigh.confirm(msg.target, msg.lladdr, now)
            elif msg.target in self.neigh.entries:
                self.neigh.learn(msg.target, msg.lladdr, now)
        self._neigh_output(now)

    def _probe(self, ip: bytes, hw: HwAddr | None) -> None:
        pk = self.config.pkey
        if len(ip) == 4:
            src = self._source_for(ip, 4) or bytes(4)
            req = ArpPacket(ArpOp.REQUEST, self.hwaddr, src, ZERO_HW, ip)
            self.counters["arp_requests"] += 1
            self.out.append(UdSend(hw or self.broadcast, EtherType.ARP, req.encode()))
            return
        src = self._source_for(ip, 6) or UNSPECIFIED6
        dst = ip if hw is not None else solicited_node(ip)
        ns = nd.build(nd.NdMessage(nd.NdType.NEIGHBOR_SOLICITATION, src, dst, ip,
                                   self.hwaddr if src != UNSPECIFIED6 else None))
        dest = hw or HwAddr(MULTICAST_QPN, ipv6_mcast_mgid(dst, pk))
        self.counters["ns_sent"] += 1
        self.out.append(UdSend(dest, EtherType.IPV6, ns))

    def _neigh_output(self, now: float) -> None:
        for o in self.neigh.take_output():
            if isinstance(o, Probe):
                self._probe(o.ip, o.hw)
            elif isinstance(o, Resolved):
                held, o.entry.queue = list(o.entry.queue), type(o.entry.queue)()
                hw = o.entry.hw
                for pkt in held:
                    if hw is not None:
                        info = parse(pkt)
                        self._send_to(hw, pkt, info, EtherType.IPV4 if info.version == 4
                                      else EtherType.IPV6, now)
            elif isinstance(o, Unresolved):
                self.counters["neigh_failed"] += 1
                self.counters["tx_dropped"] += o.dropped
            elif isinstance(o, Expired) and o.entry.hw is not None:
                key = o.entry.hw.key
                if not any(n.hw is not None and n.hw.key == key
                           for n in self.neigh.entries.values()):
                    for c in list(self.conns.of_peer(key)):
                        # an idle entry takes our connection; the peer's goes when the
                        # peer is gone, or by its own idle timer (Linux: RX reaping)
                        if c.active or not o.idle:
                            self._close(c.conn_id, now)

    # ---- show --------------------------------------------------------------------
    def snapshot(self, now: float) -> dict[str, object]:
        """The neighbour table, the connections and the counters (``ipoib show``)."""
        ips_of: dict[bytes, list[str]] = {}
        neigh = []
        for n in self.neigh.entries.values():
            ip = str(ipaddress.ip_address(n.ip))
            neigh.append({"ip": ip, "lladdr": str(n.hw) if n.hw else None,
                          "state": n.state.value, "age_s": round(now - n.updated, 3)})
            if n.hw is not None:
                ips_of.setdefault(n.hw.key, []).append(ip)
        conns = [{"id": c.conn_id, "peer": ips_of.get(c.peer.key, []),
                  "peer_lladdr": str(c.peer), "mode": c.transport,
                  "direction": "active" if c.active else "passive", "state": c.state.value,
                  "local_qpn": c.local_qpn, "remote_qpn": c.remote_qpn, "mtu": c.mtu,
                  "tx_packets": c.tx_packets, "tx_bytes": c.tx_bytes,
                  "rx_packets": c.rx_packets, "rx_bytes": c.rx_bytes}
                 for c in self.conns.conns.values()]
        return {"lladdr": str(self.hwaddr), "mode": self.config.mode, "mtu": self.config.mtu,
                "ud_mtu": self.config.ud_mtu, "pkey": f"{self.config.pkey:#06x}",
                "addresses": [str(a) for a in self.addresses], "neighbours": neigh,
                "connections": conns, "counters": dict(self.counters)}

"""The transmit side of the RoCE runtime (:class:`~softrdma.drivers.runtime.roce.Runtime`).

The runtime drains ``port.tx``, maps GIDs to IP addresses (``::ffff:a.b.c.d`` -> IPv4,
Annex A17), asks the link for the real UDP source port, computes the RoCEv2 ICRC over
exactly the IPv4/IPv6 + UDP headers the link will send (IBA 7.8.1, Annex A17: IPv4 ID 0 +
DF, as Linux sends with ``IP_PMTUDISC_DO``) and sends ``[headers, payload, pad, icrc]``
without copying the payload; runs of equal packets leave in one UDP GSO send
(design.md, "RoCEv2 batching"); RoCEv1 packets get their GRH (Annex A16).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...ib.port import Port, TxPacket
from ...wire.roce import icrc_v1, udp_gso_iov, udp_send_icrc
from ...wire.rocev1 import build_grh_v1
from ..links.link import GsoLink, Link
from ..links.udp_opts import UDP_MAX_SEGMENTS

if TYPE_CHECKING:
    from ..capture.tap import PacketTap

__all__ = ["RoceTx", "icrc_v2", "ICRC_SIZE", "GSO_MAX_PAYLOAD", "GSO_MAX_PAYLOAD_V6",
           "gso_message_limit"]

ICRC_SIZE = 4  # bytes (IBA 7.8.1)
_BTH_SIZE = 12  # bytes (IBA 9.2)
# UDP payload bytes of one GSO send that a receiver's UDP GRO socket gets whole: the
# super-packet with its link (14), IP and UDP headers within 65535 bytes. A larger one
# (65507 bytes over IPv4 still sends) is cut into its datagrams before the socket, one
# receive each (measured on Linux 6.18, loopback and veth).
GSO_MAX_PAYLOAD = 65535 - 14 - 20 - 8  # IPv4: 65493
GSO_MAX_PAYLOAD_V6 = 65535 - 14 - 40 - 8  # IPv6: 65473


def gso_message_limit(path_mtu: int, ipv6: bool) -> int:
    """The longest SEND (payload bytes) whose packets at ``path_mtu`` leave in one UDP
    GSO send (:meth:`RoceTx._flush_gso`) that the peer's GRO socket receives whole: its
    full packets and a shorter LAST, each with a BTH and the ICRC (IBA 9.2, 7.8.1), within
    :data:`GSO_MAX_PAYLOAD` (``_V6``) bytes and ``UDP_MAX_SEGMENTS`` datagrams; the
    LAST's payload a multiple of 4 (no pad). 65216 at 4096 over IPv6."""
    limit = GSO_MAX_PAYLOAD_V6 if ipv6 else GSO_MAX_PAYLOAD
    per = _BTH_SIZE + path_mtu + ICRC_SIZE
    full = min(limit // per, UDP_MAX_SEGMENTS - 1)
    last = min(path_mtu, limit - full * per - _BTH_SIZE - ICRC_SIZE) & ~3
    return full * path_mtu + last


def icrc_v2(src_ip: bytes, dst_ip: bytes, sport: int, dport: int, parts: Sequence[Any],
            length: int, ident: int = 0) -> bytes:
    """The 4 ICRC bytes of a RoCEv2 packet (IBA 7.8.1, Annex A17) whose BTH..pad are ``parts``.

    ``length`` is the byte length of BTH..pad. The IP header is the one Linux sends
    from an unconnected UDP socket with ``IP_PMTUDISC_DO``: IPv4 ID 0 and DF
    (:func:`softrdma.wire.roce.udp_send_icrc`, whose pseudo-header CRC is cached per flow).
    ``ident``: the IPv4 Identification instead (segment ``ident`` of a UDP GSO send).
    """
    return udp_send_icrc(src_ip, dst_ip, sport, dport, parts, length, ident)


class RoceTx:
    """The runtime's transmit methods (a part of :class:`~softrdma.drivers.runtime.roce.Runtime`,
    which sets these attributes and calls them under its lock)."""

    port: Port
    link: Link
    udp_port: int
    tap: PacketTap | None
    _gso: GsoLink | None
    _ip_of: Callable[[bytes], bytes]

    # ---- transmit --------------------------------------------------------------------------
    def _flush_tx_locked(self, acks: bool = True) -> int:
        port = self.port
        if not (port.tx or (acks and port.ack_pending)):
            return 0
        pkts: list[TxPacket] = port.take_output(acks)
        if self._gso is not None and len(pkts) > 1:
            self._flush_gso(pkts, self._gso)
            return len(pkts)
        link = self.link
        send = link.send
        eff = link.effective_sport
        ip_of = self._ip_of
        dport = self.udp_port
        tap = self.tap
        for p in pkts:
            if p.v1:
                self._send_v1(p)
                continue
            src = ip_of(p.sgid)
            dst = ip_of(p.dgid)
            sport = eff(p.sport)
            icrc = udp_send_icrc(src, dst, sport, dport, p.parts, p.length)  # icrc_v2
            send(dst, dport, sport, [*p.parts, icrc], p.tclass, p.hop_limit)
            if tap is not None:
                tap.tx(src, dst, sport, dport, [*p.parts, icrc], p.tclass, p.hop_limit)
        return len(pkts)

    def _flush_gso(self, pkts: list[TxPacket], link: GsoLink) -> None:
        """Transmit ``pkts`` batching runs through UDP GSO (design.md, "RoCEv2 batching").

        A run is consecutive RoCEv2 packets with the same addresses, source port, traffic
        class, hop limit and BTH DestQP, all of one length but the last (which may be
        shorter), at most ``link.gso_limit`` of them and :data:`GSO_MAX_PAYLOAD` bytes
        (:data:`GSO_MAX_PAYLOAD_V6` over IPv6; a message's shorter LAST joins its full
        packets when the bytes allow).
        One DestQP per run: a receiver that coalesces the run (UDP GRO) hands it to one
        socket, which a shared device's reuseport program picks by the first packet's
        DestQP (:mod:`softrdma.drivers.devd.reuseport`). Segment ``i``
        leaves with IPv4 Identification ``i`` (Linux ``inet_gso_segment`` numbers the
        segments of a DF super-packet from its ID, 0 on an unconnected socket), so its
        ICRC is computed with ID ``i`` (IBA 7.8.1, Annex A17).
        A refused batch is sent again one datagram per call with ID-0 ICRCs.
        """
        ip_of = self._ip_of
        eff = link.effective_sport
        send = link.send
        dport = self.udp_port
        tap = self.tap
        limits: dict[bytes, int] = {}
        n = len(pkts)
        i = 0
        while i < n:
            p = pkts[i]
            if p.v1:
                self._send_v1(p)
                i += 1
                continue
            src = ip_of(p.sgid)
            dst = ip_of(p.dgid)
            sport = eff(p.sport)
            size = p.length
            j = i + 1
            limit = limits.get(dst)
            if limit is None:
                limit = limits[dst] = link.gso_limit(dst)
            hdr = p.parts[0]
            if limit > 1 and len(hdr) >= _BTH_SIZE:
                dqpn = hdr[5:8]  # BTH DestQP (IBA 9.2)
                # at most max_bytes: segments of ``size`` and a shorter last one
                max_bytes = GSO_MAX_PAYLOAD if len(dst) == 4 else GSO_MAX_PAYLOAD_V6
                per = size + ICRC_SIZE
                full = i + max_bytes // per
                end = min(n, i + limit)
                sgid, dgid, req, tclass, hop = p.sgid, p.dgid, p.sport, p.tclass, p.hop_limit
                while j < end:
                    q = pkts[j]
                    qlen = q.length
                    if (qlen > size or q.dgid != dgid or q.sport != req or q.tclass != tclass
                            or q.hop_limit != hop or q.sgid != sgid or q.v1
                            or q.parts[0][5:8] != dqpn):
                        break
                    if qlen == size:
                        if j >= full:
                            break
                    elif (j - i) * per + qlen + ICRC_SIZE > max_bytes:
                        break
                    j += 1
                    if qlen < size:  # a shorter segment ends the run (a SEND and its
                        break            # ACK: one send, both in the peer's socket at once)
            if j - i == 1:
                icrc = udp_send_icrc(src, dst, sport, dport, p.parts, size)
                send(dst, dport, sport, [*p.parts, icrc], p.tclass, p.hop_limit)
                if tap is not None:
                    tap.tx(src, dst, sport, dport, [*p.parts, icrc], p.tclass, p.hop_limit)
                i = j
                continue
            last = pkts[j - 1]
            if last.length == size:
                iov = udp_gso_iov(src, dst, sport, dport, [q.parts for q in pkts[i:j]], size)
            else:  # a shorter last segment: its own pseudo-header length
                iov = udp_gso_iov(src, dst, sport, dport, [q.parts for q in pkts[i:j - 1]],
                                  size)
                iov += last.parts
                iov.append(udp_send_icrc(src, dst, sport, dport, last.parts, last.length,
                                         j - 1 - i))
            if not link.send_gso(dst, dport, sport, iov, size + ICRC_SIZE, j - i, p.tclass,
                                 p.hop_limit):
                for k in range(i, j):  # refused: one datagram per call, ID 0
                    q = pkts[k]
                    icrc = udp_send_icrc(src, dst, sport, dport, q.parts, q.length)
                    send(dst, dport, sport, [*q.parts, icrc], q.tclass, q.hop_limit)
                    if tap is not None:
                        tap.tx(src, dst, sport, dport, [*q.parts, icrc], q.tclass,
                               q.hop_limit)
            elif tap is not None:
                off = 0
                for k in range(i, j):
                    q = pkts[k]
                    seg = iov[off:off + len(q.parts) + 1]
                    off += len(q.parts) + 1
                    tap.tx(src, dst, sport, dport, seg, q.tclass, q.hop_limit, k - i)
            i = j

    def _send_v1(self, p: TxPacket) -> None:
        """RoCEv1 (Annex A16): the GRH is always present (A16.3.1), its PayLen counts BTH
        through the ICRC (IBA 8.3.1); the ICRC covers it with TClass, FlowLabel and HopLmt
        masked (IBA 7.8.1, Annex A16, ``wire.roce.icrc_v1``)."""
        if not self.link.roce_v1:  # a GID typed RoCE v1 on a link that cannot carry it
            self.port.counters.link_downed += 1
            return
        send_v1 = self.link.send_v1
        grh = build_grh_v1(p.sgid, p.dgid, p.length + 4, p.tclass, p.flow_label, p.hop_limit)
        send_v1(p.dgid, [grh, *p.parts, icrc_v1(grh, p.parts)], p.sl)
        if self.tap is not None:  # capture / packet trace (drivers.capture.tap)
            self.tap.tx_v1(grh, p.parts)

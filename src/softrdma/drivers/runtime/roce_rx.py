"""The receive side of the RoCE runtime (:class:`~softrdma.drivers.runtime.roce.Runtime`).

Each datagram's ICRC is checked (bad -> dropped and counted in
``port.counters.rcvd_icrc_err``, as rxe_recv.c drops silently), the
:class:`~softrdma.ib.port.RxMeta` is built (GIDs from the IP addresses, the 40-byte GRH
area a UD receive exposes: 20 zero bytes + the IPv4 header for IPv4, the IPv6 header for
IPv6, as rxe does, IBA 11.4.1.1) and ``BTH .. pad`` goes to ``port.receive``; a run of RC
MIDDLEs of one coalesced (UDP GRO) read goes to ``port.receive_run`` in one call.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import DeviceError
from ...ib.port import Port, RxMeta
from ...wire.opcodes import (
    RC_ACK,
    RC_SEND_FIRST,
    RC_SEND_LAST,
    RC_SEND_MIDDLE,
    RC_WRITE_MIDDLE,
    UD_OPCODES,
)
from ...wire.roce import (
    icrc_ok_udp,
    icrc_ok_udp_id,
    icrc_v1,
    inet_checksum,
    recover_ipv4_id,
    udp_run_bodies,
)
from ...wire.rocev1 import GRH_SIZE
from ..links.link import Datagram, GsoLink, Link, OverflowStats
from .progress import ProgressCore

if TYPE_CHECKING:
    from ..capture.tap import PacketTap

__all__ = ["RoceRx", "icrc_ok", "build_grh"]

_IP4_HDR = struct.Struct("!BBHHHBBH4s4s")
_IP6_HDR = struct.Struct("!IHBB16s16s")
_ZERO20 = bytes(20)
# build_grh's IPv4 GRH areas by (addresses, TOS, TTL, total length, ID, DF), bounded
_GRH4: dict[tuple[bytes, bytes, int, int, int, int, bool], bytes] = {}
_GRH4_MAX = 4096
# a run of one coalesced read (Port.receive_run): its first packet's opcode -> the MIDDLE
# opcode of the packets that follow it; a SEND's run may end with its LAST
_RUN_MIDDLE = {RC_SEND_FIRST: RC_SEND_MIDDLE, RC_SEND_MIDDLE: RC_SEND_MIDDLE,
               RC_WRITE_MIDDLE: RC_WRITE_MIDDLE}


def icrc_ok(src_ip: bytes, dst_ip: bytes, sport: int, dport: int, datagram: memoryview) -> bool:
    """True if the last 4 bytes of a RoCEv2 UDP payload are its ICRC (``wire.roce``;
    an IPv4 sender's unknown Identification is solved for, so rxe traffic passes)."""
    return icrc_ok_udp(src_ip, dst_ip, sport, dport, datagram)


def build_grh(d: Datagram, ident: int = 0, df: bool = True) -> bytes:
    """The 40-byte GRH area of a UD receive for datagram ``d`` (IBA 11.4.1.1, as rxe).

    IPv4: 20 zero bytes then the IPv4 header rebuilt from what the socket reports and
    the Identification/DF recovered from the ICRC (``wire.roce.recover_ipv4_id``), with a
    valid checksum. IPv6: the IPv6 header (flow label 0: a socket does not report it).
    """
    total = 20 + 8 + len(d.data)
    if len(d.src_ip) == 4:
        # cached: a flow's packets differ in ID (a GSO sender's segments: 0, 1, ...) and
        # length at most, and the header and its checksum took 1.0 us a packet
        key = (d.src_ip, d.dst_ip, d.tos, d.ttl, total, ident, df)
        grh = _GRH4.get(key)
        if grh is None:
            hdr = _IP4_HDR.pack(0x45, d.tos, total, ident, 0x4000 if df else 0, d.ttl, 17,
                                0, d.src_ip, d.dst_ip)
            csum = inet_checksum(hdr)
            grh = _ZERO20 + hdr[:10] + struct.pack("!H", csum) + hdr[12:]
            if len(_GRH4) >= _GRH4_MAX:
                _GRH4.clear()
            _GRH4[key] = grh
        return grh
    return _IP6_HDR.pack((6 << 28) | (d.tos << 20), 8 + len(d.data), 17, d.ttl,
                         d.src_ip, d.dst_ip)


class RoceRx:
    """The runtime's receive methods (a part of :class:`~softrdma.drivers.runtime.roce.Runtime`,
    which sets these attributes and calls them under its lock)."""

    port: Port
    link: Link
    core: ProgressCore
    now: Callable[[], float]
    batch: int
    tap: PacketTap | None
    _gso: GsoLink | None
    _gid_of: Callable[[bytes], bytes]
    _metas: dict[tuple[bytes, bytes, int, int, int], RxMeta]
    # IPv6 UD: (addresses, UDP source port, traffic class, hop limit, length) -> RxMeta
    _ud6_metas: dict[tuple[bytes, bytes, int, int, int, int], RxMeta] | None = None
    _backlog: list[Datagram]
    #: every datagram the last _poll_rx_locked took was an RC ACK (no request to answer)
    _rx_acks_only: bool = False
    _link_stats: OverflowStats | None
    _rx_overflow: int

    # ---- receive (RoCEv1) ------------------------------------------------------------------
    def _rx_v1(self, d: Datagram, now: float) -> None:
        """One RoCEv1 packet: GRH checks, ICRC, then the engine (A16.7.1: no LRH checks;
        the engine drops a packet from or to the loopback GID ::1, A16.7.2)."""
        port = self.port
        counters = port.counters
        grh = d.grh
        data = d.data
        if len(grh) != GRH_SIZE or len(data) < 16:
            counters.rcvd_malformed += 1
            return
        sgid, dgid = d.src_ip, d.dst_ip
        body = data[:-4]
        if icrc_v1(grh, (body,)) != data[-4:]:
            counters.rcvd_icrc_err += 1
            return
        flow = int.from_bytes(grh[1:4], "big") & 0xFFFFF
        meta = RxMeta(sgid, dgid, 0, d.tos, d.ttl, flow, bytes(grh), False, True)
        port.receive(body, meta, now)

    # ---- receive ----------------------------------------------------------------------------
    def _poll_rx_locked(self, stop_on: Any = None, max_n: int = 0) -> int:
        """Feed received datagrams to the engine; returns how many were taken.

        With ``stop_on`` (a polling CQ's queue), processing stops as soon as that CQ has a
        completion: the application sees it before the datagrams behind it (typically
        the ACK that followed a response) are processed. Those wait in ``_backlog``,
        still in the link's receive ring, which is not reused until they are done.
        """
        dgrams = self._backlog
        if dgrams:
            self._backlog = []
        else:
            if self.core.fatal is not None:
                return 0
            try:
                dgrams = self.link.recv_batch(max_n or self.batch)
            except DeviceError as exc:  # the link's daemon is gone (DevdLink)
                self._device_fatal_locked(str(exc))
                return 0
            if not dgrams:
                return 0
        port = self.port
        counters = port.counters
        ls = self._link_stats
        if ls is not None and ls.rx_overflow != self._rx_overflow:  # the kernel's drops
            counters.rcvd_rx_overflow += ls.rx_overflow - self._rx_overflow
            self._rx_overflow = ls.rx_overflow
        receive = port.receive
        gid_of = self._gid_of
        metas = self._metas
        metas6 = self._ud6_metas
        if metas6 is None:
            metas6 = self._ud6_metas = {}
        now = self.now()
        taken = 0
        tap = self.tap
        bias = misses = failures = 0  # coalesced receives: ID hint offset, what failed
        n_dg = len(dgrams)
        acks_only = True
        while taken < n_dg:
            d = dgrams[taken]
            taken += 1
            if tap is not None:
                tap.rx(d)
            data = d.data
            if acks_only and (not data or data[0] != RC_ACK):
                acks_only = False
            if d.grh:
                self._rx_v1(d, now)
                if stop_on and taken < len(dgrams):
                    self._backlog = dgrams[taken:]
                    break
                continue
            if len(data) < 16:
                counters.rcvd_malformed += 1
                continue
            src, dst = d.src_ip, d.dst_ip
            hint = d.ident
            if hint >= 0 and len(src) == 4:
                # Segment ``hint`` of a coalesced receive: a softrdma GSO sender gave it
                # IPv4 ID ``hint``; another sender (rxe: a per-destination counter) gives
                # consecutive IDs from elsewhere, found for the first segment by recovery
                # and kept as ``bias`` for the next ones.
                if hint == 0:
                    bias = 0
                ident = (hint + bias) & 0xFFFF
                df = True
                if not icrc_ok_udp_id(src, dst, d.sport, d.dport, data, ident):
                    misses += 1
                    solved = recover_ipv4_id(src, dst, d.sport, d.dport, data)
                    if solved is None:
                        failures += 1
                        counters.rcvd_icrc_err += 1
                        continue
                    ident, df = solved
                    bias = (ident - hint) & 0xFFFF
                grh = build_grh(d, ident, df) if data[0] in UD_OPCODES else b""
            # Only UD places the GRH area in the receive buffer; rxe copies the real IPv4
            # header, whose ID the ICRC lets us recover.
            elif data[0] in UD_OPCODES:
                if len(src) == 4:
                    found = recover_ipv4_id(src, dst, d.sport, d.dport, data)
                    if found is None:
                        counters.rcvd_icrc_err += 1
                        continue
                    grh = build_grh(d, found[0], found[1])
                else:
                    if not icrc_ok_udp(src, dst, d.sport, d.dport, data):
                        counters.rcvd_icrc_err += 1
                        continue
                    # IPv6 (IPoIB's datagram mode): the GRH area depends only on the flow,
                    # traffic class, hop limit and length, so one RxMeta serves them all
                    key6 = (src, dst, d.sport, d.tos, d.ttl, len(data))
                    meta = metas6.get(key6)
                    if meta is None:
                        meta = RxMeta(gid_of(src), gid_of(dst), d.sport, d.tos, d.ttl, 0,
                                      build_grh(d), False)
                        if len(metas6) >= 4096:
                            metas6.clear()
                        metas6[key6] = meta
                    if hint >= 0 and tap is None and taken < n_dg:
                        # the UD SEND ONLYs that follow in this coalesced read (a GSO
                        # sender's run: IPoIB's datagram mode), checked together and
                        # executed by the engine in one call
                        run = self._middle_run(dgrams, taken, d, 0, data[0])
                        if run:
                            k = port.receive_ud_run([data[:-4], *run], meta)
                            if k:
                                taken += k - 1
                                if stop_on and taken < n_dg:
                                    self._backlog = dgrams[taken:]
                                    break
                                continue
                    receive(data[:-4], meta, now)
                    if stop_on and taken < len(dgrams):
                        self._backlog = dgrams[taken:]
                        break
                    continue
            else:
                if not icrc_ok_udp(src, dst, d.sport, d.dport, data):
                    counters.rcvd_icrc_err += 1
                    continue
                grh = b""
            body = data[:-4]
            if grh:
                meta = RxMeta(gid_of(src), gid_of(dst), d.sport, d.tos, d.ttl, 0, grh,
                              len(src) == 4)
            else:  # RC/UC: the engine reads only the addresses; reuse one per flow
                key = (src, dst, d.sport, d.tos, d.ttl)
                meta = metas.get(key)
                if meta is None:
                    meta = RxMeta(gid_of(src), gid_of(dst), d.sport, d.tos, d.ttl, 0, b"",
                                  len(src) == 4)
                    if len(metas) >= 4096:
                        metas.clear()
                    metas[key] = meta
                if hint >= 0 and tap is None and taken < n_dg and data[0] in _RUN_MIDDLE:
                    # the packets of the message that follow in this coalesced read,
                    # checked together and executed by the engine in one call
                    # (Port.receive_run: a SEND FIRST, MIDDLEs, a SEND LAST)
                    run = self._middle_run(dgrams, taken, d, (hint + 1 + bias) & 0xFFFF)
                    if run:
                        k = port.receive_run([body, *run], meta)
                        if k:
                            taken += k - 1
                            if stop_on and taken < n_dg:  # a LAST completes a receive
                                self._backlog = dgrams[taken:]
                                break
                            continue
            receive(body, meta, now)
            if stop_on and taken < len(dgrams):
                self._backlog = dgrams[taken:]
                break
        if (misses or failures) and self._gso is not None:
            self._gso.note_rx_ids(misses, failures)
        self._rx_acks_only = acks_only
        return taken

    @staticmethod
    def _middle_run(dgrams: list[Datagram], start: int, first: Datagram,
                    first_ident: int, follow: int = -1) -> list[memoryview]:
        """The bodies (BTH .. pad) of the datagrams from index ``start`` that follow
        ``first`` in its coalesced read (the next segment indices) with a right ICRC
        (segment i with IPv4 ID ``first_ident + i``): packets of ``first``'s length with
        opcode ``follow`` (default: the MIDDLEs of ``first``'s message, the MIDDLE opcode
        of ``first``'s, :data:`_RUN_MIDDLE`; a UD run: ``first``'s UD SEND ONLY), then
        for a SEND its LAST, no longer than them."""
        data = first.data
        size = len(data)
        middle = _RUN_MIDDLE[data[0]] if follow < 0 else follow
        hint = first.ident
        datas: list[memoryview] = []
        for j in range(start, len(dgrams)):
            dj = dgrams[j]
            x = dj.data
            hint += 1
            if dj.ident != hint:
                break  # (the engine checks each DestQP)
            if len(x) == size and x[0] == middle:
                datas.append(x)
                continue
            if x[0] == RC_SEND_LAST and middle == RC_SEND_MIDDLE and len(x) <= size:
                datas.append(x)
            break
        if not datas:
            return datas
        return udp_run_bodies(first.src_ip, first.dst_ip, first.sport, first.dport, datas,
                              first_ident)

    def _device_fatal_locked(self, why: str) -> None:
        """The device is gone (IBA 11.6.3 "Unaffiliated asynchronous events": Local
        Catastrophic Error; ``IBV_EVENT_DEVICE_FATAL``): every QP to ERR, flushing its work
        requests, the async event raised, the progress thread stopped. Later verbs calls
        raise :class:`DeviceError` with ``why``; destroying objects still works."""
        core = self.core
        if core.fatal is not None:
            return
        core.fatal = f"{why}: the device is no longer usable (IBV_EVENT_DEVICE_FATAL)"
        core.stop.set()
        self.port.device_fatal()

"""The sans-I/O IB transport engine of one device port.

A :class:`Port` owns the QP table, the MR table (lkey/rkey -> MemoryRegion), the
P_Key/GID tables and the counters. It never touches a socket or a clock:

* ``port.receive(ib, meta, now)`` takes one transport packet (BTH .. payload + pad, the
  ICRC already checked and stripped by the driver) with the addressing of the network
  header around it;
* ``qp.post_send(wqe, now)`` / ``qp.post_recv(rwqe)`` take work requests;
* ``port.on_timer(now)`` runs when ``now >= port.next_deadline()``;
* packets to send are taken with ``port.take_output()`` (a list of :class:`TxPacket`;
  this also emits the ACKs coalesced since the last call); completions are pushed into
  the CQs' sinks; asynchronous events are typed :class:`~softrdma.seam.events.EngineEvent`s
  emitted into ``port.events`` (each subscriber gets them as they happen) and kept for
  ``port.pop_events()``.

It implements :class:`~softrdma.seam.protocols.DeviceEngine`, as the iWARP device does,
and the driver's :class:`~softrdma.seam.protocols.Engine` contract.

Malformed or unexpected packets are dropped silently and counted (IBA 9.6: header
validation, the clause of each rule in ``counters.DROP_REASONS``): see ``port.counters``.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Sequence

from ..errors import DecodeError, InvalidArgument
from ..seam.counters import Counters, DropReason
from ..seam.events import EngineEvent
from ..seam.protocols import Timed
from ..seam.queues import QPInit
from ..seam.states import QPT_RC, QPT_UD, RTR, SQE
from ..seam.tables import DeviceTables
from ..wire import ib as wib
from ..wire.opcodes import CNP as CNP_OPCODE
from ..wire.opcodes import (
    RC_ACK,
    RC_SEND_FIRST,
    RC_SEND_LAST,
    RC_SEND_MIDDLE,
    RC_SEND_ONLY,
    RC_SEND_ONLY_IMM,
    RC_WRITE_MIDDLE,
    UD_SEND_ONLY,
    Transport,
)
from .packet import (
    DEFAULT_PKEY,
    GID_TYPE_ROCE_V1,
    GID_TYPE_ROCE_V2,
    ICRC_SIZE,
    LOOPBACK_GID,
    MULTICAST_QPN,
    QP0,
    RxMeta,
    TxPacket,
)
from .qp import EngineQP
from .views import AckOwner

__all__ = ["Counters", "DropReason", "Port", "RxMeta", "TxPacket", "Timed"]

_U32 = struct.Struct("!I")
_U32_AT = _U32.unpack_from  # one BTH word at an offset
_U16_AT = struct.Struct("!H").unpack_from  # the BTH P_Key (IBA 9.2)
_ECN_CE = 0x03  # the ECN field of the IP TOS / traffic class byte: CE (RFC 3168 §5)
_ACK_SIZE = wib.BTH.size + wib.U32.size  # an ACKNOWLEDGE: BTH + AETH, no payload (IBA 9.7.5.2)
_BTH_SIZE = wib.BTH.size  # a shorter packet is malformed (IBA 9.2)
_UD_MIN = 20  # BTH + DETH (IBA 9.2, 9.3.3)
#: the opcodes with a fast path: the MIDDLE packets the responder places in runs, the ACK,
#: the small SEND ONLY
_FAST_OPS = frozenset((RC_WRITE_MIDDLE, RC_SEND_MIDDLE, RC_SEND_FIRST, RC_SEND_LAST, RC_ACK,
                       RC_SEND_ONLY, RC_SEND_ONLY_IMM))
#: the events :meth:`Port.pop_events` keeps at most (the oldest go first: a driver that
#: only subscribes to ``port.events`` never pops them)
_EVENT_BACKLOG = 256


class Port(DeviceTables[EngineQP]):
    """One port of a softrdma RoCE device: the engine every QP of the device runs in.

    ``gids`` is the GID table (16-byte values, index = GID index); ``gid_types`` gives
    each entry's type (``IBV_GID_TYPE_ROCE_V1`` or ``_V2``; default all RoCE v2): packets
    sent from a GID go out in its encapsulation, as Linux chooses per GID. ``qpn_alloc`` returns
    a fresh QP number (a shared device gets them from its demultiplexer so they are
    unique across processes); by default QPNs are allocated locally from 0x11 up, as rxe
    does.
    """

    #: the fast paths run (Responder.place_middles/send_only, Completer.fast_ack,
    #: Requester.post_one/emit_middles); tests switch them off to compare with the
    #: general path
    fast_paths = True

    def __init__(self, gids: list[bytes], *, max_mtu: int = 4096,
                 pkeys: tuple[int, ...] = (DEFAULT_PKEY,),
                 qpn_alloc: Callable[[], int] | None = None,
                 qpn_free: Callable[[int], None] | None = None,
                 key_alloc: Callable[[], int] | None = None,
                 gid_types: list[int] | None = None) -> None:
        super().__init__(qpn_alloc=qpn_alloc, key_alloc=key_alloc)
        self.gids = list(gids)
        self.gid_types: list[int] = []
        self.gid_v1: list[bool] = []
        self.set_gid_types(gid_types)
        self.max_mtu = max_mtu
        self.pkeys = pkeys
        self.tx: list[TxPacket] = []
        self.counters = Counters()
        self._qpn_free = qpn_free
        self.mcast: dict[bytes, set[EngineQP]] = {}
        # A16.7.2 drops packets from/to the loopback GID ::1. On RoCEv2 over the loopback
        # netdev ::1 is the port's own IPv6 address (a self-addressed packet), so a port
        # that holds ::1 as a GID accepts it.
        self.loopback_gid_ok = LOOPBACK_GID in self.gids
        self.ack_pending: list[AckOwner] = []
        # a pending ACK's peer awaits it (Responder.schedule_ack): send it promptly
        self.ack_prompt = False
        self._unpopped: deque[EngineEvent] = deque(maxlen=_EVENT_BACKLOG)
        self.events.subscribe(self._unpopped.append)

    def set_gid_types(self, gid_types: list[int] | None) -> None:
        """Set the type of every GID table entry (None: all RoCE v2)."""
        types = list(gid_types) if gid_types is not None else [GID_TYPE_ROCE_V2] * len(self.gids)
        if len(types) != len(self.gids):
            raise InvalidArgument("gid_types", f"{len(types)} types for {len(self.gids)} GIDs")
        for t in types:
            if t not in (GID_TYPE_ROCE_V1, GID_TYPE_ROCE_V2):
                raise InvalidArgument("gid_types", f"unsupported GID type {t!r}")
        self.gid_types = types
        self.gid_v1 = [t == GID_TYPE_ROCE_V1 for t in types]

    def gid_index_of(self, gid: bytes, v1: bool | None = None) -> int:
        """Index of ``gid`` in the table, of the given encapsulation when ``v1`` is not
        None (a GID may appear once per type, as in Linux); -1 if absent."""
        for i, g in enumerate(self.gids):
            if g == gid and (v1 is None or self.gid_v1[i] == v1):
                return i
        return -1

    def take_output(self, acks: bool = True) -> list[TxPacket]:
        """Packets to send, oldest first; with ``acks`` the coalesced ACKs pending since the
        last call are emitted after them (IBA 9.7.5.1.1)."""
        if acks and self.ack_pending:
            pending = self.ack_pending
            self.ack_pending = []
            self.ack_prompt = False
            for qp in pending:
                qp.flush_ack()
        tx = self.tx
        self.tx = []
        return tx

    #: the name :meth:`take_output` had before the engine contract
    take_tx = take_output

    def pop_events(self) -> list[EngineEvent]:
        """The asynchronous events (IBA 11.6.3) emitted since the last call, oldest first
        (at most the newest ``_EVENT_BACKLOG``); ``events`` subscribers had each at once."""
        out = list(self._unpopped)
        self._unpopped.clear()
        return out

    # ---- QPs -------------------------------------------------------------------------
    def create_qp(self, init: QPInit) -> EngineQP:
        """A new RC, UC or UD QP in RESET (IBA 10.2.4)."""
        return EngineQP(self, init)

    def free_qpn(self, qpn: int) -> None:
        """Give back a number from :meth:`alloc_qpn` that no QP holds (an XRC SRQ's
        number, softrdma.ib.xrc)."""
        if self._qpn_free is not None and qpn > 1 and qpn not in self.qps:
            self._qpn_free(qpn)

    def add_qp(self, qp: EngineQP) -> None:
        self.qps[qp.qpn] = qp

    def remove_qp(self, qp: EngineQP) -> None:
        if self.qps.get(qp.qpn) is qp:
            del self.qps[qp.qpn]
            self._timers.discard(qp)
            for mgid, members in list(self.mcast.items()):
                members.discard(qp)
                if not members:
                    del self.mcast[mgid]
            if self._qpn_free is not None and qp.qpn > 1:
                self._qpn_free(qp.qpn)

    # ---- receive -----------------------------------------------------------------------
    def receive_run(self, bodies: Sequence[memoryview], meta: RxMeta) -> int:
        """Execute the leading packets of ``bodies`` (consecutive segments of one
        coalesced receive, ICRC checked, one source) that the responder takes as one run
        (``Responder.place_run``: a SEND FIRST, MIDDLEs, a SEND LAST): exactly what
        :meth:`receive` does with each of them in turn. Returns how many; the caller gives the rest to :meth:`receive`.
        """
        if not bodies or not self._run_source_ok(meta):
            return 0
        first = bodies[0]
        if len(first) < _ACK_SIZE:
            return 0
        qp = self.qps.get(_U32.unpack_from(first, 4)[0] & 0xFFFFFF)
        if qp is None or qp.fast_pkey < 0 or not qp.from_peer(meta):
            return 0
        k = qp.resp.place_run(bodies)
        if k:
            c = self.counters
            c.rcvd_pkts += k
            c.rcvd_bytes += k * (len(first) + ICRC_SIZE)
            last = bodies[k - 1]
            if k > 1 and len(last) != len(first):  # a shorter LAST ends the run
                c.rcvd_bytes += len(last) - len(first)
        return k

    def _run_source_ok(self, meta: RxMeta) -> bool:
        """A run of one source may take a fast path (:meth:`receive_run`,
        :meth:`receive_ud_run`): fast paths on, neither GID the loopback one (A16.7.2,
        which :meth:`receive` counts and drops), no ECN CE mark (which it answers with a
        CNP for each packet)."""
        return (self.fast_paths and meta.tclass & _ECN_CE != _ECN_CE
                and (self.loopback_gid_ok
                     or (meta.sgid != LOOPBACK_GID and meta.dgid != LOOPBACK_GID)))

    def _count_fecn_becn(self, b4: int) -> None:
        """CA16-16: FECN/BECN (BTH byte 4, bits 7 and 6) are unused, ignored, counted."""
        c = self.counters
        c.rcvd_fecn += b4 >> 7
        c.rcvd_becn += (b4 >> 6) & 1

    def _ud_only(self, data: memoryview, meta: RxMeta) -> bool:
        """A UD SEND ONLY (IPoIB's datagram mode; at least BTH + DETH) to a UD QP whose
        P_Key matches (IBA 10.9.3), taken by ``Responder.ud_only``; False, nothing
        changed, where the general path of :meth:`receive` must run."""
        uqp = self.qps.get(_U32_AT(data, 4)[0] & 0xFFFFFF)
        return (uqp is not None and uqp.qp_type == QPT_UD
                and self.pkey_ok(_U16_AT(data, 2)[0], uqp.pkey, False)
                and uqp.resp.ud_only(data, meta))

    def receive_ud_run(self, bodies: Sequence[memoryview], meta: RxMeta) -> int:
        """Execute the leading packets of ``bodies`` (consecutive segments of one
        coalesced receive, ICRC checked, one source: a GSO sender's UD SEND ONLYs) that
        take the UD fast path, exactly as :meth:`receive` does with each in turn, the
        checks that depend only on ``meta`` made once. Returns how many; the caller gives
        the rest to :meth:`receive`."""
        if not self._run_source_ok(meta):
            return 0
        c = self.counters
        ud_only = self._ud_only
        k = 0
        for data in bodies:
            n = len(data)
            if n < _UD_MIN or data[0] != UD_SEND_ONLY or not ud_only(data, meta):
                break
            k += 1
            c.rcvd_pkts += 1
            c.rcvd_bytes += n + ICRC_SIZE
            if data[4] & 0xC0:
                self._count_fecn_becn(data[4])
        return k

    def receive(self, data: memoryview, meta: RxMeta, now: float) -> None:
        """Demultiplex one transport packet to its QP (IBA 9.6 header checks).

        The network checks come first (A16.7.2: SGID or DGID ::1 -> dropped), then the
        transport ones; each failure is counted under its own
        :class:`~softrdma.seam.counters.DropReason` (CA16-23). FECN/BECN are counted and
        otherwise ignored (CA16-16). A packet for QP0 is dropped (CA16-8).
        """
        c = self.counters
        c.rcvd_pkts += 1
        n = len(data)
        c.rcvd_bytes += n + ICRC_SIZE
        if (meta.sgid == LOOPBACK_GID or meta.dgid == LOOPBACK_GID) and not self.loopback_gid_ok:
            c.rcvd_loopback_gid += 1
            return
        if n < _BTH_SIZE:  # not even a BTH (IBA 9.2): malformed, as wib.decode finds it
            c.rcvd_malformed += 1
            return
        op = data[0]
        if meta.tclass & _ECN_CE == _ECN_CE and not meta.v1 and n >= _ACK_SIZE \
                and op != CNP_OPCODE:
            self._congestion_experienced(data, meta, now)
        if n > 4 and data[4] & 0xC0:
            self._count_fecn_becn(data[4])
        if op == UD_SEND_ONLY and n >= _UD_MIN and self.fast_paths and self._ud_only(data, meta):
            return
        if op in _FAST_OPS and n >= _ACK_SIZE:
            # The fast paths: RC WRITE/SEND MIDDLE (the bulk of large messages: a run of
            # one; a SEND's FIRST and LAST too), the ACK and the small SEND ONLY. They take the packet only when every
            # check of the general path would pass (TVer 0, no pad, the QP's full-member
            # P_Key, its peer's addresses, in sequence); anything else goes the general
            # way below.
            fqp = self.qps.get(_U32_AT(data, 4)[0] & 0xFFFFFF)
            # BTH word 0 without OpCode, SE and M: TVer 0, no pad (a SEND LAST may have
            # one: Responder.send_last takes it off), the QP's fast P_Key
            if (fqp is not None and (_U32_AT(data, 0)[0] & 0x3FFFFF == fqp.fast_pkey or (
                    op == RC_SEND_LAST and _U32_AT(data, 0)[0] & 0xFFFFF == fqp.fast_pkey))
                    and self.fast_paths and (meta is fqp.peer_meta or fqp.from_peer(meta))):
                if op == RC_ACK:
                    if n == _ACK_SIZE and fqp.comp.fast_ack(data, now):
                        return
                elif op == RC_SEND_ONLY or op == RC_SEND_ONLY_IMM:
                    if fqp.resp.send_only(data, op):
                        return
                elif fqp.resp.place_run((data,)):
                    return
        try:
            pkt = wib.decode(data)
        except DecodeError:
            c.rcvd_malformed += 1
            return
        if pkt.tver != 0:  # IBA 9.6.1.1: TVer must be 0 (rxe ``hdr_check`` drops)
            c.rcvd_bad_tver += 1
            return
        if pkt.opcode == CNP_OPCODE:  # RoCEv2 CNP: the peer saw congestion on our packets
            c.rcvd_cnp += 1
            cqp = self.qps.get(pkt.dqpn)
            if cqp is not None and cqp.qp_type == QPT_RC and cqp.from_peer(meta):
                cqp.req.on_cnp(now)  # no completion, nothing resent (DCQCN reaction point)
            return
        if pkt.dqpn == MULTICAST_QPN:
            members = self.mcast.get(meta.dgid)
            if not members or pkt.info.transport != Transport.UD:
                c.rcvd_unknown_qp += 1
                return
            for member in list(members):
                member.receive(pkt, meta, now)
            return
        if pkt.dqpn == QP0:  # CA16-8: no QP0 (SMI) on a RoCE port: silently dropped
            c.rcvd_qp0 += 1
            return
        qp = self.qps.get(pkt.dqpn)
        if qp is None:
            c.rcvd_unknown_qp += 1
            return
        qp.receive(pkt, meta, now)

    def _congestion_experienced(self, data: memoryview, meta: RxMeta, now: float) -> None:
        """A RoCEv2 packet arrived marked ECN CE (RFC 3168 §5, IP ECN 11): as a NIC's
        DCQCN notification point does, the connected QP it is for answers its peer with a
        CNP (opcode 0x81), at most one per QP per :data:`~softrdma.ib.qp.CNP_INTERVAL_S`.
        The packet itself is then processed as usual."""
        qp = self.qps.get(int.from_bytes(data[5:8], "big"))
        if qp is not None and qp.qp_type == QPT_RC and qp.peer_gids is not None \
                and RTR <= qp.state <= SQE and qp.from_peer(meta):
            qp.send_cnp(now)

    def pkey_ok(self, pkey: int, qp_pkey: int, gsi: bool) -> bool:
        """P_Key check (IBA 10.9.3; rdmavt ``pkey_match``); QP1 accepts any table entry."""
        if gsi:
            return any(_pkey_match(pkey, k) for k in self.pkeys)
        return _pkey_match(pkey, qp_pkey)


def _pkey_match(a: int, b: int) -> bool:
    ka = a & 0x7FFF
    return ka != 0 and ka == (b & 0x7FFF) and bool((a | b) & 0x8000)

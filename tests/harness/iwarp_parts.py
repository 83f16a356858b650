"""Stand-ins for the QP, device and connection around the iWARP engine's parts.

They implement the narrow protocols the parts declare (``PlacementDevice``,
``RdmapQP``, ``RdmapOwner``) with plain lists and deques, so each part can be driven
alone: no :class:`~softrdma.iwarp.qp.IwarpQP`, no :class:`~softrdma.iwarp.engine.IwarpConn`.
"""

from __future__ import annotations

from collections import deque

from softrdma import enums as e
from softrdma.iwarp.rdmap_tx import W_DONE
from softrdma.iwarp.terminate import IwarpFault
from softrdma.seam.events import EngineEvent, EventQueue
from softrdma.seam.types import SGE, MemoryRegion, RecvWQE, SendWQE
from softrdma.wire.ddp import Terminate

ACC_ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
ADDR = 0x10000


class Dev:
    """A device: STag-keyed MRs and recorded async events."""

    def __init__(self) -> None:
        self.mrs: dict[int, MemoryRegion] = {}
        self.async_events: list[EngineEvent] = []
        self.events = EventQueue()
        self.events.subscribe(self.async_events.append)
        self._next = 0x100

    def mr(self, pd: object, size: int, access: int = ACC_ALL, fill: int = 0) -> MemoryRegion:
        stag = self._next
        self._next += 0x100
        mr = MemoryRegion(stag, stag, ADDR, memoryview(bytearray([fill]) * size), access, pd)
        self.mrs[stag] = mr
        return mr


class QP:
    """A QP: a receive queue, a send queue and the completions reported."""

    def __init__(self, pd: object) -> None:
        self.pd = pd
        self.rx_pd = pd
        self.rq: deque[RecvWQE] = deque()
        self.sq: deque[SendWQE] = deque()
        self.inflight: deque[SendWQE] = deque()
        self.recvs: list[tuple[int, int, int, int, bool]] = []
        self.sends: list[tuple[int, int]] = []

    def take_rwqe(self) -> RecvWQE | None:
        return self.rq.popleft() if self.rq else None

    def complete_recv(self, rwqe: RecvWQE, status: int, byte_len: int, invalidated: int,
                      solicited: bool) -> None:
        self.recvs.append((rwqe.wr_id, status, byte_len, invalidated, solicited))

    def complete_ready(self) -> None:
        while self.inflight and self.inflight[0].state == W_DONE:
            w = self.inflight.popleft()
            self.sends.append((w.wr_id, w.error))

    def peek_send(self) -> SendWQE | None:
        return self.sq[0] if self.sq else None

    def start_send(self) -> SendWQE:
        w = self.sq.popleft()
        self.inflight.append(w)
        return w

    def post_recv(self, mr: MemoryRegion, length: int, wr_id: int = 0) -> None:
        self.rq.append(RecvWQE(wr_id, [SGE(mr.addr, length, mr.lkey)]))

    def post(self, opcode: int, mr: MemoryRegion | None = None, length: int = 0, *,
             wr_id: int = 0, rkey: int = 0, raddr: int = 0, flags: int = 0,
             inv: int = 0) -> SendWQE:
        sges = [SGE(mr.addr, length, mr.lkey)] if mr is not None else []
        w = SendWQE(wr_id, int(opcode), flags, sges, invalidate_rkey=inv, remote_addr=raddr,
                    rkey=rkey)
        self.sq.append(w)
        return w


class Owner:
    """The connection: records the faults and Terminates the parts report."""

    def __init__(self) -> None:
        self.faults: list[IwarpFault] = []
        self.terms: list[Terminate | None] = []

    def fail(self, f: IwarpFault) -> None:
        self.faults.append(f)

    def peer_terminated(self, term: Terminate | None) -> None:
        self.terms.append(term)

"""The ORQ and IRQ of one RDMAP stream: RDMA Reads outstanding each way.

As siw's ``qp->orq`` and ``qp->irq`` (``siw_qp.c``, ``siw_qp_tx.c``):

* the ORQ holds this side's outstanding RDMA Read Requests, oldest first, each with the
  sink buffer its Read Response goes into (:class:`~.ddp_place.ReadCtx`); at most ORD
  of them (RFC 5040 §6.1, negotiated in MPA, RFC 6581 §3); IBV_SEND_FENCE holds a work
  request back until the ORQ is empty (the Fence of RFC 5040 §5.5 rule 12,
  siw ``SIW_WQE_READ_FENCE``);
* the IRQ holds the Read Responses this side owes, in Read Request order (RFC 5040
  §5.5 rule 20); more than IRD inbound Requests outstanding is a Remote Operation
  Error (siw: ``RDMAP_ETYPE_REMOTE_OPERATION``, "catastrophic localized").
"""

from __future__ import annotations

from collections import deque

from ..enums import ibv_send_flags as SF
from ..enums import ibv_wr_opcode as WR
from ..seam.types import SendWQE
from ..wire.ddp import RdmapErrorCode
from .ddp_place import ReadCtx, TxMsg
from .terminate import IwarpFault

__all__ = ["ReadQueues"]

_FENCE = int(SF.IBV_SEND_FENCE)
_READ = int(WR.IBV_WR_RDMA_READ)


class ReadQueues:
    """The ORQ (``orq``, at most ``ord``) and IRQ (``irq``, at most ``ird``) of a stream.

    ``irq_count`` counts the inbound Reads not yet answered in full: queued responses and
    the one being sent."""

    __slots__ = ("orq", "irq", "irq_count", "ird", "ord")

    def __init__(self, ird: int, ord_: int) -> None:
        self.orq: deque[ReadCtx] = deque()
        self.irq: deque[TxMsg] = deque()
        self.irq_count = 0
        self.ird = ird
        self.ord = ord_

    # ---- ORQ ---------------------------------------------------------------------------------
    def ready(self, w: SendWQE) -> bool:
        """May ``w`` start now? A fenced WR waits for the outstanding Reads; a Read waits
        for an ORD slot (ORD 0 fails it when it starts)."""
        if w.send_flags & _FENCE and self.orq:
            return False
        return not (w.opcode == _READ and len(self.orq) >= self.ord > 0)

    def issue(self, rd: ReadCtx) -> None:
        """A Read Request goes out: its response is expected after the older ones."""
        self.orq.append(rd)

    def oldest(self) -> ReadCtx | None:
        """The Read the next Read Response segment answers."""
        return self.orq[0] if self.orq else None

    def retire(self) -> ReadCtx:
        """The oldest Read's last response segment was placed."""
        return self.orq.popleft()

    # ---- IRQ ---------------------------------------------------------------------------------
    def check_room(self, hdr: bytes) -> None:
        """A Read Request arrived: refuse it if IRD are already outstanding."""
        if self.irq_count >= self.ird:
            raise IwarpFault.remote_operation(RdmapErrorCode.CATASTROPHIC_LOCALIZED,
                                              f"more than IRD={self.ird} outstanding RDMA Read "
                                              "Requests", hdr, 0)

    def owe(self, resp: TxMsg) -> None:
        """Queue the Read Response for an accepted Read Request."""
        self.irq_count += 1
        self.irq.append(resp)

    def next_response(self) -> TxMsg | None:
        """The next Read Response to send, oldest first."""
        return self.irq.popleft() if self.irq else None

    def response_sent(self) -> None:
        """A Read Response was pulled whole: its IRD slot is free."""
        self.irq_count -= 1

"""DDP for one iWARP stream: segmentation out, placement in (RFC 5041).

* Transmit (RFC 5041 §5.1, §8): a :class:`TxMsg` is one outbound RDMAP message;
  :func:`segment` cuts its next DDP segment (tagged: STag + TO advancing with the
  offset; untagged: QN, MSN, MO) no longer than the MULPDU allows; the payload is a list
  of views of the registered memory, never copied.
* Receive (RFC 5041 §3, §7.2; siw ``siw_proc_write``, ``siw_proc_rresp``,
  ``siw_proc_send``): :class:`DdpRx` checks each segment against the buffer model and
  names where its payload goes.

  - Tagged buffers: an RDMA Write's STag must be valid, of the QP's PD, grant remote
    write and cover ``[TO, TO+len)`` (:func:`~.stag.check_access`); a Read Response
    must target the sink buffer of the oldest outstanding Read (:class:`ReadCtx`) at the
    next offset. The segments of one tagged message carry the same STag and contiguous
    TOs (siw: a Write or Read Response continues where it stopped).
  - Untagged buffers: QN 0 (Send) consumes a receive WQE at MO 0 of each message, MSN
    in sequence (§5.3, §7.2); a message longer than the buffer is "message too long".

  Every violation is an :class:`~.terminate.IwarpFault` with the DDP error type and code
  of RFC 5041 §7.2 (or RDMAP's, RFC 5040 §7.2, where siw reports the opcode).

The QP and the device are seen through :class:`PlacementQP` and :class:`PlacementDevice`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..enums import ibv_access_flags as ACC
from ..enums import ibv_wc_status as WCS
from ..seam.events import AsyncEventType, EventQueue
from ..seam.memory import gather, resolve_sges, total_len
from ..seam.types import MemoryRegion, RecvWQE, SendWQE
from ..wire.ddp import (
    DDP_L,
    DDP_T,
    DDP_VERSION,
    QN_READ_REQUEST,
    QN_SEND,
    RDMAP_RV_SHIFT,
    RDMAP_VERSION,
    TAGGED,
    TAGGED_HDR_LEN,
    UNTAGGED,
    UNTAGGED_HDR_LEN,
    DdpTaggedErrorCode,
    DdpUntaggedErrorCode,
    RdmapErrorCode,
    RdmapOpcode,
)
from .mpa_stream import Buf
from .stag import Access, check_access
from .terminate import TAGGED_CODE, IwarpFault

__all__ = ["TxMsg", "ReadCtx", "DdpRx", "PlacementQP", "PlacementDevice", "segment",
           "TAGGED_HDR_LEN", "UNTAGGED_HDR_LEN", "DDP_T", "DDP_L", "DDP_DV", "MASK64",
           "MASK32", "ACCESS_ERR", "RDMAP_RV", "access_error"]

DDP_DV = DDP_VERSION  # the DV bits of the DDP control octet (RFC 5041 §5.1)
RDMAP_RV = RDMAP_VERSION << RDMAP_RV_SHIFT  # RV in the RDMAP control octet (RFC 5040 §4.3)
MASK64 = (1 << 64) - 1
MASK32 = 0xFFFFFFFF
#: The async event of an access violation by the peer (IBV_EVENT_QP_ACCESS_ERR).
ACCESS_ERR = AsyncEventType.QP_ACCESS_ERR
_OP_WRITE = int(RdmapOpcode.RDMA_WRITE)
_REMOTE_WRITE = int(ACC.IBV_ACCESS_REMOTE_WRITE)
_LOCAL_WRITE = int(ACC.IBV_ACCESS_LOCAL_WRITE)
_BAD_RESP = int(WCS.IBV_WC_BAD_RESP_ERR)


class PlacementDevice(Protocol):
    """What placement needs of the device: the STag-keyed memory table and the queue
    its typed async events go to (:class:`~.qp.IwarpDevice`)."""

    mrs: dict[int, MemoryRegion]
    events: EventQueue


def access_error(dev: PlacementDevice, qp: object) -> None:
    """The peer violated ``qp``'s protection: the QP_ACCESS_ERR async event (siw
    ``siw_qp_event(qp, IB_EVENT_QP_ACCESS_ERR)``). The one place it is raised."""
    dev.events.raise_event(ACCESS_ERR, qp)


class PlacementQP(Protocol):
    """What placement needs of the QP (:class:`~.qp.IwarpQP`)."""

    @property
    def pd(self) -> object:
        """The protection domain tagged buffers are checked against."""

    @property
    def rx_pd(self) -> object:
        """The PD receive buffers are checked against (the SRQ's, if any)."""

    def take_rwqe(self) -> RecvWQE | None:
        """The next receive WQE (RQ or SRQ), or None."""


class TxMsg:
    """One outbound RDMAP message, cut into DDP segments on demand (RFC 5041 §5.1)."""

    __slots__ = ("tagged", "rdmap", "stag", "to", "rsvdulp", "qn", "msn", "extra", "segs",
                 "length", "off", "wqe", "read_resp", "rtr")

    def __init__(self, opcode: int, segs: list[memoryview], length: int, *, tagged: bool,
                 stag: int = 0, to: int = 0, rsvdulp: int = 0, qn: int = 0, msn: int = 0,
                 extra: bytes = b"", wqe: SendWQE | None = None, read_resp: bool = False,
                 rtr: bool = False) -> None:
        self.tagged = tagged
        self.rdmap = RDMAP_RV | opcode
        self.stag = stag
        self.to = to
        self.rsvdulp = rsvdulp
        self.qn = qn
        self.msn = msn
        self.extra = extra
        self.segs = segs
        self.length = length
        self.off = 0
        self.wqe = wqe
        self.read_resp = read_resp
        self.rtr = rtr


def segment(msg: TxMsg, maxpay_t: int, maxpay_u: int) -> tuple[list[Buf], int, bool]:
    """The next DDP segment of ``msg``: ``([header, payload views...], payload length,
    last)``. ``maxpay_t``/``maxpay_u``: the most payload a tagged/untagged segment may
    carry (the MULPDU less the headers, RFC 5041 §5.1 / RFC 5044 §4.2)."""
    off = msg.off
    left = msg.length - off
    if msg.tagged:
        n = left if left < maxpay_t else maxpay_t
        last = n == left
        hdr = TAGGED.pack(DDP_T | (DDP_L if last else 0) | DDP_DV, msg.rdmap, msg.stag,
                          (msg.to + off) & MASK64)
    else:
        n = left if left < maxpay_u else maxpay_u
        last = n == left
        hdr = UNTAGGED.pack((DDP_L if last else 0) | DDP_DV, msg.rdmap, msg.rsvdulp,
                            msg.qn, msg.msn, off & MASK32)
        if msg.extra:
            hdr += msg.extra
    msg.off = off + n
    if not n:
        return [hdr], 0, last
    segs = msg.segs
    if len(segs) == 1:
        return [hdr, segs[0][off:off + n]], n, last
    return [hdr, *gather(segs, off, n)], n, last


@dataclass(eq=False, slots=True)
class ReadCtx:
    """An outstanding outbound RDMA Read (an ORQ entry): the tagged sink buffer its
    Read Response is placed into (RFC 5040 §4.5); ``received`` bytes of it so far."""

    wqe: SendWQE | None
    sink_stag: int
    sink_to: int
    size: int
    segs: list[memoryview]
    received: int = field(default=0, init=False)


class DdpRx:
    """Receive-side placement of one stream (see the module docstring).

    ``rx_msn[qn]`` is the MSN the next message on queue ``qn`` must carry (RFC 5041
    §5.3: the first is 1). A tagged message in progress is ``rt_op`` (-1: none) with the
    STag and the TO its next segment must carry; an untagged (Send) one is ``ru_wqe``
    with its buffers, capacity and next MO.
    """

    __slots__ = ("dev", "rx_msn", "ru_wqe", "ru_segs", "ru_cap", "ru_mo", "ru_op", "ru_inv",
                 "rt_op", "rt_stag", "rt_to")

    def __init__(self, dev: PlacementDevice) -> None:
        self.dev = dev
        self.rx_msn = [1, 1, 1]
        self.ru_wqe: RecvWQE | None = None
        self.ru_segs: list[memoryview] = []
        self.ru_cap = 0
        self.ru_mo = 0
        self.ru_op = -1
        self.ru_inv = 0
        self.rt_op = -1
        self.rt_stag = 0
        self.rt_to = 0

    @property
    def mid_message(self) -> bool:
        """A tagged or untagged message has started and not ended."""
        return self.ru_wqe is not None or self.rt_op >= 0

    def advance_msn(self, qn: int) -> None:
        """A whole message on queue ``qn`` was taken (RFC 5041 §5.3)."""
        self.rx_msn[qn] = (self.rx_msn[qn] + 1) & MASK32

    # ---- tagged ----------------------------------------------------------------------------
    def _same_message(self, op: int, hdr: bytes, paylen: int) -> None:
        if self.rt_op >= 0 and self.rt_op != op:
            raise IwarpFault.remote_operation(RdmapErrorCode.UNEXPECTED_OPCODE,
                                              "tagged message interleaved with another",
                                              hdr, paylen)

    def write(self, qp: PlacementQP, op: int, stag: int, to: int, paylen: int, last: bool,
              hdr: bytes) -> list[memoryview]:
        """An RDMA Write segment: its target in the STag's region (RFC 5041 §7.2)."""
        self._same_message(op, hdr, paylen)
        if self.rt_op >= 0 and stag != self.rt_stag:
            raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.INVALID_STAG,
                                        "STag changed within an RDMA Write", hdr, paylen)
        if self.rt_op >= 0 and to != self.rt_to:
            raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION,
                                        "TO not contiguous within an RDMA Write", hdr, paylen)
        targets: list[memoryview] = []
        if paylen:
            mr = self.dev.mrs.get(stag)
            acc, off = check_access(mr, stag, qp.pd, to, paylen, _REMOTE_WRITE)
            if acc != Access.OK:
                if acc == Access.ACCESS_PERM or acc == Access.PD_MISMATCH:
                    access_error(self.dev, qp)
                raise IwarpFault.ddp_tagged(TAGGED_CODE[acc],
                                            f"RDMA Write to STag {stag:#010x} TO {to:#x} "
                                            f"len {paylen}: {acc.name}", hdr, paylen)
            assert mr is not None
            targets = [mr.buf[off:off + paylen]]
        self.rt_op = -1 if last else op
        self.rt_stag = stag
        self.rt_to = (to + paylen) & MASK64
        return targets

    def read_response(self, rd: ReadCtx | None, op: int, stag: int, to: int, paylen: int,
                      last: bool, hdr: bytes) -> list[memoryview]:
        """A Read Response segment: its target in the oldest Read's sink buffer."""
        self._same_message(op, hdr, paylen)
        if rd is None:
            raise IwarpFault.ddp_catastrophic("RDMA Read Response without an outstanding Read")
        if rd.wqe is not None:  # a bad response fails the Read it answers (IB: BAD_RESP_ERR)
            rd.wqe.error = _BAD_RESP
        if stag != rd.sink_stag:
            raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.INVALID_STAG,
                                        f"Read Response STag {stag:#010x}, the Read asked for "
                                        f"{rd.sink_stag:#010x}", hdr, paylen)
        if to != (rd.sink_to + rd.received) & MASK64 or rd.received + paylen > rd.size or \
                (last and rd.received + paylen != rd.size):
            raise IwarpFault.ddp_tagged(DdpTaggedErrorCode.BASE_OR_BOUNDS_VIOLATION,
                                        f"Read Response TO {to:#x} len {paylen} outside the "
                                        f"{rd.size}-byte Read", hdr, paylen)
        if rd.wqe is not None:
            rd.wqe.error = 0
        self.rt_op = -1 if last else op
        return gather(rd.segs, rd.received, paylen) if paylen else []

    # ---- untagged --------------------------------------------------------------------------
    def _check_qn_msn(self, want: int, what: str, qn: int, msn: int, hdr: bytes,
                      paylen: int) -> None:
        """An untagged segment for queue ``want`` carries its QN and the queue's next MSN
        (RFC 5041 §5.2, §7.2: Invalid QN, Invalid MSN - MSN range is not valid)."""
        if qn != want:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_QN,
                                          f"{what} on QN {qn}", hdr, paylen)
        if msn != self.rx_msn[want]:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MSN_RANGE,
                                          f"{what} MSN {msn}, expected {self.rx_msn[want]}",
                                          hdr, paylen)

    def send_check(self, op: int, qn: int, msn: int, mo: int, paylen: int,
                   hdr: bytes) -> bool:
        """Check a Send segment's QN, MSN and MO; True if it starts a message."""
        self._check_qn_msn(QN_SEND, "Send", qn, msn, hdr, paylen)
        if self.ru_op >= 0:
            if op != self.ru_op:
                raise IwarpFault.remote_operation(RdmapErrorCode.UNEXPECTED_OPCODE,
                                                  "opcode changed within a Send message",
                                                  hdr, paylen)
            if mo != self.ru_mo:
                raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MO,
                                              f"MO {mo}, expected {self.ru_mo}", hdr, paylen)
            return False
        if mo != 0:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MO,
                                          f"first segment of a Send with MO {mo}", hdr, paylen)
        return True

    def send(self, qp: PlacementQP, new: bool, op: int, inv: int, msn: int, paylen: int,
             hdr: bytes) -> list[memoryview]:
        """A checked Send segment (:meth:`send_check`): its target in the receive WQE
        (a new message takes the next one)."""
        if new:
            rwqe = qp.take_rwqe()
            if rwqe is None:
                raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MSN_NO_BUFFER,
                                              f"Send MSN {msn}: no receive buffer posted",
                                              hdr, paylen)
            self.ru_wqe = rwqe
            self.ru_op = op
            self.ru_mo = 0
            self.ru_inv = inv
            segs = resolve_sges(self.dev.mrs, qp.rx_pd, rwqe.sg_list, _LOCAL_WRITE)
            if segs is None:
                access_error(self.dev, qp)
                raise IwarpFault.ddp_catastrophic("receive WQE with a bad lkey",
                                                  int(WCS.IBV_WC_LOC_PROT_ERR))
            self.ru_segs = segs
            self.ru_cap = total_len(segs)
        if self.ru_mo + paylen > self.ru_cap:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.MESSAGE_TOO_LONG,
                                          f"Send of more than {self.ru_cap} bytes for a "
                                          f"{self.ru_cap}-byte receive buffer", hdr, paylen,
                                          int(WCS.IBV_WC_LOC_LEN_ERR))
        targets = gather(self.ru_segs, self.ru_mo, paylen) if paylen else []
        self.ru_mo += paylen
        return targets

    def send_done(self) -> tuple[RecvWQE, int, int, int]:
        """The last segment of the Send is in: ``(receive WQE, opcode, invalidate STag,
        length)``; the next Send starts a message with the next MSN."""
        rwqe = self.ru_wqe
        assert rwqe is not None
        done = (rwqe, self.ru_op, self.ru_inv, self.ru_mo)
        self.ru_wqe = None
        self.ru_op = -1
        self.ru_segs = []
        self.advance_msn(QN_SEND)
        return done

    def abort_recv(self) -> RecvWQE | None:
        """The stream ends: the receive WQE of a Send in progress, if any."""
        rwqe = self.ru_wqe
        if rwqe is not None:
            self.ru_wqe = None
            self.ru_op = -1
        return rwqe

    def read_request_check(self, qn: int, msn: int, mo: int, last: bool, hdr: bytes,
                           plen: int) -> None:
        """An RDMA Read Request (QN 1) is one whole segment with the next MSN."""
        self._check_qn_msn(QN_READ_REQUEST, "RDMA Read Request", qn, msn, hdr, plen)
        if mo != 0 or not last:
            raise IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_MO,
                                          "an RDMA Read Request is one whole segment", hdr, plen)

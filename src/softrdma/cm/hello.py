"""iWARP/TCP-like connections over the IB CM: the Hello/HelloReply dialect and the
FlowC 0 byte stream ("Mapping of iWarp/TCP connections to InfiniBand", Haviv, v0.30).

* Service ID: ``IBTA_IWARP_PREFIX 0x0000000000020000 + listener TCP port``.
* The REQ carries a :class:`~softrdma.wire.iwarp_ib.Hello` (MID 0: bufs, len, MajVer,
  MinVer, IPVer, FlowC, DesRemRcvSz, LocalRcvSz, local port, source and destination IP)
  then 28 bytes of consumer data; the REP a
  :class:`~softrdma.wire.iwarp_ib.HelloReply` (MID 1, ActRcvSz) then 172 bytes.
* FlowC 1: the ULP owns flow control and every Send buffer; the dialect only carries
  the addressing (as iSER would use it).
* FlowC 0: the transport owns flow control and puts the 16-byte SDP-style header
  (:class:`~softrdma.wire.iwarp_ib.SdpHeader`: MID, flags, bufs, len, mseq, mseq_ack)
  in every RC Send. :class:`SdpStream` gives a socket-like byte stream with SDP's
  credit rule (linux SDP ``sdp_bcopy.c``): a header advertises ``bufs``, the receive
  buffers its sender has posted, and ``mseq_ack``, the last message it received; the
  peer may have ``bufs - (its mseq - mseq_ack)`` messages in flight. The last credit is
  kept for credit updates (header-only messages), so neither side can deadlock.
  :meth:`SdpStream.switch_to_rdma` sends a Mode Change (SDP MID 0x07) after the queued
  bytes: from then on that direction's Sends are the application's own messages (no
  header), delivered whole by :meth:`SdpStream.recv_message`, and RDMA Read/Write on
  the QP are the application's, as an iWARP ULP moves from streaming to RDMA mode.

A malformed Hello (wrong MID, another major version) is rejected with REJ 28 and an
empty ARI; the A11 ARI format does not apply outside the A11 Service ID range.
"""

from __future__ import annotations

import ipaddress
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from .. import enums as e
from .. import verbs as v
from ..errors import DecodeError, InvalidArgument, StateError
from ..ibcm.params import AcceptParams, ConnParams, DialectId, DialectReject, ReqVerdict
from ..wire.cm import RejReason
from ..wire.gid import ip_to_gid
from ..wire.ipcm import IpAddress
from ..wire.iwarp_ib import (
    HELLO_REPLY_SIZE,
    HELLO_SIZE,
    SDP_HEADER_SIZE,
    SDP_MAJOR_VERSION,
    FlowControl,
    Hello,
    HelloReply,
    SdpHeader,
    iwarp_ib_service_id,
    parse_iwarp_ib_service_id,
)

if TYPE_CHECKING:
    from ..ibcm.cmid import IbCmId

__all__ = ["HelloDialect", "hello_listen", "hello_connect", "hello_accept", "SdpStream",
           "MID_DATA", "MID_MODE_CHANGE", "HELLO_CONSUMER_MAX", "HELLO_REPLY_CONSUMER_MAX"]

MID_DATA = 0xFF  # SDP_MID_DATA
MID_MODE_CHANGE = 0x07  # SDP_MID_MODE_CHANGE
HELLO_CONSUMER_MAX = 92 - HELLO_SIZE  # 28
HELLO_REPLY_CONSUMER_MAX = 196 - HELLO_REPLY_SIZE  # 172


class HelloDialect:
    """Server side of the Hello exchange (a listener's dialect)."""

    name = "hello"

    def __init__(self) -> None:
        self._replies: weakref.WeakKeyDictionary[DialectId, HelloReply] = weakref.WeakKeyDictionary()

    def check_req(self, listener: DialectId, service_id: int, private_data: bytes,
                  sidr: bool) -> ReqVerdict | DialectReject:
        port = parse_iwarp_ib_service_id(service_id)
        try:
            hello = Hello.decode(private_data)
            src, dst = hello.src_addr, hello.dst_addr
        except DecodeError:
            return DialectReject(RejReason.CONSUMER_DEFINED)
        if hello.majv != SDP_MAJOR_VERSION or hello.flowc not in (FlowControl.TRANSPORT,
                                                                   FlowControl.ULP):
            return DialectReject(RejReason.CONSUMER_DEFINED)
        return ReqVerdict(private_data[HELLO_SIZE:], remote_ip=src,
                          remote_port=hello.local_port, local_ip=dst,
                          local_port=port if port is not None else service_id & 0xFFFF,
                          info={"hello": hello, "flowc": hello.flowc})

    def set_reply(self, cm_id: IbCmId, reply: HelloReply) -> None:
        self._replies[cm_id] = reply

    def rep_private_data(self, cm_id: DialectId, private_data: bytes) -> bytes:
        if len(private_data) > HELLO_REPLY_CONSUMER_MAX:
            raise InvalidArgument("private_data", f"at most {HELLO_REPLY_CONSUMER_MAX} bytes "
                                                  f"follow a HelloReply, got {len(private_data)}")
        reply = self._replies.pop(cm_id, None) or HelloReply()
        return reply.encode() + bytes(private_data)

    def parse_rep(self, cm_id: DialectId, private_data: bytes) -> tuple[bytes, dict[str, Any]]:
        return private_data[HELLO_REPLY_SIZE:], {}


class _ClientDialect:
    """Client side: the REP must start with a HelloReply."""

    name = "hello"

    def check_req(self, listener: DialectId, service_id: int, private_data: bytes,
                  sidr: bool) -> ReqVerdict | DialectReject:  # pragma: no cover - not a listener
        return ReqVerdict(private_data)

    def rep_private_data(self, cm_id: DialectId, private_data: bytes) -> bytes:  # pragma: no cover
        return private_data

    def parse_rep(self, cm_id: DialectId, private_data: bytes) -> tuple[bytes, dict[str, Any]]:
        try:
            reply = HelloReply.decode(private_data)
        except DecodeError as exc:
            return private_data, {"hello_reply_error": str(exc)}
        return private_data[HELLO_REPLY_SIZE:], {"hello_reply": reply}


def hello_listen(cm_id: IbCmId, port: int, *, backlog: int | None = None,
                 now: float | None = None) -> HelloDialect:
    """Listen on ``0x20000 + port`` with the Hello dialect."""
    d = HelloDialect()
    cm_id.listen(iwarp_ib_service_id(port), backlog=backlog, dialect=d, now=now)
    return d


def hello_connect(cm_id: IbCmId, qp: Any, src: IpAddress | str, dst: IpAddress | str,
                  dst_port: int, *, src_port: int = 0, flowc: int = FlowControl.ULP,
                  bufs: int = 0, des_rem_rcv_sz: int = 0, local_rcv_sz: int = 0,
                  private_data: bytes = b"", now: float | None = None, **conn: Any) -> Hello:
    """A REQ with a Hello to ``dst:dst_port`` (Service ID 0x20000 + port)."""
    if len(private_data) > HELLO_CONSUMER_MAX:
        raise InvalidArgument("private_data", f"at most {HELLO_CONSUMER_MAX} bytes follow "
                                              f"a Hello, got {len(private_data)}")
    s = ipaddress.ip_address(src)
    d = ipaddress.ip_address(dst)
    hello = Hello.make(s, d, src_port, flowc=flowc, bufs=bufs, des_rem_rcv_sz=des_rem_rcv_sz,
                       local_rcv_sz=local_rcv_sz)
    params = ConnParams(iwarp_ib_service_id(dst_port), ip_to_gid(d.packed), ip_to_gid(s.packed),
                        private_data=hello.encode() + bytes(private_data), **conn)
    cm_id.connect(qp, params, dialect=_ClientDialect(), now=now)
    return hello


def hello_accept(cm_id: IbCmId, qp: Any, *, bufs: int = 0, act_rcv_sz: int = 0,
                 private_data: bytes = b"", params: AcceptParams | None = None,
                 now: float | None = None) -> None:
    """Accept with a HelloReply (``bufs`` posted receive buffers of ``act_rcv_sz``)."""
    d = cm_id.dialect
    if not isinstance(d, HelloDialect):
        raise StateError("hello_accept needs a CONNECT_REQUEST of a Hello listener")
    d.set_reply(cm_id, HelloReply(bufs=bufs, act_rcv_sz=act_rcv_sz))
    p = params if params is not None else AcceptParams()
    p.private_data = bytes(private_data)
    cm_id.accept(qp, p, now=now)


# --------------------------------------------------------------------------- FlowC 0
_TX_FLAG = 1 << 32


class SdpStream:
    """A socket-like byte stream on an RC QP (FlowC 0; see the module docstring).

    Create it on each side before connecting/accepting, with the QP's ``pd`` and its
    single ``cq`` (send and receive); it posts ``nbufs`` receive buffers of ``buf_size``
    bytes (header included) at once: advertise them in the Hello (``bufs``,
    ``local_rcv_sz``) or HelloReply (``bufs``, ``act_rcv_sz``). After ESTABLISHED call
    :meth:`start` with the peer's advertisement. :meth:`progress` polls the CQ; with
    the verbs progress thread it is all that is needed, in manual mode the caller also
    drives the device.
    """

    def __init__(self, pd: Any, qp: Any, cq: Any, *, nbufs: int = 16,
                 buf_size: int = 4096) -> None:
        if buf_size <= SDP_HEADER_SIZE:
            raise InvalidArgument("buf_size", f"must exceed the {SDP_HEADER_SIZE}-byte header")
        if nbufs < 2:
            raise InvalidArgument("nbufs", "at least 2 receive buffers (one credit is kept "
                                           "for credit updates)")
        self._v = v
        self.pd = pd
        self.qp = qp
        self.cq = cq
        self.nbufs = nbufs
        self.buf_size = buf_size
        access = int(e.IBV_ACCESS_LOCAL_WRITE)
        self.rx_mr = v.MR(pd, nbufs * buf_size, access)
        self._tx_slots = nbufs
        self.tx_mr: Any = None
        self.peer_bufs = 0
        self.peer_ack = 0
        self.peer_rcv_sz = 0
        self.tx_mseq = 0
        self.rx_last = 0
        self.rx_posted = 0
        self._acked_at = 0  # rx_last when we last told the peer
        self._txq = bytearray()
        self._rx = bytearray()
        self._rx_msgs: deque[bytes] = deque()
        self._free_tx: list[int] = []
        self._switch_pending = False
        self.tx_rdma = False  # we sent Mode Change
        self.rx_rdma = False  # the peer did
        self.started = False
        self.sent_messages = 0
        self.credit_updates = 0
        if qp.qp_state == e.IBV_QPS_RESET:
            qp.to_init(v.QPAttr(qp_access_flags=int(e.IBV_ACCESS_LOCAL_WRITE
                                                    | e.IBV_ACCESS_REMOTE_WRITE
                                                    | e.IBV_ACCESS_REMOTE_READ)))
        for i in range(nbufs):
            self._post_rx(i)

    def _post_rx(self, i: int) -> None:
        v = self._v
        sge = v.SGE(self.rx_mr.addr + i * self.buf_size, self.buf_size, self.rx_mr.lkey)
        self.qp.post_recv(v.RecvWR(wr_id=i, num_sge=1, sg=[sge]))
        self.rx_posted += 1

    def start(self, peer_bufs: int, peer_rcv_sz: int) -> None:
        """The connection is established: the peer posted ``peer_bufs`` buffers of
        ``peer_rcv_sz`` bytes (from its Hello or HelloReply)."""
        if peer_rcv_sz <= SDP_HEADER_SIZE:
            raise InvalidArgument("peer_rcv_sz", "the peer's receive size must exceed 16")
        self.peer_bufs = peer_bufs
        self.peer_rcv_sz = peer_rcv_sz
        self.tx_mr = self._v.MR(self.pd, self._tx_slots * peer_rcv_sz,
                                int(e.IBV_ACCESS_LOCAL_WRITE))
        self._free_tx = list(range(self._tx_slots))
        self.started = True
        self.progress()

    # ---- credits ------------------------------------------------------------------------
    @property
    def credits(self) -> int:
        """Messages we may still send before the peer runs out of receive buffers."""
        return self.peer_bufs - (self.tx_mseq - self.peer_ack)

    # ---- application side -----------------------------------------------------------------
    def send(self, data: bytes | bytearray | memoryview) -> int:
        """Queue bytes for the stream; they go out as credits allow. Returns len(data)."""
        if self.tx_rdma or self._switch_pending:
            raise StateError("the stream was switched to RDMA mode: post Sends on the QP")
        self._txq += data
        self.progress()
        return len(data)

    def recv(self, max_bytes: int = 1 << 30) -> bytes:
        """Up to ``max_bytes`` received stream bytes (b"" if none yet; never blocks)."""
        self.progress()
        n = min(max_bytes, len(self._rx))
        out = bytes(self._rx[:n])
        del self._rx[:n]
        return out

    def recv_message(self) -> bytes | None:
        """After the peer switched to RDMA mode: its next whole Send, None if none yet."""
        self.progress()
        return self._rx_msgs.popleft() if self._rx_msgs else None

    @property
    def pending(self) -> int:
        """Bytes queued but not sent yet."""
        return len(self._txq)

    def switch_to_rdma(self) -> None:
        """Send Mode Change after the queued bytes; this direction then stops framing."""
        if self.tx_rdma:
            return
        self._switch_pending = True
        self.progress()

    # ---- the engine -----------------------------------------------------------------------
    def progress(self) -> None:
        """Poll the CQ, repost receive buffers, send what credits allow."""
        n, wcs = self.cq.poll(64)
        while n:
            for wc in wcs:
                self._complete(wc)
            n, wcs = self.cq.poll(64)
        if self.started:
            self._pump()

    def _complete(self, wc: Any) -> None:
        if wc.wr_id & _TX_FLAG:
            self._free_tx.append(wc.wr_id & 0xFFFF)
            return
        self.rx_posted -= 1
        if wc.status != e.IBV_WC_SUCCESS:
            return  # flushed: the connection is gone
        i = wc.wr_id
        off = i * self.buf_size
        data = self.rx_mr.read(wc.byte_len, off)
        if self.rx_rdma:
            self._rx_msgs.append(data)
        else:
            self._on_message(data)
        self._post_rx(i)

    def _on_message(self, data: bytes) -> None:
        if len(data) < SDP_HEADER_SIZE:
            return
        h = SdpHeader.decode(data)
        self.rx_last = h.mseq
        self.peer_bufs = h.bufs
        self.peer_ack = h.mseq_ack
        if h.mid == MID_DATA:
            self._rx += data[SDP_HEADER_SIZE:min(h.length, len(data))]
        elif h.mid == MID_MODE_CHANGE:
            self.rx_rdma = True

    def _post_message(self, mid: int, payload: bytes) -> None:
        v = self._v
        slot = self._free_tx.pop()
        self.tx_mseq += 1
        hdr = SdpHeader(mid=mid, bufs=self.rx_posted, length=SDP_HEADER_SIZE + len(payload),
                        mseq=self.tx_mseq, mseq_ack=self.rx_last).encode()
        msg = hdr + payload
        off = slot * self.peer_rcv_sz
        self.tx_mr.write(msg, len(msg), off)
        sge = v.SGE(self.tx_mr.addr + off, len(msg), self.tx_mr.lkey)
        self.qp.post_send(v.SendWR(wr_id=_TX_FLAG | slot, num_sge=1, sg=[sge]))
        self._acked_at = self.rx_last
        self.sent_messages += 1

    def _pump(self) -> None:
        if self.tx_rdma:
            return
        room = self.peer_rcv_sz - SDP_HEADER_SIZE
        while self._txq and self.credits > 1 and self._free_tx:
            chunk = bytes(self._txq[:room])
            del self._txq[:room]
            self._post_message(MID_DATA, chunk)
        if self._switch_pending and not self._txq and self.credits > 1 and self._free_tx:
            self._post_message(MID_MODE_CHANGE, b"")
            self._switch_pending = False
            self.tx_rdma = True
            return
        # Credit update: the peer has not heard of half our buffers coming back.
        if (self.rx_last - self._acked_at) * 2 >= self.nbufs and self.credits >= 1 \
                and self._free_tx:
            self.credit_updates += 1
            self._post_message(MID_DATA, b"")

    def close(self) -> None:
        """Deregister the stream's buffers (the QP is the caller's)."""
        for mr in (self.rx_mr, self.tx_mr):
            if mr is not None:
                mr.close()

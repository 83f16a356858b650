"""The verbs side of perftest (perftest_resources.c): resources, QP connection and the
waits (the measured loops over them are :mod:`.loops`).

Memory layout as perftest (``ctx_init``, ``set_up_connection`` without ``mr_per_qp``):
one buffer of ``2 x QPs x BUFF_SIZE`` bytes (``BUFF_SIZE`` = max(size, page size)),
QP ``i`` sends from slot ``i`` and advertises slot ``QPs + i`` (its VAddr) as the target
of the peer's RDMA WRITE/READ/atomics and of its own receives. The QP attributes are
perftest's (``ctx_modify_qp_to_init/rtr/rts``): RTR with the path MTU, the peer's QPN and
PSN, ``max_dest_rd_atomic`` = our out reads, ``min_rnr_timer`` 12, a GRH to the peer's
GID with hop limit 255; RTS with ``timeout`` ``-u``, ``retry_cnt`` 7, ``rnr_retry`` 7,
``max_rd_atomic`` = the peer's out reads (IBA 11.2.4.2). The GRH carries ``--tclass``
and the address vector the SL ``-S``. ``-c UC`` leaves out what an unreliable connection
has not (RTR: no responder resources, no RNR timer; RTS: no timeout, retries or
initiator depth: IBA 11.2.4.2 per QP type); ``-c UD`` QPs take perftest's Q_Key
0x11111111 at INIT, RTR and RTS without a peer, and each SEND an address handle to the
peer's GID with its QPN and that Q_Key; a UD receive has the 40-byte GRH area first
(IBA 11.4.1.1). ``-I N``: a message of at most N bytes is posted with
``IBV_SEND_INLINE`` (the QP's ``max_inline_data`` is N).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

from ... import enums as e
from ... import verbs as v
from ...errors import SoftRdmaError
from ..closers import Closers
from .oob import DEFAULT_CYCLE_BUFFER, Dest
from .options import DEF_QKEY, Options, PerftestError

MIN_RNR_TIMER = 12
RETRY_CNT = 7
RNR_RETRY = 7
HOP_LIMIT = 0xFF
ATOMIC_SIZE = 8
DURATION_GRACE_S = 1.0
PEER_CHECK_S = 0.2  # how often a wait looks whether the peer closed the exchange channel
PEER_GONE_GRACE_S = 1.0  # completions still awaited after the peer closed it (its last ACKs)
#: ``--timeout`` ends a wait for completions only once the transport has also received
#: nothing for that long, or after this many ``--timeout`` without a completion (issue 25)
STALL_LIMIT = 10
TRANSPORT_SAMPLE_S = 0.5  # how often a wait reads this process's rcvd_pkts
PAGE_ALIGN = 4096
UNRELIABLE_IDLE_S = 1.0  # a UC/UD receiver checks this often whether the sender is done
# send-bw over iWARP: iWARP has no RNR NAK, so perftest's receiver grants credits, its
# count of received messages, by RDMA WRITE of a host-order (x86: little-endian) uint32
# into the sender's credit slot every rx_depth/3 messages (perftest send_rcredit)
CREDIT = struct.Struct("<I")
MTU_ENUM_TO_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
MTU_BYTES_TO_ENUM = {b: m for m, b in MTU_ENUM_TO_BYTES.items()}
ACCESS = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
             | e.IBV_ACCESS_REMOTE_ATOMIC)
OPCODES = {"send": e.IBV_WR_SEND, "write": e.IBV_WR_RDMA_WRITE, "read": e.IBV_WR_RDMA_READ}
QP_TYPES = {"RC": e.IBV_QPT_RC, "UC": e.IBV_QPT_UC, "UD": e.IBV_QPT_UD}
UD_GRH = 40  # the GRH area ahead of a UD receive's data (IBA 11.4.1.1)
UC_ACCESS = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
_SIGNALED = int(e.IBV_SEND_SIGNALED)
_INLINE = int(e.IBV_SEND_INLINE)


def wc_fail(wc: Any, what: str) -> PerftestError:
    return PerftestError(f"Completion with error at {what}: status {int(wc.status)} "
                         f"({v.wc_status_str(wc.status)}), wr_id {int(wc.wr_id)}, "
                         f"vendor_err {int(getattr(wc, 'vendor_err', 0))}")


class Resources:
    """PD, CQs (and a completion channel with ``-e``), the MR and the QPs of one side."""

    def __init__(self, ctx: v.Context, o: Options, max_size: int) -> None:
        self.ctx = ctx
        self.o = o
        self.ud = o.connection == "UD"
        self.reliable = o.connection == "RC"
        self.buff = max(max_size + (UD_GRH if self.ud else 0), DEFAULT_CYCLE_BUFFER)
        self.ahs: dict[int, Any] = {}
        self._inline: dict[int, bool] = {}  # id(WR) -> posted with IBV_SEND_INLINE
        self._recv_wrs: dict[tuple[int, int], Any] = {}  # (QP, size) -> its receive WR
        self.buf = bytearray(2 * o.num_qps * self.buff + PAGE_ALIGN
                             + 2 * o.num_qps * CREDIT.size)
        self._closers = Closers()
        self.qps: list[Any] = []
        try:
            self.pd = v.PD(ctx)
            self._closers.append(self.pd)
            self.mr = v.MR(self.pd, len(self.buf), ACCESS, buffer=self.buf)
            self._closers.append(self.mr)
            self.channel = v.CompChannel(ctx) if o.events else None
            if self.channel is not None:
                self._closers.append(self.channel)
            depth = o.num_qps * (o.tx_depth + o.rx_depth) + 16
            self.send_cq = v.CQ(ctx, depth, None, self.channel, 0)
            self._closers.append(self.send_cq)
            self.recv_cq = v.CQ(ctx, depth, None, self.channel, 0)
            self._closers.append(self.recv_cq)
        except SoftRdmaError as exc:
            self.close()
            raise PerftestError(f"Couldn't create the IB resources: {exc}") from exc
        # perftest's buffers are page aligned (memalign): atomics need 8-byte targets
        self.base = -int(self.mr.addr) % PAGE_ALIGN
        self.addr = int(self.mr.addr) + self.base
        # ctrl_buf[QPs] then credit_buf[QPs] (ctx_alloc_credit), after the data slots
        self.ctrl_off = self.base + 2 * o.num_qps * self.buff
        self.credit_off = self.ctrl_off + o.num_qps * CREDIT.size
        self.credits = o.spec.verb == "send" and o.spec.tst == "bw" and \
            o.transport == "iwarp"
        #: ``() -> bool``: has the peer closed the exchange channel (it failed or stopped)?
        #: Set by the runner where the channel can tell (TCP); waits then end promptly.
        self.peer_gone: Callable[[], bool] | None = None
        #: ``() -> bool``: has the peer written its next exchange message (it is done
        #: sending)? A UC/UD receiver then stops waiting for messages that were lost.
        self.peer_done: Callable[[], bool] | None = None
        self._peer_checked = 0.0
        self._peer_gone_at: float | None = None
        self._rcvd_seen = -1  # this process's rcvd_pkts when last read (expired)
        self._quiet = 0  # reads in a row that found it unchanged
        self._rcvd_sample = 0.0  # when to read it next

    def check_peer(self, now: float) -> None:
        """In a wait: :class:`PerftestError` once the peer closed the exchange channel and
        nothing completed for :data:`PEER_GONE_GRACE_S` since, rather than wait out
        ``--timeout`` for a peer that is gone."""
        gone_at = self._peer_gone_at
        if gone_at is None:
            if self.peer_gone is None or now - self._peer_checked < PEER_CHECK_S:
                return
            self._peer_checked = now
            if not self.peer_gone():
                return
            self._peer_gone_at = gone_at = now
        if now - gone_at >= PEER_GONE_GRACE_S:
            raise PerftestError("the peer closed the connection (it failed or stopped) "
                                "while this side was waiting for completions")

    def expired(self, deadline: float, now: float) -> bool:
        """Has a wait for completions that began at ``deadline - --timeout`` run out?

        Real perftest waits for ever (a QP with retry_cnt 7 retries for ever on rxe);
        these tools give up after ``--timeout`` s without a completion, so that a hung
        peer ends the run. On a loaded host a live peer can take longer than that to
        acknowledge a window of large WRITEs (at 4 MiB and cq_mod 100 the first
        completion needs 400 MiB delivered), so the wait is over only when the
        transport has also received nothing for ``--timeout`` s of this process's own
        running time (its ``rcvd_pkts``, read every :data:`TRANSPORT_SAMPLE_S`), or when
        :data:`STALL_LIMIT` times ``--timeout`` passed without a completion."""
        if now >= self._rcvd_sample:
            self._rcvd_sample = now + TRANSPORT_SAMPLE_S
            n = self.ctx.counters().get("rcvd_pkts", 0)
            if n != self._rcvd_seen:
                self._rcvd_seen = n
                self._quiet = 0
            else:
                self._quiet += 1
        if now < deadline:
            return False
        t = self.o.timeout
        # silence is counted in reads taken while this process ran (each at least
        # TRANSPORT_SAMPLE_S apart), so time it was not scheduled is not silence
        return self._quiet * TRANSPORT_SAMPLE_S >= t or now - (deadline - t) >= STALL_LIMIT * t

    def init_attr(self) -> v.QPInitAttr:
        cap = v.QPCap(max_send_wr=self.o.tx_depth, max_recv_wr=max(self.o.rx_depth, 1),
                      max_send_sge=1, max_recv_sge=1, max_inline_data=self.o.inline_size)
        return v.QPInitAttr(qp_type=QP_TYPES[self.o.connection], scq=self.send_cq,
                            rcq=self.recv_cq, cap=cap)

    def add_qp(self, cm_id: Any = None) -> Any:
        """A QP (RESET -> INIT here, or left to rdma_cm when ``cm_id`` is given)."""
        try:
            if cm_id is not None:
                qp = cm_id.create_qp(self.pd, self.init_attr())
            else:
                qp = v.QP(self.pd, self.init_attr())
                self._closers.append(qp)
                mask = e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                at = v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=self.o.ib_port)
                if self.ud:
                    at.qkey = DEF_QKEY
                    mask |= e.IBV_QP_QKEY
                else:
                    at.qp_access_flags = ACCESS if self.reliable else UC_ACCESS
                    mask |= e.IBV_QP_ACCESS_FLAGS
                qp.modify(at, int(mask))
        except SoftRdmaError as exc:
            raise PerftestError(f"Couldn't create QP: {exc}") from exc
        self.qps.append(qp)
        return qp

    def slot(self, i: int) -> int:
        """Address of QP ``i``'s source slot."""
        return self.addr + i * self.buff

    def target(self, i: int) -> int:
        """Address of QP ``i``'s target slot (its advertised VAddr)."""
        return self.addr + (self.o.num_qps + i) * self.buff

    def my_dest(self, i: int, lid: int, psn: int, out_reads: int, gid: bytes,
                gid_index: int) -> Dest:
        """QP ``i``'s address; with send credits its RKey/VAddr are those of its credit
        slot (``ctx_alloc_credit``), which the receiver RDMA WRITEs."""
        vaddr = self.addr - self.base + self.credit_off + i * CREDIT.size if self.credits \
            else self.target(i)
        return Dest(lid, out_reads, int(self.qps[i].qp_num), psn, int(self.mr.rkey),
                    vaddr, gid, 0, gid_index)

    def credit(self, i: int) -> int:
        """The receiver's count of messages received on QP ``i`` (its last credit)."""
        return int(CREDIT.unpack_from(self.buf, self.credit_off + i * CREDIT.size)[0])

    def reset_credits(self) -> None:
        n = self.o.num_qps * CREDIT.size
        self.buf[self.credit_off:self.credit_off + n] = bytes(n)

    def post_credit(self, i: int, rem: Dest, rcnt: int) -> None:
        """RDMA WRITE ``rcnt`` into the sender's credit slot (``ctx_set_credit_wqes``)."""
        off = self.ctrl_off + i * CREDIT.size
        CREDIT.pack_into(self.buf, off, rcnt & 0xFFFFFFFF)
        sge = v.SGE(self.addr - self.base + off, CREDIT.size, self.mr.lkey)
        wr = v.SendWR(wr_id=i, num_sge=1, sg=[sge], opcode=e.IBV_WR_RDMA_WRITE,
                      send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(rem.rkey, rem.vaddr)
        try:
            self.qps[i].post_send(wr)
        except SoftRdmaError as exc:
            raise PerftestError(f"Couldn't post send qp {i} credit = {rcnt}: {exc}") from exc

    def connect(self, i: int, my: Dest, rem: Dest, mtu_enum: int, gid_index: int) -> None:
        """``ctx_connect``: INIT -> RTR -> RTS towards ``rem``."""
        qp = self.qps[i]
        gr = v.GlobalRoute(dgid=v.GID(rem.gid), sgid_index=gid_index, hop_limit=HOP_LIMIT,
                           traffic_class=self.o.tclass)
        ah = v.AHAttr(port_num=self.o.ib_port, is_global=1, gr=gr, dlid=rem.lid,
                      sl=self.o.sl)
        if self.ud:
            rtr = v.QPAttr(qp_state=e.IBV_QPS_RTR)
            rtr_mask = e.IBV_QP_STATE
            rts = v.QPAttr(qp_state=e.IBV_QPS_RTS, sq_psn=my.psn)
            rts_mask = e.IBV_QP_STATE | e.IBV_QP_SQ_PSN
            try:
                self.ahs[i] = v.AH(self.pd, ah)
            except SoftRdmaError as exc:
                raise PerftestError(f"Failed to create AH for UD: {exc}") from exc
            self._closers.append(self.ahs[i])
        else:
            rtr = v.QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=mtu_enum, dest_qp_num=rem.qpn,
                           rq_psn=rem.psn, ah_attr=ah)
            rtr_mask = (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                        | e.IBV_QP_RQ_PSN)
            rts = v.QPAttr(qp_state=e.IBV_QPS_RTS, sq_psn=my.psn)
            rts_mask = e.IBV_QP_STATE | e.IBV_QP_SQ_PSN
            if self.reliable:
                rtr.max_dest_rd_atomic = max(my.out_reads, 1)
                rtr.min_rnr_timer = MIN_RNR_TIMER
                rtr_mask |= e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER
                rts.timeout = self.o.qp_timeout
                rts.retry_cnt = RETRY_CNT
                rts.rnr_retry = RNR_RETRY
                rts.max_rd_atomic = max(rem.out_reads, 1)
                rts_mask |= (e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
                             | e.IBV_QP_MAX_QP_RD_ATOMIC)
        try:
            qp.modify(rtr, int(rtr_mask))
        except SoftRdmaError as exc:
            raise PerftestError(f"Failed to modify QP {qp.qp_num} to RTR: {exc}") from exc
        try:
            qp.modify(rts, int(rts_mask))
        except SoftRdmaError as exc:
            raise PerftestError(f"Failed to modify QP {qp.qp_num} to RTS: {exc}") from exc

    # -- completions -----------------------------------------------------------------------
    def poll(self, cq: Any, deadline: float | None, what: str | Callable[[], str],
             n: int = 16) -> list[Any]:
        """Up to ``n`` completions; waits (events or polling) until ``deadline`` (None:
        ``--timeout`` from the first empty poll, so a completion already there costs no
        clock read). ``what`` (or what it returns, built only for the error) names the
        wait."""
        while True:
            got, wcs = cq.poll(n)
            if got:
                return list(wcs)
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.o.timeout
            if self.expired(deadline, now):
                doing = what if isinstance(what, str) else what()
                raise PerftestError(f"no completion for {self.o.timeout:g} s while {doing}: "
                                    "is the peer still running?")
            self.check_peer(now)
            if self.channel is not None:
                cq.req_notify()
                got, wcs = cq.poll(n)
                if got:
                    return list(wcs)
                try:
                    self.channel.get_cq_event(timeout=min(0.2, max(deadline - time.monotonic(),
                                                                   0.001)))
                    cq.ack_events(1)
                except (TimeoutError, SoftRdmaError):
                    continue
            # else spin: cq.poll makes progress itself (the progress thread stands back
            # while this thread polls), as the bench's ping-pong does; a time.sleep(0)
            # here cost a system call per empty poll (the latency tests took 3-5x the
            # bench's round trip, issue 26)

    def post_recvs(self, i: int, count: int, size: int) -> None:
        """``count`` receives on QP ``i``, in one post: one WR per (QP, size), built once
        and posted again (the post copies it), as perftest's ``ctx_set_recv_wqes`` builds
        its WRs once; the latency tests repost one per message received."""
        wr = self._recv_wrs.get((i, size))
        if wr is None:
            sge = v.SGE(self.target(i), size + (UD_GRH if self.ud else 0), self.mr.lkey)
            wr = self._recv_wrs[(i, size)] = v.RecvWR(wr_id=i, num_sge=1, sg=[sge])
        try:
            self.qps[i].post_recv(wr if count == 1 else [wr] * count)
        except SoftRdmaError as exc:
            raise PerftestError(f"Couldn't post recv on QP {i}: {exc}") from exc

    def send_wr(self, i: int, rem: Dest, size: int) -> Any:
        """The WR QP ``i`` posts over and over (``ctx_set_send_wqes``)."""
        o = self.o
        verb = o.spec.verb
        length = ATOMIC_SIZE if verb == "atomic" else size
        sge = v.SGE(self.slot(i), length, self.mr.lkey)
        if verb == "atomic":
            cas = o.atomic_type == "CMP_AND_SWAP"
            wr = v.SendWR(wr_id=i, num_sge=1, sg=[sge],
                          opcode=e.IBV_WR_ATOMIC_CMP_AND_SWP if cas
                          else e.IBV_WR_ATOMIC_FETCH_AND_ADD, send_flags=0)
            wr.set_wr_atomic(rem.rkey, rem.vaddr, 0 if cas else 1, 0)
        else:
            wr = v.SendWR(wr_id=i, num_sge=1, sg=[sge], opcode=OPCODES[verb], send_flags=0)
            if verb != "send":
                wr.set_wr_rdma(rem.rkey, rem.vaddr)
            elif self.ud:
                wr.set_wr_ud(self.ahs[i], rem.qpn, DEF_QKEY)
        self._inline[id(wr)] = 0 < length <= o.inline_size
        return wr

    def recv_len(self, size: int) -> int:
        """The byte_len a receive of a ``size``-byte message completes with."""
        return size + (UD_GRH if self.ud else 0)

    def post(self, i: int, wr: Any, signaled: bool) -> None:
        flags = _SIGNALED if signaled else 0
        if self._inline.get(id(wr)):
            flags |= _INLINE
        if wr.send_flags != flags:  # the latency loops post one WR, signaled each time
            wr.send_flags = flags
        try:
            self.qps[i].post_send(wr)
        except SoftRdmaError as exc:
            raise PerftestError(f"Couldn't post send: qp {i}: {exc}") from exc

    def close(self) -> None:
        self._closers.close()

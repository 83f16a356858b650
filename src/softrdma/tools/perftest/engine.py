"""The verbs side of perftest (perftest_resources.c): resources, QP connection and the
measured loops.

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

Loops (every wait bounded by ``--timeout``; an error completion, a wrong length or a
latency counter that never arrives is a :class:`PerftestError`):

* :func:`run_bw` (``run_iter_bw``): up to ``-t`` WRs in flight per QP, one signaled
  every ``-Q``; the time of every post and of every covered completion;
* :func:`run_bw_server` (``run_iter_bw_server``, send-bw): ``-r`` receives per QP,
  re-posted while more messages are due;
* :func:`run_lat_write` (``run_iter_lat_write``): RDMA WRITE ping-pong, each side polls
  the last byte of its own slot for the peer's counter (the server writes first);
* :func:`run_lat_send` (``run_iter_lat_send``): SEND ping-pong, the client sends first;
* :func:`run_lat` (``run_iter_lat``): one READ or atomic at a time (client only).
"""

from __future__ import annotations

import collections
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

from ... import enums as e
from ... import verbs as v
from ...errors import SoftRdmaError
from ..closers import Closers
from .oob import DEFAULT_CYCLE_BUFFER, ZERO_DEST, Dest
from .options import DEF_QKEY, Options, PerftestError
from .report import Progress

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


def _wc_fail(wc: Any, what: str) -> PerftestError:
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
    def poll(self, cq: Any, deadline: float, what: str, n: int = 16) -> list[Any]:
        """Up to ``n`` completions; waits (events or polling) until ``deadline``."""
        while True:
            got, wcs = cq.poll(n)
            if got:
                return list(wcs)
            now = time.monotonic()
            if self.expired(deadline, now):
                raise PerftestError(f"no completion for {self.o.timeout:g} s while {what}: "
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
        flags = int(e.IBV_SEND_SIGNALED) if signaled else 0
        if self._inline.get(id(wr)):
            flags |= int(e.IBV_SEND_INLINE)
        wr.send_flags = flags
        try:
            self.qps[i].post_send(wr)
        except SoftRdmaError as exc:
            raise PerftestError(f"Couldn't post send: qp {i}: {exc}") from exc

    def close(self) -> None:
        self._closers.close()


# ---- BW ----------------------------------------------------------------------------------

def run_bw(res: Resources, rem: list[Dest], size: int, progress: Progress) -> tuple[
        list[float], list[float]]:
    """The client's BW loop; returns the post and completion times (seconds)."""
    o = res.o
    nq = o.num_qps
    iters = o.iters
    end = time.monotonic() + o.duration if o.duration else None
    sends = _Sends(res, rem, size)
    scnt, ccnt = sends.scnt, sends.ccnt
    deadline = time.monotonic() + o.timeout
    stop = False
    granted = 0
    while True:
        if end is not None and not stop and time.monotonic() >= end:
            stop = True
            deadline = min(deadline, time.monotonic() + DURATION_GRACE_S)
        for i in range(nq):
            target = scnt[i] if stop else (iters if end is None else scnt[i] + o.tx_depth)
            sends.post(i, target, end is not None)
        if all(c >= s for c, s in zip(ccnt, scnt, strict=True)) and (
                stop or (end is None and all(c >= iters for c in ccnt))):
            break
        try:
            if res.credits:  # credits arrive by RDMA WRITE, without a completion here
                wcs = list(res.send_cq.poll(16)[1])
                if not wcs:
                    if time.monotonic() >= deadline:
                        raise PerftestError(f"no completion and no credit for {o.timeout:g} s "
                                            f"({sum(ccnt)} completed): is the peer still "
                                            "running?")
                    grant = sum(res.credit(i) for i in range(nq))
                    if grant != granted:
                        granted = grant
                        deadline = time.monotonic() + o.timeout
                    time.sleep(0)
                    continue
            else:
                wcs = res.poll(res.send_cq, deadline, f"sending ({sum(ccnt)}/"
                               f"{iters * nq if end is None else sum(scnt)} completed)")
        except PerftestError:
            if stop:
                break  # duration mode: the tail that did not complete is not counted
            raise
        sends.complete(wcs)
        deadline = time.monotonic() + o.timeout if not stop else deadline
        progress.update(sum(ccnt))
    return sends.times()


class _Sends:
    """The send side of a BW loop (:func:`run_bw`, :func:`run_bi`): per QP the sends
    posted (``scnt``) and completed (``ccnt``), the counts of its signalled sends awaiting
    their completion (``-Q``: one signalled send in ``cq_mod``), and the post and
    completion times."""

    def __init__(self, res: Resources, rem: list[Dest], size: int) -> None:
        nq = res.o.num_qps
        self.res = res
        self.wrs = [res.send_wr(i, rem[i], size) for i in range(nq)]
        self.scnt = [0] * nq
        self.ccnt = [0] * nq
        self.pending: list[collections.deque[int]] = [collections.deque() for _ in range(nq)]
        self.tposted: list[float] = []
        self.tcompleted: list[float] = []

    def post(self, i: int, target: int, signal_all: bool) -> None:
        """Post on QP ``i`` up to ``target`` sends in all, within the send queue depth
        (and, over iWARP, the receives the peer granted); every send is signalled with
        ``signal_all``, else one in ``cq_mod`` and the last."""
        res = self.res
        o = res.o
        scnt, ccnt, wr = self.scnt, self.ccnt, self.wrs[i]
        while scnt[i] < target and scnt[i] - ccnt[i] < o.tx_depth:
            if res.credits and scnt[i] + 1 - res.credit(i) >= o.rx_depth:
                break  # the receiver has no receive posted for more
            scnt[i] += 1
            sig = scnt[i] % o.cq_mod == 0 or scnt[i] == o.iters or signal_all
            self.tposted.append(time.perf_counter())
            res.post(i, wr, sig)
            if sig:
                self.pending[i].append(scnt[i])

    def complete(self, wcs: Iterable[v.WC]) -> None:
        """Count the send completions ``wcs`` (polled now): a signalled completion of QP i
        completes its sends up to the count recorded in ``pending[i]`` when it was
        posted; an error completion ends the run."""
        now = time.perf_counter()
        scnt, ccnt = self.scnt, self.ccnt
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                raise _wc_fail(wc, f"scnt={sum(scnt)}, ccnt={sum(ccnt)}")
            i = int(wc.wr_id)
            upto = self.pending[i].popleft()
            self.tcompleted.extend([now] * (upto - ccnt[i]))
            ccnt[i] = upto

    def times(self) -> tuple[list[float], list[float]]:
        """The post and completion times of the sends that completed."""
        return self.tposted[:len(self.tcompleted)], self.tcompleted


def _received(res: Resources, wc: Any, size: int, rcnt: list[int]) -> int:
    """A receive completion checked (status, length) and counted in ``rcnt``; returns
    its QP's index."""
    if wc.status != e.IBV_WC_SUCCESS:
        raise _wc_fail(wc, f"rcnt={sum(rcnt)}")
    if int(wc.byte_len) != res.recv_len(size):
        raise PerftestError(f"data mismatch: received {int(wc.byte_len)} bytes, "
                            f"expected {res.recv_len(size)}")
    i = int(wc.wr_id)
    rcnt[i] += 1
    return i


def run_bi(res: Resources, rem: list[Dest], size: int, progress: Progress) -> tuple[
        list[float], list[float]]:
    """``run_iter_bi`` (send-bw ``-b``): send ``iters`` messages per QP as :func:`run_bw`
    does while receiving the peer's as many, re-posting receives; neither CQ is waited
    on alone (each side's sends need the other's receives). Returns the send side's post
    and completion times. A UC/UD side stops waiting for lost messages once its sends
    are done, nothing arrived for a while and the peer is done too."""
    o = res.o
    nq = o.num_qps
    iters = o.iters
    sends = _Sends(res, rem, size)
    ccnt = sends.ccnt
    rcnt = [0] * nq
    deadline = time.monotonic() + o.timeout
    idle_since = time.monotonic()
    while any(c < iters for c in ccnt) or any(r < iters for r in rcnt):
        for i in range(nq):
            sends.post(i, iters, False)
        wcs = list(res.send_cq.poll(16)[1])
        rwcs = list(res.recv_cq.poll(16)[1])
        sends.complete(wcs)
        for wc in rwcs:
            i = _received(res, wc, size, rcnt)
            if rcnt[i] + o.rx_depth <= iters:
                res.post_recvs(i, 1, size)
        mono = time.monotonic()
        if wcs or rwcs:
            deadline = mono + o.timeout
            idle_since = mono
        else:
            if (not res.reliable and all(c >= iters for c in ccnt)
                    and mono - idle_since >= UNRELIABLE_IDLE_S
                    and res.peer_done is not None and res.peer_done()):
                break  # the peer is done: the messages still missing were lost
            if res.expired(deadline, mono):
                raise PerftestError(f"no completion for {o.timeout:g} s ({sum(ccnt)} sent, "
                                    f"{sum(rcnt)} received): is the peer still running?")
            res.check_peer(mono)
            time.sleep(0)
        progress.update(sum(ccnt))
    return sends.times()


def run_bw_server(res: Resources, rem: list[Dest], size: int, progress: Progress
                  ) -> tuple[list[float], list[float]]:
    """The send-bw server: receive ``iters`` messages per QP (or for ``-D`` seconds),
    granting credits over iWARP (see :data:`CREDIT`)."""
    o = res.o
    credit_cnt = max(o.rx_depth // 3, 1)
    writes = 0
    nq = o.num_qps
    iters = o.iters
    rcnt = [0] * nq
    tcompleted: list[float] = []
    clock = time.perf_counter
    first = 0.0
    end: float | None = None
    deadline = time.monotonic() + o.timeout
    while any(r < iters for r in rcnt) if o.duration is None else (
            end is None or time.monotonic() < end):
        wait_until = deadline if end is None else min(deadline, end)
        if not res.reliable:  # UC/UD: look now and then whether the sender is done
            wait_until = min(wait_until, time.monotonic() + UNRELIABLE_IDLE_S)
        try:
            wcs = res.poll(res.recv_cq, wait_until,
                           f"receiving ({sum(rcnt)}/{iters * nq} received)")
        except PerftestError:
            if end is not None:
                break
            if not res.reliable and res.peer_done is not None and res.peer_done():
                break  # the sender is done: the messages still missing were lost
            if not res.reliable and time.monotonic() < deadline:
                continue
            raise
        now = clock()
        for wc in wcs:
            i = _received(res, wc, size, rcnt)
            if not tcompleted:
                first = now
                if o.duration:
                    end = time.monotonic() + o.duration
            tcompleted.append(now)
            if o.duration or rcnt[i] + o.rx_depth <= iters:
                res.post_recvs(i, 1, size)
            if res.credits and (rcnt[i] % o.rx_depth) % credit_cnt == 0:
                while writes >= o.tx_depth:
                    writes -= _reap(res, res.poll(res.send_cq, time.monotonic() + o.timeout,
                                                  "granting credits"))
                res.post_credit(i, rem[i], rcnt[i])
                writes += 1
        if writes:
            writes -= _reap(res, list(res.send_cq.poll(16)[1]))
        deadline = time.monotonic() + o.timeout
        progress.update(sum(rcnt))
    while writes > 0:
        writes -= _reap(res, res.poll(res.send_cq, time.monotonic() + o.timeout,
                                      "granting credits"))
    return [first] * len(tcompleted), tcompleted


def _reap(res: Resources, wcs: list[Any]) -> int:
    for wc in wcs:
        if wc.status != e.IBV_WC_SUCCESS:
            raise _wc_fail(wc, "a credit RDMA WRITE")
    return len(wcs)


# ---- latency -----------------------------------------------------------------------------

def run_lat_write(res: Resources, rem: Dest, size: int, progress: Progress) -> list[float]:
    """RDMA WRITE ping-pong on QP 0; returns the post times."""
    o = res.o
    wr = res.send_wr(0, rem, size)
    post_off = res.base + size - 1
    poll_off = res.base + o.num_qps * res.buff + size - 1
    buf = res.buf
    iters = o.iters
    server = not o.is_client
    tposted: list[float] = []
    clock = time.perf_counter
    scnt = rcnt = ccnt = 0
    while scnt < iters or ccnt < iters or rcnt < iters:
        if rcnt < iters and not (scnt < 1 and server):
            rcnt += 1
            want = rcnt & 0xFF
            deadline = time.monotonic() + o.timeout
            while buf[poll_off] != want:
                now = time.monotonic()
                if now >= deadline:
                    raise PerftestError(f"the peer's write #{rcnt} never arrived "
                                        f"(after {o.timeout:g} s)")
                res.check_peer(now)
                # busy-polling a CQ (empty here) drives the receive path in this thread,
                # which places the peer's WRITE (softrdma.drivers.runtime)
                res.recv_cq.poll(1)
        if scnt < iters:
            tposted.append(clock())
            scnt += 1
            buf[post_off] = scnt & 0xFF
            res.post(0, wr, True)
        if ccnt < iters:
            wcs = res.poll(res.send_cq, time.monotonic() + o.timeout, "writing", 1)
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise _wc_fail(wc, f"scnt={scnt}, ccnt={ccnt}")
                ccnt += 1
        progress.update(scnt)
    return tposted


def run_lat_send(res: Resources, size: int, progress: Progress,
                 rem: Dest = ZERO_DEST) -> list[float]:
    """SEND ping-pong on QP 0 (client first); returns the post times."""
    o = res.o
    iters = o.iters
    client = o.is_client
    tposted: list[float] = []
    clock = time.perf_counter
    scnt = rcnt = 0
    unsignaled = 0
    wr = res.send_wr(0, rem, size)  # (UD: the peer's QPN goes in every SEND)
    while scnt < iters or rcnt < iters:
        if rcnt < iters and not (scnt < 1 and client):
            wcs = res.poll(res.recv_cq, time.monotonic() + o.timeout,
                           f"waiting for message {rcnt + 1}/{iters}", 1)
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise _wc_fail(wc, f"rcnt={rcnt}")
                if int(wc.byte_len) != res.recv_len(size):
                    raise PerftestError(f"data mismatch: received {int(wc.byte_len)} "
                                        f"bytes, expected {res.recv_len(size)}")
                rcnt += 1
                if rcnt + o.rx_depth <= iters:
                    res.post_recvs(0, 1, size)
        if scnt < iters:
            tposted.append(clock())
            scnt += 1
            unsignaled += 1
            sig = scnt % o.cq_mod == 0 or scnt == iters or unsignaled >= o.tx_depth
            res.post(0, wr, sig)
            if sig:
                unsignaled = 0
                wcs = res.poll(res.send_cq, time.monotonic() + o.timeout, "sending", 1)
                for wc in wcs:
                    if wc.status != e.IBV_WC_SUCCESS:
                        raise _wc_fail(wc, f"scnt={scnt}")
        progress.update(scnt)
    return tposted


def run_lat(res: Resources, rem: Dest, size: int, progress: Progress) -> list[float]:
    """One READ or atomic at a time on QP 0; returns the post times (plus the last
    completion, so every operation has a gap)."""
    o = res.o
    wr = res.send_wr(0, rem, size)
    tposted: list[float] = []
    clock = time.perf_counter
    for n in range(o.iters):
        tposted.append(clock())
        res.post(0, wr, True)
        wcs = res.poll(res.send_cq, time.monotonic() + o.timeout,
                       f"waiting for completion {n + 1}/{o.iters}", 1)
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                raise _wc_fail(wc, f"scnt={n + 1}")
        progress.update(n + 1)
    return tposted


# ---- --run_infinitely -------------------------------------------------------------------

def run_bw_infinitely(res: Resources, rem: list[Dest], size: int, every: float,
                      on_period: Callable[[int, float], None]) -> None:
    """``run_iter_bw_infinitely``: post for ever (up to ``-t`` in flight per QP, one
    signaled every ``-Q``) and call ``on_period(messages completed, seconds)`` every
    ``every`` seconds; ends only by an error or KeyboardInterrupt (Ctrl-C)."""
    o = res.o
    nq = o.num_qps
    wrs = [res.send_wr(i, rem[i], size) for i in range(nq)]
    scnt = [0] * nq
    ccnt = [0] * nq
    pending: list[collections.deque[int]] = [collections.deque() for _ in range(nq)]
    clock = time.perf_counter
    start = clock()
    shown = 0
    deadline = time.monotonic() + o.timeout
    while True:
        for i in range(nq):
            while scnt[i] - ccnt[i] < o.tx_depth:
                if res.credits and scnt[i] + 1 - res.credit(i) >= o.rx_depth:
                    break
                scnt[i] += 1
                sig = scnt[i] % o.cq_mod == 0
                res.post(i, wrs[i], sig)
                if sig:
                    pending[i].append(scnt[i])
        wcs = list(res.send_cq.poll(16)[1])
        now_m = time.monotonic()
        if wcs:
            deadline = now_m + o.timeout
        elif res.expired(deadline, now_m):
            raise PerftestError(f"no completion for {o.timeout:g} s ({sum(ccnt)} completed): "
                                "is the peer still running?")
        else:
            res.check_peer(now_m)
            time.sleep(0)
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                raise _wc_fail(wc, f"scnt={sum(scnt)}, ccnt={sum(ccnt)}")
            i = int(wc.wr_id)
            ccnt[i] = pending[i].popleft()
        now = clock()
        if now - start >= every:
            done = sum(ccnt)
            on_period(done - shown, now - start)
            shown = done
            start = now


def receive_infinitely(res: Resources, size: int, every: float,
                       on_period: Callable[[int, float], None]) -> None:
    """``run_iter_bw_infinitely_server`` (send-bw): receive for ever, re-posting each
    receive, and report every ``every`` seconds; ends when the sender leaves."""
    o = res.o
    clock = time.perf_counter
    start = clock()
    count = 0
    while True:
        try:
            wcs = res.poll(res.recv_cq, time.monotonic() + every, "receiving")
        except PerftestError:
            if res.peer_gone is not None and res.peer_gone():
                return
            wcs = []
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                raise _wc_fail(wc, f"rcnt={count}")
            count += 1
            res.post_recvs(int(wc.wr_id), 1, size)
        now = clock()
        if now - start >= every:
            on_period(count, now - start)
            count = 0
            start = now
        if o.timeout and res.peer_gone is not None and not wcs and res.peer_gone():
            return

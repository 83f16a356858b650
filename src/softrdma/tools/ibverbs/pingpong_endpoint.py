"""One side of a pingpong (rdma-core ``{rc,uc,ud}_pingpong.c``'s ``pp_context``): the
port's GID (:func:`local_gid`, ``-g``), the QP brought to RTS, the receives and sends of
the data phase and the checked payload (:class:`Endpoint`). Re-exported by
:mod:`.pingpong`.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from ... import enums as e
from ...errors import SoftRdmaError
from ..closers import Closers
from . import pingpong_ext
from .pingpong_dest import Dest, PingPongError
from .pingpong_options import Options

if TYPE_CHECKING:
    from ... import verbs as v

UD_QKEY = 0x11111111
GRH_LEN = 40
RECV_WRID = 1
SEND_WRID = 2
IBV_LINK_LAYER_ETHERNET = 2
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
POISON = 0xEE  # written over a checked receive area so a short placement is detected
MTU_BYTES_TO_ENUM = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
                     2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
QP_TYPES = {"rc": e.IBV_QPT_RC, "uc": e.IBV_QPT_UC, "ud": e.IBV_QPT_UD}
_WC_SUCCESS = int(e.IBV_WC_SUCCESS)
#: the data loop tops its receive queue up once this many receives are used, right
#: after its next SEND (while the answer is on its way), and before a SEND once at most
#: one is left (``rc_pingpong.c``'s rule); a refill of ``rx_depth`` at once (0.9 us a
#: receive) delayed one round trip in ``rx_depth`` by the whole refill
RECV_BATCH = 16


def local_gid(ctx: Any, port: int, gid_idx: int | None) -> tuple[int, bytes]:
    """``-g`` of every pingpong tool: ``(index, GID)`` this side uses and announces.

    Without ``-g`` (``None``) a RoCE port uses index 0, since every RoCE packet carries
    the GID as its address (IBA Annex A16/A17), and an InfiniBand port announces none
    (-1, the zero GID, as the C tools without ``-g``). Checked at start, before any
    peer is waited for: an index outside the GID table or an empty entry raises
    :class:`PingPongError` naming ``-g`` (the C tools would send ``::`` and the peer's
    connection would fail later)."""
    try:
        attr = ctx.query_port(port)
    except SoftRdmaError as exc:
        raise PingPongError(f"Couldn't get port info for port {port}: {exc}") from exc
    roce = int(getattr(attr, "link_layer", IBV_LINK_LAYER_ETHERNET)) == IBV_LINK_LAYER_ETHERNET
    idx = gid_idx if gid_idx is not None else (0 if roce else -1)
    if idx < 0:
        return -1, bytes(16)
    try:
        gid = bytes(ctx.query_gid(port, idx).raw)
    except SoftRdmaError as exc:
        raise PingPongError(f"-g {idx}: {exc}") from exc
    if not any(gid):
        try:
            used = [i for i, g in enumerate(ctx.gids) if any(bytes(g.raw))]
        except (SoftRdmaError, AttributeError):
            used = []
        have = f" (entries in use: {', '.join(map(str, used))})" if used else ""
        raise PingPongError(f"-g {idx}: GID index {idx} of port {port} is empty{have}")
    return idx, gid


def _mark_pages(buf: bytearray, off: int, size: int) -> None:
    """Zero the first byte of every page of ``buf[off:off+size]`` (in place)."""
    buf[off:off + size:PAGE_SIZE] = bytes(len(range(0, size, PAGE_SIZE)))


def _fill(buf: bytearray, off: int, size: int, value: int) -> None:
    """``memset(buf + off, value, size)`` without a temporary of ``size`` bytes."""
    block = bytes([value]) * min(size, 1 << 20)
    mv = memoryview(buf)
    for start in range(off, off + size, len(block) or 1):
        n = min(len(block), off + size - start)
        mv[start:start + n] = block[:n]


def check_pattern(size: int) -> bytes:
    """The ``-c`` send pattern: rc_pingpong's 0x7b buffer with ``buf[i] = 0`` at every
    page start (``i / page_size % sizeof(char)``), so a C peer run with ``-c`` matches."""
    pat = bytearray(b"\x7b" * size)
    pat[::PAGE_SIZE] = bytes(len(range(0, size, PAGE_SIZE)))
    return bytes(pat)


class Endpoint:
    """PD, MR, CQ (and channel with ``-e``), one QP in INIT with ``rx_depth`` receives.

    The MR holds a receive area (``size``, plus the 40-byte GRH area for UD) followed by
    a send area (``size``), so ``--chk`` really checks what arrived.
    """

    def __init__(self, ctx: v.Context, opts: Options, name: str = "") -> None:
        from ... import verbs as v

        self.ctx = ctx
        self.opts = opts
        self.name = name
        self.qp_type = QP_TYPES[opts.kind]
        self.ah: v.AH | None = None
        self._closers = Closers()
        try:
            self.port_attr = ctx.query_port(opts.ib_port)
        except SoftRdmaError as exc:
            raise PingPongError(f"Couldn't get port info for port {opts.ib_port}: {exc}") from exc
        self.roce = int(getattr(self.port_attr, "link_layer", IBV_LINK_LAYER_ETHERNET)) \
            == IBV_LINK_LAYER_ETHERNET
        if opts.kind == "ud":
            mtu = 1 << (int(self.port_attr.active_mtu) + 7)
            if opts.size > mtu:
                raise PingPongError(f"Requested size larger than port MTU ({mtu})")
        self.gid_idx, gid = local_gid(ctx, opts.ib_port, opts.gid_idx)
        self.grh = GRH_LEN if opts.kind == "ud" else 0
        self.rlen = opts.size + self.grh
        # One buffer and no copy of it (a 2 GiB message must not cost several times its
        # size): the send area is the --chk pattern itself, written in place.
        self.buf = bytearray(b"\x7b") * (self.rlen + opts.size)
        if opts.chk:
            _mark_pages(self.buf, self.rlen, opts.size)
        self.pattern = memoryview(self.buf)[self.rlen:] if opts.chk else memoryview(b"")
        try:
            self.pd = v.PD(ctx)
            self._closers.append(self.pd)
            self.mr = v.MR(self.pd, len(self.buf), pingpong_ext.mr_access(
                opts.ext, int(e.IBV_ACCESS_LOCAL_WRITE)), buffer=self.buf)
            self._closers.append(self.mr)
            # the buffer's real address, as ibv_reg_mr; device memory is zero-based
            self.addr = 0 if opts.ext.dm else int(self.mr.addr)
            self.channel = v.CompChannel(ctx) if opts.events else None
            if self.channel is not None:
                self._closers.append(self.channel)
            self.cq = v.CQ(ctx, opts.rx_depth + 1, None, self.channel, 0,
                           timestamps=opts.ext.ts)
            self._closers.append(self.cq)
            cap = v.QPCap(max_send_wr=1, max_recv_wr=opts.rx_depth, max_send_sge=1,
                          max_recv_sge=1)
            init = v.QPInitAttr(qp_type=self.qp_type, scq=self.cq, rcq=self.cq, cap=cap)
            self.qp = v.QP(self.pd, init)
            self._closers.append(self.qp)
        except SoftRdmaError as exc:
            self.close()
            raise PingPongError(f"Couldn't create the verbs resources: {exc}") from exc
        self.send_flags = e.IBV_SEND_SIGNALED
        #: -t: the cycles between receive completions
        self.recv_clock = pingpong_ext.RecvClock() if opts.ext.ts else None
        self._send_wr: Any = None  # post_send's WR (built at the first SEND)
        self._recv_wr: Any = None  # post_recv's WR (built at the first post)
        #: another application thread polls in this process (--loopback's server): an
        #: empty poll then hands it the GIL (time.sleep(0)); alone, the poll loop spins
        #: as the bench's does (cq.poll makes progress itself)
        self.shares_gil = False
        self._to_init()
        self.routs = self.post_recv(opts.rx_depth)
        if self.routs < opts.rx_depth:
            raise self._post_failed(self.routs)
        self.local = Dest(int(getattr(self.port_attr, "lid", 0)), self.qp.qp_num,
                          random.getrandbits(24), bytes(gid))
        self.remote: Dest | None = None

    # -- setup -------------------------------------------------------------------------
    def _to_init(self) -> None:
        from ... import verbs as v

        mask = e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
        if self.qp_type == e.IBV_QPT_UD:
            attr = v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0,
                            port_num=self.opts.ib_port, qkey=UD_QKEY)
            mask |= e.IBV_QP_QKEY
        else:
            attr = v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0,
                            port_num=self.opts.ib_port, qp_access_flags=0)
            mask |= e.IBV_QP_ACCESS_FLAGS
        try:
            self.qp.modify(attr, int(mask))
        except SoftRdmaError as exc:
            raise PingPongError(f"Failed to modify QP to INIT: {exc}") from exc

    def _ah_attr(self, rem: Dest) -> v.AHAttr:
        from ... import verbs as v

        if any(rem.gid[8:]):  # dest->gid.global.interface_id
            gr = v.GlobalRoute(dgid=v.GID(rem.gid), sgid_index=max(self.gid_idx, 0),
                               hop_limit=1)
            return v.AHAttr(port_num=self.opts.ib_port, is_global=1, gr=gr, dlid=rem.lid,
                            sl=self.opts.sl)
        if self.roce:
            raise PingPongError("the peer sent no GID, which RoCE needs: run it with "
                                "-g <gid index>")
        return v.AHAttr(port_num=self.opts.ib_port, is_global=0, dlid=rem.lid,
                        sl=self.opts.sl)

    def connect(self, rem: Dest) -> None:
        """``pp_connect_ctx``: RTR then RTS (and the AH for UD) towards ``rem``."""
        from ... import verbs as v

        self.remote = rem
        ah_attr = self._ah_attr(rem)
        if self.qp_type == e.IBV_QPT_UD:
            rtr = v.QPAttr(qp_state=e.IBV_QPS_RTR)
            rtr_mask = e.IBV_QP_STATE
            rts = v.QPAttr(qp_state=e.IBV_QPS_RTS, sq_psn=self.local.psn)
            rts_mask = e.IBV_QP_STATE | e.IBV_QP_SQ_PSN
        else:
            path_mtu = MTU_BYTES_TO_ENUM[self.opts.mtu]
            rtr = v.QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=path_mtu,
                           dest_qp_num=rem.qpn, rq_psn=rem.psn, ah_attr=ah_attr)
            rtr_mask = (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU
                        | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN)
            rts = v.QPAttr(qp_state=e.IBV_QPS_RTS, sq_psn=self.local.psn)
            rts_mask = e.IBV_QP_STATE | e.IBV_QP_SQ_PSN
            if self.qp_type == e.IBV_QPT_RC:
                rtr.max_dest_rd_atomic = 1
                rtr.min_rnr_timer = 12
                rtr_mask |= e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER
                rts.timeout = 14
                rts.retry_cnt = 7
                rts.rnr_retry = 7
                rts.max_rd_atomic = 1
                rts_mask |= (e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
                             | e.IBV_QP_MAX_QP_RD_ATOMIC)
        try:
            self.qp.modify(rtr, int(rtr_mask))
        except SoftRdmaError as exc:
            raise PingPongError(f"Failed to modify QP to RTR: {exc}") from exc
        try:
            self.qp.modify(rts, int(rts_mask))
        except SoftRdmaError as exc:
            raise PingPongError(f"Failed to modify QP to RTS: {exc}") from exc
        if self.qp_type == e.IBV_QPT_UD:
            try:
                self.ah = v.AH(self.pd, ah_attr)
            except SoftRdmaError as exc:
                raise PingPongError(f"Failed to create AH: {exc}") from exc
            self._closers.append(self.ah)

    # -- data path ---------------------------------------------------------------------
    def post_recv(self, n: int, refill: bool = False) -> int:
        """``pp_post_recv``: post up to ``n`` receives of the whole receive area; returns
        how many were posted. ``refill``: the ping-pong's refill, ``n`` being what the
        receive queue lacks: the ``n`` posts are then one call (one lock round, not ``n``;
        a refill of 499 receives one at a time cost about 3 us per iteration)."""
        from ... import verbs as v

        if n <= 0:
            return 0
        # one WR, built once and posted n times (the post copies it into a WQE), as
        # pp_post_recv posts its one struct ibv_recv_wr
        wr = self._recv_wr
        if wr is None:
            wr = self._recv_wr = v.RecvWR(wr_id=RECV_WRID, num_sge=1,
                                          sg=[v.SGE(self.addr, self.rlen, self.mr.lkey)])
        post = self.qp.post_recv
        if refill:
            try:
                post([wr] * n)
            except SoftRdmaError:
                return 0  # the queue had room for n: the QP is unusable, the caller fails
            return n
        posted = 0
        while posted < n:
            try:
                post(wr)
            except SoftRdmaError:
                break
            posted += 1
        return posted

    def _refill(self) -> None:
        """Top the receive queue up to ``rx_depth`` in one post (``pp_post_recv``)."""
        rx_depth = self.opts.rx_depth
        routs = self.routs = self.routs + self.post_recv(rx_depth - self.routs, True)
        if routs < rx_depth:
            raise self._post_failed(routs)

    def _post_failed(self, routs: int) -> PingPongError:
        """``Couldn't post receive (N)``, or why the device failed when it did (its devd
        died: the QP took no more receives because nothing serves it any more)."""
        fatal = getattr(self.ctx.runtime, "fatal", None)
        if fatal is not None:
            return PingPongError(str(fatal))
        return PingPongError(f"Couldn't post receive ({routs})")

    def post_send(self) -> None:
        """``pp_post_send``: one signaled SEND of ``size`` bytes from the send area."""
        wr = self._send_wr
        if wr is None:  # built once, at the first SEND (after connect), and posted again
            if self.opts.ext.new_send:  # -N: ibv_wr_start / wr_set_sge / wr_complete
                self._post_send_new()
                return
            wr = self._send_wr = self._build_send_wr()
        try:
            self.qp.post_send(wr)
        except SoftRdmaError as exc:
            raise PingPongError(f"Couldn't post send: {exc}") from exc

    def _build_send_wr(self) -> Any:
        from ... import verbs as v

        sge = v.SGE(self.addr + self.rlen, self.opts.size, self.mr.lkey)
        wr = v.SendWR(wr_id=SEND_WRID, num_sge=1, sg=[sge], opcode=e.IBV_WR_SEND,
                      send_flags=self.send_flags)
        if self.ah is not None:
            assert self.remote is not None
            wr.set_wr_ud(self.ah, self.remote.qpn, UD_QKEY)
        return wr

    def _post_send_new(self) -> None:
        """``-N``: the SEND through ibv_wr_start / wr_send / wr_set_sge / wr_complete."""
        from ... import verbs as v

        batch = pingpong_ext.NewSendBatch(self.qp, v)
        batch.wr_start()
        batch.wr_id, batch.wr_flags = SEND_WRID, int(self.send_flags)
        batch.wr_send()
        batch.wr_set_sge(self.mr.lkey, self.addr + self.rlen, self.opts.size)
        try:
            batch.wr_complete()
        except SoftRdmaError as exc:
            raise PingPongError(f"Couldn't post send: {exc}") from exc

    def _check_received(self, byte_len: int) -> None:
        size = self.opts.size
        if byte_len != self.rlen:
            raise PingPongError(f"received {byte_len} bytes, expected {self.rlen}")
        got = memoryview(self.buf)[self.grh:self.rlen]
        if got != self.pattern:
            bad = next(i for i in range(size) if got[i] != self.pattern[i])
            raise PingPongError(
                f"Invalid data in page {bad // PAGE_SIZE} (byte {bad}: 0x{got[bad]:02x}, "
                f"expected 0x{self.pattern[bad]:02x})")
        _fill(self.buf, self.grh, size, POISON)

    def _activity(self) -> int:
        """Packets the device has sent and received so far (its port counters; read
        directly, this runs once per wait)."""
        c = getattr(getattr(self.ctx, "port", None), "counters", None)
        return int(getattr(c, "sent_pkts", 0)) + int(getattr(c, "rcvd_pkts", 0))

    def _next_completions(self, abort: threading.Event | None) -> list[Any]:
        """Wait (events or polling) for up to two completions, once a poll found none;
        give up only after ``timeout`` seconds without progress: a large message keeps
        the device busy for longer than the timeout, and as long as its packets move the
        wait goes on. Polling spins on ``cq.poll``, which makes progress itself (the
        progress thread stands back meanwhile), as the bench's ping-pong does."""
        poll = self.cq.poll
        channel = self.channel
        clock = time.monotonic
        timeout = self.opts.timeout
        deadline = clock() + timeout
        seen = self._activity()
        while True:
            if clock() >= deadline:
                now = self._activity()
                if now == seen:
                    return []  # nothing moved for ``timeout`` s
                seen = now  # packets moved in the last ``timeout`` s: keep waiting
                deadline = clock() + timeout
            if abort is not None and abort.is_set():
                raise PingPongError("stopped: the other side failed")
            n, wcs = poll(2)
            if n:
                return wcs
            if channel is not None:
                try:
                    channel.get_cq_event(timeout=min(max(deadline - clock(), 0.001), 0.2))
                except TimeoutError:
                    continue
                except SoftRdmaError as exc:
                    if "time" in str(exc).lower():
                        continue
                    raise PingPongError(f"Failed to get cq_event: {exc}") from exc
                self.cq.ack_events(1)
                self.cq.req_notify()
            elif self.shares_gil:
                time.sleep(0)  # let the other application thread poll

    def _failed(self, wc: Any) -> PingPongError:
        """The error of a completion whose status is not success."""
        from ... import verbs as v

        fatal = getattr(self.ctx.runtime, "fatal", None)
        if fatal is not None:  # the device failed (its devd died)
            return PingPongError(str(fatal))
        return PingPongError(f"Failed status {v.wc_status_str(wc.status)} "
                             f"({int(wc.status)}) for wr_id {int(wc.wr_id)}")

    def run(self, is_client: bool, abort: threading.Event | None = None) -> float:
        """The data phase (``rc_pingpong.c``'s loop); returns the elapsed microseconds
        (``gettimeofday`` delta). Each side sends its next message once both its
        previous SEND and the peer's message have completed."""
        opts = self.opts
        iters = opts.iters
        chk = opts.chk
        events = self.channel is not None
        if events:
            self.cq.req_notify()
        poll = self.cq.poll
        wait = self._next_completions
        post_send = self.post_send
        rx_depth = opts.rx_depth
        recv_clock = self.recv_clock
        pending = RECV_WRID
        if is_client:
            post_send()
            pending |= SEND_WRID
        start = time.perf_counter()
        rcnt = scnt = 0
        while rcnt < iters or scnt < iters:
            if events:
                wcs = wait(abort)  # polls first, then sleeps on the channel
            else:
                n, wcs = poll(2)  # a completion already there costs one poll
                if not n:
                    wcs = wait(abort)
            if not wcs:
                raise PingPongError(
                    f"no completion for {opts.timeout:g} s ({scnt}/{iters} sent, "
                    f"{rcnt}/{iters} received): is the peer still running?")
            for wc in wcs:
                if wc.status != _WC_SUCCESS:
                    raise self._failed(wc)
                wr_id = wc.wr_id
                if wr_id == SEND_WRID:
                    scnt += 1
                elif wr_id == RECV_WRID:
                    self.routs -= 1
                    if self.routs <= 1:  # (nearly) empty: refill before the next SEND
                        self._refill()
                    if chk:
                        self._check_received(int(wc.byte_len))
                    if recv_clock is not None:
                        recv_clock.add(wc.timestamp)
                    rcnt += 1
                else:
                    raise PingPongError(f"Completion for unknown wr_id {int(wr_id)}")
                pending &= ~wr_id
                if scnt < iters and not pending:
                    post_send()
                    pending = RECV_WRID | SEND_WRID
                    if rx_depth - self.routs >= RECV_BATCH:  # while the answer is on its way
                        self._refill()
                if rcnt >= iters and scnt >= iters:
                    # done: later completions (an iWARP peer's close flushes the receives
                    # still posted) are not part of the exchange
                    break
        return (time.perf_counter() - start) * 1e6

    def close(self) -> None:
        """Destroy what this endpoint created (QP, CQ, MR, PD ...), newest first."""
        self._closers.close()


# --------------------------------------------------------------------------------------
# Reports and the two roles
# --------------------------------------------------------------------------------------

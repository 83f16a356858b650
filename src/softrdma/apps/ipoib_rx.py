"""The receive side of the IPoIB process: its completions, its receive buffers, and the
packets it writes to the TUN device. :class:`IpoibReceive` is a base of
:class:`softrdma.apps.ipoib_runtime.IpoibRuntime`, which owns the resources it uses.

* The UD QP's receive buffers (GRH + IB MTU each) and the SRQ's (64 KiB each) are posted
  again one batch, one call, at a time, from work requests built once per buffer (the
  verbs copy what they post).
* The packets of one completion batch go to the host together, consecutive TCP segments
  of a flow coalesced into one packet (:mod:`softrdma.ipoib.gro`): in datagram mode one
  write and one host-stack receive per up to 64 KiB, not per 4 KB, and the receiver's
  TCP sends its ACKs per coalesced packet, each one less IPoIB message back.
* The sends the completions cause are posted together after the batch.
"""

from __future__ import annotations

from typing import Any

from .. import enums as e
from .. import verbs as v
from ..drivers.links.tun import TunDevice
from ..ipoib.gro import Merged, TcpCoalescer
from ..ipoib.iface import IpoibInterface
from ..wire.gid import ip_to_gid

__all__ = ["IpoibReceive", "GRH", "SLOT", "WR_RECV_BASE", "POLL_BATCH"]

GRH = 40                     # UD receive buffers start with the GRH area (IBA 11.4.1.2)
SLOT = 1 << 16               # >= IPOIB_CM_BUF_SIZE
POLL_BATCH = 64
WR_RECV_BASE = 1 << 32       # receive wr_ids: WR_RECV_BASE + buffer index; sends: the slot


class IpoibReceive:
    """Completions and receive buffers (the resources: the runtime's)."""

    engine: IpoibInterface
    tun: TunDevice | None
    cq: v.CQ
    rc_rcq: v.CQ
    srq: v.SRQ | None
    ud_qp: v.QP
    driver_counters: dict[str, int]
    _by_qpn: dict[int, int]
    _free_slots: list[int]
    _ud_view: memoryview
    _ud_slot: int
    _srq_view: memoryview
    _batching: bool
    _closing: bool
    _ud_rwrs: list[v.RecvWR]
    _srq_rwrs: list[v.RecvWR]

    def _init_receive(self) -> None:
        self._gro = TcpCoalescer()
        self._coalescing = False
        self._ud_rwrs = []
        self._srq_rwrs = []

    def _execute(self, outputs: Any) -> None:
        raise NotImplementedError  # the runtime's

    def _post_queued(self) -> None:
        raise NotImplementedError  # the runtime's

    def _ud_sent(self, slot: int) -> None:
        raise NotImplementedError  # the runtime's

    def _drop_conn(self, conn_id: int, *, disconnect: bool) -> None:
        raise NotImplementedError  # the connections'

    # ---- buffers -------------------------------------------------------------------
    def _make_recv_wrs(self, mr: v.MR, count: int, size: int) -> list[v.RecvWR]:
        """One receive WR per buffer of ``mr`` (``count`` of ``size`` bytes)."""
        return [v.RecvWR(wr_id=WR_RECV_BASE + i, sg=[v.SGE(mr.addr + i * size, size, mr.lkey)],
                         num_sge=1) for i in range(count)]

    def _post_ud_recvs(self, idxs: list[int]) -> None:
        """Post the UD receive buffers ``idxs`` in one call."""
        wrs = self._ud_rwrs
        self.ud_qp.post_recv([wrs[i] for i in idxs])

    def _post_srq_recvs(self, idxs: list[int]) -> None:
        """Post the SRQ buffers ``idxs`` in one call."""
        assert self.srq is not None
        wrs = self._srq_rwrs
        self.srq.post_recv([wrs[i] for i in idxs])

    # ---- completions ---------------------------------------------------------------
    def _poll(self, now: float) -> int:
        """Handle the completions; the sends they cause are posted together at the end,
        and the receive buffers are posted again one batch (one call) at a time."""
        self._batching = True
        try:
            return self._poll_batch(now)
        finally:
            self._batching = False
            if self._coalescing:  # left by an exception: what was received still goes
                self._coalescing = False
                self._write_rx()
            self._post_queued()

    def _write_rx(self) -> None:
        """Write the packets of a receive batch to the TUN device, consecutive TCP
        segments of a flow coalesced (:mod:`softrdma.ipoib.gro`); before the batch's
        receive buffers are posted again, as the packets still point into them."""
        gro = self._gro
        gro.flush()
        tun = self.tun
        if tun is None:
            gro.take()
            return
        for p in gro.take():
            if isinstance(p, Merged):
                ok = tun.write_gso(p.head, p.payloads, p.gso_type, p.gso_size)
            else:
                ok = tun.write(p)
            if not ok:
                self.driver_counters["tun_write_errors"] += 1

    def _poll_batch(self, now: float) -> int:
        n = 0
        eng = self.engine
        ok = e.IBV_WC_SUCCESS
        acked: set[int] = set()   # QPs whose sends the peer acknowledged
        ud_view, ud_slot = self._ud_view, self._ud_slot
        ud_qpn = self.ud_qp.qp_num
        while True:
            got, wcs = self.cq.poll(POLL_BATCH)
            if not got:
                break
            n += got
            again: list[int] = []
            self._coalescing = True
            for wc in wcs:
                if wc.wr_id < WR_RECV_BASE:  # a send slot is free again
                    if wc.qp_num == ud_qpn:
                        self._ud_sent(int(wc.wr_id))  # and the unsignaled ones before it
                    else:
                        self._free_slots.append(int(wc.wr_id))
                    if wc.status != ok:
                        self._send_failed(wc.qp_num, now)
                    else:
                        acked.add(wc.qp_num)
                    continue
                i = int(wc.wr_id) - WR_RECV_BASE
                if wc.status == ok:
                    off = i * ud_slot
                    grh = ud_view[off:off + GRH]
                    if grh[0] >> 4 == 6:
                        src = bytes(grh[8:24])
                    else:
                        src = ip_to_gid(grh[32:36])
                    eng.receive_ud(ud_view[off + GRH:off + wc.byte_len], src, wc.src_qp, now)
                else:
                    self.driver_counters["recv_errors"] += 1
                again.append(i)
            self._execute(eng.take_output())  # the batch's outputs, in order
            self._coalescing = False
            self._write_rx()
            if again and not self._closing:
                self._post_ud_recvs(again)
        for qpn in acked:  # RC forward progress confirms the neighbour (RFC 4861 §7.3.1)
            conn_id = self._by_qpn.get(qpn)
            if conn_id is not None:
                eng.conn_progress(conn_id, now)
                self._execute(eng.take_output())
        while self.srq is not None:
            got, wcs = self.rc_rcq.poll(POLL_BATCH)
            if not got:
                break
            n += got
            again = []
            self._coalescing = True
            srq_view = self._srq_view
            for wc in wcs:
                i = int(wc.wr_id) - WR_RECV_BASE
                conn_id = self._by_qpn.get(wc.qp_num)
                if wc.status == ok and conn_id is not None:
                    off = i * SLOT
                    eng.receive_conn(conn_id, srq_view[off:off + wc.byte_len], now)
                elif wc.status != ok and wc.status != e.IBV_WC_WR_FLUSH_ERR:
                    self.driver_counters["recv_errors"] += 1
                again.append(i)
            self._execute(eng.take_output())
            self._coalescing = False
            self._write_rx()
            if again and not self._closing:
                self._post_srq_recvs(again)
        return n

    def _send_failed(self, qp_num: int, now: float) -> None:
        """A send completed in error: on a connection (retries exhausted, the peer is
        gone) the connection is closed, and the next packet sets up a new one."""
        self.driver_counters["send_errors"] += 1
        conn_id = self._by_qpn.get(qp_num)
        if conn_id is not None:
            self._drop_conn(conn_id, disconnect=True)
            self.engine.conn_closed(conn_id, now)
            self._execute(self.engine.take_output())

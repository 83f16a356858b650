"""Receive first (issue 25, "Never give up on a live peer"): before a due timer runs, the
runtime feeds the engine what already arrived. An ACK waiting in our own socket buffer is
not a lost ACK: a retransmission timer that is due (perhaps late, because this process
was descheduled) must not count a retry for it.

Two RC QPs on two UDP links on the loopback, manual progress, each on a clock the test
moves (no sleeps): A's SEND is acknowledged by B, the ACK sits in A's socket, A's clock
jumps past the Local ACK Timeout (IBA 9.7.6.1.1), then an ordinary verbs call on A runs
the runtime's housekeeping.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import ports

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime.roce import Runtime

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
MASK_INIT = int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
MASK_RTR = int(e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
               | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
MASK_RTS = int(e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
               | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
DEADLINE = 10.0  # generous: the machine may be busy (s)


class _Side:
    def __init__(self, ip: str, port: int) -> None:
        self.t = 1000.0  # this side's clock (s): moves only when the test says
        self.link = UdpLink(ip, port)
        self.ctx = v.Context(link=self.link, progress="manual", clock=lambda: self.t)
        self.pd = v.PD(self.ctx)
        self.buf = bytearray(4096)
        self.mr = v.MR(self.pd, 4096, ACC, buffer=self.buf)
        self.cq = v.CQ(self.ctx, 16)
        cap = v.QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        self.qp = v.QP(self.pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq,
                                             rcq=self.cq, cap=cap))

    def connect(self, peer: _Side) -> None:
        qp = self.qp
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=1,
                           qp_access_flags=ACC), MASK_INIT)
        gid = peer.ctx.query_gid(1, 0)
        ah = v.AHAttr(port_num=1, is_global=1,
                      gr=v.GlobalRoute(dgid=gid, sgid_index=0, hop_limit=64))
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=3, dest_qp_num=peer.qp.qp_num,
                           rq_psn=0, max_dest_rd_atomic=1, min_rnr_timer=1, ah_attr=ah),
                  MASK_RTR)
        # timeout 14: 4.096 us * 2**14 = 67 ms (IBA 9.7.6.1.1)
        qp.modify(v.QPAttr(qp_state=e.IBV_QPS_RTS, timeout=14, retry_cnt=7, rnr_retry=7,
                           sq_psn=0, max_rd_atomic=1), MASK_RTS)

    def completions(self, want: int) -> list[Any]:
        """Progress (manual) until ``want`` completions are in the CQ."""
        got: list[Any] = []
        end = time.monotonic() + DEADLINE
        while len(got) < want and time.monotonic() < end:
            self.ctx.runtime.progress(0.05)
            got.extend(self.cq.poll(16)[1])
        return got

    @property
    def runtime(self) -> Runtime:
        rt = self.ctx.runtime
        assert isinstance(rt, Runtime)
        return rt

    def counter(self, name: str) -> int:
        return int(self.runtime.port.counters.as_dict()[name])

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture
def pair() -> Iterator[tuple[_Side, _Side]]:
    port = ports.free_port()
    a, b = _Side("127.0.0.1", port), _Side("127.0.0.2", port)
    try:
        a.connect(b)
        b.connect(a)
        yield a, b
    finally:
        a.close()
        b.close()


def _send_and_leave_the_ack_in_a_socket(a: _Side, b: _Side) -> None:
    b.qp.post_recv(v.RecvWR(wr_id=7, num_sge=1, sg=[v.SGE(b.mr.addr, 64, b.mr.lkey)]))
    a.qp.post_send(v.SendWR(wr_id=1, opcode=e.IBV_WR_SEND, num_sge=1,
                            sg=[v.SGE(a.mr.addr, 64, a.mr.lkey)],
                            send_flags=e.IBV_SEND_SIGNALED))
    (wc,) = b.completions(1)  # B received the SEND and its progress sent the ACK
    assert wc.status == 0 and wc.wr_id == 7
    fd = a.link.fileno()
    assert fd is not None
    ready, _, _ = select.select([fd], [], [], DEADLINE)
    assert ready, "B's ACK never reached A's socket"


def test_a_due_timer_runs_after_the_ack_in_the_socket_is_read(
        pair: tuple[_Side, _Side]) -> None:
    a, b = pair
    _send_and_leave_the_ack_in_a_socket(a, b)
    a.t += 5.0  # A was descheduled: its Local ACK Timeout is long overdue
    # An ordinary verbs call: the runtime's housekeeping after it finds the timer due.
    a.qp.post_recv(v.RecvWR(wr_id=8, num_sge=1, sg=[v.SGE(a.mr.addr, 64, a.mr.lkey)]))
    assert a.counter("retransmitted_pkts") == 0, "the ACK in the socket was taken for lost"
    assert a.counter("completer_retry") == 0
    (wc,) = a.completions(1)
    assert wc.status == 0 and wc.wr_id == 1


def test_the_progress_loop_reads_everything_before_a_late_timer(
        pair: tuple[_Side, _Side]) -> None:
    """More datagrams than one receive batch ahead of the ACK: all are read first."""
    a, b = pair
    junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        port = a.link.port
        assert port is not None
        for _ in range(3 * a.runtime.batch):  # dropped by A (no ICRC), counted
            junk.sendto(bytes(40), ("127.0.0.1", port))
    finally:
        junk.close()
    _send_and_leave_the_ack_in_a_socket(a, b)
    a.t += 5.0
    a.ctx.runtime.progress()
    assert a.counter("retransmitted_pkts") == 0, "the timer ran before the ACK was read"
    assert a.counter("rcvd_icrc_err") + a.counter("rcvd_malformed") >= 3 * a.runtime.batch
    (wc,) = a.completions(1)
    assert wc.status == 0 and wc.wr_id == 1

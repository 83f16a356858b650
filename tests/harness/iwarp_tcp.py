"""iWARP endpoints through the verbs API over TCP on the loopback, and :func:`connect`.

(Moved from tests/iwarp/test_iwarp_tcp.py, which other test files imported.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from harness.rdma_cm import poll_wcs
from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.iwarp.mpa_setup import MpaConfig

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


MB = 1 << 20


@pytest.fixture
def ctx() -> Iterator[v.Context]:
    c = v.Context(transport="iwarp")
    yield c
    c.close()


class Ep:
    def __init__(self, ctx: v.Context, size: int = MB, depth: int = 32) -> None:
        self.pd = v.PD(ctx)
        self.cq = v.CQ(ctx, 4 * depth)
        self.qp = v.QP(self.pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                             cap=v.QPCap(depth, depth, 2, 2)))
        self.qp.to_init(v.QPAttr(qp_access_flags=ACC))
        self.mr = v.MR(self.pd, size, ACC)

    def sge(self, length: int, offset: int = 0) -> v.SGE:
        return v.SGE(self.mr.addr + offset, length, self.mr.lkey)

    def recv(self, length: int, wr_id: int = 0) -> None:
        self.qp.post_recv(v.RecvWR(wr_id, 1, [self.sge(length)]))

    def send(self, op: int, length: int, wr_id: int = 0, *, remote: Ep | None = None,
             roff: int = 0, loff: int = 0, flags: int = int(e.IBV_SEND_SIGNALED),
             inv: int = 0) -> None:
        wr = v.SendWR(wr_id, None, 1 if length else 0, [self.sge(length, loff)] if length else [],
                      op, flags)
        if remote is not None:
            wr.set_wr_rdma(remote.mr.rkey, remote.mr.addr + roff)
        wr.invalidate_rkey = inv
        self.qp.post_send(wr)

    def wait(self, n: int, timeout: float = 20.0) -> list[Any]:
        return poll_wcs(self.cq, n, timeout)


def connect(ca: v.Context, cb: v.Context, a: Ep, b: Ep, cfg_a: MpaConfig | None = None,
            cfg_b: MpaConfig | None = None) -> tuple[iwconnect.Connection, iwconnect.Connection]:
    lst = iwconnect.listen(cb, 0, cfg=cfg_b)
    got: dict[str, Any] = {}

    def serve() -> None:
        try:
            got["b"] = lst.accept(b.qp, b"server-pd", timeout=10)
        except BaseException as exc:  # reported below
            got["err"] = exc

    t = threading.Thread(target=serve)
    t.start()
    conn_a = iwconnect.connect(a.qp, "127.0.0.1", lst.port, b"client-pd", cfg=cfg_a)
    t.join(10)
    lst.close()
    assert "err" not in got, got.get("err")
    return conn_a, got["b"]

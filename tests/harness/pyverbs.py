"""What the pyverbs-level tests share: bringing an RC QP to RTS towards a peer on the same
device, and waiting for one completion."""

from __future__ import annotations

import time
from typing import Any

from softrdma.compat.pyverbs import device as d
from softrdma.compat.pyverbs import enums as e
from softrdma.compat.pyverbs.addr import AHAttr, GlobalRoute
from softrdma.compat.pyverbs.cq import CQ
from softrdma.compat.pyverbs.qp import QPAttr


def rc_to_rts(ctx: d.Context, qp: Any, peer_qp: Any) -> None:
    """``qp`` (on ``ctx``) to RTS towards ``peer_qp`` on the same device: path MTU 1024,
    one read/atomic in flight, RNR timer 12, timeout 14, 7 retries of each kind."""
    a = QPAttr()
    a.path_mtu = e.IBV_MTU_1024
    a.dest_qp_num = peer_qp.qp_num
    a.max_dest_rd_atomic = a.max_rd_atomic = 1
    a.min_rnr_timer, a.timeout, a.retry_cnt, a.rnr_retry = 12, 14, 7, 7
    a.ah_attr = AHAttr(is_global=1, port_num=1,
                       gr=GlobalRoute(dgid=ctx.query_gid(1, 0), sgid_index=0))
    qp.to_rts(a)


def first_wc(cq: CQ, timeout: float) -> Any:
    """The next completion on ``cq``, busy-polled; AssertionError after ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        n, wcs = cq.poll()
        if n:
            return wcs[0]
    raise AssertionError("no completion")

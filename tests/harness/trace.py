"""Capturing softrdma's trace (``softrdma.trace``) in tests, and the RC pair on an
in-memory fabric whose packets they trace and capture."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path

from softrdma import enums as e
from softrdma import trace
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric


@contextlib.contextmanager
def captured_trace(kinds: str) -> Iterator[io.StringIO]:
    """Trace ``kinds`` (as ``SOFTRDMA_TRACE``) into a buffer; restore the loggers after."""
    names = [f"softrdma.{k}" for k in trace.KINDS]
    saved = {n: logging.getLogger(n).level for n in names}
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    top = logging.getLogger("softrdma")
    top.addHandler(handler)
    trace.configure(kinds, buf)
    try:
        yield buf
    finally:
        top.removeHandler(handler)
        for h in list(top.handlers):
            if h.get_name() == "softrdma-trace":
                top.removeHandler(h)
        for n, lvl in saved.items():
            logging.getLogger(n).setLevel(lvl)


Side = tuple[v.CQ, v.QP, v.MR]
_ALL = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


def rc_pair(fab: Fabric, ips: tuple[str, str], pcap: Path | None = None,
            roce_ver: str = "2") -> tuple[list[v.Context], list[Side]]:
    """Two devices on ``fab`` (RoCE ``roce_ver``, captured to ``pcap`` if given), each with
    a CQ, a 4 KiB MR and an RC QP in RTS towards the other (path MTU 1024, PSN 7)."""
    ctxs = [v.Context(fabric=fab.link(ip, roce_ver=roce_ver), pcap=pcap) for ip in ips]
    sides = []
    for ctx in ctxs:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 16)
        qp = v.QP(pd, v.QPInitAttr(e.IBV_QPT_RC, scq=cq, rcq=cq, cap=v.QPCap(4, 4, 1, 1)))
        sides.append((cq, qp, v.MR(pd, 4096, _ALL)))
    for (_, qp, _), (_, peer, _), pctx in ((sides[0], sides[1], ctxs[1]),
                                           (sides[1], sides[0], ctxs[0])):
        at = v.QPAttr(path_mtu=e.IBV_MTU_1024, dest_qp_num=peer.qp_num, sq_psn=7, rq_psn=7,
                      max_rd_atomic=1, max_dest_rd_atomic=1, min_rnr_timer=1, timeout=8,
                      retry_cnt=7, rnr_retry=7)
        at.qp_access_flags = _ALL
        at.ah_attr = v.AHAttr(gr=v.GlobalRoute(dgid=pctx.query_gid(1, 0), hop_limit=64))
        qp.to_rts(at)
    return ctxs, sides


def rc_send(fab: Fabric, sides: list[Side], n: int) -> None:
    """A SEND of ``n`` bytes from the first side to the second, run to its completion."""
    (cqa, qpa, mra), (_cqb, qpb, mrb) = sides
    qpb.post_recv(v.RecvWR(1, 1, [v.SGE(mrb.addr, 4096, mrb.lkey)]))
    qpa.post_send(v.SendWR(2, None, 1, [v.SGE(mra.addr, n, mra.lkey)]))
    fab.clock.run()
    assert [w.status for w in cqa.poll(4)[1]] == [e.IBV_WC_SUCCESS]

"""Shared receive queues (IBA 10.2.9; ``ibv_create_srq``).

Checks as rxe ``rxe_srq_chk_attr``: ``max_wr`` 1..max_srq_wr, ``max_sge`` 1..max_srq_sge,
``srq_limit`` <= ``max_wr``; a resize may not shrink below the WQEs queued (EINVAL).
When the queue drops below a non-zero limit the engine raises
``IBV_EVENT_SRQ_LIMIT_REACHED`` once and disarms the limit (IBA 10.2.9.6).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import enums as e
from ..errors import InvalidArgument
from ..seam.queues import EngineSRQ, RecvFeed
from ._args import uint
from ._object import VerbsObject
from .device import MAX_SRQ_SGE, MAX_SRQ_WR
from .pd import PD, open_pd
from .wr import RecvWR, build_recv_wqes

__all__ = ["SrqAttr", "SrqInitAttr", "SRQ"]


@dataclass(eq=False, slots=True)
class SrqAttr:
    """``struct ibv_srq_attr``."""

    max_wr: int = 100
    max_sge: int = 1
    srq_limit: int = 0


class SrqInitAttr:
    """``struct ibv_srq_init_attr``."""

    __slots__ = ("attr", "srq_context")

    def __init__(self, attr: SrqAttr | None = None, srq_context: object = None) -> None:
        self.attr = attr if attr is not None else SrqAttr()
        self.srq_context = srq_context


def check_recv_feed(feed: object) -> None:
    """InvalidArgument naming ``feed`` unless it is a :class:`RecvFeed` (``set_recv_feed``
    of a QP or an SRQ)."""
    if not (callable(getattr(feed, "drain", None)) and callable(getattr(feed, "reopen", None))):
        raise InvalidArgument("feed", "a RecvFeed has drain() and reopen()")


class SRQ(VerbsObject):
    """A shared receive queue of ``pd``; QPs created with it close when it closes."""

    _close_rank = 3

    def __init__(self, pd: PD, init_attr: SrqInitAttr) -> None:
        super().__init__()
        pd = open_pd(pd)
        if not isinstance(init_attr, SrqInitAttr):
            raise InvalidArgument("init_attr", f"expected SrqInitAttr, got {type(init_attr).__name__}")
        a = init_attr.attr
        max_wr = uint(a.max_wr, MAX_SRQ_WR, "attr.max_wr", 1)
        max_sge = uint(a.max_sge, MAX_SRQ_SGE, "attr.max_sge", 1)
        limit = uint(a.srq_limit, max_wr, "attr.srq_limit", 0)
        ctx = pd.ctx
        self._runtime = ctx.runtime
        with self._counting(ctx.objects, "max_srq"):
            self.engine: EngineSRQ = ctx.runtime.call(ctx.port.create_srq, pd.protection_domain,
                                                      max_wr, max_sge, limit)
        self._depend_on(pd)
        self.pd = pd
        self.ctx = ctx
        self.srq_context = init_attr.srq_context
        ctx._register_owner(self.engine, self)

    def post_recv(self, wr: RecvWR | list[RecvWR]) -> None:
        """Post receive WRs (``ibv_post_srq_recv``); ResourceError when full."""
        self._check()
        wqes, err = build_recv_wqes(wr, self.engine.max_sge)
        if wqes:
            self._runtime.call(self.engine.post_recvs, wqes)
        if err is not None:
            raise err

    def modify(self, attr: SrqAttr, attr_mask: int) -> None:
        """Resize (IBV_SRQ_MAX_WR) and/or arm the limit (IBV_SRQ_LIMIT)."""
        self._check()
        if not isinstance(attr_mask, int) or attr_mask & ~int(e.IBV_SRQ_MAX_WR | e.IBV_SRQ_LIMIT):
            raise InvalidArgument("attr_mask", f"unknown SRQ attribute bits {attr_mask!r}")
        max_wr: int | None = None
        limit: int | None = None
        cur_max = self.engine.max_wr
        if attr_mask & e.IBV_SRQ_MAX_WR:
            max_wr = uint(attr.max_wr, MAX_SRQ_WR, "attr.max_wr", 1)
            queued = self._runtime.call(self.engine.level)
            if max_wr < queued:
                raise InvalidArgument("attr.max_wr", f"{max_wr} < {queued} queued WQEs")
            cur_max = max_wr
        if attr_mask & e.IBV_SRQ_LIMIT:
            limit = uint(attr.srq_limit, cur_max, "attr.srq_limit", 0)
        self._runtime.call(self.engine.modify, max_wr, limit)

    def set_recv_feed(self, feed: RecvFeed | None) -> None:
        """Take receives posted into ``feed`` as well as through :meth:`post_recv` (a
        softrdma extension, as :meth:`softrdma.verbs.QP.set_recv_feed`; None detaches it,
        its receives kept): a receive ring in another language's memory (softrdma.capi's
        ``ibv_post_srq_recv``). The feed stores a receive only while its receives and the
        queue's length stay below the SRQ's ``max_wr`` as of this call; the SRQ keeps the
        feed closed while a limit is armed (IBA 10.2.9.6: the level it checks must be
        exact) and while a resize leaves ``max_wr`` below that capacity. An XRC SRQ, whose
        receives are taken by the XRC domain's TGT QPs, has none."""
        self._check()
        if feed is not None:
            if type(self.engine).post_recv is not EngineSRQ.post_recv:
                raise InvalidArgument("srq", "an XRC SRQ has no feed")
            check_recv_feed(feed)
        engine = self.engine
        self._runtime.call(engine.set_feed, feed, engine.max_wr)

    def query(self) -> SrqAttr:
        self._check()
        s = self.engine
        return SrqAttr(s.max_wr, s.max_sge, s.srq_limit)

    def _release(self) -> None:
        self.ctx._unregister_owner(self.engine)

"""``pyverbs.srq``: shared receive queues (IBA 10.2.9; rdma-core ``pyverbs/srq.pyx`` API).

:class:`SRQ` is a :class:`softrdma.verbs.SRQ`. ``SRQ(pd, SrqInitAttr)`` is
``ibv_create_srq``; ``SRQ(ctx, SrqInitAttrEx)`` is ``ibv_create_srq_ex``: a basic SRQ,
or with ``srq_type = IBV_SRQT_XRC`` an XRC SRQ of an XRC domain with its own CQ
(``softrdma.verbs.XrcSRQ``; the mask must name the PD, the XRCD and the CQ, EINVAL
otherwise), whose number ``get_srq_num`` gives. Tag-matching SRQs fail with EOPNOTSUPP,
as on rxe. Limits and checks are rxe's (``rxe_srq_chk_attr``, EINVAL).
"""

from __future__ import annotations

import errno
from typing import Any

from softrdma import verbs as _v

from . import libibverbs_enums as e
from .base import PyverbsCM, PyverbsObject, translate
from .cq import CQ
from .device import Context
from .pd import PD
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError
from .wr import RecvWR
from .xrcd import XRCD

__all__ = ["SrqAttr", "SrqInitAttr", "SrqInitAttrEx", "SRQ", "OpsWr"]

_SRQT_XRC = int(e.IBV_SRQT_XRC)
SIA = e.ibv_srq_init_attr_mask


class SrqAttr(_v.SrqAttr, PyverbsObject):
    """``struct ibv_srq_attr``: verbs' :class:`~softrdma.verbs.srq.SrqAttr`."""


class SrqInitAttr(PyverbsObject):
    """``struct ibv_srq_init_attr``."""

    def __init__(self, attr: SrqAttr | None = None) -> None:
        a = attr if attr is not None else SrqAttr()
        self.max_wr = a.max_wr
        self.max_sge = a.max_sge
        self.srq_limit = a.srq_limit


class SrqInitAttrEx(PyverbsObject):
    """``struct ibv_srq_init_attr_ex``."""

    def __init__(self, max_wr: int = 100, max_sge: int = 1, srq_limit: int = 0) -> None:
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.srq_limit = srq_limit
        self.srq_type = int(e.IBV_SRQT_BASIC)
        self.pd: Any = None
        self.xrcd: Any = None
        self.cq: Any = None
        self.comp_mask = 0
        self.max_num_tags = 0
        self.max_ops = 0


class OpsWr(PyverbsCM):
    """``struct ibv_ops_wr`` (tag-matching SRQ operations)."""

    def __init__(self, wr_id: int = 0, opcode: int = 0, flags: int = 0, ops_handle: int = 0,
                 unexpected_cnt: int = 0, recv_wr_id: int = 0, tag: int = 0,
                 mask: int = 0, sg: Any = None, next_wr: Any = None) -> None:
        self.wr_id = wr_id
        self.opcode = opcode
        self.flags = flags
        self.handle = ops_handle
        self.unexpected_cnt = unexpected_cnt
        self.recv_wr_id = recv_wr_id
        self.tag = tag
        self.mask = mask
        self.sg = sg
        self.next_wr = next_wr


class SRQ(_v.SRQ, PyverbsCM):
    """A shared receive queue."""

    def __new__(cls, creator: Any, attr: Any) -> SRQ:
        if cls is SRQ and isinstance(attr, SrqInitAttrEx) and attr.srq_type == _SRQT_XRC:
            return object.__new__(_XrcSRQ)
        return object.__new__(cls)

    def __init__(self, creator: Any, attr: Any) -> None:
        if isinstance(creator, Context):
            if not isinstance(attr, SrqInitAttrEx):
                raise PyverbsUserError("An SRQ created on a Context needs a SrqInitAttrEx")
            if attr.srq_type != e.IBV_SRQT_BASIC:
                raise PyverbsRDMAError("Failed to create SRQ", errno.EOPNOTSUPP)
            if not attr.comp_mask & SIA.IBV_SRQ_INIT_ATTR_PD or not isinstance(attr.pd, PD):
                raise PyverbsRDMAError("Failed to create SRQ", errno.EINVAL)
            pd = attr.pd
        elif isinstance(creator, PD):
            if not isinstance(attr, SrqInitAttr):
                raise PyverbsUserError("An SRQ created on a PD needs a SrqInitAttr")
            pd = creator
        else:
            raise PyverbsUserError(f"SRQ creator must be a PD or a Context, not {type(creator)}")
        init = _v.SrqInitAttr(_v.SrqAttr(attr.max_wr, attr.max_sge, attr.srq_limit))
        with translate("Failed to create SRQ"):
            super().__init__(pd, init)

    def get_srq_num(self) -> int:
        """``ibv_get_srq_num``: only XRC SRQs have a number (EOPNOTSUPP here)."""
        raise PyverbsRDMAError("Failed to retrieve SRQ number", errno.EOPNOTSUPP)

    def _check_xrc(self, ctx: Any, attr: SrqInitAttrEx) -> tuple[Any, Any, Any]:
        """The PD, XRCD and CQ of an XRC SRQ's ``ibv_srq_init_attr_ex`` (EINVAL if any is
        missing from the mask or of another context)."""
        need = int(SIA.IBV_SRQ_INIT_ATTR_PD | SIA.IBV_SRQ_INIT_ATTR_XRCD | SIA.IBV_SRQ_INIT_ATTR_CQ)
        if attr.comp_mask & need != need or not isinstance(attr.pd, PD) \
                or not isinstance(attr.xrcd, XRCD) or not isinstance(attr.cq, CQ):
            raise PyverbsRDMAError("Failed to create SRQ", errno.EINVAL)
        if any(o.ctx is not ctx for o in (attr.pd, attr.xrcd, attr.cq)):
            raise PyverbsRDMAError("Failed to create SRQ", errno.EINVAL)
        return attr.pd, attr.xrcd, attr.cq

    def post_recv(self, wr: RecvWR, bad_wr: RecvWR | None = None) -> None:  # type: ignore[override]
        """``ibv_post_srq_recv`` (the ``next_wr`` chain)."""
        wrs = []
        w: RecvWR | None = wr
        while w is not None:
            wrs.append(w.to_verbs())
            w = w.next_wr
        with translate("Failed to post receive to SRQ"):
            super().post_recv(wrs)

    def post_srq_ops(self, wr: OpsWr, bad_wr: OpsWr | None = None) -> None:
        raise PyverbsRDMAError("Failed to post SRQ ops", errno.EOPNOTSUPP)

    def modify(self, attr: SrqAttr, comp_mask: int) -> None:  # type: ignore[override]
        """``ibv_modify_srq``."""
        with translate("Failed to modify SRQ"):
            super().modify(_v.SrqAttr(attr.max_wr, attr.max_sge, attr.srq_limit), comp_mask)

    def query(self) -> SrqAttr:
        """``ibv_query_srq``."""
        with translate("Failed to query SRQ"):
            a = super().query()
        return SrqAttr(a.max_wr, a.max_sge, a.srq_limit)

    def close(self) -> None:
        _v.SRQ.close(self)


class _XrcSRQ(_v.XrcSRQ, SRQ):
    """An XRC SRQ (``ibv_create_srq_ex`` with ``IBV_SRQT_XRC``)."""

    def __init__(self, creator: Any, attr: Any) -> None:
        if not isinstance(creator, Context):
            raise PyverbsUserError("An XRC SRQ is created on a Context")
        pd, xrcd, cq = self._check_xrc(creator, attr)
        init = _v.SrqInitAttr(_v.SrqAttr(attr.max_wr, attr.max_sge, attr.srq_limit))
        with translate("Failed to create SRQ"):
            _v.XrcSRQ.__init__(self, pd, xrcd, cq, init)

    def get_srq_num(self) -> int:
        """``ibv_get_srq_num``."""
        with translate("Failed to retrieve SRQ number"):
            return _v.XrcSRQ.get_srq_num(self)

    def close(self) -> None:
        _v.XrcSRQ.close(self)

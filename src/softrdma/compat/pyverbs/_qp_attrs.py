"""pyverbs' QP attribute objects (rdma-core ``pyverbs/qp.pyx``): ``QPCap``,
``QPInitAttr(Ex)``, ``QPAttr`` (``struct ibv_qp_cap``, ``ibv_qp_init_attr(_ex)``,
``ibv_qp_attr``; IBA 11.2.4.1) over :mod:`softrdma.verbs`' ones, ``ECE`` and
``DataBuffer``, and the conversions from the verbs layer's attributes. Re-exported by
:mod:`.qp`, their pyverbs home.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from softrdma import verbs as _v

from . import libibverbs_enums as e
from .addr import AHAttr, GlobalRoute
from .base import Alias, Copied, Forward, PyverbsCM, PyverbsObject
from .cq import CQ
from .pyverbs_error import PyverbsUserError
from .utils import flags_to_str

__all__ = ["QPCap", "QPInitAttr", "QPInitAttrEx", "QPAttr", "ECE", "DataBuffer",
           "ah_attr_from_verbs", "qp_attr_from_verbs"]

UD = int(e.IBV_QPT_UD)
M = e.ibv_qp_attr_mask


class QPCap(_v.QPCap, PyverbsObject):
    """``struct ibv_qp_cap``: softrdma's, with pyverbs's ``copy`` and text."""

    def copy(self) -> QPCap:
        return replace(self)

    def __str__(self) -> str:
        return (f"max send wrs: {self.max_send_wr}, max recv wrs: {self.max_recv_wr}, "
                f"max send sges: {self.max_send_sge}, max recv sges: {self.max_recv_sge}, "
                f"max inline data: {self.max_inline_data}")


class _CapView(PyverbsObject):
    """Flat ``max_*`` accessors over a ``_cap`` (pyverbs init attributes)."""

    _cap: QPCap
    cap = Copied[QPCap](QPCap.copy)

    max_send_wr = Forward[int]("_cap")
    max_recv_wr = Forward[int]("_cap")
    max_send_sge = Forward[int]("_cap")
    max_recv_sge = Forward[int]("_cap")
    max_inline_data = Forward[int]("_cap")


def _check_cq(cq: Any) -> Any:
    if cq is not None and not isinstance(cq, CQ):
        raise PyverbsUserError(f"Expected CQ/CQEX, got {type(cq)}")
    return cq


class QPInitAttr(_CapView):
    """``struct ibv_qp_init_attr`` (``ibv_create_qp``)."""

    def __init__(self, qp_type: int = UD, qp_context: Any = None, scq: Any = None,
                 rcq: Any = None, srq: Any = None, cap: QPCap | None = None,
                 sq_sig_all: int = 1) -> None:
        self._cap = cap.copy() if cap is not None else QPCap(0, 0, 0, 0, 0)
        self.qp_context = qp_context
        self.scq = _check_cq(scq)
        self.rcq = _check_cq(rcq)
        self.srq = srq
        self.qp_type = qp_type
        self.sq_sig_all = sq_sig_all

    send_cq = Alias[Any]("scq", _check_cq)
    recv_cq = Alias[Any]("rcq", _check_cq)


class QPInitAttrEx(QPInitAttr):
    """``struct ibv_qp_init_attr_ex`` (``ibv_create_qp_ex``)."""

    def __init__(self, qp_type: int = UD, qp_context: Any = None, scq: Any = None,
                 rcq: Any = None, srq: Any = None, cap: QPCap | None = None,
                 sq_sig_all: int = 0, comp_mask: int = 0, pd: Any = None, xrcd: Any = None,
                 create_flags: int = 0, max_tso_header: int = 0, source_qpn: int = 0,
                 hash_conf: Any = None, ind_table: Any = None, send_ops_flags: int = 0) -> None:
        super().__init__(qp_type, qp_context, scq, rcq, srq, cap, sq_sig_all)
        self.comp_mask = comp_mask
        self.pd = pd
        self.xrcd = xrcd
        self.create_flags = create_flags
        self.max_tso_header = max_tso_header
        self.source_qpn = source_qpn
        self.hash_conf = hash_conf
        self.ind_table = ind_table
        self.send_ops_flags = send_ops_flags

    def mask_to_str(self, mask: int) -> str:
        return flags_to_str(mask, {1: "PD", 2: "XRCD", 4: "Create Flags", 8: "Max TSO header",
                                   16: "Indirection Table", 32: "RX hash"})

    def flags_to_str(self, flags: int) -> str:
        return flags_to_str(flags, {1: "Block self mcast loopback", 2: "Scatter FCS",
                                    4: "CVLAN stripping", 8: "Source QPN",
                                    16: "PCI write end padding"})


_QPATTR_INTS = (
    "path_mig_state", "qkey", "rq_psn", "sq_psn", "dest_qp_num", "qp_access_flags",
    "pkey_index", "alt_pkey_index", "en_sqd_async_notify", "sq_draining", "max_rd_atomic",
    "max_dest_rd_atomic", "min_rnr_timer", "timeout", "retry_cnt", "rnr_retry",
    "alt_port_num", "alt_timeout", "rate_limit",
)


def ah_attr_from_verbs(vah: Any) -> AHAttr:
    """The pyverbs :class:`AHAttr` of a softrdma :class:`~softrdma.verbs.AHAttr`."""
    g = vah.gr
    gr = GlobalRoute(g.dgid.raw, g.flow_label, g.sgid_index, g.hop_limit,
                     g.traffic_class) if g is not None else None
    return AHAttr(vah.dlid, vah.sl, vah.src_path_bits, vah.static_rate, vah.is_global,
                  vah.port_num, gr)


def qp_attr_from_verbs(va: _v.QPAttr) -> QPAttr:
    """The pyverbs :class:`QPAttr` of a softrdma :class:`~softrdma.verbs.QPAttr`."""
    a = QPAttr(va.qp_state, va.cur_qp_state, va.port_num, va.path_mtu)
    for f in _QPATTR_INTS:
        setattr(a, f, int(getattr(va, f) or 0))
    vc = va.cap
    a.cap = QPCap(vc.max_send_wr, vc.max_recv_wr, vc.max_send_sge, vc.max_recv_sge,
                  vc.max_inline_data)
    if va.ah_attr is not None:
        a.ah_attr = ah_attr_from_verbs(va.ah_attr)
    return a


class QPAttr(PyverbsObject):
    """``struct ibv_qp_attr``; ``ah_attr``/``alt_ah_attr``/``cap`` are copied in and out
    (C struct semantics)."""

    # the integer fields (_QPATTR_INTS), set to 0 in __init__
    path_mig_state: int
    qkey: int
    rq_psn: int
    sq_psn: int
    dest_qp_num: int
    qp_access_flags: int
    pkey_index: int
    alt_pkey_index: int
    en_sqd_async_notify: int
    sq_draining: int
    max_rd_atomic: int
    max_dest_rd_atomic: int
    min_rnr_timer: int
    timeout: int
    retry_cnt: int
    rnr_retry: int
    alt_port_num: int
    alt_timeout: int
    rate_limit: int

    def __init__(self, qp_state: int = int(e.IBV_QPS_INIT),
                 cur_qp_state: int = int(e.IBV_QPS_RESET), port_num: int = 1,
                 path_mtu: int = int(e.IBV_MTU_1024)) -> None:
        self.qp_state = qp_state
        self.cur_qp_state = cur_qp_state
        self.port_num = port_num
        self.path_mtu = path_mtu
        for f in _QPATTR_INTS:
            setattr(self, f, 0)
        self._cap = QPCap(0, 0, 0, 0, 0)
        self._ah_attr = AHAttr(port_num=0)
        self._alt_ah_attr = AHAttr(port_num=0)

    cap = Copied[QPCap](QPCap.copy)
    ah_attr = Copied[AHAttr](AHAttr.copy)
    alt_ah_attr = Copied[AHAttr](AHAttr.copy)

    def to_verbs(self, mask: int) -> _v.QPAttr:
        """The softrdma :class:`~softrdma.verbs.QPAttr` with this content."""
        v = _v.QPAttr(qp_state=self.qp_state, cur_qp_state=self.cur_qp_state,
                      port_num=self.port_num, path_mtu=self.path_mtu)
        for f in _QPATTR_INTS:
            setattr(v, f, getattr(self, f))
        c = self._cap
        v.cap = _v.QPCap(c.max_send_wr, c.max_recv_wr, c.max_send_sge, c.max_recv_sge,
                         c.max_inline_data)
        if mask & M.IBV_QP_AV:
            v.ah_attr = self._ah_attr.to_verbs()
        if mask & M.IBV_QP_ALT_PATH:
            v.alt_ah_attr = self._alt_ah_attr.to_verbs()
        return v

    def __str__(self) -> str:
        fields = ("qp_state", "cur_qp_state", "path_mtu", *_QPATTR_INTS, "port_num")
        return "".join(f"{f:22}: {getattr(self, f)}\n" for f in fields)


class ECE(PyverbsCM):
    """``struct ibv_ece`` (enhanced connection establishment)."""

    def __init__(self, vendor_id: int = 0, options: int = 0, comp_mask: int = 0) -> None:
        self.vendor_id = vendor_id
        self.options = options
        self.comp_mask = comp_mask


class DataBuffer(PyverbsCM):
    """``struct ibv_data_buf`` (``wr_set_inline_data_list``)."""

    def __init__(self, addr: int, length: int) -> None:
        self.addr = addr
        self.length = length

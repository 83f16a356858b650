"""A QP's attributes (``struct ibv_qp_cap``, ``ibv_qp_init_attr``, ``ibv_qp_attr``;
IBA 11.2.4.1) and the checks of ``ibv_modify_qp``'s attributes (IBA 11.2.4.2; rxe
``rxe_qp_chk_attr``, the steps :mod:`.qp` lists): why a transition is refused and each
given attribute in range.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from types import SimpleNamespace
from typing import Any

from .. import enums as e
from ..errors import InvalidArgument
from ..seam.protocols import ModifyAttrs
from ..seam.states import QPT_UD, RTR, RTS, SQD, SQE, state_name
from . import qp_rules
from ._args import U24, U32, uint
from .ah import AHAttr, address_vector
from .cq import CQ
from .device import MAX_QP_RD_ATOM, Context
from .mr import ACCESS_SUPPORTED
from .srq import SRQ

__all__ = ["QPCap", "QPInitAttr", "QPAttr", "M", "explain_refusal", "check_attrs",
           "state_text"]

M = e.ibv_qp_attr_mask
#: the mask bits as plain ints: IntFlag's ``&`` is a Python-level call, and
#: :func:`check_attrs` tests each bit on every modify
_BIT = SimpleNamespace(**{m.name: int(m) for m in M if m.name is not None})
UD = QPT_UD
_QP_ACCESS = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
                 | e.IBV_ACCESS_REMOTE_ATOMIC)


@dataclass(eq=False, slots=True)
class QPCap:
    """``struct ibv_qp_cap``."""

    max_send_wr: int = 1
    max_recv_wr: int = 10
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = 0


@dataclass(eq=False, slots=True)
class QPInitAttr:
    """``struct ibv_qp_init_attr`` (pyverbs names ``scq``/``rcq``)."""

    qp_type: int = UD
    qp_context: object = None
    scq: CQ | None = None
    rcq: CQ | None = None
    srq: SRQ | None = None
    cap: QPCap = field(default_factory=QPCap)
    sq_sig_all: int = 0

    @property
    def send_cq(self) -> CQ | None:
        return self.scq

    @property
    def recv_cq(self) -> CQ | None:
        return self.rcq


def _no_qp_cap() -> QPCap:
    return QPCap(0, 0, 0, 0, 0)


@dataclass(init=False, repr=False, eq=False, slots=True)
class QPAttr:
    """``struct ibv_qp_attr``: every field by name, pyverbs defaults (INIT from RESET,
    port 1, path MTU 1024), the rest 0. A name that is not a field is refused
    (:class:`~softrdma.errors.InvalidArgument` naming it)."""

    qp_state: int = int(e.IBV_QPS_INIT)
    cur_qp_state: int = int(e.IBV_QPS_RESET)
    path_mtu: int = int(e.IBV_MTU_1024)
    path_mig_state: int = 0
    qkey: int = 0
    rq_psn: int = 0
    sq_psn: int = 0
    dest_qp_num: int = 0
    qp_access_flags: int = 0
    cap: QPCap = field(default_factory=_no_qp_cap)
    ah_attr: AHAttr | None = None
    alt_ah_attr: AHAttr | None = None
    pkey_index: int = 0
    alt_pkey_index: int = 0
    en_sqd_async_notify: int = 0
    sq_draining: int = 0
    max_rd_atomic: int = 0
    max_dest_rd_atomic: int = 0
    min_rnr_timer: int = 0
    port_num: int = 1
    timeout: int = 0
    retry_cnt: int = 0
    rnr_retry: int = 0
    alt_port_num: int = 0
    alt_timeout: int = 0
    rate_limit: int = 0

    def __init__(self, qp_state: int = int(e.IBV_QPS_INIT),
                 cur_qp_state: int = int(e.IBV_QPS_RESET), port_num: int = 1,
                 path_mtu: int = int(e.IBV_MTU_1024), **fields: Any) -> None:
        for name, value in _QPATTR_VALUES:
            setattr(self, name, value)
        self.cap = _no_qp_cap()
        self.qp_state = qp_state
        self.cur_qp_state = cur_qp_state
        self.port_num = port_num
        self.path_mtu = path_mtu
        for name, value in fields.items():
            if name not in QPATTR_FIELDS:
                raise InvalidArgument(f"qp_attr.{name}", "no such QP attribute")
            setattr(self, name, value)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in QPATTR_FIELDS
                          if getattr(self, n) not in (0, None))
        return f"QPAttr({inner})"


QPATTR_FIELDS = tuple(f.name for f in dataclass_fields(QPAttr))
#: the fields with a plain default value (``cap`` has a factory)
_QPATTR_VALUES = tuple((f.name, f.default) for f in dataclass_fields(QPAttr)
                       if not callable(f.default_factory))


def _mask_names(mask: int) -> str:
    names = [m.name for m in M if m.value & mask and m.name is not None]
    return "|".join(n.replace("IBV_QP_", "") for n in names) or "0"


def state_text(state: int) -> str:
    return state_name(state).replace("IBV_QPS_", "")


def explain_refusal(qp_type: int, cur: int, new: int, mask: int) -> str:
    """Why ``ib_modify_qp_is_ok`` (:mod:`.qp_rules`) refuses ``cur`` -> ``new`` with
    ``mask`` for a QP of ``qp_type``: the text of the EINVAL."""
    t = e.ibv_qp_type(qp_type).name.replace("IBV_QPT_", "")
    tr = f"{state_text(cur)}->{state_text(new)}"
    if mask & M.IBV_QP_CUR_STATE and cur not in (RTR, RTS, SQD,
                                                   SQE):
        return f"IBV_QP_CUR_STATE is not allowed from {state_text(cur)}"
    if qp_rules.rule_for(cur, new) is None:
        return f"illegal transition {tr}"
    req = qp_rules.required_mask(cur, new, qp_type)
    opt = qp_rules.optional_mask(cur, new, qp_type)
    missing = req & ~mask
    if missing:
        return f"{t} {tr} requires {_mask_names(missing)}"
    extra = mask & ~(req | opt | int(M.IBV_QP_STATE))
    return f"{t} {tr} does not allow {_mask_names(extra)}"


def check_attrs(ctx: Context, pkeys: Sized, a: QPAttr, mask: int) -> ModifyAttrs:
    """The attributes ``mask`` names, each checked in range (rxe ``rxe_qp_chk_attr``,
    step 4 of :mod:`.qp`'s list) for a QP of ``ctx`` whose port holds ``pkeys``; what the
    engine is given (``QPEngine.modify``)."""
    out: ModifyAttrs = {}
    mask = int(mask)
    if mask & _BIT.IBV_QP_PORT:
        if a.port_num != 1:
            raise InvalidArgument("qp_attr.port_num", f"must be 1, got {a.port_num!r}")
        out["port_num"] = 1
    if mask & _BIT.IBV_QP_PKEY_INDEX:
        n = len(pkeys)
        out["pkey_index"] = uint(a.pkey_index, n - 1, "qp_attr.pkey_index")
    if mask & _BIT.IBV_QP_QKEY:
        out["qkey"] = uint(a.qkey, U32, "qp_attr.qkey")
    if mask & _BIT.IBV_QP_AV:
        if a.ah_attr is None:
            raise InvalidArgument("qp_attr.ah_attr", "IBV_QP_AV given without ah_attr")
        out["ah"] = address_vector(ctx, a.ah_attr, "qp_attr.ah_attr")
    if mask & _BIT.IBV_QP_ALT_PATH:
        raise InvalidArgument("qp_attr.alt_ah_attr", "RoCE has no alternate path (APM is IB only)")
    if mask & _BIT.IBV_QP_PATH_MTU:
        mtu = a.path_mtu
        if mtu not in (1, 2, 3, 4, 5):
            raise InvalidArgument("qp_attr.path_mtu", f"not an ibv_mtu value: {mtu!r}")
        active = ctx.active_mtu
        if mtu > active:
            raise InvalidArgument("qp_attr.path_mtu", f"{128 << mtu} is above the port's "
                                  f"active MTU {128 << active}")
        out["path_mtu"] = mtu
    if mask & _BIT.IBV_QP_TIMEOUT:
        out["timeout"] = uint(a.timeout, 31, "qp_attr.timeout")
    if mask & _BIT.IBV_QP_RETRY_CNT:
        out["retry_cnt"] = uint(a.retry_cnt, 7, "qp_attr.retry_cnt")
    if mask & _BIT.IBV_QP_RNR_RETRY:
        out["rnr_retry"] = uint(a.rnr_retry, 7, "qp_attr.rnr_retry")
    if mask & _BIT.IBV_QP_MIN_RNR_TIMER:
        out["min_rnr_timer"] = uint(a.min_rnr_timer, 31, "qp_attr.min_rnr_timer")
    if mask & _BIT.IBV_QP_MAX_QP_RD_ATOMIC:
        out["max_rd_atomic"] = uint(a.max_rd_atomic, MAX_QP_RD_ATOM, "qp_attr.max_rd_atomic")
    if mask & _BIT.IBV_QP_MAX_DEST_RD_ATOMIC:
        out["max_dest_rd_atomic"] = uint(a.max_dest_rd_atomic, MAX_QP_RD_ATOM,
                                          "qp_attr.max_dest_rd_atomic")
    if mask & _BIT.IBV_QP_RQ_PSN:
        out["rq_psn"] = uint(a.rq_psn, U32, "qp_attr.rq_psn") & 0xFFFFFF
    if mask & _BIT.IBV_QP_SQ_PSN:
        out["sq_psn"] = uint(a.sq_psn, U32, "qp_attr.sq_psn") & 0xFFFFFF
    if mask & _BIT.IBV_QP_DEST_QPN:
        out["dest_qp_num"] = uint(a.dest_qp_num, U24, "qp_attr.dest_qp_num")
    if mask & _BIT.IBV_QP_ACCESS_FLAGS:
        acc = a.qp_access_flags
        if not isinstance(acc, int) or acc < 0 or acc & ~ACCESS_SUPPORTED:
            raise InvalidArgument("qp_attr.qp_access_flags", f"unknown access flags {acc!r}")
        out["access_flags"] = acc & _QP_ACCESS
    if mask & _BIT.IBV_QP_EN_SQD_ASYNC_NOTIFY:
        out["en_sqd_async_notify"] = bool(a.en_sqd_async_notify)
    if mask & _BIT.IBV_QP_PATH_MIG_STATE:
        uint(a.path_mig_state, int(e.IBV_MIG_ARMED), "qp_attr.path_mig_state")
    return out

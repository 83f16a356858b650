"""The QP state-transition table of ``ibv_modify_qp`` (IBA 10.3.1, IBA 11.2.4.2).

For every legal ``(current state, next state)`` pair and QP type, the attributes that a
Modify QP call *must* carry (``required``) and *may* carry (``optional``), exactly as
the Linux kernel's ``qp_state_table`` in ``drivers/infiniband/core/verbs.c`` (the table
``ib_modify_qp_is_ok`` checks for every provider, rxe included). Only the QP types
softrdma implements (RC, UC, UD, and XRC: ``IB_QPT_XRC_INI`` = ``IBV_QPT_XRC_SEND``,
``IB_QPT_XRC_TGT`` = ``IBV_QPT_XRC_RECV``) are listed; RoCE has no SMI/GSI *types* at the verbs
level (QP1 is created internally) and no alternate path, but the masks keep
``IBV_QP_ALT_PATH`` / ``IBV_QP_PATH_MIG_STATE`` where the kernel has them: the mask
check accepts them and the attribute check then rejects alternate paths on RoCE, as the
kernel does (``_ib_modify_qp``: "APM only for IB", EINVAL).

Mask bits are the ``IBV_QP_*`` values of :mod:`softrdma.enums`.
"""

from __future__ import annotations

from typing import Final

from ..enums import ibv_qp_attr_mask as M
from ..enums import ibv_qp_type as T
from ..seam.states import ERR, INIT, QPT_RC, QPT_UC, QPT_UD, RESET, RTR, RTS, SQD, SQE

__all__ = ["Rule", "QP_STATE_TABLE", "STANDARD_MASK", "IGNORED_MASK", "modify_is_ok",
           "user_mask", "rule_for", "required_mask", "optional_mask"]

RC: Final = QPT_RC
UC: Final = QPT_UC
UD: Final = QPT_UD
XI: Final = int(T.IBV_QPT_XRC_SEND)  # IB_QPT_XRC_INI
XT: Final = int(T.IBV_QPT_XRC_RECV)  # IB_QPT_XRC_TGT

# IB_QP_ATTR_STANDARD_BITS = GENMASK(20, 0): bits outside it -> EOPNOTSUPP (rxe_modify_qp).
STANDARD_MASK: Final = (1 << 21) - 1


class Rule:
    """One legal transition: per-QP-type required and optional attribute masks."""

    __slots__ = ("required", "optional")

    def __init__(self, required: dict[int, int] | None = None,
                 optional: dict[int, int] | None = None) -> None:
        self.required: dict[int, int] = required or {}
        self.optional: dict[int, int] = optional or {}

    def __repr__(self) -> str:
        return f"Rule(required={self.required!r}, optional={self.optional!r})"


_STATE = int(M.IBV_QP_STATE)
_CUR = int(M.IBV_QP_CUR_STATE)
_PKEY = int(M.IBV_QP_PKEY_INDEX)
_PORT = int(M.IBV_QP_PORT)
_QKEY = int(M.IBV_QP_QKEY)
_ACCESS = int(M.IBV_QP_ACCESS_FLAGS)
_AV = int(M.IBV_QP_AV)
_MTU = int(M.IBV_QP_PATH_MTU)
_DQPN = int(M.IBV_QP_DEST_QPN)
_RQPSN = int(M.IBV_QP_RQ_PSN)
_SQPSN = int(M.IBV_QP_SQ_PSN)
_MDRA = int(M.IBV_QP_MAX_DEST_RD_ATOMIC)
_MQRA = int(M.IBV_QP_MAX_QP_RD_ATOMIC)
_RNRT = int(M.IBV_QP_MIN_RNR_TIMER)
_TIMEOUT = int(M.IBV_QP_TIMEOUT)
_RETRY = int(M.IBV_QP_RETRY_CNT)
_RNR = int(M.IBV_QP_RNR_RETRY)
_ALT = int(M.IBV_QP_ALT_PATH)
_MIG = int(M.IBV_QP_PATH_MIG_STATE)
_SQD_NOTIFY = int(M.IBV_QP_EN_SQD_ASYNC_NOTIFY)

#: the bits a user's Modify QP may set on an XRC QP and the kernel removes before its
#: checks (``modify_qp_mask`` in uverbs_cmd.c, "Remove ignored fields set in the attribute
#: mask"): an INI QP has no responder resources or RNR timer, a TGT QP no initiator depth
#: or retries. perftest's ``-c XRC`` sets them on both; the attributes are not applied.
IGNORED_MASK: Final = {XI: _MDRA | _RNRT, XT: _MQRA | _RETRY | _RNR}

_ANY = Rule()  # valid, nothing required, nothing optional (X -> RESET, X -> ERR)
# what RESET -> INIT requires and INIT -> INIT accepts
_INIT_ATTRS: Final = {
    UD: _PKEY | _PORT | _QKEY,
    UC: _PKEY | _PORT | _ACCESS,
    RC: _PKEY | _PORT | _ACCESS,
    XI: _PKEY | _PORT | _ACCESS,
    XT: _PKEY | _PORT | _ACCESS,
}
# what RTR -> RTS, RTS -> RTS and SQD -> RTS accept
_RTS_OPTIONAL: Final = {
    UD: _CUR | _QKEY,
    UC: _CUR | _ALT | _ACCESS | _MIG,
    RC: _CUR | _ALT | _ACCESS | _RNRT | _MIG,
    XI: _CUR | _ALT | _ACCESS | _MIG,
    XT: _CUR | _ALT | _ACCESS | _RNRT | _MIG,
}

#: ``QP_STATE_TABLE[cur][next]`` -> :class:`Rule`; a missing pair is an illegal transition.
QP_STATE_TABLE: Final[dict[int, dict[int, Rule]]] = {
    RESET: {
        RESET: _ANY,
        INIT: Rule(required=_INIT_ATTRS),
        # (no RESET -> ERR in the kernel table)
    },
    INIT: {
        RESET: _ANY,
        ERR: _ANY,
        INIT: Rule(optional=_INIT_ATTRS),
        RTR: Rule(
            required={
                UC: _AV | _MTU | _DQPN | _RQPSN,
                RC: _AV | _MTU | _DQPN | _RQPSN | _MDRA | _RNRT,
                XI: _AV | _MTU | _DQPN | _RQPSN,
                XT: _AV | _MTU | _DQPN | _RQPSN | _MDRA | _RNRT,
            },
            optional={
                UD: _PKEY | _QKEY,
                UC: _ALT | _ACCESS | _PKEY,
                RC: _ALT | _ACCESS | _PKEY,
                XI: _ALT | _ACCESS | _PKEY,
                XT: _ALT | _ACCESS | _PKEY,
            },
        ),
    },
    RTR: {
        RESET: _ANY,
        ERR: _ANY,
        RTS: Rule(
            required={
                UD: _SQPSN,
                UC: _SQPSN,
                RC: _TIMEOUT | _RETRY | _RNR | _SQPSN | _MQRA,
                XI: _TIMEOUT | _RETRY | _RNR | _SQPSN | _MQRA,
                XT: _TIMEOUT | _SQPSN,
            },
            optional=_RTS_OPTIONAL,
        ),
    },
    RTS: {
        RESET: _ANY,
        ERR: _ANY,
        RTS: Rule(optional=_RTS_OPTIONAL),
        SQD: Rule(optional=dict.fromkeys((UD, UC, RC, XI, XT), _SQD_NOTIFY)),
    },
    SQD: {
        RESET: _ANY,
        ERR: _ANY,
        RTS: Rule(optional=_RTS_OPTIONAL),
        SQD: Rule(optional={
            UD: _PKEY | _QKEY,
            UC: _AV | _ALT | _ACCESS | _PKEY | _MIG,
            RC: (_PORT | _AV | _TIMEOUT | _RETRY | _RNR | _MQRA | _MDRA | _ALT | _ACCESS
                 | _PKEY | _RNRT | _MIG),
            XI: (_PORT | _AV | _TIMEOUT | _RETRY | _RNR | _MQRA | _ALT | _ACCESS | _PKEY
                 | _MIG),
            XT: _PORT | _AV | _TIMEOUT | _MDRA | _ALT | _ACCESS | _PKEY | _RNRT | _MIG,
        }),
    },
    SQE: {
        RESET: _ANY,
        ERR: _ANY,
        # RC has no SQE state (IBA 10.3.1.5); the kernel lists only UD/UC (and SMI/GSI).
        RTS: Rule(optional={UD: _CUR | _QKEY, UC: _CUR | _ACCESS}),
    },
    ERR: {
        RESET: _ANY,
        ERR: _ANY,
    },
}

# States from which IBV_QP_CUR_STATE may be given (ib_modify_qp_is_ok).
_CUR_STATE_OK: Final = frozenset({RTR, RTS, SQD, SQE})


def rule_for(cur: int, nxt: int) -> Rule | None:
    """The rule of ``cur -> nxt``, or None when the transition is illegal."""
    row = QP_STATE_TABLE.get(cur)
    return None if row is None else row.get(nxt)


def required_mask(cur: int, nxt: int, qp_type: int) -> int:
    """Attributes ``cur -> nxt`` requires for ``qp_type`` (IBV_QP_STATE not included)."""
    rule = rule_for(cur, nxt)
    return 0 if rule is None else rule.required.get(qp_type, 0)


def optional_mask(cur: int, nxt: int, qp_type: int) -> int:
    """Attributes ``cur -> nxt`` accepts for ``qp_type`` besides the required ones."""
    rule = rule_for(cur, nxt)
    return 0 if rule is None else rule.optional.get(qp_type, 0)


def user_mask(qp_type: int, mask: int) -> int:
    """``mask`` from an application, as the kernel checks and applies it: without the
    bits it ignores for ``qp_type`` (:data:`IGNORED_MASK`)."""
    return mask & ~IGNORED_MASK.get(qp_type, 0)


def modify_is_ok(cur: int, nxt: int, qp_type: int, mask: int) -> bool:
    """``ib_modify_qp_is_ok``: is ``mask`` legal for ``cur -> nxt`` on a ``qp_type`` QP?"""
    if mask & _CUR and cur not in _CUR_STATE_OK:
        return False
    rule = rule_for(cur, nxt)
    if rule is None:
        return False
    req = rule.required.get(qp_type, 0)
    opt = rule.optional.get(qp_type, 0)
    if mask & req != req:
        return False
    return not mask & ~(req | opt | _STATE)

"""An rdma_cm id's QP type and the QP ``rdma_create_qp`` makes for it (librdmacm
``rdma_create_id2``, ``rdma_create_qp_ex``, ``ucma_init_conn_qp``, ``ucma_get_xrcd``).

An id's type follows its port space as Linux's ``ucma_get_qp_type``: ``RDMA_PS_TCP`` ids
are RC (a UC QP is connected too), ``RDMA_PS_UDP`` ids UD, ``RDMA_PS_IB`` ids whatever
type they are made with: RC, UC, UD, or XRC (``IBV_QPT_XRC_SEND``: an XRC INI QP that
connects, ``IBV_QPT_XRC_RECV``: an XRC TGT QP that accepts; IBA Annex A14). UD ids
resolve a service through SIDR; the others connect with REQ/REP.
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import verbs as v
from ..errors import InvalidArgument
from ..ibcm.qpctl import DEFAULT_ACCESS
from ..wire.ipcm import RDMA_UDP_QKEY
from .rdma_transport import QPT_UD, RDMA_PS_IB, RDMA_PS_UDP

__all__ = ["id_qp_type", "make_qp"]

RC, UC = int(v.qp.RC), int(v.qp.UC)
XRC_SEND, XRC_RECV = int(v.qp.XRC_SEND), int(v.qp.XRC_RECV)
_ID_QP_TYPES = frozenset({RC, UC, QPT_UD, XRC_SEND, XRC_RECV})
_XRC = (XRC_SEND, XRC_RECV)
#: XRC domains of rdma_cm's XRC TGT QPs, one per device context (librdmacm
#: ``ucma_get_xrcd``: an XRCD opened with no file, kept with the device)
_xrcds: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def id_qp_type(ps: int, qp_type: int | None) -> int:
    """The QP type of an id of port space ``ps`` asked for ``qp_type`` (None: the port
    space's own); an ``RDMA_PS_IB`` id of another type is an error naming ``qp_type``."""
    if ps != RDMA_PS_IB:
        return QPT_UD if ps == RDMA_PS_UDP else RC
    qpt = RC if qp_type is None else qp_type
    if qpt not in _ID_QP_TYPES:
        raise InvalidArgument("qp_type", f"an RDMA_PS_IB id is RC, UC, UD or XRC, got "
                                         f"{qp_type!r}")
    return qpt


def make_qp(ctx: Any, id_type: int, pd: Any, init_attr: Any, xrcd: Any) -> Any:
    """The QP of ``rdma_create_qp`` on an id of type ``id_type`` of device ``ctx``: on
    ``pd`` (a PD of ``ctx``) or, an XRC TGT QP, on ``xrcd`` (None: the device's XRC domain
    of rdma_cm); a UD QP goes to RTS with the rdma_cm Q_Key 0x01234567, the others to INIT
    with the rdma_cm access rights."""
    qpt = init_attr.qp_type
    if pd is not None and pd.ctx is not ctx:
        raise InvalidArgument("pd", "the PD belongs to another device than the id")
    if xrcd is not None and (not isinstance(xrcd, v.XRCD) or xrcd.ctx is not ctx):
        raise InvalidArgument("xrcd", "an XRCD of the id's device")
    if (qpt == QPT_UD) != (id_type == QPT_UD):
        raise InvalidArgument("init_attr.qp_type", "UD ids (RDMA_PS_UDP) take UD QPs, "
                                                   "the others RC, UC or XRC QPs")
    # an XRC QP on an RC id (RDMA_PS_TCP's) is connected as RC, as Linux does (the
    # kernel's id is RC, ``ucma_get_qp_type``: libfabric's XRC endpoints); an XRC id
    # (RDMA_PS_IB's) takes a QP of its own type only
    if (qpt in _XRC and id_type not in (qpt, RC)) or (id_type in _XRC and qpt != id_type):
        raise InvalidArgument("init_attr.qp_type", f"a QP of type {qpt} on an id of type "
                                                   f"{id_type}: an XRC QP needs an RC id "
                                                   f"or an RDMA_PS_IB id of its type")
    if qpt == QPT_UD:
        return v.QP(pd, init_attr, v.QPAttr(qkey=RDMA_UDP_QKEY))
    if qpt == XRC_RECV:
        if xrcd is None:
            xrcd = _xrcds.get(ctx)
            if xrcd is None:
                xrcd = _xrcds[ctx] = v.XRCD(ctx)
        qp = v.QP(xrcd, v.QPInitAttr(qp_type=XRC_RECV, qp_context=init_attr.qp_context))
    else:
        qp = v.QP(pd, init_attr)
    try:  # librdmacm ucma_init_conn_qp: INIT with the rdma_cm access rights
        qp.to_init(v.QPAttr(qp_access_flags=DEFAULT_ACCESS))
    except BaseException:
        qp.close()
        raise
    return qp

"""``rdma_init_qp_attr``'s answer as verbs objects: the CM's attributes for a QP that the
application moves itself (:func:`softrdma.ibcm.userqp.cm_qp_attr`) become an
``ibv_qp_attr`` (:class:`softrdma.verbs.QPAttr`) and its ``ibv_qp_attr_mask``, ready for
``qp.modify(attr, mask)`` (librdmacm ``rdma_init_qp_attr`` + ``ibv_modify_qp``)."""

from __future__ import annotations

from typing import Any

from .. import enums as e
from .. import verbs as v

__all__ = ["qp_attr_of"]

M = e.ibv_qp_attr_mask
_MASKS = {
    "qp_state": M.IBV_QP_STATE, "pkey_index": M.IBV_QP_PKEY_INDEX, "port_num": M.IBV_QP_PORT,
    "qp_access_flags": M.IBV_QP_ACCESS_FLAGS, "ah_attr": M.IBV_QP_AV,
    "path_mtu": M.IBV_QP_PATH_MTU, "dest_qp_num": M.IBV_QP_DEST_QPN,
    "rq_psn": M.IBV_QP_RQ_PSN, "max_dest_rd_atomic": M.IBV_QP_MAX_DEST_RD_ATOMIC,
    "min_rnr_timer": M.IBV_QP_MIN_RNR_TIMER, "sq_psn": M.IBV_QP_SQ_PSN,
    "timeout": M.IBV_QP_TIMEOUT, "retry_cnt": M.IBV_QP_RETRY_CNT,
    "rnr_retry": M.IBV_QP_RNR_RETRY, "max_rd_atomic": M.IBV_QP_MAX_QP_RD_ATOMIC,
}


def qp_attr_of(ctx: Any, fields: dict[str, Any]) -> tuple[v.QPAttr, int]:
    """``(QPAttr, attr_mask)`` from the CM's field dict (``ah_attr`` given as the path's
    ``dgid``/``sgid_index``/``hop_limit``/``traffic_class``/``flow_label``)."""
    attr = v.QPAttr(qp_state=int(fields["qp_state"]))
    mask = 0
    for name, value in fields.items():
        mask |= int(_MASKS[name])
        if name == "ah_attr":
            gr = v.GlobalRoute(dgid=bytes(value["dgid"]), flow_label=value["flow_label"],
                               sgid_index=value["sgid_index"], hop_limit=value["hop_limit"],
                               traffic_class=value["traffic_class"])
            attr.ah_attr = v.AHAttr(port_num=1, is_global=1, gr=gr)
        elif name != "qp_state":
            setattr(attr, name, int(value))
    return attr, mask

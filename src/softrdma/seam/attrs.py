"""The attributes a QP engine takes in ``modify`` and reports in ``query`` (IBA 11.2.5;
``ibv_qp_attr`` field names where they are the same), typed, and the ones every
transport applies the same way."""

from __future__ import annotations

from typing import Protocol, TypedDict

__all__ = ["ModifyAttrs", "QueryAttrs", "apply_port_attrs"]


class ModifyAttrs(TypedDict, total=False):
    """The validated attributes of one ``modify`` (``ibv_qp_attr`` field names where they
    are the same; IBA 11.2.5.2). ``ah`` is the IB address vector
    (``softrdma.ib.qp.AddressVector``) built by ``softrdma.verbs.ah``."""

    qp_state: int
    cur_qp_state: int
    path_mtu: int
    qkey: int
    pkey_index: int
    port_num: int
    access_flags: int
    ah: object
    timeout: int
    retry_cnt: int
    rnr_retry: int
    rq_psn: int
    sq_psn: int
    max_rd_atomic: int
    max_dest_rd_atomic: int
    min_rnr_timer: int
    dest_qp_num: int
    en_sqd_async_notify: bool


class QueryAttrs(ModifyAttrs, total=True):
    """What ``query`` reports (IBA 11.2.5.3 Query QP): every attribute of
    :class:`ModifyAttrs`, whether the send queue drains in SQD, and the capacities
    ``(max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data)``."""

    sq_draining: bool
    cap: tuple[int, int, int, int, int]


class _PortAttrs(Protocol):
    port_num: int
    pkey_index: int
    access_flags: int


def apply_port_attrs(qp: _PortAttrs, attrs: ModifyAttrs) -> None:
    """The attributes both transports keep as they are given (IBA 11.2.5.2): the port,
    the P_Key index and the remote access flags."""
    if "port_num" in attrs:
        qp.port_num = attrs["port_num"]
    if "pkey_index" in attrs:
        qp.pkey_index = attrs["pkey_index"]
    if "access_flags" in attrs:
        qp.access_flags = int(attrs["access_flags"])

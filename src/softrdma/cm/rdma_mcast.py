"""rdma_cm multicast on RoCE (librdmacm ``rdma_join_multicast`` / ``rdma_leave_multicast``).

RoCE has no SA to join through: the group's MGID is its IP address as a GID (IPv4
``::ffff:a.b.c.d``, Linux ``cma_iboe_set_mgid``), the id's UD QP is attached to it
(``ibv_attach_mcast``, which makes the device join the IP group with IGMP/MLD) and
``RDMA_CM_EVENT_MULTICAST_JOIN`` follows with the address handle attributes of the
group, QPN 0xFFFFFF (IBA 10.5.2.1: the multicast QPN) and the rdma_cm Q_Key.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ..errors import InvalidArgument, StateError
from ..verbs.ah import AHAttr, GlobalRoute
from ..wire.gid import ip_to_gid
from ..wire.ipcm import RDMA_UDP_QKEY
from .rdma_cm import RDMA_PS_UDP, CmId
from .rdma_events import RdmaCmEvent, RdmaCmEventType, UdParam

__all__ = ["MULTICAST_QPN", "mgid_of", "join", "leave"]

MULTICAST_QPN = 0xFFFFFF
_MCAST_HOP_LIMIT = 1  # the group is reached on the local link


def mgid_of(addr: Any) -> bytes:
    """The MGID of the multicast IP address ``addr`` (``"230.0.0.1"`` or ``(host,
    port...)``)."""
    host = addr[0] if isinstance(addr, tuple) else addr
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        raise InvalidArgument("addr", f"not an IP address: {host!r}") from None
    if not ip.is_multicast:
        raise InvalidArgument("addr", f"{ip} is not a multicast address")
    return ip_to_gid(ip.packed)


def _ud_qp(cid: CmId) -> Any:
    if cid.ps != RDMA_PS_UDP:
        raise InvalidArgument("cm_id", "multicast needs an RDMA_PS_UDP id")
    if cid.transport != "roce":
        raise InvalidArgument("cm_id", "rdma_cm multicast needs a RoCE device")
    if cid.qp is None:
        raise StateError("join a multicast group after create_qp")
    return cid.qp


def join(cid: CmId, addr: Any, *, send_only: bool = False) -> None:
    """Attach the id's UD QP to the group and queue MULTICAST_JOIN. A send-only full
    member (``RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER``) is not attached: librdmacm's
    ``ucma_process_join`` skips ``ibv_attach_mcast`` for it, and on RoCE Linux sends no
    IGMP/MLD join for it."""
    qp = _ud_qp(cid)
    mgid = mgid_of(addr)
    if not send_only:
        qp.attach_mcast(mgid)
    gids = list(cid.verbs.port.gids)
    src = cid.local_addr[0] if cid.local_addr is not None else None
    sgid = b""
    if src is not None:
        sip = ipaddress.ip_address(src)
        sgid = ip_to_gid(sip.packed)
    idx = gids.index(sgid) if sgid in gids else 0
    ah = AHAttr(gr=GlobalRoute(dgid=mgid, sgid_index=idx, hop_limit=_MCAST_HOP_LIMIT),
                is_global=1, port_num=cid.port_num)
    cid.channel.post(RdmaCmEvent(RdmaCmEventType.MULTICAST_JOIN, cid,
                                  ud=UdParam(MULTICAST_QPN, RDMA_UDP_QKEY, ah)))


def leave(cid: CmId, addr: Any, *, send_only: bool = False) -> None:
    """Detach the id's UD QP from the group (no event, as librdmacm); a send-only member
    was never attached."""
    qp = _ud_qp(cid)
    mgid = mgid_of(addr)
    if not send_only:
        qp.detach_mcast(mgid)

"""``pyverbs.cmid``: the RDMA connection manager API (librdmacm; rdma-core
``pyverbs/cmid.pyx`` API).

The parameter objects (:class:`AddrInfo`, :class:`ConnParam`, :class:`UDParam`,
:class:`JoinMCAttrEx`) are complete. Connection management itself (event channels and
``rdma_cm_id``\\ s: address/route resolution, the CM MAD exchange, IP-based RoCE CM) needs
softrdma's CM service, which this compatibility layer does not reach yet:
:class:`CMEventChannel` and :class:`CMID` fail with EOPNOTSUPP.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from . import cm_enums as ce
from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

__all__ = ["AddrInfo", "ConnParam", "UDParam", "JoinMCAttrEx", "CMEventChannel", "CMEvent",
           "CMID"]

_NOT_AVAILABLE = "rdma_cm is not available in softrdma's pyverbs compatibility layer"


class AddrInfo(PyverbsObject):
    """``rdma_getaddrinfo``: source and destination socket addresses."""

    def __init__(self, src: str | None = None, dst: str | None = None,
                 src_service: str | None = None, dst_service: str | None = None,
                 port_space: int = int(ce.RDMA_PS_TCP), flags: int = 0) -> None:
        if port_space not in (int(ce.RDMA_PS_TCP), int(ce.RDMA_PS_UDP), int(ce.RDMA_PS_IB),
                              int(ce.RDMA_PS_IPOIB)):
            raise PyverbsUserError(f"Unknown port space {port_space}")
        self.port_space = port_space
        self.flags = flags
        self.src_addr = self._resolve(src, src_service) if src is not None else None
        self.dst_addr = self._resolve(dst, dst_service) if dst is not None else None

    @staticmethod
    def _resolve(host: str, service: str | None) -> tuple[Any, ...]:
        try:
            infos = socket.getaddrinfo(host.split("%", 1)[0], service, 0, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise PyverbsRDMAError(f"Failed to get address info ({exc})", errno.EADDRNOTAVAIL) from exc
        return tuple(infos[0][4])

    def close(self) -> None:
        """Nothing to release."""


class ConnParam(PyverbsObject):
    """``struct rdma_conn_param``."""

    def __init__(self, resources: int = 1, depth: int = 1, flow_control: int = 0,
                 retry: int = 5, rnr_retry: int = 5, srq: int = 0, qp_num: int = 0,
                 data_len: int = 0) -> None:
        self.responder_resources = resources
        self.initiator_depth = depth
        self.flow_control = flow_control
        self.retry_count = retry
        self.rnr_retry_count = rnr_retry
        self.srq = srq
        self.qpn = qp_num
        self.private_data = b"\0" * data_len

    def set_private_data(self, data: bytes) -> None:
        self.private_data = bytes(data)


class UDParam(PyverbsObject):
    """``struct rdma_ud_param``: the peer's QPN, Q_Key and address."""

    def __init__(self, cm_event: Any = None) -> None:
        self.qp_num = int(getattr(cm_event, "qp_num", 0))
        self.qkey = int(getattr(cm_event, "qkey", 0))
        self.ah_attr = getattr(cm_event, "ah_attr", None)


class JoinMCAttrEx(PyverbsObject):
    """``struct rdma_cm_join_mc_attr_ex``."""

    def __init__(self, addr: Any = None, comp_mask: int = 0, join_flags: int = 0) -> None:
        self.addr = addr
        self.comp_mask = comp_mask
        self.join_flags = join_flags


class CMEventChannel(PyverbsCM):
    """``rdma_create_event_channel``: EOPNOTSUPP (see the module docstring)."""

    def __init__(self) -> None:
        raise PyverbsRDMAError(_NOT_AVAILABLE, errno.EOPNOTSUPP)


class CMEvent(PyverbsObject):
    """``rdma_get_cm_event``: EOPNOTSUPP (no event channel can exist)."""

    def __init__(self, channel: CMEventChannel) -> None:
        raise PyverbsRDMAError(_NOT_AVAILABLE, errno.EOPNOTSUPP)


class CMID(PyverbsCM):
    """``rdma_create_id`` / ``rdma_create_ep``: EOPNOTSUPP (see the module docstring)."""

    def __init__(self, creator: Any = None, qp_init_attr: Any = None, pd: Any = None,
                 port_space: int = int(ce.RDMA_PS_TCP), listen_id: Any = None) -> None:
        raise PyverbsRDMAError(_NOT_AVAILABLE, errno.EOPNOTSUPP)

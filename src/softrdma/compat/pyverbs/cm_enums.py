"""librdmacm enumerations as pyverbs exposes them (``pyverbs.cm_enums``).

Values of ``<rdma/rdma_cma.h>`` and ``<rdma/rsocket.h>``; the event types, the port spaces
and the option names softrdma's rdma_cm API has are its values (one source), under
pyverbs's names.
"""

from enum import IntEnum

from softrdma.cm import rdma_cm as _rc
from softrdma.cm.rdma_events import RdmaCmEventType

from ._enum_names import export_members, renamed_enum

__all__: list[str] = []


#: ``enum rdma_cm_event_type``: softrdma.cm's event types under pyverbs's names
rdma_cm_event_type = renamed_enum("rdma_cm_event_type", RdmaCmEventType, "RDMA_CM_EVENT_",
                                  __name__)


class rdma_cm_join_mc_attr_mask(IntEnum):
    RDMA_CM_JOIN_MC_ATTR_ADDRESS = 1
    RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS = 2


class rdma_cm_mc_join_flags(IntEnum):
    RDMA_MC_JOIN_FLAG_FULLMEMBER = 0
    RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER = 1


class rdma_port_space(IntEnum):
    RDMA_PS_IPOIB = _rc.RDMA_PS_IPOIB
    RDMA_PS_TCP = _rc.RDMA_PS_TCP
    RDMA_PS_UDP = _rc.RDMA_PS_UDP
    RDMA_PS_IB = _rc.RDMA_PS_IB  # ids of any QP type (Linux's; XRC through rdma_cm)


RAI_FAMILY = 8
RAI_NOROUTE = 4
RAI_NUMERICHOST = 2
RAI_PASSIVE = 1
RDMA_OPTION_ID = _rc.RDMA_OPTION_ID
RDMA_OPTION_ID_ACK_TIMEOUT = _rc.RDMA_OPTION_ID_ACK_TIMEOUT

__all__ = export_members(globals())

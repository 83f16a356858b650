"""The state of an rdma_cm id (:class:`softrdma.cm.rdma_cm.CmId`), with the names of Linux's
``enum rdma_cm_state`` (drivers/infiniband/core/cma_priv.h), which ``rdma res show cm_id``
prints (``cm_id_state_to_str``).

The moves, as Linux makes them::

    IDLE --bind_addr--> ADDR_BOUND --listen--> LISTEN
    IDLE | ADDR_BOUND --resolve_addr--> ADDR_QUERY --> ADDR_RESOLVED (an error: back)
    ADDR_RESOLVED --resolve_route--> ROUTE_RESOLVED --connect--> CONNECT
    (a CONNECT_REQUEST's new id starts in CONNECT; an established id stays there)
    CONNECT --DISCONNECTED--> DISCONNECT;  any --device gone--> DEVICE_REMOVAL
    any --destroy--> DESTROYING

Our address and route resolution answer at once, so ADDR_QUERY lasts only the call and
ROUTE_QUERY is never seen (RoCE v2 and TCP need no path query).
"""

from __future__ import annotations

import enum

__all__ = ["CmState", "BEFORE_CONNECT", "ADDRESS_KNOWN"]


class CmState(enum.Enum):
    """``enum rdma_cm_state``; the value is the name ``rdma res`` shows."""

    IDLE = "IDLE"
    ADDR_QUERY = "ADDR_QUERY"
    ADDR_RESOLVED = "ADDR_RESOLVED"
    ROUTE_QUERY = "ROUTE_QUERY"
    ROUTE_RESOLVED = "ROUTE_RESOLVED"
    CONNECT = "CONNECT"
    DISCONNECT = "DISCONNECT"
    ADDR_BOUND = "ADDR_BOUND"
    LISTEN = "LISTEN"
    DEVICE_REMOVAL = "DEVICE_REMOVAL"
    DESTROYING = "DESTROYING"


#: States an address resolution may start from (and move on from).
BEFORE_CONNECT = frozenset({CmState.IDLE, CmState.ADDR_BOUND, CmState.ADDR_QUERY,
                            CmState.ADDR_RESOLVED, CmState.ROUTE_QUERY,
                            CmState.ROUTE_RESOLVED})

#: States of an id whose local and remote addresses are known (resolved, or a request's).
ADDRESS_KNOWN = frozenset({CmState.ADDR_RESOLVED, CmState.ROUTE_QUERY,
                           CmState.ROUTE_RESOLVED, CmState.CONNECT, CmState.DISCONNECT})

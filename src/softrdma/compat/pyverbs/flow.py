"""``pyverbs.flow``: flow steering (``ibv_create_flow``; rdma-core ``pyverbs/flow.pyx``).

Flow steering needs raw-packet QPs, which software RoCE devices do not have, so
:class:`Flow` fails with EOPNOTSUPP (as on rxe).
"""

from __future__ import annotations

import errno
from typing import Any

from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError

__all__ = ["FlowAttr", "Flow", "FlowAction"]


class FlowAttr(PyverbsObject):
    """``struct ibv_flow_attr`` and its specs."""

    def __init__(self, num_of_specs: int = 0, flow_type: int = 0, priority: int = 0,
                 port: int = 1, flags: int = 0) -> None:
        self.num_of_specs = num_of_specs
        self.type = flow_type
        self.priority = priority
        self.port = port
        self.flags = flags
        self.specs: list[Any] = []


class FlowAction(PyverbsObject):
    """A flow action handle."""


class Flow(PyverbsCM):
    """A steering rule (``ibv_create_flow``): EOPNOTSUPP on softrdma devices."""

    def __init__(self, qp: Any, flow_attr: FlowAttr) -> None:
        raise PyverbsRDMAError("Flow creation failed", errno.EOPNOTSUPP)

"""``pyverbs.wq``: work queues and RSS indirection tables (rdma-core ``pyverbs/wq.pyx``).

The attribute structs whose constructor takes their field names are dataclasses
(``eq=False``: compared by identity, as pyverbs objects are).

Receive work queues feed raw-packet RSS QPs, which software RoCE devices do not have:
:class:`WQ` and :class:`RwqIndTable` fail with EOPNOTSUPP (as on rxe).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError

__all__ = ["WQInitAttr", "WQAttr", "WQ", "RwqIndTableInitAttr", "RwqIndTable", "RxHashConf"]


class WQInitAttr(PyverbsObject):
    """``struct ibv_wq_init_attr``."""

    def __init__(self, wq_context: Any = None, wq_pd: Any = None, wq_cq: Any = None,
                 wq_type: int = 0, max_wr: int = 100, max_sge: int = 1, comp_mask: int = 0,
                 create_flags: int = 0) -> None:
        self.wq_context = wq_context
        self.pd = wq_pd
        self.cq = wq_cq
        self.wq_type = wq_type
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.comp_mask = comp_mask
        self.create_flags = create_flags


@dataclass(eq=False)
class WQAttr(PyverbsObject):
    """``struct ibv_wq_attr``."""

    attr_mask: int = 0
    wq_state: int = 0
    curr_wq_state: int = 0
    flags: int = 0
    flags_mask: int = 0


class WQ(PyverbsCM):
    """A receive work queue (``ibv_create_wq``): EOPNOTSUPP on softrdma devices."""

    def __init__(self, ctx: Any, attr: WQInitAttr) -> None:
        raise PyverbsRDMAError("Failed to create WQ", errno.EOPNOTSUPP)


@dataclass(eq=False)
class RwqIndTableInitAttr(PyverbsObject):
    """``struct ibv_rwq_ind_table_init_attr``."""

    log_ind_tbl_size: int = 0
    ind_tbl: Any = None
    comp_mask: int = 0


class RwqIndTable(PyverbsCM):
    """An RSS indirection table (``ibv_create_rwq_ind_table``): EOPNOTSUPP."""

    def __init__(self, ctx: Any, attr: RwqIndTableInitAttr) -> None:
        raise PyverbsRDMAError("Failed to create RWQ indirection table", errno.EOPNOTSUPP)


@dataclass(eq=False)
class RxHashConf(PyverbsObject):
    """``struct ibv_rx_hash_conf``."""

    rx_hash_function: int = 0
    rx_hash_key_len: int = 0
    rx_hash_key: Any = None
    rx_hash_fields_mask: int = 0

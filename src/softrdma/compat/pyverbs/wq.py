"""``pyverbs.wq``: work queues and RSS indirection tables (rdma-core ``pyverbs/wq.pyx``).

Receive work queues feed raw-packet RSS QPs, which software RoCE devices do not have:
:class:`WQ` and :class:`RwqIndTable` fail with EOPNOTSUPP (as on rxe).
"""

from __future__ import annotations

import errno
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


class WQAttr(PyverbsObject):
    """``struct ibv_wq_attr``."""

    def __init__(self, attr_mask: int = 0, wq_state: int = 0, curr_wq_state: int = 0,
                 flags: int = 0, flags_mask: int = 0) -> None:
        self.attr_mask = attr_mask
        self.wq_state = wq_state
        self.curr_wq_state = curr_wq_state
        self.flags = flags
        self.flags_mask = flags_mask


class WQ(PyverbsCM):
    """A receive work queue (``ibv_create_wq``): EOPNOTSUPP on softrdma devices."""

    def __init__(self, ctx: Any, attr: WQInitAttr) -> None:
        raise PyverbsRDMAError("Failed to create WQ", errno.EOPNOTSUPP)


class RwqIndTableInitAttr(PyverbsObject):
    """``struct ibv_rwq_ind_table_init_attr``."""

    def __init__(self, log_ind_tbl_size: int = 0, ind_tbl: Any = None, comp_mask: int = 0) -> None:
        self.log_ind_tbl_size = log_ind_tbl_size
        self.ind_tbl = ind_tbl
        self.comp_mask = comp_mask


class RwqIndTable(PyverbsCM):
    """An RSS indirection table (``ibv_create_rwq_ind_table``): EOPNOTSUPP."""

    def __init__(self, ctx: Any, attr: RwqIndTableInitAttr) -> None:
        raise PyverbsRDMAError("Failed to create RWQ indirection table", errno.EOPNOTSUPP)


class RxHashConf(PyverbsObject):
    """``struct ibv_rx_hash_conf``."""

    def __init__(self, rx_hash_function: int = 0, rx_hash_key_len: int = 0,
                 rx_hash_key: Any = None, rx_hash_fields_mask: int = 0) -> None:
        self.rx_hash_function = rx_hash_function
        self.rx_hash_key_len = rx_hash_key_len
        self.rx_hash_key = rx_hash_key
        self.rx_hash_fields_mask = rx_hash_fields_mask

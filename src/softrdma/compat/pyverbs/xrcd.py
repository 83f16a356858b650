"""``pyverbs.xrcd``: XRC domains (IBA Annex A14; rdma-core ``pyverbs/xrcd.pyx`` API).

softrdma's engine has no XRC transport, so ``ibv_open_xrcd`` fails with EOPNOTSUPP,
as it does on rxe.
"""

from __future__ import annotations

import errno
from typing import Any

from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError

__all__ = ["XRCDInitAttr", "XRCD"]


class XRCDInitAttr(PyverbsObject):
    """``struct ibv_xrcd_init_attr``."""

    def __init__(self, comp_mask: int, oflags: int, fd: int) -> None:
        self.comp_mask = comp_mask
        self.oflags = oflags
        self.fd = fd


class XRCD(PyverbsCM):
    """An XRC domain (``ibv_open_xrcd``): EOPNOTSUPP on softrdma devices."""

    def __init__(self, context: Any, init_attr: XRCDInitAttr) -> None:
        raise PyverbsRDMAError("Failed to allocate XRCD", errno.EOPNOTSUPP)

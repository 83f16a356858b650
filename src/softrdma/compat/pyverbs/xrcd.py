"""``pyverbs.xrcd``: XRC domains (IBA Annex A14; rdma-core ``pyverbs/xrcd.pyx`` API).

``XRCD(ctx, XRCDInitAttr(comp_mask, oflags, fd))`` is ``ibv_open_xrcd``: a
:class:`softrdma.verbs.XRCD` (see ``softrdma/verbs/xrcd.py``). As libibverbs, the
mask must name both the file descriptor and the open flags (EINVAL), and unknown mask
bits are EOPNOTSUPP; a file without a domain needs ``O_CREAT`` and ``O_EXCL`` refuses
an existing one (EINVAL, as the kernel's ``ib_uverbs_open_xrcd``).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

from softrdma import verbs as _v

from . import libibverbs_enums as e
from .base import PyverbsCM, PyverbsObject, translate
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

__all__ = ["XRCDInitAttr", "XRCD"]

_FD = int(e.IBV_XRCD_INIT_ATTR_FD)
_OFLAGS = int(e.IBV_XRCD_INIT_ATTR_OFLAGS)
_RESERVED = int(e.IBV_XRCD_INIT_ATTR_RESERVED)


@dataclass(eq=False)
class XRCDInitAttr(PyverbsObject):
    """``struct ibv_xrcd_init_attr``."""

    comp_mask: int
    oflags: int
    fd: int


class XRCD(_v.XRCD, PyverbsCM):
    """An XRC domain (``ibv_open_xrcd``); closing it closes its SRQs and TGT QPs first."""

    def __init__(self, context: Any, init_attr: XRCDInitAttr) -> None:
        if not isinstance(init_attr, XRCDInitAttr):
            raise PyverbsUserError(f"Expected XRCDInitAttr, got {type(init_attr).__name__}")
        mask = int(init_attr.comp_mask)
        if mask >= _RESERVED:
            raise PyverbsRDMAError("Failed to allocate XRCD", errno.EOPNOTSUPP)
        if mask & (_FD | _OFLAGS) != _FD | _OFLAGS:
            raise PyverbsRDMAError("Failed to allocate XRCD", errno.EINVAL)
        with translate("Failed to allocate XRCD"):
            super().__init__(context, int(init_attr.fd), int(init_attr.oflags))

    def close(self) -> None:
        """``ibv_close_xrcd``."""
        _v.XRCD.close(self)

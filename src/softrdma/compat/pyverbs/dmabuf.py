"""``pyverbs.dmabuf``: dma-buf allocation from a GPU render node (rdma-core
``pyverbs/dmabuf.pyx`` API).

A softrdma engine reaches memory through the CPU, so it cannot register GPU dma-bufs:
without the render node this fails with ENOENT (as pyverbs does), otherwise with
EOPNOTSUPP.
"""

from __future__ import annotations

import errno
import os

from .pyverbs_error import PyverbsRDMAError

__all__ = ["DmaBuf"]


class DmaBuf:
    """A dma-buf of ``size`` bytes from ``/dev/dri/renderD<128+gpu>``."""

    def __init__(self, size: int, gpu: int = 0, gtt: int = 0) -> None:
        node = f"/dev/dri/renderD{128 + gpu}"
        if not os.path.exists(node):
            raise PyverbsRDMAError(f"Failed to open {node}", errno.ENOENT)
        raise PyverbsRDMAError("Failed to allocate dma-buf: softrdma cannot register GPU "
                               "memory", errno.EOPNOTSUPP)

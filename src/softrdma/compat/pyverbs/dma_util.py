"""``pyverbs.dma_util``: memory barriers and MMIO doorbell writes (rdma-core
``pyverbs/dma_util.pyx`` API), used by direct-verbs programs.

There is no device MMIO with softrdma; the barriers order CPU stores, which Python's
memory accesses (under the GIL) already are, and the MMIO writes store big-endian values
at the given address like the C helpers do.
"""

from __future__ import annotations

from . import mem_alloc

__all__ = ["udma_to_dev_barrier", "udma_from_dev_barrier", "mmio_write32_as_be",
           "mmio_write64_as_be"]


def udma_to_dev_barrier() -> None:
    """Order CPU stores before a device reads them (nothing to do in Python)."""


def udma_from_dev_barrier() -> None:
    """Order device writes before CPU loads (nothing to do in Python)."""


def mmio_write32_as_be(addr: int, val: int) -> None:
    mem_alloc.writebe32(addr, val, 0)


def mmio_write64_as_be(addr: int, val: int) -> None:
    mem_alloc.writebe64(addr, val, 0)

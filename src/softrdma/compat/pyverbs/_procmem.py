"""The process's own address space as one memory region (implicit on-demand paging):
:mod:`softrdma.verbs.procmem` (the C interface serves implicit ODP MRs with it too)."""

from softrdma.verbs.procmem import SIZE_MAX, ProcessMemory, ProcessMemoryRegion, mapped

__all__ = ["ProcessMemory", "ProcessMemoryRegion", "SIZE_MAX", "mapped"]

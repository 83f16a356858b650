"""The engines' data model moved to :mod:`softrdma.seam.types` (the seam between the
transports, the verbs layer and the drivers); this name re-exports it for modules
written against the old place."""

from __future__ import annotations

from ..seam.types import (
    PSN_MASK,
    SGE,
    Access,
    CompletionSink,
    MemoryRegion,
    RecvWQE,
    SendWQE,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    psn_add,
    psn_diff,
    psn_le,
    psn_lt,
)

__all__ = ["Access", "WcOpcode", "WcStatus", "WrOpcode", "SGE", "SendWQE", "RecvWQE",
           "WorkCompletion", "MemoryRegion", "CompletionSink", "PSN_MASK", "psn_add",
           "psn_diff", "psn_lt", "psn_le"]

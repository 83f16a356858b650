"""softrdma: a software RDMA stack in Python.

Verbs (PD, MR, CQ, QP, SRQ, AH) over the InfiniBand transport carried by RoCEv2, and
iWARP (RDMAP/DDP/MPA over TCP), wire-compatible with Linux rxe and siw.
See docs/design.md for the architecture.
"""

__version__ = "0.1.0"

from .trace import configure_from_env as _configure_trace

_configure_trace()  # SOFTRDMA_TRACE=qp,cm,pkt (softrdma.trace)

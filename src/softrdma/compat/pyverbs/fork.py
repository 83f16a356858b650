"""``pyverbs.fork``: ``ibv_fork_init`` / ``ibv_is_fork_initialized``.

softrdma never pins or DMA-maps memory: the engine reaches registered buffers through the
process's own mappings, so a child created by ``fork`` cannot corrupt them and nothing has
to be set up. That is libibverbs's ``IBV_FORK_UNNEEDED`` (kernels with copy-on-fork
pinning), and :func:`fork_init` succeeds.
"""

from __future__ import annotations

from . import libibverbs_enums as e

__all__ = ["fork_init", "is_fork_initialized"]


def fork_init() -> None:
    """``ibv_fork_init``: nothing to do (fork protection is unneeded)."""


def is_fork_initialized() -> int:
    """``ibv_is_fork_initialized``: ``IBV_FORK_UNNEEDED``."""
    return int(e.ibv_fork_status.IBV_FORK_UNNEEDED)

"""Memory windows from C (IBA 10.6.7): ``ibv_alloc_mw`` and ``ibv_bind_mw``, the ops
``shim.c`` puts in ``ibv_context.ops`` for ``verbs.h``'s inline helpers.

``ibv_dealloc_mw`` is the generic handle destruction; a type 2 window's ``IBV_WR_BIND_MW``
and ``IBV_WR_LOCAL_INV`` (``ibv_post_send``, ``ibv_wr_bind_mw``, ``ibv_wr_local_inv``) go
through :mod:`.posting`. The rules are :mod:`softrdma.verbs.mw`'s: a bind that breaks
one completes with ``IBV_WC_MW_BIND_ERR``; an iWARP device has no windows
(``EOPNOTSUPP``, as siw).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..verbs import MR, MW, PD, QP, MWBindInfo
from .handles import _add, _get

__all__ = ["EXPORTS", "bind_info"]


def bind_info(mr: int, addr: int, length: int, access: int) -> MWBindInfo:
    """``struct ibv_mw_bind_info`` of MR handle ``mr`` (0: none, an unbind)."""
    return MWBindInfo(_get(mr, MR) if mr else None, addr, length, access)


def _alloc_mw(pd: int, mw_type: int, rkey: Any) -> int:
    mw = MW(_get(pd, PD), mw_type)
    rkey[0] = mw.rkey
    return _add(mw)


def _bind_mw(qp: int, mw: int, mr: int, addr: int, length: int, access: int, wr_id: int,
             send_flags: int, rkey: Any) -> int:
    """``ibv_bind_mw`` of type 1 window ``mw`` on QP ``qp``; ``rkey[0]``: its new key."""
    rkey[0] = _get(qp, QP).bind_mw(_get(mw, MW), bind_info(mr, addr, length, access),
                                   wr_id=wr_id, send_flags=send_flags)
    return 0


#: name in cdefs.PY_EXPORTS -> (function, returns a handle)
EXPORTS: dict[str, tuple[Callable[..., int], bool]] = {
    "sr_py_alloc_mw": (_alloc_mw, True),
    "sr_py_bind_mw": (_bind_mw, False),
}

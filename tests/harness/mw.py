"""A key a RoCE peer may invalidate remotely: rxe (and so softrdma) lets SEND_WITH_INVALIDATE
revoke only type-2 memory windows (``softrdma.ib.mw.remotely_invalidatable``), so tests of
SEND_WITH_INV bind one over a few bytes of an MR, as a BIND_MW work request would."""

from __future__ import annotations

from softrdma import verbs as v
from softrdma.ib.mw import MW_TYPE_2, BindRequest, EngineMW


def type2_window(ctx: v.Context, pd: v.PD, qp: v.QP, mr: v.MR, length: int = 64) -> int:
    """Bind a type-2 window over ``length`` bytes of ``mr`` (registered with
    IBV_ACCESS_MW_BIND) on ``qp``; return its R_Key."""
    port = ctx.port
    with ctx.runtime.lock:
        key = port.new_key()
        mw = EngineMW(MW_TYPE_2, pd.protection_domain, key)
        rkey = (key & ~0xFF) | ((key + 1) & 0xFF)
        status = BindRequest(mw, mr.engine_mr, mr.addr, length, 0, rkey).execute(
            port, qp.engine, pd.protection_domain)
    assert status == 0, status
    return rkey

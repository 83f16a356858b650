"""Protection domains (IBA 10.2.3; ``ibv_alloc_pd``).

A PD groups the MRs, QPs, AHs and SRQs that may be used together; the engine compares
``mr.pd is qp.pd`` on every access (IBA 10.6.3.2). What it compares is the PD's
:class:`PdToken`, not the PD: the engine's objects live as long as the device (an MR or
QP collected unclosed is released by the next progress call), and a token refers to
nothing, so they do not keep the PD, and through it the context, alive. Closing a PD
closes everything created on it (pyverbs ``PD.close``).
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ._object import VerbsObject
from .device import Context

__all__ = ["PD", "PdToken", "open_pd"]


class PdToken:
    """The identity of one protection domain as the engine holds it (``mr.pd``, ``qp.pd``,
    compared with ``is``, IBA 10.6.3.2). It refers to no verbs object."""

    __slots__ = ("__weakref__",)


class PD(VerbsObject):
    """A protection domain of ``ctx``."""

    _close_rank = 5

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        if not isinstance(ctx, Context):
            raise InvalidArgument("ctx", f"PD needs a Context, got {type(ctx).__name__}")
        ctx._check()
        self._count_on(ctx.objects, "max_pd")
        self._depend_on(ctx)
        self.ctx = ctx
        self._token = PdToken()

    @property
    def protection_domain(self) -> PdToken:
        """What the engine's access checks compare (IBA 10.6.3.2): this PD's token
        (pyverbs' parent domains and imported PDs name another PD's)."""
        return self._token

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<PD of {self.ctx.name}{state}>"


def open_pd(pd: object) -> PD:
    """``pd`` if it is an open :class:`PD` (what every object created on a PD checks
    first); else :class:`InvalidArgument` naming ``pd``, or the closed PD's error."""
    if not isinstance(pd, PD):
        raise InvalidArgument("pd", f"expected a PD, got {type(pd).__name__}")
    pd._check()
    return pd

"""``pyverbs.pd``: protection domains and parent domains (IBA 10.2.3; rdma-core
``pyverbs/pd.pyx`` API).

:class:`PD` is a :class:`softrdma.verbs.PD`; closing it closes the QPs, AHs, MWs, MRs and
SRQs created on it (pyverbs ``PD.close``).

:class:`ParentDomain` (``ibv_alloc_parent_domain``) is a PD that stands for its
protection domain: objects created on it are checked against the protection domain, so
an MR of the protection domain serves a QP of the parent domain. The custom allocators
of a :class:`ParentDomainContext` are what libibverbs providers call for queue buffers
they place in user memory; softrdma's queues live in the engine, so it never calls them.

:meth:`PD.advise_mr` (``ibv_advise_mr``) prefetches on-demand-paging MRs: in softrdma
every MR is accessed in place, on demand, so a prefetch only validates its arguments.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from softrdma import verbs as _v
from softrdma.errors import InvalidArgument
from softrdma.verbs.pd import PdToken

from . import libibverbs_enums as e
from ._imports import file_handle, resolve, unimport
from .base import PyverbsCM, PyverbsObject, translate
from .device import Context
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

__all__ = ["PD", "ParentDomain", "ParentDomainInitAttr", "ParentDomainContext"]

_ADVICES = frozenset({int(e._IBV_ADVISE_MR_ADVICE_PREFETCH),
                      int(e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE),
                      int(e._IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)})


class PD(_v.PD, PyverbsCM):
    """A protection domain (``ibv_alloc_pd``); ``PD(ctx, handle=h)`` imports the PD
    with handle ``h`` of ``ctx``'s device (``ibv_import_pd``, see :mod:`._imports`)."""

    _handle: int | None = None
    _origin: PD | None = None

    def __init__(self, creator: Any, **kwargs: Any) -> None:
        PyverbsObject.__init__(self)
        handle = kwargs.pop("handle", None)
        if kwargs:
            raise PyverbsUserError(f"PD: unexpected arguments {sorted(kwargs)}")
        if not isinstance(creator, Context):
            raise PyverbsUserError(f"PD: expected a Context, got {type(creator).__name__}")
        origin: PD | None = None
        if handle is not None:
            found = resolve(creator, "pd", handle, PD)
            assert isinstance(found, PD)
            origin = found
        with translate("Failed to allocate PD"):
            super().__init__(creator)
        if origin is not None:
            self._handle, self._origin = origin.handle, origin

    @property
    def protection_domain(self) -> PdToken:
        """What access checks compare (its own token; a parent domain's protection
        domain's; an imported PD's original's)."""
        if self._origin is not None:
            return self._origin.protection_domain
        return super().protection_domain

    @property
    def handle(self) -> int:
        return file_handle(self, self.ctx, "pd")

    def _check(self) -> None:
        super()._check()
        if self._origin is not None and self._origin.closed:
            # the shared PD was deallocated: its handle names nothing any more
            raise InvalidArgument("pd", "the imported PD was deallocated through another "
                                  "context")

    def unimport(self) -> None:
        """``ibv_unimport_pd`` (see :mod:`._imports`)."""
        unimport(self, "PD")

    def advise_mr(self, advise: int, flags: int, sg_list: Sequence[Any]) -> None:
        """``ibv_advise_mr``: EINVAL for an unknown advice or flag, an SGE outside an
        on-demand-paging MR of this PD, or PREFETCH_WRITE on a region without
        LOCAL_WRITE."""
        self._check()
        if advise not in _ADVICES or flags & ~int(e._IBV_ADVISE_MR_FLAG_FLUSH) or not sg_list:
            raise PyverbsRDMAError("Failed to advise MR", errno.EINVAL)
        port = self.ctx.port
        with self.ctx.runtime.lock:
            for sge in sg_list:
                mr = port.lookup_mr(int(sge.lkey))
                if (mr is None or not mr.valid or mr.pd is not self.protection_domain
                        or mr.offset_of(int(sge.addr), int(sge.length)) < 0
                        or not getattr(mr.owner, "on_demand", False)):
                    raise PyverbsRDMAError("Failed to advise MR", errno.EINVAL)
                if (advise == e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE
                        and not mr.access & e.IBV_ACCESS_LOCAL_WRITE):
                    raise PyverbsRDMAError("Failed to advise MR", errno.EINVAL)

    def close(self) -> None:
        """Close the PD and everything created on it (``ibv_dealloc_pd``)."""
        _v.PD.close(self)


AllocFunc = Callable[[Any, Any, int, int, int], int]
FreeFunc = Callable[[Any, Any, int, int], Any]


@dataclass(eq=False)
class ParentDomainContext(PyverbsObject):
    """Custom allocators and user data of a parent domain (``ibv_parent_domain_init_attr``
    ``alloc``/``free``/``pd_context``)."""

    pd: PD
    alloc_func: AllocFunc
    free_func: FreeFunc
    user_data: Any = None


class ParentDomainInitAttr(PyverbsObject):
    """``struct ibv_parent_domain_init_attr``."""

    def __init__(self, pd: PD, pd_context: ParentDomainContext | None = None) -> None:
        super().__init__()
        self.pd = pd
        self.pd_context = pd_context
        self.comp_mask = 0
        if pd_context is not None:
            mask = e.ibv_parent_domain_init_attr_mask
            self.comp_mask |= int(mask.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS
                                  | mask.IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)


class ParentDomain(PD):
    """A parent domain over ``attr.pd`` (``ibv_alloc_parent_domain``)."""

    def __init__(self, context: Any, attr: ParentDomainInitAttr) -> None:
        if not isinstance(attr, ParentDomainInitAttr) or not isinstance(attr.pd, PD):
            raise PyverbsUserError("ParentDomain needs a ParentDomainInitAttr with a PD")
        if attr.pd.ctx is not context:
            raise PyverbsRDMAError("Failed to allocate Parent Domain", errno.EINVAL)
        if isinstance(attr.pd, ParentDomain):
            raise PyverbsRDMAError("Failed to allocate Parent Domain", errno.EINVAL)
        super().__init__(context)
        self._protection_domain = attr.pd
        self._depend_on(attr.pd)
        self.pd_context = attr.pd_context

    @property
    def protection_domain(self) -> PdToken:
        return self._protection_domain.protection_domain

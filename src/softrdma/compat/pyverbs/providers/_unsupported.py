"""Provider classes of vendors whose hardware softrdma does not emulate.

rdma-core's direct-verbs providers (mlx5, EFA) only work on their own devices: on any
other device opening the provider context fails with EOPNOTSUPP (``mlx5dv_open_device``,
``efadv_query_device`` ...). :func:`provider_classes` builds the provider's classes with
that behaviour, so that programs importing them load and their device-specific paths are
refused the way libibverbs refuses them on rxe. Attribute structures (the ``...Attr``
parameter objects) are plain value holders, as in pyverbs, and construct normally.
"""

from __future__ import annotations

import errno
from typing import Any

from ..base import PyverbsCM
from ..pyverbs_error import PyverbsRDMAError

__all__ = ["provider_classes", "ProviderObject", "ProviderAttr", "ATTRIBUTE_CLASSES"]

#: Provider classes that are parameter structures, not device objects.
ATTRIBUTE_CLASSES = frozenset({
    "Mlx5DVContextAttr", "Mlx5DVCQInitAttr", "Mlx5DVQPInitAttr", "Mlx5DVDCInitAttr",
    "Mlx5DCIStreamInitAttr", "Mlx5CryptoAttr", "Mlx5CryptoLoginAttr",
    "Mlx5CryptoExtLoginAttr", "Mlx5DEKInitAttr", "Mlx5FlowMatcherAttr", "Mlx5FlowActionAttr",
    "Mlx5FlowMatchParameters", "Mlx5MkeyConfAttr", "Mlx5SigBlockAttr", "Mlx5SigBlockDomain",
    "Mlx5SigCrc", "Mlx5SigT10Dif", "Mlx5MrInterleaved", "Mlx5dvSchedAttr", "Mlx5VfioAttr",
    "DrActionDestAttr", "DrFlowSamplerAttr", "EfaDVCQInitAttr", "EfaQPInitAttr",
    "Mlx5DVPortAttr", "EfaDVDeviceAttr",
})


class _ProviderType(type):
    """The class of a provider object class: its static and class methods that the class
    does not define (``Mlx5Context.device_timestamp_to_ns(ctx, ts)``,
    ``Mlx5Context.query_mlx5_device(ctx)``...) fail with EOPNOTSUPP when called, as the
    real provider's do on a device of another vendor."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def unsupported(*args: Any, **kwargs: Any) -> Any:
            raise PyverbsRDMAError(f"{cls.__name__}.{name}: softrdma devices are not "
                                   f"{getattr(cls, 'provider', 'vendor')} devices",
                                   errno.EOPNOTSUPP)
        unsupported.__name__ = name
        return unsupported


class ProviderObject(PyverbsCM, metaclass=_ProviderType):
    """An object of a vendor provider softrdma devices do not have."""

    provider = "vendor"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise PyverbsRDMAError(f"{type(self).__name__}: softrdma devices are not "
                               f"{self.provider} devices", errno.EOPNOTSUPP)


class ProviderAttr(PyverbsCM):
    """A provider parameter structure: keeps the fields it is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        for name, value in kwargs.items():
            setattr(self, name, value)


def provider_classes(provider: str, names: list[str], module: str) -> dict[str, type]:
    """One class per name, for ``provider``: :class:`ProviderAttr` subclasses for the
    names in :data:`ATTRIBUTE_CLASSES`, :class:`ProviderObject` subclasses otherwise."""
    out: dict[str, type] = {}
    for n in names:
        if n in ATTRIBUTE_CLASSES:
            out[n] = type(n, (ProviderAttr,), {"__module__": module,
                                               "__doc__": f"{provider} ``{n}`` parameters."})
        else:
            out[n] = type(n, (ProviderObject,), {"provider": provider, "__module__": module,
                                                 "__doc__": f"{provider} ``{n}`` (EOPNOTSUPP)."})
    return out

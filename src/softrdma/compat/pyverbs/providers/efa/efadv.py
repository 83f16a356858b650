"""``pyverbs.providers.efa.efadv``: EFA direct-verbs classes.

softrdma devices are not EFA devices: constructing any of these classes fails with
EOPNOTSUPP (see :mod:`softrdma.compat.pyverbs.providers._unsupported`).
"""

from __future__ import annotations

from .._unsupported import provider_classes
from . import efa_enums

_NAMES = ["EfaAH", "EfaCQ", "EfaContext", "EfaDVCQInitAttr", "EfaQPInitAttr", "SRDQP", "SRDQPEx", "EfaDVDeviceAttr", ]
globals().update(provider_classes("EFA", _NAMES, __name__))
__all__ = list(_NAMES)


def dev_cap_to_str(flags: int) -> str:
    """Names of the EFA device capability bits set in ``flags``."""
    names = {int(getattr(efa_enums, n)): n for n in dir(efa_enums)
             if n.startswith("EFADV_DEVICE_ATTR_CAPS_")}
    return "".join(f"{n} " for bit, n in names.items() if flags & bit)


__all__ += ["dev_cap_to_str"]

"""``pyverbs.providers.mlx5.mlx5dv_objects``: mlx5 direct-verbs classes.

softrdma devices are not mlx5 devices: constructing any of these classes fails with
EOPNOTSUPP (see :mod:`softrdma.compat.pyverbs.providers._unsupported`).
"""

from __future__ import annotations

from .._unsupported import provider_classes

_NAMES = ["Mlx5DvObj", ]
globals().update(provider_classes("mlx5", _NAMES, __name__))
__all__ = list(_NAMES)

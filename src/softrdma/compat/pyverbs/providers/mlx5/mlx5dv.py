"""``pyverbs.providers.mlx5.mlx5dv``: mlx5 direct-verbs classes.

softrdma devices are not mlx5 devices: constructing any of these classes fails with
EOPNOTSUPP (see :mod:`softrdma.compat.pyverbs.providers._unsupported`).
"""

from __future__ import annotations

from .._unsupported import provider_classes
from .mlx5_enums import mlx5dv_context_flags, mlx5dv_cqe_comp_res_format

_NAMES = ["Mlx5CQ", "Mlx5Context", "Mlx5Cqe64", "Mlx5DCIStreamInitAttr", "Mlx5DVCQInitAttr", "Mlx5DVContextAttr", "Mlx5DVDCInitAttr", "Mlx5DVQPInitAttr", "Mlx5DevxEq", "Mlx5DevxMsiVector", "Mlx5DevxObj", "Mlx5DmOpAddr", "Mlx5PP", "Mlx5QP", "Mlx5UAR", "Mlx5UMEM", "Mlx5VAR", "Wqe", "WqeCtrlSeg", "WqeDataSeg", "Mlx5SRQ", "Mlx5DVContext", "Mlx5DVPortAttr", ]
globals().update(provider_classes("mlx5", _NAMES, __name__))
__all__ = list(_NAMES)


def _flags_str(flags: int, enum_cls: type) -> str:
    return "".join(f"{m.name} " for m in enum_cls if flags & int(m))  # type: ignore[attr-defined]


def context_flags_to_str(flags: int) -> str:
    """Names of the ``mlx5dv_context_flags`` set in ``flags``."""
    return _flags_str(flags, mlx5dv_context_flags)


def cqe_comp_to_str(comp: int) -> str:
    """Names of the ``mlx5dv_cqe_comp_res_format`` values set in ``comp``."""
    return _flags_str(comp, mlx5dv_cqe_comp_res_format)


__all__ += ["context_flags_to_str", "cqe_comp_to_str"]

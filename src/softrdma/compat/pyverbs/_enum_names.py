"""pyverbs makes each member of a ``cpdef enum`` a module-level name too (``e.IBV_QPT_RC``):
:func:`export_members` adds those names to an enum module, from its classes, and gives
the module's ``__all__``."""

from __future__ import annotations

from enum import Enum, IntEnum, IntFlag
from typing import Any, cast

__all__ = ["export_members", "renamed_enum", "member_name", "flag_names"]


# the prefixes of the names pyverbs's enum modules export
_PUBLIC = ("IBV_", "_IBV_", "ibv_", "RDMA_", "RAI_", "rdma_", "MLX5", "_MLX5", "mlx5", "EFA",
           "efa")


def export_members(namespace: dict[str, Any]) -> list[str]:
    """Make every member of the enums defined in the module whose globals are
    ``namespace`` a module-level name of it (a name already bound is kept); return the
    module's ``__all__``: its names with a pyverbs prefix, sorted."""
    module = namespace["__name__"]
    classes = [v for v in list(namespace.values()) if isinstance(v, type)
               and issubclass(v, Enum) and v.__module__ == module]
    for cls in classes:
        for name, member in cls.__members__.items():
            namespace.setdefault(name, member)
    return sorted(n for n in namespace if n.startswith(_PUBLIC))


def renamed_enum(name: str, source: type[IntEnum], prefix: str, module: str) -> type[IntEnum]:
    """An ``IntEnum`` ``name`` of module ``module`` with the members of ``source``, each
    named ``prefix`` + its name in ``source`` (softrdma's ``ESTABLISHED`` is pyverbs's
    ``RDMA_CM_EVENT_ESTABLISHED``): one source for the values."""
    members = [(prefix + m.name, int(m)) for m in source if m.name is not None]
    return cast("type[IntEnum]", IntEnum(name, members, module=module))


def member_name(enum: type[IntEnum], value: int, unknown: str) -> str:
    """The name of ``value`` in ``enum``, or ``"<unknown> (<value>)"`` when it names no
    member (pyverbs's text of an enum value)."""
    try:
        return str(enum(value).name)
    except ValueError:
        return f"{unknown} ({value})"


def flag_names(flags: int, enum: type[IntEnum] | type[IntFlag]) -> str:
    """The names of ``enum``'s members whose bits are set in ``flags``, each followed by
    a space (pyverbs's text of a flags word)."""
    return "".join(f"{m.name} " for m in enum if flags & int(m))

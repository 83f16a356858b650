"""``pyverbs.utils``: formatting helpers (rdma-core ``pyverbs/utils.py`` API)."""

from __future__ import annotations

import struct

from . import libibverbs_enums as e
from ._enum_names import member_name
from .pyverbs_error import PyverbsUserError

__all__ = ["be64toh", "gid_str", "gid_str_to_array", "qp_type_to_str", "qp_state_to_str",
           "mtu_to_str", "access_flags_to_str", "mig_state_to_str", "rereg_error_to_str"]

_Q_NATIVE = struct.Struct("=Q")
_Q_BE = struct.Struct("!Q")


def be64toh(num: int) -> int:
    """A big-endian 64-bit value read as host order."""
    return int(_Q_NATIVE.unpack(_Q_BE.pack(num))[0])


def gid_str(subnet_prefix: int, interface_id: int) -> str:
    """``xxxx:xxxx:...`` (8 groups) from the two big-endian halves of a GID."""
    h = f"{be64toh(subnet_prefix):016x}{be64toh(interface_id):016x}"
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def gid_str_to_array(val: str) -> list[str]:
    """The 16 byte values (as 2-digit hex strings) of an 8-group GID string."""
    groups = val.split(":")
    if len(groups) != 8 or any(len(g) != 4 for g in groups):
        raise PyverbsUserError(f"Invalid GID value ({groups})")
    try:
        int("".join(groups), 16)
    except ValueError:
        raise PyverbsUserError(f"Invalid GID value ({groups})") from None
    out: list[str] = []
    for g in groups:
        out += [g[0:2], g[2:4]]
    return out


def qp_type_to_str(qp_type: int) -> str:
    types = {2: "RC", 3: "UC", 4: "UD", 8: "Raw Packet", 9: "XRCD_SEND", 10: "XRCD_RECV",
             0xFF: "Driver QP"}
    return types.get(qp_type, f"Unknown ({qp_type})")


def qp_state_to_str(qp_state: int) -> str:
    states = {0: "Reset", 1: "Init", 2: "RTR", 3: "RTS", 4: "SQD", 5: "SQE", 6: "Error",
              7: "Unknown"}
    return states.get(qp_state, f"Unknown ({qp_state})")


def mtu_to_str(mtu: int) -> int:
    return {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}.get(mtu, 0)


def flags_to_str(flags: int, values: dict[int, str]) -> str:
    """The names of the bits of ``flags`` that ``values`` names, each followed by a space
    (pyverbs's text of a flags word)."""
    return "".join(f"{name} " for bit, name in values.items() if flags & bit)


def access_flags_to_str(flags: int) -> str:
    return flags_to_str(flags, {1: "Local write", 2: "Remote write", 4: "Remote read",
                                8: "Remote atomic", 16: "MW bind", 32: "Zero based",
                                64: "On demand"})


def mig_state_to_str(mig: int) -> str:
    return {0: "Migrated", 1: "Re-arm", 2: "Armed"}.get(mig, f"Unknown ({mig})")


def rereg_error_to_str(error: int) -> str:
    return member_name(e.ibv_rereg_mr_err_code, error, "Unknown error")

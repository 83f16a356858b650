"""The texts pyverbs prints for a device's values (rdma-core ``pyverbs/device.pyx``'s
string helpers, exact): GUIDs, MTUs, node, transport and GID types, port states, widths,
speeds, events and capability flags. Re-exported by :mod:`.device`, their pyverbs home.
"""

from __future__ import annotations

from typing import Any

from softrdma import enums as se

from . import libibverbs_enums as e
from ._enum_names import member_name

__all__ = [
    "translate_mtu", "translate_link_layer", "translate_node_type",
    "translate_transport_type", "translate_gid_type", "translate_event_type",
    "translate_device_caps", "translate_port_cap_flags", "translate_port_cap_flags2",
    "port_state_to_str", "phys_state_to_str", "width_to_str", "speed_to_str",
    "guid_format", "guid_to_hex", "str_from_flags",
]


def guid_format(num: int) -> str:
    """A GUID as pyverbs prints it: the 8 bytes in memory order, 4 groups of 4 hex digits."""
    h = int.from_bytes(num.to_bytes(8, "big"), "little")
    s = f"{h:016x}"
    return ":".join(s[i:i + 4] for i in range(0, 16, 4))


def guid_to_hex(node_guid: int) -> str:
    return f"{node_guid:x}"



def translate_mtu(mtu: int) -> str:
    sizes = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
    return f"{sizes[mtu]} ({mtu})" if mtu in sizes else f"Invalid MTU ({mtu})"


def translate_link_layer(ll: int) -> str:
    names = {0: "Unspecified", 1: "InfiniBand", 2: "Ethernet"}
    return names.get(ll, f"Invalid link layer ({ll})")


def translate_node_type(node_type: int) -> str:
    names = {-1: "Unknown", 1: "CA", 2: "Switch", 3: "Router", 4: "RNIC", 5: "usNIC",
             6: "usNIC UDP", 7: "Unspecified"}
    return names.get(node_type, f"Invalid node type ({node_type})")


def translate_transport_type(transport: int) -> str:
    names = {-1: "Unknown", 0: "IB", 1: "IWARP", 2: "usNIC", 3: "usNIC UDP", 4: "Unspecified"}
    return names.get(transport, f"Invalid transport type ({transport})")


def translate_gid_type(gid_type: int) -> str:
    names = {0: "IB", 1: "RoCEv1", 2: "RoCEv2"}
    return names.get(gid_type, f"Invalid GID type ({gid_type})")


def translate_event_type(event_type: int) -> str:
    return member_name(se.ibv_event_type, event_type, "Unknown event")


def port_state_to_str(state: int) -> str:
    names = {0: "NOP", 1: "Down", 2: "Init", 3: "Armed", 4: "Active", 5: "Active deferred"}
    return f"{names[state]} ({state})" if state in names else f"Invalid state ({state})"


def phys_state_to_str(phys: int) -> str:
    names = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "Port configuration training",
             5: "Link up", 6: "Link error recovery", 7: "Phy test"}
    return f"{names[phys]} ({phys})" if phys in names else "Invalid physical state"


def width_to_str(width: int) -> str:
    names = {1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
    return f"{names[width]} ({width})" if width in names else "Invalid width"


def speed_to_str(speed: int) -> str:
    names = {0: "0.0 Gbps", 1: "2.5 Gbps", 2: "5.0 Gbps", 4: "5.0 Gbps", 8: "10.0 Gbps",
             16: "14.0 Gbps", 32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}
    return f"{names[speed]} ({speed})" if speed in names else "Invalid speed"


def str_from_flags(flags: int, dictionary: dict[int, str]) -> str:
    out = "\n  "
    for bit, name in dictionary.items():
        if flags & bit:
            out += name + "\n  "
    return out


def _flag_names(enum_cls: Any) -> dict[int, str]:
    return {int(m): str(m.name) for m in enum_cls}


def translate_device_caps(flags: int) -> str:
    return str_from_flags(flags, _flag_names(e.ibv_device_cap_flags))


def translate_port_cap_flags(flags: int) -> str:
    return str_from_flags(flags, _flag_names(e.ibv_port_cap_flags))


def translate_port_cap_flags2(flags: int) -> str:
    return str_from_flags(flags, _flag_names(e.ibv_port_cap_flags2))

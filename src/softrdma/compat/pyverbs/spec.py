"""``pyverbs.spec``: flow-steering match specifications (rdma-core ``pyverbs/spec.pyx``).

Plain value holders: softrdma devices do no flow steering (see :mod:`.flow`), so a spec
is only ever built, never applied.
"""

from __future__ import annotations

from typing import Any

from . import libibverbs_enums as e
from .base import PyverbsObject

__all__ = ["Spec", "EthSpec", "Ipv4ExtSpec", "Ipv6Spec", "TcpUdpSpec"]


class Spec(PyverbsObject):
    """A match specification: the given fields and their masks."""

    spec_type = 0

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self, name, value)
        self.size = 0

    def type_to_str(self, spec_type: int) -> str:
        try:
            return str(e.ibv_flow_spec_type(spec_type).name)
        except ValueError:
            return f"Unknown spec type ({spec_type})"


class EthSpec(Spec):
    spec_type = int(e.ibv_flow_spec_type.IBV_FLOW_SPEC_ETH)
    MAC_LEN = 6
    MAC_MASK = "ff:ff:ff:ff:ff:ff"
    ZERO_MAC = "00:00:00:00:00:00"


class Ipv4ExtSpec(Spec):
    spec_type = int(e.ibv_flow_spec_type.IBV_FLOW_SPEC_IPV4_EXT)


class Ipv6Spec(Spec):
    spec_type = int(e.ibv_flow_spec_type.IBV_FLOW_SPEC_IPV6)
    EMPTY_IPV6 = "::"
    IPV6_MASK = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    FLOW_LABEL_MASK = 0xFFFFF


class TcpUdpSpec(Spec):
    spec_type = int(e.ibv_flow_spec_type.IBV_FLOW_SPEC_UDP)

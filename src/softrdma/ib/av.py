"""The address vector of a connected QP or an address handle (IBA 11.2.5.3): where its
packets go. Kept apart from :mod:`.qp` so the engine-facing view of a QP
(:mod:`.views`) can name it."""

from __future__ import annotations

from .pacing import rate_bps

__all__ = ["AddressVector"]


class AddressVector:
    """Where a QP's packets go (IBA 11.2.5.3 address vector; ``ibv_ah_attr`` + GRH)."""

    __slots__ = ("dgid", "sgid_index", "flow_label", "hop_limit", "traffic_class", "sl", "dlid",
                 "port_num", "is_global", "dmac", "static_rate", "rate_bps")

    def __init__(self, dgid: bytes, sgid_index: int = 0, flow_label: int = 0,
                 hop_limit: int = 64, traffic_class: int = 0, sl: int = 0, dlid: int = 0,
                 port_num: int = 1, is_global: bool = True, dmac: bytes = b"",
                 static_rate: int = 0) -> None:
        self.dgid = bytes(dgid)
        self.sgid_index = sgid_index
        self.flow_label = flow_label
        self.hop_limit = hop_limit
        self.traffic_class = traffic_class
        self.sl = sl
        self.dlid = dlid
        self.port_num = port_num
        self.is_global = is_global
        self.dmac = dmac
        self.static_rate = static_rate  # IBV_RATE_* (IBA 9.11 static rate control)
        self.rate_bps = rate_bps(static_rate)

    def __repr__(self) -> str:
        return f"AddressVector(dgid={self.dgid.hex()}, sgid_index={self.sgid_index})"

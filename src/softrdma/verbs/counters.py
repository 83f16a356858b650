"""Port counters as the verbs API returns them (:meth:`Context.query_port_counters`).

What ``rdma statistic show link DEV/PORT`` shows for a Linux device (its hw counters),
as one typed object: the traffic counters by name, then the drops by reason
(:class:`softrdma.seam.counters.DropReason`, CA16-23). On a shared device (devd) the
numbers are the device's, every process's included (see the devd module docstring,
"Port counters of a shared device"); on an in-process device they are this process's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..seam.counters import DROP_REASONS, TRAFFIC_COUNTERS, DropReason

__all__ = ["PortCounters"]


@dataclass(frozen=True)
class PortCounters:
    """The counters of one port (``rdma statistic``'s hw counters, by name).

    ``sent_pkts``/``rcvd_pkts``/``sent_bytes``/``rcvd_bytes``: IB transport packets and
    their bytes (BTH .. ICRC); ``retransmitted_pkts``: packets sent again after a NAK or
    a timeout (IBA 9.7.6.1.3); ``rcvd_rnr_nak``/``send_rnr_nak``: RNR NAKs received and
    sent (IBA 9.7.5.2.8); ``rcvd_icrc_err``: packets dropped for a bad ICRC; ``drops``:
    dropped packets by reason (every reason, zeros included); ``counters``: everything,
    in ``rdma statistic`` order; ``shared``: True when the numbers are the whole
    device's (several processes through devd).
    """

    device: str
    port_num: int
    counters: Mapping[str, int] = field(repr=False)
    shared: bool = False

    @classmethod
    def from_values(cls, device: str, port_num: int, values: Mapping[str, int],
                    shared: bool = False) -> PortCounters:
        names = (*TRAFFIC_COUNTERS, *(r.value for r in DropReason))
        ordered = {n: int(values.get(n, 0)) for n in names}
        ordered.update({k: int(v) for k, v in values.items() if k not in ordered})
        return cls(device, port_num, ordered, shared)

    def __getitem__(self, name: str) -> int:
        return self.counters[name]

    @property
    def sent_pkts(self) -> int:
        return self.counters["sent_pkts"]

    @property
    def rcvd_pkts(self) -> int:
        return self.counters["rcvd_pkts"]

    @property
    def sent_bytes(self) -> int:
        return self.counters["sent_bytes"]

    @property
    def rcvd_bytes(self) -> int:
        return self.counters["rcvd_bytes"]

    @property
    def retransmitted_pkts(self) -> int:
        return self.counters["retransmitted_pkts"]

    @property
    def rcvd_rnr_nak(self) -> int:
        return self.counters["rcvd_rnr_nak"]

    @property
    def send_rnr_nak(self) -> int:
        return self.counters["send_rnr_nak"]

    @property
    def rcvd_icrc_err(self) -> int:
        return self.counters["rcvd_icrc_err"]

    @property
    def drops(self) -> dict[str, int]:
        """Dropped packets by reason (:class:`~softrdma.seam.counters.DropReason` values)."""
        return {r.value: self.counters.get(r.value, 0) for r in DropReason}

    @property
    def total_drops(self) -> int:
        return sum(self.drops.values())

    @staticmethod
    def describe(reason: str) -> str:
        """``layer: what failed (clause)`` for a drop reason's counter name."""
        for r, (layer, what, clause) in DROP_REASONS.items():
            if r.value == reason:
                return f"{layer}: {what} ({clause})"
        return reason

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
from typing import Any, overload

from ..seam.counters import DROP_REASONS, TRAFFIC_COUNTERS, DropReason

__all__ = ["PortCounters"]


class _Counter:
    """One traffic counter of :attr:`PortCounters.counters` as an attribute of its own
    name (``c.sent_pkts`` is ``c.counters["sent_pkts"]``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: Any = None) -> _Counter: ...

    @overload
    def __get__(self, obj: PortCounters, objtype: Any = None) -> int: ...

    def __get__(self, obj: PortCounters | None, objtype: Any = None) -> _Counter | int:
        return self if obj is None else obj.counters[self.name]


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

    sent_pkts = _Counter()
    rcvd_pkts = _Counter()
    sent_bytes = _Counter()
    rcvd_bytes = _Counter()
    retransmitted_pkts = _Counter()
    rcvd_rnr_nak = _Counter()
    send_rnr_nak = _Counter()
    rcvd_icrc_err = _Counter()

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

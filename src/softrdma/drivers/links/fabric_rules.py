"""Statistics and targeted-fault rules of the in-memory fabric (:mod:`.fabric`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

from ...seam.counters import SlotCounters
from .link import Datagram

__all__ = ["Action", "ACTIONS", "ETH_OVERHEAD", "FabricStats", "Rule", "RuleOwner"]

Action = Literal["drop", "duplicate", "delay", "corrupt", "reorder"]
ACTIONS = ("drop", "duplicate", "delay", "corrupt", "reorder")

# Ethernet header + FCS, counted in serialisation time (IEEE 802.3 framing).
ETH_OVERHEAD = 14 + 4


class FabricStats(SlotCounters):
    """What the fabric did, counted per datagram.

    ``sent``: accepted by ``send``; ``delivered``: put in a receive queue (duplicates
    count once each); ``dropped``: lost to a random or rule drop; ``partitioned``: lost
    because source or destination was partitioned; ``unroutable``: no link has the
    destination address/port (or it closed); ``overflow``: the destination queue was
    full; ``duplicated``/``reordered``/``delayed``/``corrupted``: faults applied;
    ``rule_hits``: rule actions applied; ``bytes_delivered``: payload bytes delivered.
    """

    __slots__ = ("sent", "delivered", "dropped", "partitioned", "unroutable", "overflow",
                 "duplicated", "reordered", "delayed", "corrupted", "rule_hits",
                 "bytes_delivered")

    sent: int
    delivered: int
    dropped: int
    partitioned: int
    unroutable: int
    overflow: int
    duplicated: int
    reordered: int
    delayed: int
    corrupted: int
    rule_hits: int
    bytes_delivered: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FabricStats) and self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.as_dict().items() if v)
        return f"FabricStats({inner})"


class RuleOwner(Protocol):
    """What a :class:`Rule` needs of its fabric (:class:`~.fabric.Fabric`): to be taken
    off it."""

    def remove_rule(self, rule: Rule) -> None: ...


class Rule:
    """A targeted fault: ``action`` applies to datagrams for which ``predicate`` is true.

    The first ``skip`` matching datagrams pass untouched; then the action applies to the
    next ``count`` matches (all of them when ``count`` is None), after which the rule is
    spent. ``matches`` counts predicate hits, ``hits`` actions applied.
    """

    __slots__ = ("predicate", "action", "count", "skip", "delay", "matches", "hits", "_fabric")

    def __init__(self, fabric: RuleOwner, predicate: Callable[[Datagram], bool], action: Action,
                 count: int | None, skip: int, delay: float) -> None:
        self._fabric: RuleOwner | None = fabric
        self.predicate = predicate
        self.action: Action = action
        self.count = count
        self.skip = skip
        self.delay = delay
        self.matches = 0
        self.hits = 0

    @property
    def spent(self) -> bool:
        """True once the action has been applied ``count`` times."""
        return self.count is not None and self.hits >= self.count

    def remove(self) -> None:
        """Take the rule off its fabric (idempotent)."""
        if self._fabric is not None:
            self._fabric.remove_rule(self)

    def __repr__(self) -> str:
        return (f"<Rule {self.action} count={self.count} skip={self.skip} "
                f"matches={self.matches} hits={self.hits}>")

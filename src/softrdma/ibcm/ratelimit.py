"""How often a CM answers a stranger on its own: a token bucket per source address.

A REQ nobody listens for is answered with REJ reason 8, Invalid Service ID (IBA 12.6.7,
A11 CA11-8), and a SIDR_REQ with SIDR_REP status 1 (IBA 12.11.2). The answer goes to the
REQ's source address, which nothing authenticates, so a CM bounds what it sends to any one
address (it must not become a reflector): at most :data:`REJ_BURST` answers per source,
refilled at :data:`REJ_PER_SECOND`. Used by the CM agent (:mod:`.agent`) and by devd,
which answers for a device with no CM (:mod:`softrdma.drivers.devd.cm_reject`).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["MAX_SOURCES", "REJ_BURST", "REJ_PER_SECOND", "RejLimiter"]

REJ_BURST = 8  # answers to one source before the rate limit applies
REJ_PER_SECOND = 8.0  # refill rate of a source's answers
MAX_SOURCES = 4096  # sources remembered; the least recently seen is forgotten


class RejLimiter:
    """A token bucket per source address: :data:`REJ_BURST` answers, then
    :data:`REJ_PER_SECOND`. Sans-I/O: the caller gives the time."""

    def __init__(self, burst: int = REJ_BURST, rate: float = REJ_PER_SECOND,
                 max_sources: int = MAX_SOURCES) -> None:
        self.burst = burst
        self.rate = rate
        self.max_sources = max_sources
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()

    def allow(self, src: bytes, now: float) -> bool:
        """Whether one more answer may go to ``src`` at time ``now`` (seconds)."""
        tokens, last = self._buckets.pop(src, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        ok = tokens >= 1.0
        if ok:
            tokens -= 1.0
        self._buckets[src] = (tokens, now)
        if len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return ok

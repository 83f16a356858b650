"""Static rate control (IBA 9.11; A16.7.3, CA16-15.1.1: "A RoCE port shall support
static rate control").

An address vector's static rate (``ibv_ah_attr.static_rate``, an ``IBV_RATE_*`` value)
or a QP's rate limit (softrdma's ``QP.modify_rate_limit``, in kbit/s as rdma-core's
``ibv_modify_qp_rate_limit``) caps the rate at which the requester emits packets: after
a packet of ``L`` bytes the next one waits until ``L * 8 / rate`` seconds after the
previous one was allowed out (the inter-packet delay of IBA 9.11, computed from the
length of the packet just sent). The bytes counted are the IB transport packet, BTH
through ICRC, as the port's ``sent_bytes`` counter counts them; the network header
around it is not counted.

Sans-I/O: :class:`Pacer` keeps the time the next packet may leave and, when the
requester has to wait, is armed on the port's timers with that deadline.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidArgument

__all__ = ["RATE_MBPS", "rate_bps", "Pacer", "ICRC_BYTES"]

ICRC_BYTES = 4

# ibv_rate value -> Mbit/s (libibverbs ibv_rate_to_mbps); IBV_RATE_MAX (0): no limit.
RATE_MBPS: dict[int, int] = {
    2: 2500, 5: 5000, 3: 10000, 6: 20000, 4: 30000, 7: 40000, 8: 60000, 9: 80000,
    10: 120000, 11: 14062, 12: 56250, 13: 112500, 14: 168750, 15: 25781, 16: 103125,
    17: 206250, 18: 309375, 19: 28125, 20: 53125, 21: 425000, 22: 637500, 23: 850000,
    24: 1275000,
}


def rate_bps(static_rate: int, argument: str = "static_rate") -> float:
    """Bits per second of an ``IBV_RATE_*`` value (0.0: IBV_RATE_MAX, unlimited)."""
    if not isinstance(static_rate, int) or isinstance(static_rate, bool):
        raise InvalidArgument(argument, f"must be an IBV_RATE_* value, got {static_rate!r}")
    if static_rate == 0:
        return 0.0
    mbps = RATE_MBPS.get(static_rate)
    if mbps is None:
        raise InvalidArgument(argument, f"{static_rate} is not an IBV_RATE_* value")
    return mbps * 1e6


class Pacer:
    """When the next packet of one requester may leave (IBA 9.11 inter-packet delay).

    Registered on the port's timers (``port.arm``) while the requester waits; at the
    deadline ``on_timer`` calls ``resume(now)``.
    """

    __slots__ = ("next_at", "deadline", "resume", "waited")

    def __init__(self, resume: Callable[[float], None]) -> None:
        self.next_at = 0.0
        self.waited = False
        self.deadline: float | None = None
        self.resume = resume

    def must_wait(self, now: float) -> bool:
        if now < self.next_at:
            self.waited = True
            return True
        return False

    def sent(self, nbytes: int, bps: float, now: float) -> None:
        """A packet of ``nbytes`` (BTH .. ICRC) left at ``now`` under a ``bps`` limit.

        A sender that waited for the pacer and was woken late (a real clock's timer)
        counts this packet from when it was due, if that is less than one delay ago: the
        long-run rate stays at the limit (never above: only real lateness is made up).
        A sender that did not wait starts the delay now (an idle sender gets no credit)."""
        ipd = nbytes * 8 / bps
        due = self.next_at
        start = due if self.waited and now - due < ipd else now
        self.waited = False
        self.next_at = (start if start > now - ipd else now) + ipd

    def on_timer(self, now: float) -> None:
        self.deadline = None
        self.resume(now)

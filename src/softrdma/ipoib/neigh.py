"""The neighbour table: next hop IP -> 20-byte link-layer address, sans-I/O.

The kernel does no ARP or ND on a TUN device, so the interface resolves next hops
itself. The states and timers are those of RFC 4861 §7.3.2 (which Linux's NUD machine
also uses for ARP): INCOMPLETE (multicast probes every RetransTimer, at most
MAX_MULTICAST_SOLICIT), REACHABLE (for ReachableTime after a confirmation), STALE,
DELAY (DELAY_FIRST_PROBE_TIME after a use of a STALE entry), PROBE (unicast probes,
at most MAX_UNICAST_SOLICIT); a failed entry is removed, and so is a STALE entry unused
for ``gc_stale_s`` (Linux ``gc_stale_time``) -- RFC 4755 §3.4 lets the connection to the
peer go with it.

Two rules keep a live peer from being declared dead on a busy machine:

* *upper-layer confirmation* (RFC 4861 §7.3.1): forward progress reported from above --
  here, the peer acknowledging our sends on its RC connection -- proves the neighbour
  reachable as an ARP/ND answer does (:meth:`NeighbourTable.confirm_progress`); a
  REACHABLE entry whose timer comes due re-arms from its last confirmation (Linux
  ``neigh->confirmed``), so a neighbour with traffic in flight is never probed;
* *late timers do not count*: a probe timer that fires ``late_s`` or more after its
  deadline was held up by our own process (descheduled, or busy), not by the peer,
  whose answer had no fair chance to be read; it sends the probe again without counting
  it (at most ``max_late`` times per resolution, so a dead peer is still found).

The machine is the table :data:`TRANSITIONS`: ``(state, event) -> (next state, action)``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from .hwaddr import HwAddr

__all__ = ["NudState", "NeighEvent", "NeighAction", "NeighConfig", "Neighbour",
           "NeighbourTable", "TRANSITIONS", "Probe", "Resolved", "Unresolved", "Expired"]


class NudState(Enum):
    INCOMPLETE = "INCOMPLETE"
    REACHABLE = "REACHABLE"
    STALE = "STALE"
    DELAY = "DELAY"
    PROBE = "PROBE"
    FAILED = "FAILED"


class NeighEvent(Enum):
    USE = "use"            # a packet is to be sent to the neighbour
    CONFIRM = "confirm"    # an ARP/ND answer, or traffic received from the neighbour
    LEARN = "learn"        # an unsolicited address (a request naming its sender)
    TIMER = "timer"


class NeighAction(Enum):
    NONE = "none"
    MCAST_PROBE = "mcast-probe"     # ARP request / NS to the multicast group, re-armed
    UCAST_PROBE = "ucast-probe"     # ARP request / NS to the known address, re-armed
    ARM_DELAY = "arm-delay"
    ARM_REACHABLE = "arm-reachable"
    ARM_GC = "arm-gc"
    RETRY_OR_FAIL = "retry-or-fail"
    EXPIRE = "expire"


S, E, A = NudState, NeighEvent, NeighAction
TRANSITIONS: dict[tuple[NudState, NeighEvent], tuple[NudState, NeighAction]] = {
    (S.INCOMPLETE, E.USE): (S.INCOMPLETE, A.NONE),
    (S.INCOMPLETE, E.CONFIRM): (S.REACHABLE, A.ARM_REACHABLE),
    (S.INCOMPLETE, E.LEARN): (S.STALE, A.ARM_GC),
    (S.INCOMPLETE, E.TIMER): (S.INCOMPLETE, A.RETRY_OR_FAIL),
    (S.REACHABLE, E.USE): (S.REACHABLE, A.NONE),
    (S.REACHABLE, E.CONFIRM): (S.REACHABLE, A.ARM_REACHABLE),
    (S.REACHABLE, E.LEARN): (S.REACHABLE, A.NONE),
    (S.REACHABLE, E.TIMER): (S.STALE, A.ARM_GC),
    (S.STALE, E.USE): (S.DELAY, A.ARM_DELAY),
    (S.STALE, E.CONFIRM): (S.REACHABLE, A.ARM_REACHABLE),
    (S.STALE, E.LEARN): (S.STALE, A.ARM_GC),
    (S.STALE, E.TIMER): (S.FAILED, A.EXPIRE),
    (S.DELAY, E.USE): (S.DELAY, A.NONE),
    (S.DELAY, E.CONFIRM): (S.REACHABLE, A.ARM_REACHABLE),
    (S.DELAY, E.LEARN): (S.DELAY, A.NONE),
    (S.DELAY, E.TIMER): (S.PROBE, A.UCAST_PROBE),
    (S.PROBE, E.USE): (S.PROBE, A.NONE),
    (S.PROBE, E.CONFIRM): (S.REACHABLE, A.ARM_REACHABLE),
    (S.PROBE, E.LEARN): (S.PROBE, A.NONE),
    (S.PROBE, E.TIMER): (S.PROBE, A.RETRY_OR_FAIL),
}
del S, E, A


@dataclass(slots=True)
class NeighConfig:
    """RFC 4861 §10 constants (Linux defaults for gc_stale and the queue)."""

    retrans_s: float = 1.0            # RetransTimer
    reachable_s: float = 30.0         # ReachableTime
    delay_s: float = 5.0              # DELAY_FIRST_PROBE_TIME
    max_mcast_probes: int = 3         # MAX_MULTICAST_SOLICIT
    max_ucast_probes: int = 3         # MAX_UNICAST_SOLICIT
    gc_stale_s: float = 60.0          # Linux gc_stale_time
    queue_len: int = 64               # packets held while INCOMPLETE (Linux unres_qlen)
    late_s: float = 0.5               # a probe timer this late was delayed by us
    max_late: int = 8                 # late probe timers not counted, per resolution


@dataclass(slots=True)
class Neighbour:
    ip: bytes
    hw: HwAddr | None = None
    state: NudState = NudState.INCOMPLETE
    deadline: float = 0.0
    probes: int = 0
    updated: float = 0.0
    confirmed: float = 0.0            # the last reachability confirmation
    late: int = 0                     # late probe timers not counted so far
    queue: deque[bytes] = field(default_factory=deque)


@dataclass(frozen=True, slots=True)
class Probe:
    """Send an ARP request / NS for ``ip``: to ``hw`` (unicast) or the group (None)."""

    ip: bytes
    hw: HwAddr | None


@dataclass(frozen=True, slots=True)
class Resolved:
    """``entry`` has an address now: its held packets can go."""

    entry: Neighbour


@dataclass(frozen=True, slots=True)
class Unresolved:
    """Resolution of ``entry`` failed: its held packets are dropped."""

    entry: Neighbour
    dropped: int


@dataclass(frozen=True, slots=True)
class Expired:
    """``entry`` left the table (RFC 4755 §3.4: its connection may go). ``idle``: it
    was only unused (a STALE entry's ``gc_stale_s``), not found dead or moved: the
    connection we opened to it goes, as Linux reaps an IPoIB neighbour and its TX
    connection, but one the peer opened and still uses is the peer's to close."""

    entry: Neighbour
    idle: bool = False


NeighOutput = Probe | Resolved | Unresolved | Expired


class NeighbourTable:
    """Neighbours by IP address (4 or 16 bytes)."""

    def __init__(self, config: NeighConfig | None = None) -> None:
        self.config = config if config is not None else NeighConfig()
        self.entries: dict[bytes, Neighbour] = {}
        self.out: list[NeighOutput] = []
        self.queue_drops = 0
        self.late_probes = 0

    def get(self, ip: bytes) -> Neighbour | None:
        return self.entries.get(ip)

    def use(self, ip: bytes, now: float, packet: bytes | None = None) -> Neighbour:
        """A packet goes to ``ip``: starts resolution of an unknown neighbour (the packet,
        if given, is held until it resolves)."""
        n = self.entries.get(ip)
        if n is None:
            n = Neighbour(ip, updated=now)
            self.entries[ip] = n
            n.probes = 1
            n.deadline = now + self.config.retrans_s
            self.out.append(Probe(ip, None))
        elif n.state is not NudState.REACHABLE:
            self._event(n, NeighEvent.USE, now)
        if packet is not None and n.hw is None:
            if len(n.queue) >= self.config.queue_len:
                n.queue.popleft()
                self.queue_drops += 1
            n.queue.append(packet)
        return n

    def confirm(self, ip: bytes, hw: HwAddr, now: float) -> Neighbour:
        """An answer (ARP reply, NA with S) or traffic proves ``ip`` is at ``hw``."""
        return self._update(ip, hw, now, NeighEvent.CONFIRM)

    def learn(self, ip: bytes, hw: HwAddr, now: float) -> Neighbour:
        """A request told us ``ip`` is at ``hw`` (RFC 4861 §7.2.3: STALE if new)."""
        return self._update(ip, hw, now, NeighEvent.LEARN)

    def _update(self, ip: bytes, hw: HwAddr, now: float, ev: NeighEvent) -> Neighbour:
        n = self.entries.get(ip)
        if n is None:
            n = Neighbour(ip, updated=now)
            self.entries[ip] = n
        was_unresolved = n.hw is None
        if n.hw is not None and n.hw.key != hw.key:
            # the address moved (e.g. the peer restarted with a new UD QPN): the old
            # peer is gone as far as connections go.
            self.out.append(Expired(Neighbour(ip, n.hw, NudState.FAILED)))
        n.hw = hw
        n.updated = now
        self._event(n, ev, now)
        if was_unresolved:
            self.out.append(Resolved(n))
        return n

    def confirm_progress(self, key: bytes, now: float) -> int:
        """Upper-layer reachability confirmation (RFC 4861 §7.3.1) for the neighbours at
        link-layer address ``key`` (flags zeroed): the peer acknowledged our traffic.
        A REACHABLE entry only notes the time; any other resolved entry becomes
        REACHABLE. Returns the number of entries confirmed."""
        found = 0
        for n in list(self.entries.values()):
            if n.hw is None or n.hw.key != key:
                continue
            found += 1
            if n.state is NudState.REACHABLE:
                n.confirmed = now
            else:
                self._event(n, NeighEvent.CONFIRM, now)
        return found

    def delete(self, ip: bytes) -> None:
        n = self.entries.pop(ip, None)
        if n is not None:
            self.out.append(Expired(n))

    def next_deadline(self) -> float | None:
        return min((n.deadline for n in self.entries.values()), default=None)

    def on_timer(self, now: float) -> None:
        cfg = self.config
        for n in [n for n in self.entries.values() if n.deadline <= now]:
            if n.state is NudState.REACHABLE and now - n.confirmed < cfg.reachable_s:
                # confirmed since the timer was armed (§7.3.1): reachable a while longer
                n.deadline = n.confirmed + cfg.reachable_s
                continue
            if (n.state in (NudState.INCOMPLETE, NudState.PROBE)
                    and now - n.deadline >= cfg.late_s and n.late < cfg.max_late):
                # our own delay, not the peer's silence: probe again, uncounted
                n.late += 1
                self.late_probes += 1
                n.deadline = now + cfg.retrans_s
                self.out.append(Probe(n.ip, n.hw))
                continue
            self._event(n, NeighEvent.TIMER, now)

    def take_output(self) -> list[NeighOutput]:
        out, self.out = self.out, []
        return out

    def _event(self, n: Neighbour, ev: NeighEvent, now: float) -> None:
        state, action = TRANSITIONS[(n.state, ev)]
        cfg = self.config
        n.state = state
        if action is NeighAction.ARM_REACHABLE:
            n.deadline = now + cfg.reachable_s
            n.confirmed = now
            n.probes = 0
            n.late = 0
        elif action is NeighAction.ARM_GC:
            n.deadline = now + cfg.gc_stale_s
        elif action is NeighAction.ARM_DELAY:
            n.deadline = now + cfg.delay_s
        elif action is NeighAction.UCAST_PROBE:
            n.probes = 1
            n.deadline = now + cfg.retrans_s
            self.out.append(Probe(n.ip, n.hw))
        elif action is NeighAction.RETRY_OR_FAIL:
            limit = cfg.max_mcast_probes if n.hw is None else cfg.max_ucast_probes
            if n.probes < limit:
                n.probes += 1
                n.deadline = now + cfg.retrans_s
                self.out.append(Probe(n.ip, n.hw))
            else:
                self._remove(n, failed=True)
        elif action is NeighAction.EXPIRE:
            self._remove(n, failed=False)

    def _remove(self, n: Neighbour, *, failed: bool) -> None:
        n.state = NudState.FAILED
        self.entries.pop(n.ip, None)
        if n.queue:
            self.out.append(Unresolved(n, len(n.queue)))
        if n.hw is not None or not failed:
            self.out.append(Expired(n, idle=not failed))

"""IPoIB-CM connections of one interface, sans-I/O (RFC 4755 §3.2-§3.4, §5.1, §6).

The table decides; its driver sets the connections up through the IB CM and reports
back. Per peer (a link-layer address with the flags zeroed) there is at most one
connection we opened (active) and any number the peer opened (passive). A REQ that
arrives while our own REQ to the same peer is outstanding is the REQ crossing of §3.3:
the side with the numerically smaller address (flags zeroed, most significant octet
first) accepts, the other rejects with Consumer Reject. Linux does not apply that rule:
each of its connections carries one direction, so a Linux peer opens its own connection
alongside ours once ours is up; such a REQ (none of ours outstanding) is accepted, and
either connection carries our packets (§7: all unicast is accepted on any mode).

Per-connection MTU = min(both Receive MTUs) - 4 (§5.1), at most :data:`IPOIB_CM_MTU`.
Idle passive connections are reaped after ``idle_s`` (Linux ``IPOIB_CM_RX_TIMEOUT``,
2 x 256 s); active ones go with their neighbour entry (§3.4).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from ..errors import DecodeError
from ..wire.cm import RejReason
from .encap import ENCAP_LEN
from .hwaddr import MULTICAST_QPN, CmData, HwAddr
from .ip import IPV4_MIN_MTU

__all__ = ["IPOIB_CM_MTU", "IPOIB_CM_BUF_SIZE", "ConnState", "Conn", "ConnTable", "Accept",
           "Refuse", "conn_mtu"]

IPOIB_CM_MTU = 0x10000 - 0x10           # 65520, Linux IPOIB_CM_MTU
IPOIB_CM_BUF_SIZE = IPOIB_CM_MTU + ENCAP_LEN   # 65524: the Receive MTU Linux announces
IDLE_S = 2 * 256.0                      # Linux IPOIB_CM_RX_TIMEOUT
RETRY_S = 10.0                          # no new REQ to a peer that refused for this long
PENDING_MAX = 128                       # packets held while a connection is set up
MIN_RECEIVE_MTU = IPV4_MIN_MTU + ENCAP_LEN


class ConnState(Enum):
    CONNECTING = "CONNECTING"
    ESTABLISHED = "ESTABLISHED"


@dataclass(slots=True)
class Conn:
    """One IPoIB-CM connection and its counters."""

    conn_id: int
    peer: HwAddr
    active: bool
    transport: str                      # "RC" or "UC"
    state: ConnState = ConnState.CONNECTING
    mtu: int = 0
    remote_receive_mtu: int = 0
    local_qpn: int = 0
    remote_qpn: int = 0
    created: float = 0.0
    last_used: float = 0.0
    confirmed: float = float("-inf")    # the last reachability confirmation it gave
    tx_packets: int = 0
    tx_bytes: int = 0
    rx_packets: int = 0
    rx_bytes: int = 0
    pending: deque[tuple[int, bytes]] = field(default_factory=deque)


def conn_mtu(local_receive_mtu: int, remote_receive_mtu: int) -> int:
    """The IPoIB MTU over a connection (RFC 4755 §5.1), capped at 65520."""
    return min(local_receive_mtu, remote_receive_mtu, IPOIB_CM_BUF_SIZE) - ENCAP_LEN


@dataclass(frozen=True, slots=True)
class Accept:
    """Accept the REQ: connection ``conn`` (passive) answers with REP ``private_data``."""

    conn: Conn
    private_data: bytes


@dataclass(frozen=True, slots=True)
class Refuse:
    """Reject the REQ with ``reason`` and ``private_data`` (which carries our UD QPN,
    §3.2: "The IPoIB-UD QPN MUST be included in all REJ messages too")."""

    reason: int
    private_data: bytes
    why: str


class ConnTable:
    """The connections of an interface whose own address is ``local``."""

    def __init__(self, local: HwAddr, receive_mtu: int = IPOIB_CM_BUF_SIZE, *,
                 crossing_rule: bool = True, idle_s: float = IDLE_S,
                 retry_s: float = RETRY_S) -> None:
        self.local = local
        self.receive_mtu = receive_mtu
        self.crossing_rule = crossing_rule
        self.idle_s = idle_s
        self.retry_s = retry_s
        self.conns: dict[int, Conn] = {}
        self.by_peer: dict[bytes, list[Conn]] = {}
        self.backoff: dict[bytes, float] = {}
        self._next_id = 1
        self.crossing_rejects = 0
        self.bad_requests = 0

    @property
    def private_data(self) -> bytes:
        """Ours, for every REQ, REP and REJ (§6)."""
        return CmData(self.local.qpn, self.receive_mtu).encode()

    def _new(self, peer: HwAddr, active: bool, transport: str, now: float) -> Conn:
        c = Conn(self._next_id, peer, active, transport, created=now, last_used=now)
        self._next_id += 1
        self.conns[c.conn_id] = c
        self.by_peer.setdefault(peer.key, []).append(c)
        return c

    def of_peer(self, key: bytes) -> list[Conn]:
        return self.by_peer.get(key, [])

    def tx_conn(self, key: bytes) -> Conn | None:
        """The connection packets to the peer use: ours if established, else one the
        peer opened (§7)."""
        best: Conn | None = None
        for c in self.by_peer.get(key, ()):
            if c.state is ConnState.ESTABLISHED and (best is None or c.active):
                best = c
        return best

    def connecting(self, key: bytes, *, active_only: bool = False) -> Conn | None:
        """A connection to the peer being set up (ours first; with ``active_only``, only
        ours: the outstanding REQ of §3.3)."""
        found: Conn | None = None
        for c in self.by_peer.get(key, ()):
            if c.state is ConnState.CONNECTING and (c.active or not active_only):
                if c.active:
                    return c
                found = found or c
        return found

    def connect(self, peer: HwAddr, transport: str, now: float) -> Conn | None:
        """Open a connection to ``peer`` unless one exists (either way, being set up or
        up), or the peer refused recently."""
        key = peer.key
        if self.of_peer(key):
            return None
        if self.backoff.get(key, 0.0) > now:
            return None
        return self._new(peer, True, transport, now)

    def on_request(self, peer_gid: bytes, private_data: bytes, transport: str,
                   now: float) -> Accept | Refuse:
        """A REQ from ``peer_gid``: check its private data (§6), apply the crossing rule
        (§3.3), and accept or refuse."""
        try:
            data = CmData.decode(private_data)
        except DecodeError as exc:
            self.bad_requests += 1
            return Refuse(RejReason.CONSUMER_DEFINED, self.private_data, str(exc))
        if data.receive_mtu < MIN_RECEIVE_MTU or data.ud_qpn in (0, 1, MULTICAST_QPN):
            self.bad_requests += 1
            return Refuse(RejReason.CONSUMER_DEFINED, self.private_data,
                          f"private data UD QPN {data.ud_qpn:#x} / Receive MTU "
                          f"{data.receive_mtu} is not usable")
        peer = HwAddr(data.ud_qpn, bytes(peer_gid))
        if self.crossing_rule and self.connecting(peer.key, active_only=True) is not None:
            if not self.local.key < peer.key:
                self.crossing_rejects += 1
                return Refuse(RejReason.CONSUMER_DEFINED, self.private_data,
                              "REQ crossing: the peer's address is smaller, it accepts ours")
        c = self._new(peer, False, transport, now)
        c.remote_receive_mtu = data.receive_mtu
        c.mtu = conn_mtu(self.receive_mtu, data.receive_mtu)
        return Accept(c, self.private_data)

    def established(self, conn_id: int, now: float, *, rep_private_data: bytes | None = None,
                    local_qpn: int = 0, remote_qpn: int = 0) -> Conn | None:
        """The connection is up (REP received for ours, RTU for theirs). A REP whose
        private data is malformed or missing leaves the connection unusable: None (close
        it)."""
        c = self.conns.get(conn_id)
        if c is None:
            return None
        if rep_private_data is None and c.active:
            # ours, with no REP to tell the peer's receive MTU (RFC 4755 §6): unusable
            self.bad_requests += 1
            return None
        if rep_private_data is not None:
            try:
                data = CmData.decode(rep_private_data)
            except DecodeError:
                self.bad_requests += 1
                return None
            if data.receive_mtu < MIN_RECEIVE_MTU:
                self.bad_requests += 1
                return None
            c.remote_receive_mtu = data.receive_mtu
            c.mtu = conn_mtu(self.receive_mtu, data.receive_mtu)
        c.state = ConnState.ESTABLISHED
        c.local_qpn, c.remote_qpn = local_qpn, remote_qpn
        c.last_used = now
        self.backoff.pop(c.peer.key, None)
        return c

    def closed(self, conn_id: int, now: float, *, refused: bool = False) -> Conn | None:
        """The connection is gone (REJ, timeout, DREQ, error). A peer with no other
        connection that refused ours, or never answered, is not asked again for
        ``retry_s``."""
        c = self.conns.pop(conn_id, None)
        if c is None:
            return None
        peers = self.by_peer.get(c.peer.key, [])
        if c in peers:
            peers.remove(c)
        if not peers:
            self.by_peer.pop(c.peer.key, None)
            if c.active and (refused or c.state is ConnState.CONNECTING):
                self.backoff[c.peer.key] = now + self.retry_s
        return c

    def idle(self, now: float) -> list[Conn]:
        """Passive connections unused for ``idle_s`` (Linux reaps its RX side)."""
        return [c for c in self.conns.values()
                if not c.active and now - c.last_used >= self.idle_s]

    def next_deadline(self) -> float | None:
        return min((c.last_used + self.idle_s for c in self.conns.values() if not c.active),
                   default=None)

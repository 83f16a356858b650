"""An in-memory RoCEv2 network on a virtual clock, with deterministic fault injection.

A :class:`Fabric` connects any number of :class:`FabricLink` s, each owning an IP address
and a UDP port (default 4791, Annex A17). ``link.send`` queues the datagram for
delivery at ``now + latency`` (plus serialisation time when a ``bandwidth`` is given,
plus injected delay); delivery happens from :class:`~softrdma.drivers.runtime.clock.VirtualClock`
callbacks, puts the datagram in the destination link's receive queue and calls that
link's ``on_readable``. Datagrams carry UDP payloads (BTH .. ICRC): the fabric, like the
network, never looks inside them except for the ``corrupt`` fault, which flips one bit,
and the user's rule predicates.

Faults come from one ``random.Random(seed)``, so a run is reproducible: the same seed,
configuration and traffic give the same :attr:`Fabric.stats`. Random faults (per
datagram probabilities ``drop``, ``duplicate``, ``reorder``, ``corrupt``; a uniform extra
delay in ``[0, delay)``) apply to all traffic; rules (:meth:`Fabric.add_rule`) target
chosen datagrams. :meth:`Fabric.partition` makes a peer unreachable until
:meth:`Fabric.heal`. :meth:`Fabric.capture` records delivered datagrams as
Ethernet/IP/UDP frames in a pcap that tshark dissects as RoCE.
"""

from __future__ import annotations

import heapq
import math
import os
import random
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...errors import ClosedError, InvalidArgument, StateError
from ...wire import roce
from ...wire.gid import ip_to_gid
from ...wire.pcap import LINKTYPE_ETHERNET, PcapWriter
from ...wire.rocev1 import ETH_P_ROCE_V1, GRH_SIZE, mac_of_link_local_gid
from ..runtime.clock import TimerHandle, VirtualClock
from .fabric_rules import ACTIONS, ETH_OVERHEAD, Action, FabricStats, Rule
from .link import (
    GID_TYPE_ROCE_V1,
    ROCE_V2_UDP_PORT,
    Datagram,
    GidEntry,
    LinkState,
    check_port,
    check_roce_ver,
    check_u8,
    gid_entries,
    ip_bytes,
    ip_text,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

class FabricLink(LinkState):
    """One endpoint of a :class:`Fabric` (implements :class:`~softrdma.drivers.links.link.Link`).

    ``on_readable`` (set by the runtime) is called, with no argument, after datagrams
    have been queued for this link; ``recv_batch`` takes them out. The queue holds at
    most ``queue_limit`` datagrams (more are counted as ``overflow`` and lost, like a
    full socket buffer).
    """

    roce_v1 = True  # RoCEv1 frames travel the fabric too (send_v1)
    __slots__ = ("fabric", "ip", "port", "queue_limit", "on_readable", "_rxq", "_mark",
                 "_tx_free", "_closed", "_ips", "roce_ver", "mac", "gid_entries", "clock",
                 "fast_rc_meta")

    def __init__(self, fabric: Fabric, ip: bytes, port: int, queue_limit: int,
                 roce_ver: str = "2") -> None:
        self.fabric = fabric
        self.clock: VirtualClock | None = fabric.clock  # the simulation runs on it
        self.ip = ip
        self.port: int = port
        self.queue_limit = queue_limit
        self.on_readable: Callable[[], None] | None = None
        self.fast_rc_meta = False  # set by the runtime (Link.fast_rc_meta); the fabric ignores it
        self._rxq: deque[Datagram] = deque()
        self._mark = False
        self._tx_free = -math.inf  # when the egress is free again (bandwidth model)
        self._closed = False
        self._ips = (ip,)
        self.roce_ver = roce_ver
        self.mac = _mac(ip)
        # the GID table (link.V1Link): RoCEv1 GIDs from the MAC and the address (Annex A16)
        self.gid_entries: tuple[GidEntry, ...] = gid_entries(roce_ver, self.mac, (ip,),
                                                             (ip_to_gid(ip),))

    def effective_sport(self, requested: int) -> int:
        """Any source port is available on the fabric: ``requested`` itself."""
        return check_port(requested, "requested")

    def send(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
             tos: int = 0, ttl: int = 64) -> None:
        """Hand one datagram (the concatenation of ``parts``) to the fabric.

        The bytes are copied, so the caller may reuse its buffers at once.
        """
        if self._closed:
            raise ClosedError("FabricLink is closed")
        if len(dst_ip) != len(self.ip):
            dst_ip = ip_bytes(dst_ip, "dst_ip")
            if len(dst_ip) != len(self.ip):
                raise InvalidArgument("dst_ip", "address family differs from the link's")
        if not (0 <= dport <= 0xFFFF and 0 <= sport <= 0xFFFF):
            check_port(dport, "dport")
            check_port(sport, "sport")
        if not (0 <= tos <= 0xFF and 0 <= ttl <= 0xFF):
            check_u8(tos, "tos")
            check_u8(ttl, "ttl")
        self.fabric._send(self, bytes(dst_ip), dport, sport, b"".join(parts), tos, ttl)

    def send_v1(self, dgid: bytes, parts: Sequence[ReadableBuffer], sl: int = 0) -> None:
        """Hand one RoCEv1 packet (GRH, BTH .. pad, ICRC) to the fabric (Annex A16); it is
        delivered to the link owning RoCEv1 GID ``dgid``. ``sl`` has no effect here."""
        if self._closed:
            raise ClosedError("FabricLink is closed")
        if self.roce_ver == "2":
            raise StateError("this fabric link runs RoCE v2 only")
        data = b"".join(parts)
        if len(data) < GRH_SIZE:
            raise InvalidArgument("parts", "a RoCEv1 packet starts with a 40-byte GRH")
        self.fabric._send_v1(self, bytes(dgid), data)

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        """Up to ``max_n`` queued datagrams, oldest first (never blocks)."""
        q = self._rxq
        if max_n >= len(q):
            if not q:
                return []
            out = list(q)
            q.clear()
            return out
        if max_n <= 0:
            if max_n < 0:
                raise InvalidArgument("max_n", "must be >= 0")
            return []
        pop = q.popleft
        return [pop() for _ in range(max_n)]

    def pending(self) -> int:
        """How many datagrams wait in the receive queue."""
        return len(self._rxq)

    def fileno(self) -> int | None:
        """None: the fabric wakes its reader through ``on_readable``, not a descriptor."""
        return None

    def close(self) -> None:
        """Detach from the fabric; queued and in-flight datagrams are lost."""
        if not self._closed:
            self._closed = True
            self._rxq.clear()
            self.on_readable = None
            self.fabric._detach(self)

    def __repr__(self) -> str:
        return f"<FabricLink {ip_text(self.ip)}:{self.port}{' closed' if self._closed else ''}>"


_Entry = tuple[float, int, Datagram, FabricLink]


class Fabric:
    """The in-memory network (see the module docstring).

    ``latency`` is the one-way propagation delay in seconds; ``bandwidth`` (bits per
    second, None = infinite) adds serialisation time per sending link, frames queueing
    behind each other. ``drop``/``duplicate``/``reorder``/``corrupt`` are per-datagram
    probabilities, ``delay`` the upper bound of a uniform extra delay. A reordered
    datagram is held back and delivered right after the next datagram on the same path
    (source address to destination link), or after ``reorder_window`` seconds if none
    comes. The probabilities are plain attributes and may be changed between sends.
    """

    def __init__(self, clock: VirtualClock, *, seed: int = 0, latency: float = 1e-6,
                 drop: float = 0.0, duplicate: float = 0.0, reorder: float = 0.0,
                 delay: float = 0.0, corrupt: float = 0.0, bandwidth: float | None = None,
                 reorder_window: float = 1e-3, queue_limit: int = 1 << 16) -> None:
        if not isinstance(clock, VirtualClock):
            raise InvalidArgument("clock", "the fabric needs a VirtualClock")
        for name, p in (("drop", drop), ("duplicate", duplicate), ("reorder", reorder),
                        ("corrupt", corrupt)):
            if not 0.0 <= p <= 1.0:
                raise InvalidArgument(name, f"a probability must be in [0, 1], got {p!r}")
        for name, d in (("latency", latency), ("delay", delay),
                        ("reorder_window", reorder_window)):
            if not (d >= 0.0 and math.isfinite(d)):
                raise InvalidArgument(name, f"must be a finite number of seconds >= 0, got {d!r}")
        if bandwidth is not None and not (bandwidth > 0 and math.isfinite(bandwidth)):
            raise InvalidArgument("bandwidth", f"must be > 0 bits/s or None, got {bandwidth!r}")
        if queue_limit < 1:
            raise InvalidArgument("queue_limit", "must be >= 1")
        self.clock = clock
        self.seed = seed
        self.rng = random.Random(seed)
        self.latency = float(latency)
        self.drop = drop
        self.duplicate = duplicate
        self.reorder = reorder
        self.delay = float(delay)
        self.corrupt = corrupt
        self.bandwidth = bandwidth
        self.reorder_window = float(reorder_window)
        self.queue_limit = queue_limit
        self.stats = FabricStats()
        self._links: dict[tuple[bytes, int], FabricLink] = {}
        self._v1: dict[bytes, FabricLink] = {}  # RoCEv1 GID -> link
        self._rules: list[Rule] = []
        self._partitioned: set[bytes] = set()
        self._heap: list[_Entry] = []
        self._seq = 0
        self._timer: TimerHandle | None = None
        self._timer_at = math.inf
        # reorder: path -> (seq of the fallback entry, arrival time, datagram, dst)
        self._held: dict[tuple[bytes, FabricLink], tuple[int, float, Datagram]] = {}
        self._held_seq: dict[int, tuple[bytes, FabricLink]] = {}
        self._void: set[int] = set()
        self._pcap: PcapWriter | None = None

    # ---- topology --------------------------------------------------------------------
    def link(self, ip: str | bytes, port: int = ROCE_V2_UDP_PORT, *,
             queue_limit: int | None = None, roce_ver: str | int = "2") -> FabricLink:
        """A new endpoint with address ``ip`` (text, 4 or 16 bytes) and UDP ``port``.

        ``roce_ver`` 1, 2 or ``"both"``: which encapsulations its GIDs have. RoCEv1
        endpoints get a MAC (02:00 + the address's last 4 bytes) and the GIDs of
        ``link.v1_gids``; RoCEv1 packets are routed by DGID.
        """
        ver = check_roce_ver(roce_ver)
        raw = ip_bytes(ip, "ip")
        check_port(port, "port")
        if (raw, port) in self._links:
            raise StateError(f"fabric address {ip_text(raw)} port {port} is already in use")
        limit = self.queue_limit if queue_limit is None else queue_limit
        if limit < 1:
            raise InvalidArgument("queue_limit", "must be >= 1")
        lk = FabricLink(self, raw, port, limit, ver)
        if ver != "2":
            taken = [g for g, t in lk.gid_entries if t == GID_TYPE_ROCE_V1 and g in self._v1]
            if taken:
                raise StateError(f"fabric RoCEv1 GID {taken[0].hex()} is already in use")
            for g, t in lk.gid_entries:
                if t == GID_TYPE_ROCE_V1:
                    self._v1[g] = lk
        self._links[(raw, port)] = lk
        return lk

    def links(self) -> list[FabricLink]:
        """The attached links."""
        return list(self._links.values())

    def _detach(self, lk: FabricLink) -> None:
        if self._links.get((lk.ip, lk.port)) is lk:
            del self._links[(lk.ip, lk.port)]
        for g in [g for g, owner in self._v1.items() if owner is lk]:
            del self._v1[g]

    def partition(self, ip: str | bytes) -> None:
        """Drop everything from or to ``ip`` (sent or already in flight) until healed."""
        self._partitioned.add(ip_bytes(ip, "ip"))

    def heal(self, ip: str | bytes) -> None:
        """Undo :meth:`partition` (a no-op if ``ip`` is not partitioned)."""
        self._partitioned.discard(ip_bytes(ip, "ip"))

    # ---- rules -----------------------------------------------------------------------
    def add_rule(self, predicate: Callable[[Datagram], bool], action: Action,
                 count: int | None = None, *, skip: int = 0, delay: float = 0.0) -> Rule:
        """Apply ``action`` to datagrams matching ``predicate``.

        ``action``: ``"drop"``, ``"duplicate"`` (deliver twice), ``"delay"`` (``delay``
        extra seconds), ``"corrupt"`` (flip one random payload bit) or ``"reorder"``
        (deliver after the next datagram on the same path). ``skip`` matches pass first,
        then the next ``count`` (None: every) match is hit. Example, drop the 3rd RDMA
        Write Last to QP 0x12: ``add_rule(lambda d: d.data[0] == 0x08 and
        d.data[5:8] == b"\\0\\0\\x12", "drop", count=1, skip=2)``. The predicate sees the
        datagram before any fault is applied; it must not keep ``data``.
        """
        if action not in ACTIONS:
            raise InvalidArgument("action", f"must be one of {', '.join(ACTIONS)}; got {action!r}")
        if not callable(predicate):
            raise InvalidArgument("predicate", "must be callable")
        if count is not None and count < 0:
            raise InvalidArgument("count", "must be >= 0 or None")
        if skip < 0:
            raise InvalidArgument("skip", "must be >= 0")
        if not (delay >= 0.0 and math.isfinite(delay)):
            raise InvalidArgument("delay", f"must be a finite number of seconds >= 0, got {delay!r}")
        if action == "delay" and delay == 0.0:
            raise InvalidArgument("delay", "a 'delay' rule needs delay > 0")
        rule = Rule(self, predicate, action, count, skip, float(delay))
        self._rules.append(rule)
        return rule

    def remove_rule(self, rule: Rule) -> None:
        """Remove ``rule`` (idempotent)."""
        if rule in self._rules:
            self._rules.remove(rule)
        rule._fabric = None

    @property
    def rules(self) -> list[Rule]:
        return list(self._rules)

    # ---- capture ---------------------------------------------------------------------
    def capture(self, path: str | os.PathLike[str]) -> None:
        """Write every delivered datagram to ``path`` as an Ethernet/IP/UDP pcap frame.

        Timestamps are virtual time. IPv4 headers are what Linux sends from an
        unconnected socket with ``IP_PMTUDISC_DO`` (ID 0, DF, UDP checksum 0; captures
        README), so the ICRC in the payload checks against them.
        """
        self.stop_capture()
        self._pcap = PcapWriter(path, LINKTYPE_ETHERNET)

    def stop_capture(self) -> None:
        """Close the capture file (idempotent)."""
        if self._pcap is not None:
            self._pcap.close()
            self._pcap = None

    # ---- state -----------------------------------------------------------------------
    def in_flight(self) -> int:
        """Datagrams scheduled for delivery (held reordered ones included)."""
        return len(self._heap) - len(self._void)

    def close(self) -> None:
        """Stop delivering, forget in-flight datagrams, close the capture."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self._heap.clear()
        self._held.clear()
        self._held_seq.clear()
        self._void.clear()
        self.stop_capture()

    # ---- data path -------------------------------------------------------------------
    def _send(self, src: FabricLink, dst_ip: bytes, dport: int, sport: int, data: bytes,
              tos: int, ttl: int) -> None:
        self.stats.sent += 1
        dg = Datagram(memoryview(data), src.ip, dst_ip, sport, dport, tos, ttl)
        self._forward(src, self._links.get((dst_ip, dport)), dst_ip, dg)

    def _send_v1(self, src: FabricLink, dgid: bytes, frame: bytes) -> None:
        """A RoCEv1 packet (GRH + BTH .. ICRC) to the link owning RoCEv1 GID ``dgid``."""
        self.stats.sent += 1
        grh = frame[:GRH_SIZE]
        dg = Datagram(memoryview(frame)[GRH_SIZE:], grh[8:24], dgid, 0, 0,
                      ((grh[0] & 0x0F) << 4) | (grh[1] >> 4), grh[7], grh)
        dst = self._v1.get(dgid)
        self._forward(src, dst, dst.ip if dst is not None else dgid, dg)

    def _forward(self, src: FabricLink, dst: FabricLink | None, dst_ip: bytes,
                 dg: Datagram) -> None:
        st = self.stats
        data = dg.data
        if self._partitioned and (src.ip in self._partitioned or dst_ip in self._partitioned):
            st.partitioned += 1
            return
        if dst is None:
            st.unroutable += 1
            return
        now = self.clock.now()
        if self.bandwidth is None:
            t = now + self.latency
        else:
            hdr = GRH_SIZE if dg.grh else 28 if len(dst_ip) == 4 else 48
            start = src._tx_free if src._tx_free > now else now
            src._tx_free = start + (len(data) + hdr + ETH_OVERHEAD) * 8.0 / self.bandwidth
            t = src._tx_free + self.latency
        copies = 1
        hold = False
        if self._rules:
            extra, copies, hold, dropped = self._apply_rules(dg)
            if dropped:
                return
            t += extra
        rng = self.rng
        if self.drop and rng.random() < self.drop:
            st.dropped += 1
            return
        if self.duplicate and rng.random() < self.duplicate:
            st.duplicated += 1
            copies += 1
        if self.corrupt and rng.random() < self.corrupt:
            self._flip_bit(dg)
        if self.delay:
            st.delayed += 1
            t += rng.random() * self.delay
        if self.reorder and rng.random() < self.reorder:
            hold = True
        self._seq += 1
        held_map = self._held
        if hold and (src.ip, dst) not in held_map:
            key = (src.ip, dst)
            # Hold back: delivered after the next datagram on this path, or on timeout.
            st.reordered += 1
            seq = self._seq
            held_map[key] = (seq, t, dg)
            self._held_seq[seq] = key
            self._push(t + self.reorder_window, seq, dg, dst)
            for _ in range(copies - 1):
                self._seq += 1
                self._push(t, self._seq, _copy(dg), dst)
            return
        self._push(t, self._seq, dg, dst)
        for _ in range(copies - 1):
            self._seq += 1
            self._push(t, self._seq, _copy(dg), dst)
        if held_map:
            held = held_map.pop((src.ip, dst), None)
            if held is not None:
                hseq, ht, hdg = held
                del self._held_seq[hseq]
                self._void.add(hseq)
                self._seq += 1
                self._push(t if t > ht else ht, self._seq, hdg, dst)

    def _apply_rules(self, dg: Datagram) -> tuple[float, int, bool, bool]:
        """Run the rules on ``dg``: (extra delay, copies, hold, dropped)."""
        st = self.stats
        extra = 0.0
        copies = 1
        hold = False
        spent = False
        corrupt = 0
        for rule in self._rules:
            if rule.count is not None and rule.hits >= rule.count:
                spent = True
                continue
            if not rule.predicate(dg):
                continue
            rule.matches += 1
            if rule.matches <= rule.skip:
                continue
            rule.hits += 1
            st.rule_hits += 1
            action = rule.action
            if action == "drop":
                st.dropped += 1
                return extra, copies, hold, True
            if action == "duplicate":
                st.duplicated += 1
                copies += 1
            elif action == "delay":
                st.delayed += 1
                extra += rule.delay
            elif action == "corrupt":
                corrupt += 1
            else:
                hold = True
        for _ in range(corrupt):  # after every predicate has seen the intact datagram
            self._flip_bit(dg)
        if spent:
            for rule in [r for r in self._rules if r.count is not None and r.hits >= r.count]:
                self._rules.remove(rule)
                rule._fabric = None
        return extra, copies, hold, False

    def _flip_bit(self, dg: Datagram) -> None:
        n = len(dg.data)
        if n == 0:
            return
        buf = bytearray(dg.data)
        bit = self.rng.randrange(n * 8)
        buf[bit >> 3] ^= 1 << (bit & 7)
        dg.data = memoryview(bytes(buf))
        self.stats.corrupted += 1

    def _push(self, t: float, seq: int, dg: Datagram, dst: FabricLink) -> None:
        heapq.heappush(self._heap, (t, seq, dg, dst))
        if t < self._timer_at:
            self._push_timer(t)

    def _deliver(self) -> None:
        """Clock callback: deliver everything due, then wake the receivers."""
        self._timer = None
        self._timer_at = math.inf
        now = self.clock.now()
        heap = self._heap
        pop = heapq.heappop
        st = self.stats
        ready: list[FabricLink] = []
        void = self._void
        part = self._partitioned
        pcap = self._pcap
        while heap and heap[0][0] <= now:
            t, seq, dg, dst = pop(heap)
            if void and seq in void:
                void.discard(seq)
                continue
            if self._held_seq and seq in self._held_seq:  # reorder window expired
                del self._held[self._held_seq.pop(seq)]
            if dst._closed:
                st.unroutable += 1
                continue
            if part and (dg.dst_ip in part or dg.src_ip in part):
                st.partitioned += 1
                continue
            q = dst._rxq
            if len(q) >= dst.queue_limit:
                st.overflow += 1
                continue
            q.append(dg)
            st.delivered += 1
            st.bytes_delivered += len(dg.data)
            if pcap is not None:
                pcap.write(frame_of(dg), t)
            if not dst._mark:
                dst._mark = True
                ready.append(dst)
        for lk in ready:
            lk._mark = False
        for lk in ready:
            cb = lk.on_readable
            if cb is not None and not lk._closed:
                cb()
        if heap and heap[0][0] < self._timer_at:
            self._push_timer(heap[0][0])

    def _push_timer(self, t: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = t
        self._timer = self.clock.call_at(t, self._deliver)


def _copy(dg: Datagram) -> Datagram:
    return Datagram(dg.data, dg.src_ip, dg.dst_ip, dg.sport, dg.dport, dg.tos, dg.ttl, dg.grh)


# ---- pcap framing (the headers Linux puts on an unconnected socket's datagrams) -------
_ETH = struct.Struct("!6s6sH")


def _mac(ip: bytes) -> bytes:
    """A locally administered MAC derived from the address (02:00 + its last 4 bytes)."""
    return b"\x02\x00" + ip[-4:]


def frame_of(dg: Datagram) -> bytes:
    """``dg`` as the Ethernet frame a Linux sender would emit (Annex A17).

    IPv4: ID 0 (``dg.ident`` for a segment of a UDP GSO send or GRO receive), DF, UDP
    checksum 0 (what ``UdpLink`` sockets send); IPv6: a real UDP
    checksum. RoCEv1 (``dg.grh`` set): Ethernet (EtherType 0x8915) + GRH + BTH .. ICRC,
    the MACs read back from link-local GIDs (else derived from the GID's last bytes).
    """
    if dg.grh:
        src = mac_of_link_local_gid(dg.src_ip) or _mac(dg.src_ip)
        dst = mac_of_link_local_gid(dg.dst_ip) or _mac(dg.dst_ip)
        return b"".join((_ETH.pack(dst, src, ETH_P_ROCE_V1), dg.grh, dg.data))
    ulen = 8 + len(dg.data)
    if len(dg.src_ip) == 4:
        ip = roce.ipv4_header(dg.src_ip, dg.dst_ip, ulen, tos=dg.tos, ttl=dg.ttl,
                              ident=max(dg.ident, 0), df=True)
        udp = roce.udp_header(dg.sport, dg.dport, ulen)
        ethertype = 0x0800
    else:
        ip = roce.ipv6_header(dg.src_ip, dg.dst_ip, ulen, tclass=dg.tos, hop_limit=dg.ttl)
        udp0 = roce.udp_header(dg.sport, dg.dport, ulen)
        udp = roce.udp_header(dg.sport, dg.dport, ulen,
                              roce.udp_checksum(dg.src_ip, dg.dst_ip, udp0, (dg.data,)))
        ethertype = 0x86DD
    return b"".join((_ETH.pack(_mac(dg.dst_ip), _mac(dg.src_ip), ethertype), ip, udp, dg.data))

"""A link that records what it is given to send.

(Moved from tests/drivers/test_udp_gso.py, which other test files imported.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from softrdma.drivers.links.link import Datagram, LinkState
from softrdma.drivers.links.udp import UDP_MAX_SEGMENTS

SRC = bytes([10, 1, 0, 1])


class RecordingLink(LinkState):
    """A GsoLink that records what it is asked to send; its address ``local_ip``."""

    gso = True

    def __init__(self, limit: int = UDP_MAX_SEGMENTS, refuse: bool = False,
                 local_ip: bytes = SRC) -> None:
        self.limit = limit
        self.refuse = refuse
        self.local_ip = local_ip
        self.singles: list[tuple[bytes, int, list[bytes]]] = []
        self.batches: list[tuple[bytes, int, list[bytes], int, int, int, int]] = []
        self.rx: list[Datagram] = []
        self.notes: list[tuple[int, int]] = []

    @property
    def local_ips(self) -> tuple[bytes, ...]:
        return (self.local_ip,)

    def effective_sport(self, requested: int) -> int:
        return requested

    def send(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[Any],
             tos: int = 0, ttl: int = 64) -> None:
        self.singles.append((dst_ip, sport, [bytes(p) for p in parts]))

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        out, self.rx = self.rx, []
        return out

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        pass

    def gso_limit(self, dst_ip: bytes) -> int:
        return self.limit

    def send_gso(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[Any],
                 seg_size: int, nseg: int, tos: int = 0, ttl: int = 64) -> bool:
        self.batches.append((dst_ip, sport, [bytes(p) for p in parts], seg_size, nseg, tos,
                             ttl))
        return not self.refuse

    def note_rx_ids(self, hint_misses: int, failures: int) -> None:
        self.notes.append((hint_misses, failures))

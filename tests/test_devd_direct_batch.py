"""A shared device's process reads its direct (reuseport) sockets, IPv4 then IPv6: a GRO
read of the first may return more datagrams than asked (one per segment), and the second
is then not asked for a negative count (``max_n: must be >= 0`` killed rdma_client when a
busy poll asked for one datagram)."""

from __future__ import annotations

from typing import Any

from softrdma.drivers.devd_client import DevdLink


class _FakeLink:
    def __init__(self, n: int) -> None:
        self.n = n
        self.asked: list[int] = []

    def recv_batch(self, max_n: int = 64) -> list[Any]:
        assert max_n >= 0
        self.asked.append(max_n)
        return [object()] * self.n


def _link(direct: list[_FakeLink]) -> DevdLink:
    link = DevdLink.__new__(DevdLink)
    link._closed = False
    link._direct = tuple(direct)  # type: ignore[arg-type]
    link.counters = {"rx_direct": 0}
    return link


def test_a_coalesced_read_beyond_max_n_stops_the_round() -> None:
    v4, v6 = _FakeLink(3), _FakeLink(1)
    got = _link([v4, v6]).recv_batch(1)
    assert len(got) == 3
    assert v4.asked == [1] and v6.asked == []


def test_both_sockets_share_the_budget() -> None:
    v4, v6 = _FakeLink(2), _FakeLink(5)
    link = _link([v4, v6])
    assert len(link.recv_batch(8)) == 7
    assert v4.asked == [8] and v6.asked == [6]
    assert link.counters["rx_direct"] == 7

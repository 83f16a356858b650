"""The GRH area of a UD receive over IPv4 (IBA 11.4.1.1, as rxe: 20 zero bytes, then the
IPv4 header the packet came with), which ``build_grh`` caches per flow, length, ID and DF:
every answer, first or cached, is the header scapy builds from the same fields (an
independent oracle, its checksum included), also once the cache has been emptied for
being full."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP

from softrdma.drivers.links.link import Datagram
from softrdma.drivers.runtime import roce_rx
from softrdma.drivers.runtime.roce_rx import build_grh


def _oracle(src: bytes, dst: bytes, tos: int, ttl: int, n: int, ident: int, df: bool) -> bytes:
    """The IPv4 header scapy builds for a UDP datagram of ``n`` payload bytes."""
    pkt = IP(src=str(ipaddress.IPv4Address(src)), dst=str(ipaddress.IPv4Address(dst)),
             tos=tos, ttl=ttl, id=ident, flags="DF" if df else 0) / UDP() / (b"\0" * n)
    return bytes(pkt)[:20]


addr = st.binary(min_size=4, max_size=4)


@settings(max_examples=150, deadline=None)
@given(src=addr, dst=addr, tos=st.integers(0, 255), ttl=st.integers(0, 255),
       n=st.integers(16, 4200), ident=st.integers(0, 0xFFFF), df=st.booleans())
def test_ipv4_grh_matches_scapy_first_and_cached(src: bytes, dst: bytes, tos: int, ttl: int,
                                                 n: int, ident: int, df: bool) -> None:
    d = Datagram(memoryview(bytes(n)), src, dst, 49152, 4791, tos, ttl)
    want = bytes(20) + _oracle(src, dst, tos, ttl, n, ident, df)
    assert build_grh(d, ident, df) == want  # built (or found)
    assert build_grh(d, ident, df) == want  # found
    # another ID or DF of the same flow is its own entry, not the first one's
    other = (ident + 1) & 0xFFFF
    assert build_grh(d, other, df) == bytes(20) + _oracle(src, dst, tos, ttl, n, other, df)
    assert build_grh(d, ident, not df) == bytes(20) + _oracle(src, dst, tos, ttl, n, ident,
                                                               not df)


def test_ipv4_grh_cache_is_bounded() -> None:
    """A peer whose every packet has a new ID (rxe: a per-destination counter) never
    grows the cache past its bound, and answers stay right across the emptying."""
    src, dst = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
    d = Datagram(memoryview(bytes(64)), src, dst, 49152, 4791, 0, 64)
    for ident in range(roce_rx._GRH4_MAX + 100):
        grh = build_grh(d, ident, True)
        assert len(roce_rx._GRH4) <= roce_rx._GRH4_MAX
    assert grh == bytes(20) + _oracle(src, dst, 0, 64, 64, ident, True)

"""The ICRC check of a datagram from a UDP socket over IPv6 (issue 26: IPoIB's RC and UD
traffic runs on the device's IPv6 GID): a flow whose pseudo-header CRC is cached is
checked by the per-packet path, as IPv4 flows are, and that path stays exact."""

from __future__ import annotations

import os

import pytest

from softrdma.wire import icrc_udp as iu

SRC6 = bytes.fromhex("fd770000000000000000000000000001")
DST6 = bytes.fromhex("fd770000000000000000000000000002")
MAPPED = (bytes(10) + b"\xff\xff" + bytes((10, 77, 0, 1)),
          bytes(10) + b"\xff\xff" + bytes((10, 77, 0, 2)))


def _datagram(src: bytes, dst: bytes, size: int) -> bytes:
    body = bytearray(os.urandom(size))
    body[0] = 0x06  # RC SEND MIDDLE
    return bytes(body) + iu.udp_send_icrc(src, dst, 49152, 4791, [bytes(body)])


def _no_full_check(*args: object) -> object:
    raise AssertionError("the full check ran for a cached IPv6 flow")


@pytest.mark.parametrize("size", [12, 12 + 4096])
def test_cached_ipv6_flow_takes_the_per_packet_path(size: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    dg = _datagram(SRC6, DST6, size)
    assert iu.icrc_ok_udp(SRC6, DST6, 49152, 4791, memoryview(dg))  # caches the flow
    monkeypatch.setattr(iu, "_udp_check", _no_full_check)
    assert iu.icrc_ok_udp(SRC6, DST6, 49152, 4791, memoryview(dg))


def test_per_packet_path_rejects_damage_ipv6() -> None:
    dg = _datagram(SRC6, DST6, 12 + 4096)
    assert iu.icrc_ok_udp(SRC6, DST6, 49152, 4791, memoryview(dg))
    for pos in (0, 5, 11, 12, 2000, len(dg) - 5, len(dg) - 1):
        bad = bytearray(dg)
        bad[pos] ^= 0x10
        assert not iu.icrc_ok_udp(SRC6, DST6, 49152, 4791, memoryview(bytes(bad))), pos
    # another flow (port, address) is not this one's
    assert not iu.icrc_ok_udp(SRC6, DST6, 49153, 4791, memoryview(dg))
    assert not iu.icrc_ok_udp(DST6, SRC6, 49152, 4791, memoryview(dg))


def test_ipv4_mapped_pairs_keep_the_ipv4_check() -> None:
    s, d = MAPPED
    dg = _datagram(s, d, 12 + 1024)
    assert iu.icrc_ok_udp(s, d, 49152, 4791, memoryview(dg))
    assert iu.icrc_ok_udp(s[12:], d[12:], 49152, 4791, memoryview(dg))
    bad = bytearray(dg)
    bad[100] ^= 1
    assert not iu.icrc_ok_udp(s, d, 49152, 4791, memoryview(bytes(bad)))
    with pytest.raises(Exception, match="families differ"):
        iu.icrc_ok_udp(s, DST6, 49152, 4791, memoryview(dg))

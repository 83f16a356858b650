"""The connected-mode interface MTU chosen when none is asked for
(``softrdma.apps.ipoib_runtime.connected_mtu``): 65520 (Linux ``IPOIB_CM_MTU``), or the
MTU whose message fills its UDP GSO sends exactly, where that saves a send on every
message and gives up at most an eighth of the 65520."""

from __future__ import annotations

import pytest

from softrdma.apps.ipoib_runtime import connected_mtu
from softrdma.drivers.links.udp import UDP_MAX_SEGMENTS
from softrdma.drivers.runtime.roce_tx import gso_message_bytes
from softrdma.ipoib.conn import IPOIB_CM_MTU
from softrdma.ipoib.encap import ENCAP_LEN


def _sends(message: int, batched: int) -> int:
    return -(-message // batched)


@pytest.mark.parametrize(("ib_mtu", "want"), [(4096, 61436), (2048, 63484), (1024, 63484),
                                              (512, IPOIB_CM_MTU), (256, IPOIB_CM_MTU)])
def test_the_default_per_ib_mtu(ib_mtu: int, want: int) -> None:
    batched = gso_message_bytes(ib_mtu, UDP_MAX_SEGMENTS)
    got = connected_mtu(batched)
    assert got == want
    full = _sends(IPOIB_CM_MTU + ENCAP_LEN, batched)
    if got < IPOIB_CM_MTU:  # one send fewer a message, the sends filled exactly
        assert _sends(got + ENCAP_LEN, batched) == full - 1
        assert (got + ENCAP_LEN) % batched == 0
        assert _sends(got + 1 + ENCAP_LEN, batched) == full
        assert got >= IPOIB_CM_MTU * 7 // 8


def test_without_batching_it_is_linux_s() -> None:
    assert connected_mtu(0) == IPOIB_CM_MTU
    assert connected_mtu(gso_message_bytes(4096, 0)) == IPOIB_CM_MTU


def test_a_message_that_fits_one_send_keeps_65520() -> None:
    assert connected_mtu(IPOIB_CM_MTU + ENCAP_LEN) == IPOIB_CM_MTU
    assert connected_mtu(1 << 20) == IPOIB_CM_MTU

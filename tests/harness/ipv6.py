"""Whether this network namespace has the IPv6 loopback (``::1``), for the tests that
need it: :func:`has_ipv6_loopback` and the ``needs_v6`` skip marker."""

from __future__ import annotations

import socket

import pytest

__all__ = ["has_ipv6_loopback", "needs_v6"]


def has_ipv6_loopback() -> bool:
    """True if a UDP socket can bind ``::1`` here."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_v6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback (::1) here")

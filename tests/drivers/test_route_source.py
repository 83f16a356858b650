"""The kernel's route lookup under rdma_resolve_addr (``drivers/host/route.py``), which the
rdma_cm device list uses through ``drivers/cm/cm_devices.route_source``: the source
address of a destination, or the lookup's errno."""

from __future__ import annotations

import errno
import ipaddress
import socket

from harness.ipv6 import needs_v6

from softrdma.drivers.cm.cm_devices import route_source as cm_route_source
from softrdma.drivers.host.route import route_source


def test_loopback_v4_source_is_loopback() -> None:
    assert route_source(socket.inet_aton("127.0.0.1")) == socket.inet_aton("127.0.0.1")
    # the rest of 127/8 is routed through lo too: a 4-byte source, not an errno
    other = route_source(socket.inet_aton("127.0.0.2"))
    assert isinstance(other, bytes) and other[0] == 127


@needs_v6
def test_loopback_v6_source_is_loopback() -> None:
    one = socket.inet_pton(socket.AF_INET6, "::1")
    assert route_source(one) == one


def test_no_route_gives_the_errno() -> None:
    # a link-local destination without a scope cannot be routed: EINVAL from connect
    got = route_source(socket.inet_pton(socket.AF_INET6, "fe80::1"))
    assert isinstance(got, int)
    assert got in (errno.EINVAL, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)


def test_cm_devices_takes_an_address_object() -> None:
    assert cm_route_source(ipaddress.ip_address("127.0.0.1")) == socket.inet_aton("127.0.0.1")
    got = cm_route_source(ipaddress.ip_address("fe80::1"))
    assert isinstance(got, int) and got > 0

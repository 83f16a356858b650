"""The kernel's count of a reuseport group's sockets (drivers/host/sockdiag.py), which devd
compares with its mirror before it lets a client on the direct receive path: a snapshot
even while other processes open and close sockets (the ``/proc/net/udp`` reading it
replaced miscounted then, and devd refused healthy clients)."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Iterator

import pytest

from softrdma.drivers.host import sockdiag

GROUP = 5


def _group(family: int, host: str, n: int) -> list[socket.socket]:
    socks: list[socket.socket] = []
    for _ in range(n):
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, socks[0].getsockname()[1] if socks else 0))
        socks.append(s)
    return socks


def _churn() -> None:  # another process: opens and closes UDP sockets until terminated
    held: list[socket.socket] = []
    while True:
        for _ in range(50):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            held.append(s)
        for s in held:
            s.close()
        held.clear()


@pytest.fixture
def churning() -> Iterator[None]:
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_churn, daemon=True)
    p.start()
    try:
        yield
    finally:
        p.terminate()
        p.join(30)


def test_counts_the_group_and_nothing_else() -> None:
    group = _group(socket.AF_INET, "127.0.0.1", GROUP)
    port = group[0].getsockname()[1]
    other = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM)]
    other[0].bind(("127.0.0.2", port))  # the same port number on another address
    group[-1].connect(("127.0.0.1", 9))  # connected, still bound to the group's address
    v6 = _group(socket.AF_INET6, "::1", 3)
    try:
        ip = socket.inet_aton("127.0.0.1")
        assert sockdiag.udp_bound_count_diag(ip, port) == GROUP
        assert sockdiag.udp_bound_count_proc(ip, port) == GROUP
        assert sockdiag.udp_bound_count(socket.inet_aton("127.0.0.3"), port) == 0
        ip6 = socket.inet_pton(socket.AF_INET6, "::1")
        port6 = v6[0].getsockname()[1]
        assert sockdiag.udp_bound_count_diag(ip6, port6) == 3
        assert sockdiag.udp_bound_count_proc(ip6, port6) == 3
        group.pop().close()
        assert sockdiag.udp_bound_count(ip, port) == GROUP - 1
    finally:
        for s in group + other + v6:
            s.close()


def test_a_snapshot_while_another_process_churns_sockets(churning: None) -> None:
    ballast = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(300)]
    group = _group(socket.AF_INET, "127.0.0.1", GROUP)
    try:
        for b in ballast:  # a long table: many page-sized reads of /proc/net/udp
            b.bind(("127.0.0.1", 0))
        ip, port = socket.inet_aton("127.0.0.1"), group[0].getsockname()[1]
        counts = [sockdiag.udp_bound_count_diag(ip, port) for _ in range(300)]
        assert counts == [GROUP] * 300, [c for c in counts if c != GROUP][:10]
    finally:
        for s in ballast + group:
            s.close()


def test_without_sock_diag_the_count_comes_from_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    group = _group(socket.AF_INET, "127.0.0.1", 3)
    real = socket.socket

    def no_netlink(family: int = -1, *args: object, **kw: object) -> socket.socket:
        if family == socket.AF_NETLINK:
            raise PermissionError(13, "no sock_diag here")
        return real(family, *args, **kw)  # type: ignore[arg-type]

    try:
        ip, port = socket.inet_aton("127.0.0.1"), group[0].getsockname()[1]
        monkeypatch.setattr("softrdma.drivers.host.sockdiag.socket.socket", no_netlink)
        assert sockdiag.udp_bound_count_diag(ip, port) is None
        assert sockdiag.udp_bound_count(ip, port) == 3
    finally:
        for s in group:
            s.close()

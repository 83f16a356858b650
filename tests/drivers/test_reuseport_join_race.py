"""A direct client that leaves while another one binds (issue 25, drivers/devd/qpn.py).

devd serializes joins (JOIN ... bind ... JOINED) so that its mirror of the kernel's
reuseport array is in bind order. A departure processed inside another client's turn,
after that client bound, made the kernel move the new, not yet mirrored socket into the
hole while the mirror moved its own last member there: two live clients then got each
other's datagrams for good (rdma-core's traffic tests timed out at load, their packets
counted ``rcvd_unknown_qp`` by the wrong context). All traffic is on 127.0.0.1."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.devd import Running, start_devd
from harness.reuseport import LOCAL, packet, qpns_of, recv_all
from harness.wait import wait_until

from softrdma.drivers.devd.proto import MAX_DATAGRAM, OP_JOIN, OP_JOINED
from softrdma.drivers.devd.reuseport import slot_of
from softrdma.drivers.links.udp import UdpLink


@pytest.fixture
def devd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    state = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    monkeypatch.delenv("SOFTRDMA_DEVD_DIRECT", raising=False)
    r = start_devd(state, "race0")
    try:
        yield r
    finally:
        r.devd.shutdown()
        r.thread.join(5)
        assert not r.thread.is_alive()


def _qpns_on(sock: UdpLink, n: int, timeout: float = 10.0) -> set[int]:
    """The DestQPs of ``n`` datagrams read from the raw socket ``sock``."""
    fd = sock.fileno()
    assert fd is not None
    got: list[int] = []
    while len(got) < n:
        batch = sock.recv_batch(64)
        got += [int.from_bytes(d.data[5:8], "big") for d in batch]
        if not batch and not select.select([fd], [], [], timeout)[0]:
            raise AssertionError(f"{len(got)} of {n} datagrams arrived")
    return set(got)


def test_leave_during_another_clients_join_keeps_every_mapping(devd: Running) -> None:
    d = devd.devd
    port = d.udp_port
    links = {n: devd.client() for n in "abc"}
    x = devd.client(direct=False)  # joins by hand below, one step at a time
    bound: UdpLink | None = None
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert all(link.direct for link in links.values())
        qpns = {n: link.alloc_qpn() for n, link in links.items()}
        # x's turn: it binds its socket (the kernel appends it to the group) ...
        slot = x._request(OP_JOIN)[0]
        assert slot
        bound = UdpLink(LOCAL, port, reuseport=True, max_datagram=MAX_DATAGRAM)
        # ... and b leaves before x says JOINED, devd sees it go
        links.pop("b").close()
        wait_until(lambda: len(d._clients) == 3, what="b's departure seen", interval=0.01)
        assert bound._rx is not None
        assert x._request(OP_JOINED, 1, fds=[bound._rx.fileno()])[0] == slot
        qx = x.alloc_qpn()
        assert slot_of(qx) == slot
        wait_until(lambda: len(d._slot_clients) == 3, what="b's slot freed", interval=0.01)
        for _ in range(20):
            for q in (*qpns.values(), qx):
                tx.sendto(packet(q), (LOCAL, port))
        del qpns["b"]
        for n, link in links.items():
            assert set(qpns_of(recv_all(link, 20, timeout=10.0))) == {qpns[n]}, n
        assert _qpns_on(bound, 20) == {qx}
        # b's datagrams reach devd's socket (b is gone): counted there as its QP's late
        # packets (a QPN it freed), none forwarded
        wait_until(lambda: links["a"].stats()["closed_qpn"] == 20, what="b's 20 at devd",
                   interval=0.05)
        st = links["a"].stats()
        assert st["forwarded"] == 0 and st["unknown_qpn"] == 0
    finally:
        tx.close()
        if bound is not None:
            bound.close()
        x.close()
        for link in links.values():
            link.close()

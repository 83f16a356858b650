"""The CM side of a devd test: a client that listens for nothing, a raw peer.

(Moved from tests/drivers/test_devd_rej.py, which other test files imported.)"""

from __future__ import annotations

import socket

import pytest

from harness.devd import Running

V4_MAPPED = bytes(10) + b"\xff\xff"


PEER = "127.0.0.2"  # answers go to the RoCE port of the source: the peer binds it there


@pytest.fixture
def cm_client(running: Running):
    with running.client() as c:
        c.cm_slot()  # a routed CM client, listening on nothing
        yield c


@pytest.fixture
def peer(running: Running):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((PEER, running.devd.udp_port))
    yield s
    s.close()

"""The one TCP out-of-band exchange (port 18515) of the pingpong, srq/xsrq and perftest
tools (:mod:`softrdma.tools.oobtcp`): each failure is the calling tool's error class with
a line that names what was awaited, and no wait is unbounded unless asked."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from softrdma.errors import SoftRdmaError
from softrdma.tools import oobtcp


class ToolError(SoftRdmaError):
    """Stands for a tool's own error class (PingPongError, PerftestError)."""


@pytest.fixture()
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    lst = oobtcp.listen(0, ToolError, bind="127.0.0.1")
    port = lst.getsockname()[1]
    with lst:
        cli = oobtcp.connect("127.0.0.1", port, time.monotonic() + 30, ToolError,
                             nodelay=True)
        srv = oobtcp.accept(lst, ToolError, deadline=time.monotonic() + 30)
    yield cli, srv
    cli.close()
    srv.close()


def test_whole_messages_both_ways(pair: tuple[socket.socket, socket.socket]) -> None:
    cli, srv = pair
    deadline = time.monotonic() + 30
    oobtcp.send_all(cli, b"0" * 52, deadline, "local address", ToolError)
    assert oobtcp.recv_exact(srv, 52, deadline, "remote address", ToolError) == b"0" * 52
    # a message that arrives in pieces is read whole
    def pieces() -> None:
        srv.sendall(b"do")
        time.sleep(0.05)  # the second piece comes later (a pause, not a wait for a state)
        srv.sendall(b"ne\x00")

    t = threading.Thread(target=pieces)
    t.start()
    assert oobtcp.recv_exact(cli, 5, None, '"done"', ToolError) == b"done\x00"
    t.join()


def test_peer_close_mid_message(pair: tuple[socket.socket, socket.socket]) -> None:
    cli, srv = pair
    srv.sendall(b"abc")
    srv.close()
    with pytest.raises(ToolError, match=r"closed the connection during remote address "
                                        r"\(3/52 bytes\)"):
        oobtcp.recv_exact(cli, 52, time.monotonic() + 30, "remote address", ToolError)


def test_deadline_and_its_own_line(pair: tuple[socket.socket, socket.socket]) -> None:
    cli, _srv = pair
    with pytest.raises(ToolError, match="timed out waiting for remote address"):
        oobtcp.recv_exact(cli, 52, time.monotonic() + 0.2, "remote address", ToolError)
    with pytest.raises(ToolError, match="the peer did not answer for 1 s"):
        oobtcp.recv_exact(cli, 5, time.monotonic() - 1, "a message", ToolError,
                          timed_out="the peer did not answer for 1 s")


def test_accept_deadline_and_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOFTRDMA_CONNECT_RETRY", raising=False)
    with oobtcp.listen(0, ToolError, bind="127.0.0.1") as lst:
        port = lst.getsockname()[1]
        with pytest.raises(ToolError, match="accept.. failed: no client came in time"):
            oobtcp.accept(lst, ToolError, deadline=time.monotonic() + 0.2)
        with pytest.raises(ToolError, match=f"Couldn't listen to port {port}"):
            oobtcp.listen(port, ToolError, bind="127.0.0.1")
    # nothing listens there any more: a refusal fails at once
    start = time.monotonic()
    with pytest.raises(ToolError, match=f"Couldn't connect to 127.0.0.1:{port}: "
                                        "Connection refused"):
        oobtcp.connect("127.0.0.1", port, time.monotonic() + 30, ToolError)
    assert time.monotonic() - start < 20

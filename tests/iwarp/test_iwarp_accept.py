"""The iWARP passive side under hostile or slow peers (issue 13 items 6 and 10):

* MPA negotiation runs per connection, concurrently, each with its own timer: 100 idle TCP
  connections do not delay a real client, and a silent connection is closed when its
  timer expires (siw's MPA request timeout);
* an MPA Request with R (reject) set is refused in MPA with a Terminate and counted
  (``rcvd_mpa_req_reject``), never returned as a connection request.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness.iwarp_tcp import Ep
from harness.wait import wait_until

from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.wire import ddp, mpa

IDLE = 100


@pytest.fixture
def ctx() -> Iterator[v.Context]:
    c = v.Context(transport="iwarp")
    yield c
    c.close()


def _serve(lst: iwconnect.Listener, b: Ep, got: dict[str, Any], timeout: float) -> threading.Thread:
    def serve() -> None:
        t0 = time.monotonic()
        try:
            got["conn"] = lst.accept(b.qp, b"hi", timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            got["err"] = exc
        got["s"] = time.monotonic() - t0

    t = threading.Thread(target=serve)
    t.start()
    return t


def test_idle_connections_do_not_delay_a_real_client(ctx: v.Context) -> None:
    a, b = Ep(ctx), Ep(ctx)
    lst = iwconnect.listen(ctx, 0)
    idle: list[socket.socket] = []
    got: dict[str, Any] = {}
    try:
        t = _serve(lst, b, got, timeout=30)
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", lst.port), timeout=10))
        # the listener has accepted the idle connections (they wait for their MPA Request)
        wait_until(lambda: len(lst._pending) >= IDLE, what="the idle connections accepted",
                   interval=0.01)
        t0 = time.monotonic()
        conn = iwconnect.connect(a.qp, "127.0.0.1", lst.port, b"real", timeout=20)
        connect_s = time.monotonic() - t0
        t.join(20)
        assert "err" not in got, got.get("err")
        assert conn.connected and got["conn"].connected
        assert got["conn"].private_data == b"real"
        print(f"\n[iwarp] connect with {IDLE} idle TCP connections open: {connect_s * 1e3:.1f} ms")
        assert connect_s < 3.0
    finally:
        for s in idle:
            s.close()
        lst.close()


def test_silent_connection_closed_when_its_mpa_timer_expires(ctx: v.Context) -> None:
    lst = iwconnect.listen(ctx, 0)
    lst.mpa_timeout = 0.3
    try:
        silent = socket.create_connection(("127.0.0.1", lst.port), timeout=5)
        with pytest.raises(iwconnect.ConnectError):
            lst.get_request(timeout=1.0)  # accepts it, then its timer expires
        silent.settimeout(5)
        assert silent.recv(100) == b""  # closed by the listener, nothing sent
        silent.close()
    finally:
        lst.close()


def test_slow_client_is_not_dropped(ctx: v.Context) -> None:
    """A client that sends its Request after a second still gets through (was: 0.25 s)."""
    b = Ep(ctx)
    lst = iwconnect.listen(ctx, 0)
    got: dict[str, Any] = {}
    try:
        t = _serve(lst, b, got, timeout=10)
        raw = socket.create_connection(("127.0.0.1", lst.port), timeout=10)
        time.sleep(1.0)
        raw.sendall(mpa.MpaRequest.build(v2=mpa.MpaV2Params(4, 4), user_data=b"slow").encode())
        p = mpa.MpaFrameParser(mpa.MpaReply)
        while (frame := p.feed(raw.recv(1))) is None:
            pass
        assert isinstance(frame, mpa.MpaReply) and not frame.reject
        t.join(10)
        assert "err" not in got and got["conn"].private_data == b"slow"
        raw.close()
    finally:
        lst.close()


def test_mpa_request_with_reject_flag_is_refused_and_counted(ctx: v.Context) -> None:
    a, b = Ep(ctx), Ep(ctx)
    lst = iwconnect.listen(ctx, 0)
    got: dict[str, Any] = {}
    try:
        t = _serve(lst, b, got, timeout=10)
        raw = socket.create_connection(("127.0.0.1", lst.port), timeout=10)
        raw.sendall(mpa.MpaRequest.build(v2=mpa.MpaV2Params(4, 4), reject=True).encode())
        reply = b""
        while chunk := raw.recv(4096):  # a Terminate, then the FIN
            reply += chunk
        raw.close()
        segs = [ddp.decode_segment(f.ulpdu)
                for f in mpa.FpduDeframer(crc=False, markers=False).feed(reply)]
        assert len(segs) == 1 and segs[0].terminate is not None
        assert (segs[0].terminate.layer, segs[0].terminate.code) == (2, 0x04)  # LLP (MPA), bad frame
        assert ctx.counters()["rcvd_mpa_req_reject"] == 1
        # the listener did not hand it out: the next real client is the one accepted
        conn = iwconnect.connect(a.qp, "127.0.0.1", lst.port, b"real", timeout=10)
        t.join(10)
        assert "err" not in got, got.get("err")
        assert conn.connected and got["conn"].private_data == b"real"
    finally:
        lst.close()

"""SOFTRDMA_CM_RETRY_NO_LISTENER (softrdma.cm.rdma_retry): a RoCE connect whose REQ gets
REJ 8 (nobody listens yet) sends it again, 100 ms apart, while the window lasts; unset,
REJECTED 8 comes at once as on Linux. On iWARP the same race is a TCP RST to the
connect (REJECTED -ECONNREFUSED), made again the same way. The slow listener is perftest
-R's second connection against the lab's emulated rxe/siw server (issue 22)."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.rdma_cm import Ep, expect, setup_env
from harness.wait import wait_until

from softrdma.cm import rdma_cm as rc
from softrdma.cm import rdma_retry
from softrdma.cm.rdma_cm import EventChannel
from softrdma.drivers.cm import iwconnect
from softrdma.errors import InvalidArgument
from softrdma.verbs import SGE, SendWR
from softrdma.wire.cm import RejReason

T = rc.RdmaCmEventType


class _Retries(logging.Handler):
    """Counts the retry lines of softrdma.cm (one per REJ 8 or TCP refusal answered by a
    retry)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "(nobody listens)" in record.getMessage():
            self.count += 1


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


@pytest.fixture
def retries() -> Iterator[_Retries]:
    log = logging.getLogger("softrdma.cm")
    h, level = _Retries(), log.level
    log.addHandler(h)
    log.setLevel(logging.DEBUG)
    try:
        yield h
    finally:
        log.removeHandler(h)
        log.setLevel(level)


TRANSPORTS = pytest.mark.parametrize("transport", ["roce", "iwarp"])
#: the REJECTED status when nobody listens: REJ 8 (IBA 12.6.7), a TCP RST (siw_connect)
NO_LISTENER = {"roce": RejReason.INVALID_SERVICE_ID, "iwarp": -errno.ECONNREFUSED}


def _by_worker(monkeypatch: pytest.MonkeyPatch, transport: str) -> str:
    """``iwarp-worker``: the iWARP connect as to a remote peer (its TCP connect not up at
    once: the blocking connect on a worker thread); the device kind to use."""
    if transport == "iwarp-worker":
        monkeypatch.setattr(iwconnect, "start_connect", lambda *a, **k: None)
    return transport.split("-")[0]


def _free_port(ch: EventChannel, transport: str) -> int:
    lst = rc.CmId(ch)
    lst.bind_addr(("127.0.0.1", 0), device=transport)
    lst.listen(4)
    assert lst.local_addr is not None
    port = lst.local_addr[1]
    lst.destroy()  # nobody listens on it now
    return port


def _client(ch: EventChannel, port: int, transport: str) -> tuple[rc.CmId, Ep]:
    cli = rc.CmId(ch)
    cli.resolve_addr(None, ("127.0.0.1", port), 2000, device=transport)
    expect(ch, T.ADDR_RESOLVED)
    cli.resolve_route(2000)
    expect(ch, T.ROUTE_RESOLVED)
    return cli, Ep(cli)


@pytest.mark.iba("12.6.7")
@pytest.mark.parametrize("transport", ["roce", "iwarp", "iwarp-worker"])
def test_late_listener_is_reached(env: Path, retries: _Retries,
                                  monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    """The server listens only after the client's connect was refused (REJ 8, or a TCP
    RST on iWARP): with the window set, the connect goes again and the connection is
    made; the QP, reset between the tries, carries a SEND. Without the retry the client
    gets REJECTED and this fails."""
    monkeypatch.setenv(rdma_retry.ENV, "60")  # generous: the test ends at ESTABLISHED
    transport = _by_worker(monkeypatch, transport)
    chs, chc = EventChannel(), EventChannel()
    port = _free_port(chs, transport)
    cli, ce = _client(chc, port, transport)
    cli.connect(rc.ConnParam(private_data=b"early"))
    wait_until(lambda: retries.count >= 1 or chc.pending(), 30.0,
               what="the first connect's refusal (a retry, or an event)")
    assert chc.pending() == 0, "the client's application saw its connect rejected"
    lst = rc.CmId(chs)
    lst.bind_addr(("127.0.0.1", port), device=transport)
    lst.listen(4)  # the slow server listens at last
    req = expect(chs, T.CONNECT_REQUEST, 30.0)
    assert req.private_data[:5] == b"early"
    se = Ep(req.id)
    se.recv(64)
    req.id.accept(rc.ConnParam())
    expect(chc, T.ESTABLISHED, 30.0)
    expect(chs, T.ESTABLISHED, 30.0)
    ce.mr.write(b"after a retry")
    ce.qp.post_send(SendWR(wr_id=7, sg=[SGE(ce.mr.addr, 13, ce.mr.lkey)], num_sge=1))
    wc = se.wait(1, 30.0)
    assert len(wc) == 1 and wc[0].status == 0 and wc[0].byte_len == 13
    assert se.mr.read(13) == b"after a retry"
    assert retries.count >= 1
    cli.destroy()
    req.id.destroy()
    lst.destroy()


@pytest.mark.iba("12.6.7")
@TRANSPORTS
def test_window_ends_in_rej_8(env: Path, retries: _Retries,
                              monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    """Nobody ever listens: the connect is made again while the window lasts, then the
    application gets the REJECTED Linux reports (REJ 8; -ECONNREFUSED on iWARP), no
    sooner than one retry's pace."""
    monkeypatch.setenv(rdma_retry.ENV, "2")  # a first REJ within 1.9 s, at any load
    chc = EventChannel()
    port = _free_port(EventChannel(), transport)
    cli, _ce = _client(chc, port, transport)
    t0 = time.monotonic()
    cli.connect(rc.ConnParam())
    rej = expect(chc, T.REJECTED, 30.0)
    assert rej.status == NO_LISTENER[transport]
    assert retries.count >= 1 and time.monotonic() - t0 >= rdma_retry.PACE_S
    cli.destroy()


@TRANSPORTS
def test_unset_rejects_at_once(env: Path, retries: _Retries,
                               monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    """Unset (the default), a refusal is the application's at once: no retry (Linux)."""
    monkeypatch.delenv(rdma_retry.ENV, raising=False)
    chc = EventChannel()
    cli, _ce = _client(chc, _free_port(EventChannel(), transport), transport)
    cli.connect(rc.ConnParam())
    assert expect(chc, T.REJECTED, 30.0).status == NO_LISTENER[transport]
    assert retries.count == 0
    cli.destroy()


@TRANSPORTS
@pytest.mark.parametrize("bad", ["soon", "-1", "inf", "nan"])
def test_bad_value_names_the_variable(env: Path, monkeypatch: pytest.MonkeyPatch,
                                      bad: str, transport: str) -> None:
    monkeypatch.setenv(rdma_retry.ENV, bad)
    chc = EventChannel()
    cli, _ce = _client(chc, _free_port(EventChannel(), transport), transport)
    with pytest.raises(InvalidArgument, match=rdma_retry.ENV):
        cli.connect(rc.ConnParam())
    cli.destroy()


@pytest.mark.parametrize("transport", ["iwarp", "iwarp-worker"])
def test_iwarp_consumer_reject_is_not_retried(env: Path, retries: _Retries,
                                             monkeypatch: pytest.MonkeyPatch,
                                             transport: str) -> None:
    """An MPA Reply with R set (RFC 5044 §7.1.2) is the listener's answer, reported with
    the same -ECONNREFUSED as a TCP RST: with the window set it still reaches the
    application at once, with the server's private data, and the listener sees one
    request."""
    monkeypatch.setenv(rdma_retry.ENV, "60")
    _by_worker(monkeypatch, transport)
    chs, chc = EventChannel(), EventChannel()
    lst = rc.CmId(chs)
    lst.bind_addr(("127.0.0.1", 0), device="iwarp")
    lst.listen(4)
    assert lst.local_addr is not None
    cli, _ce = _client(chc, lst.local_addr[1], "iwarp")
    cli.connect(rc.ConnParam())
    req = expect(chs, T.CONNECT_REQUEST, 30.0)
    req.id.reject(b"no")
    rej = expect(chc, T.REJECTED, 30.0)
    assert rej.status == -errno.ECONNREFUSED and rej.private_data[:2] == b"no"
    assert retries.count == 0 and chs.pending() == 0
    cli.destroy()
    req.id.destroy()
    lst.destroy()

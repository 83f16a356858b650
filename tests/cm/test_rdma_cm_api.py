"""The rdma_cm-style API: one application function over RoCE (IB CM + Annex A11, through
devd) and iWARP (TCP + MPA); rejections, unreachable peers, UD through SIDR, IPv6 ::1,
the asyncio form and the event numbering of librdmacm."""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.rdma_cm import Ep, expect, next_non_timewait, setup_env

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc
from softrdma.cm.rdma_cm import EventChannel
from softrdma.drivers.cm import iwconnect
from softrdma.drivers.cm.gsi import CmBinding
from softrdma.errors import SoftRdmaError, StateError
from softrdma.wire.cm import RejReason

T = rc.RdmaCmEventType


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from setup_env(tmp_path, monkeypatch)


def app(transport: str, ip: str = "127.0.0.1") -> dict[str, Any]:
    """Listen, connect with private data, SEND + RDMA WRITE, disconnect: transport-blind
    application code (only the device preference names the transport)."""
    out: dict[str, Any] = {}
    chs, chc = EventChannel(), EventChannel()
    lst = rc.CmId(chs, rc.RDMA_PS_TCP, context="server")
    lst.bind_addr((ip, 0), device=transport)
    lst.listen(4)
    port = lst.local_addr[1] if lst.local_addr else 0
    assert port
    cli = rc.CmId(chc, rc.RDMA_PS_TCP)
    cli.resolve_addr(None, (ip, port), 2000, device=transport)
    expect(chc, T.ADDR_RESOLVED)
    cli.resolve_route(2000)
    expect(chc, T.ROUTE_RESOLVED)
    out["transport"] = cli.transport
    ce = Ep(cli)
    ce.recv(64)
    cli.connect(rc.ConnParam(private_data=b"hello server", responder_resources=4,
                             initiator_depth=4))
    req = expect(chs, T.CONNECT_REQUEST)
    child = req.id
    assert req.listen_id is lst and child is not lst and child.context == "server"
    assert child.peer_addr is not None and child.peer_addr[0] == ip
    out["req_pd"] = req.private_data
    se = Ep(child)
    se.recv(64)
    child.accept(rc.ConnParam(private_data=b"welcome", responder_resources=4,
                              initiator_depth=4))
    est = expect(chc, T.ESTABLISHED)
    out["rep_pd"] = est.private_data
    expect(chs, T.ESTABLISHED)
    assert ce.qp.qp_state == se.qp.qp_state == e.IBV_QPS_RTS
    # SEND client -> server, RDMA WRITE server -> client's MR
    ce.mr.write(b"ping over rdma_cm", 17, 1024)
    ce.qp.post_send(v.SendWR(1, None, 1, [v.SGE(ce.mr.addr + 1024, 17, ce.mr.lkey)]))
    wcs = se.wait(1)
    assert wcs and wcs[0].status == 0 and se.mr.read(17, 0) == b"ping over rdma_cm"
    se.mr.write(b"written back", 12, 2048)
    wr = v.SendWR(2, None, 1, [v.SGE(se.mr.addr + 2048, 12, se.mr.lkey)],
                  e.IBV_WR_RDMA_WRITE, e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(ce.mr.rkey, ce.mr.addr + 3000)
    se.qp.post_send(wr)
    wcs = se.wait(1)
    assert wcs and wcs[0].status == 0
    end = time.monotonic() + 5  # iWARP completes a WRITE once sent, not once placed
    while ce.mr.read(12, 3000) != b"written back" and time.monotonic() < end:
        time.sleep(0.001)
    assert ce.mr.read(12, 3000) == b"written back"
    assert ce.wait(1)  # the client's own SEND completion
    cli.disconnect()
    assert next_non_timewait(chc).event == T.DISCONNECTED
    assert next_non_timewait(chs).event == T.DISCONNECTED
    assert ce.qp.qp_state == se.qp.qp_state == e.IBV_QPS_ERR
    for cid in (cli, child, lst):
        cid.destroy_qp()
        cid.destroy()
    chs.close()
    chc.close()
    return out


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
def test_same_app_over_both_transports(env: Path, transport: str) -> None:
    out = app(transport)
    assert out["transport"] == transport
    # the consumer data travels intact: exact on iWARP (MPA), zero-padded to the 56 bytes
    # after the A11 IP CM header on RoCE (as Linux reports the REQ's private data)
    assert out["req_pd"].rstrip(b"\0") == b"hello server"
    assert out["rep_pd"].rstrip(b"\0") == b"welcome"
    if transport == "roce":
        assert len(out["req_pd"]) == 56
    else:
        assert out["req_pd"] == b"hello server"


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
def test_ipv6_loopback(env: Path, transport: str) -> None:
    out = app(transport, "::1")
    assert out["req_pd"].rstrip(b"\0") == b"hello server"


def _listen(ch: EventChannel, transport: str, ps: int = rc.RDMA_PS_TCP) -> tuple[rc.CmId, int]:
    lst = rc.CmId(ch, ps)
    lst.bind_addr(("127.0.0.1", 0), device=transport)
    lst.listen(4)
    assert lst.local_addr is not None
    return lst, lst.local_addr[1]


def _client(ch: EventChannel, transport: str, port: int, ip: str = "127.0.0.1",
            ps: int = rc.RDMA_PS_TCP) -> tuple[rc.CmId, Ep]:
    cli = rc.CmId(ch, ps)
    cli.resolve_addr(None, (ip, port), 2000, device=transport)
    expect(ch, T.ADDR_RESOLVED)
    cli.resolve_route(2000)
    expect(ch, T.ROUTE_RESOLVED)
    return cli, Ep(cli, ud=ps == rc.RDMA_PS_UDP)


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
@pytest.mark.iba("12.6.7")
def test_reject_with_private_data(env: Path, transport: str) -> None:
    chs, chc = EventChannel(), EventChannel()
    lst, port = _listen(chs, transport)
    cli, ce = _client(chc, transport, port)
    cli.connect(rc.ConnParam(private_data=b"may I?"))
    req = expect(chs, T.CONNECT_REQUEST)
    req.id.reject(b"go away")
    rej = expect(chc, T.REJECTED)
    assert rej.private_data.rstrip(b"\0") == b"go away"
    assert rej.reject is not None and rej.reject.text
    if transport == "roce":
        assert rej.status == RejReason.CONSUMER_DEFINED  # 28, rdma_is_consumer_reject
        assert rej.reject.consumer_reject
    else:
        assert rej.status == -errno.ECONNREFUSED
    assert ce.qp.qp_state in (e.IBV_QPS_ERR, e.IBV_QPS_INIT, e.IBV_QPS_RESET)
    for cid in (cli, req.id, lst):
        cid.destroy()


def test_roce_a11_reject_reaches_the_app_with_its_ari(env: Path) -> None:
    """The listener is bound to ::1; an IPv4 REQ for its port is refused by the A11 checks
    (REJ 28, ARI "IP version not supported" suggesting IPv6, Tables 4-5, oA11-2) and the
    application sees that cause as text."""
    chs, chc = EventChannel(), EventChannel()
    lst = rc.CmId(chs)
    lst.bind_addr(("::1", 0), device="roce")
    lst.listen(4)
    assert lst.local_addr is not None
    cli, _ce = _client(chc, "roce", lst.local_addr[1])
    cli.connect(rc.ConnParam())
    rej = expect(chc, T.REJECTED)
    assert rej.status == 28 and rej.reject is not None and rej.reject.ip_cm is not None
    assert "IP version not supported" in rej.text and "IPv6" in rej.text
    assert chs.pending() == 0  # the listener's application never saw the REQ
    cli.destroy()
    lst.destroy()


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
@pytest.mark.iba("12.6.7")
def test_nobody_listens(env: Path, transport: str) -> None:
    """RoCE: REJ 8 Invalid Service ID (sent by devd, nobody listens in any process);
    iWARP: the TCP RST, ECONNREFUSED."""
    chc = EventChannel()
    chs = EventChannel()
    lst, port = _listen(chs, transport)
    lst.destroy()  # the port is known free now
    cli, _ce = _client(chc, transport, port)
    cli.connect(rc.ConnParam())
    rej = expect(chc, T.REJECTED)
    if transport == "roce":
        assert rej.status == RejReason.INVALID_SERVICE_ID
        assert "Service ID" in rej.text
    else:
        assert rej.status == -errno.ECONNREFUSED
    cli.destroy()


@pytest.mark.iba("12.6.5")
def test_unreachable_roce(env: Path) -> None:
    """No CM answers at 127.0.0.99 (no device there): the REQ is retried max_cm_retries
    times, then UNREACHABLE (-ETIMEDOUT)."""
    ch = EventChannel()
    cli, _ce = _client(ch, "roce", 7000, ip="127.0.0.99")
    assert cli.local_addr is not None and cli.local_addr[0] == "127.0.0.1"
    cli.connect(rc.ConnParam())
    ev = expect(ch, T.UNREACHABLE, timeout=15)
    assert ev.status == -errno.ETIMEDOUT and ev.reject is not None
    assert "timeout" in ev.reject.text
    cli.destroy()


def test_unreachable_iwarp(env: Path) -> None:
    """A TCP peer that accepts but never answers the MPA Request."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    held: list[socket.socket] = []
    t = threading.Thread(target=lambda: held.append(srv.accept()[0]), daemon=True)
    t.start()
    try:
        ch = EventChannel()
        cli, _ce = _client(ch, "iwarp", srv.getsockname()[1])
        cli.connect(rc.ConnParam())
        ev = expect(ch, T.UNREACHABLE, timeout=10)
        assert ev.status == -errno.ETIMEDOUT
        cli.destroy()
    finally:
        t.join(5)
        for s in held:
            s.close()
        srv.close()


@pytest.mark.iba("12.11")
def test_ud_through_sidr(env: Path) -> None:
    chs, chc = EventChannel(), EventChannel()
    lst, port = _listen(chs, "roce", rc.RDMA_PS_UDP)
    cli, ce = _client(chc, "roce", port, ps=rc.RDMA_PS_UDP)
    assert ce.qp.qp_state == e.IBV_QPS_RTS  # librdmacm: UD QPs are ready at create
    cli.connect(rc.ConnParam(private_data=b"ud hello"))
    req = expect(chs, T.CONNECT_REQUEST)
    assert req.private_data.rstrip(b"\0") == b"ud hello" and req.info.get("sidr")
    se = Ep(req.id, ud=True)
    se.recv(64 + 40)
    req.id.accept(rc.ConnParam())
    est = expect(chc, T.ESTABLISHED)
    assert est.ud is not None and est.ud.qp_num == se.qp.qp_num
    assert est.ud.qkey == 0x01234567
    ah = v.AH(ce.pd, est.ud.ah_attr)
    ce.mr.write(b"datagram", 8, 0)
    wr = v.SendWR(1, None, 1, [v.SGE(ce.mr.addr, 8, ce.mr.lkey)], e.IBV_WR_SEND,
                  e.IBV_SEND_SIGNALED)
    wr.set_wr_ud(ah, est.ud.qp_num, est.ud.qkey)
    ce.qp.post_send(wr)
    wcs = se.wait(1)
    assert wcs and wcs[0].status == 0 and se.mr.read(8, 40) == b"datagram"
    for cid in (cli, req.id, lst):
        cid.destroy()


def test_ud_on_iwarp_is_refused(env: Path) -> None:
    ch = EventChannel()
    cli = rc.CmId(ch, rc.RDMA_PS_UDP)
    with pytest.raises(SoftRdmaError, match="UD"):
        cli.bind_addr(("127.0.0.1", 0), device="iwarp")
        cli.listen()


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
def test_asyncio_form(env: Path, transport: str) -> None:
    async def main() -> list[rc.RdmaCmEventType]:
        chs, chc = EventChannel(), EventChannel()
        lst, port = _listen(chs, transport)
        cli = rc.CmId(chc)
        cli.resolve_addr(None, ("127.0.0.1", port), 2000, device=transport)
        seen = [(await chc.next_event()).event]
        cli.resolve_route(2000)
        seen.append((await chc.next_event()).event)
        Ep(cli)
        cli.connect(rc.ConnParam())
        req = await asyncio.wait_for(chs.next_event(), 10)
        Ep(req.id)
        req.id.accept()
        seen.append((await asyncio.wait_for(chc.next_event(), 10)).event)
        seen.append((await asyncio.wait_for(chs.next_event(), 10)).event)
        req.id.disconnect()
        seen.append((await asyncio.wait_for(chc.next_event(), 10)).event)
        for cid in (cli, req.id, lst):
            cid.destroy()
        return seen

    assert asyncio.run(main()) == [T.ADDR_RESOLVED, T.ROUTE_RESOLVED, T.ESTABLISHED,
                                   T.ESTABLISHED, T.DISCONNECTED]


def test_event_numbering_is_librdmacm() -> None:
    assert [int(t) for t in T] == list(range(16))
    assert rc.event_str(T.TIMEWAIT_EXIT) == "RDMA_CM_EVENT_TIMEWAIT_EXIT"
    assert (rc.RDMA_PS_TCP, rc.RDMA_PS_UDP) == (0x0106, 0x0111)


def test_timewait_exit_and_device_removal(env: Path) -> None:
    chs, chc = EventChannel(), EventChannel()
    lst, port = _listen(chs, "roce")
    cli, _ce = _client(chc, "roce", port)
    cli.connect(rc.ConnParam())
    req = expect(chs, T.CONNECT_REQUEST)
    Ep(req.id)
    req.id.accept()
    expect(chc, T.ESTABLISHED)
    expect(chs, T.ESTABLISHED)
    cli.disconnect()
    expect(chc, T.DISCONNECTED)
    expect(chc, T.TIMEWAIT_EXIT)  # FAST_CM: 50 ms TimeWait
    expect(chs, T.DISCONNECTED)
    expect(chs, T.TIMEWAIT_EXIT)
    rc.release_devices()
    assert expect(chs, T.DEVICE_REMOVAL).id in (lst, req.id)


def test_roce_events_reach_the_channel_without_the_cm_event_thread(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: the rdma_cm layer's handlers only post to the event channel, so the
    IB CM runs them in the thread that processed the MAD or timer: no hand-off to the
    CM's event thread (a thread switch for each of a connection's events)."""
    scheduled: list[CmBinding] = []
    real = CmBinding._schedule_delivery

    def counting(self: CmBinding) -> None:
        scheduled.append(self)
        real(self)
    monkeypatch.setattr(CmBinding, "_schedule_delivery", counting)
    chs, chc = EventChannel(), EventChannel()
    lst, port = _listen(chs, "roce")
    for _ in range(3):
        cli, _ce = _client(chc, "roce", port)
        cli.connect(rc.ConnParam(private_data=b"inline"))
        req = expect(chs, T.CONNECT_REQUEST)
        assert req.private_data.rstrip(b"\0") == b"inline"
        Ep(req.id)
        req.id.accept()
        expect(chc, T.ESTABLISHED)
        expect(chs, T.ESTABLISHED)
        req.id.disconnect()  # the passive side's DREQ this time
        expect(chs, T.DISCONNECTED)
        expect(chc, T.DISCONNECTED)
        expect(chs, T.TIMEWAIT_EXIT)
        expect(chc, T.TIMEWAIT_EXIT)
        for cid in (cli, req.id):
            cid.destroy_qp()
            cid.destroy()
    lst.destroy()
    assert scheduled == []


def _iwarp_rounds(n: int) -> None:
    """``n`` iWARP connections: connect, accept, ESTABLISHED, disconnect, destroy."""
    chs, chc = EventChannel(), EventChannel()
    lst, port = _listen(chs, "iwarp")
    for _ in range(n):
        cli, _ce = _client(chc, "iwarp", port)
        cli.connect(rc.ConnParam(private_data=b"round"))
        req = expect(chs, T.CONNECT_REQUEST)
        assert req.private_data == b"round"
        Ep(req.id)
        req.id.accept(rc.ConnParam(private_data=b"back"))
        assert expect(chc, T.ESTABLISHED).private_data == b"back"
        expect(chs, T.ESTABLISHED)
        cli.disconnect()
        expect(chc, T.DISCONNECTED)
        expect(chs, T.DISCONNECTED)
        for cid in (cli, req.id):
            cid.destroy_qp()
            cid.destroy()
    lst.destroy()


def test_iwarp_connect_to_a_local_peer_runs_no_thread(env: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: an iWARP connect ran in a worker thread (its blocking TCP connect and
    wait for the MPA Reply) and each listener had a thread waiting for MPA Requests: two
    thread hand-offs per connection. A TCP connection that is up at once (a local peer)
    now sends its Request from the caller, and the runtime's thread reports the Reply
    and the Requests from the connections' events."""
    blocking: list[str] = []
    real = iwconnect.connect

    def connect(*a: Any, **kw: Any) -> Any:
        blocking.append(threading.current_thread().name)
        return real(*a, **kw)
    monkeypatch.setattr(iwconnect, "connect", connect)
    monkeypatch.setattr(iwconnect.Listener, "get_request",
                        lambda *a, **k: pytest.fail("a thread waits for MPA Requests"))
    before = {t.ident for t in threading.enumerate()}
    _iwarp_rounds(3)
    assert blocking == []
    new = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not any(n.startswith("rdma_cm-iw") for n in new), new


def test_iwarp_local_peer_events_are_queued_by_the_call(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: connect, accept and disconnect towards a peer on this runtime serve the
    peer's socket in the caller's thread (TcpRuntime.call_local): the CONNECT_REQUEST,
    ESTABLISHED and DISCONNECTED they cause are on the channels when the call returns,
    with the progress thread held out (before: two thread hand-offs through it each)."""
    from softrdma.drivers.runtime.tcp import TcpRuntime
    gate = threading.Event()
    real = TcpRuntime._thread_step

    def held(self: TcpRuntime) -> bool:
        if gate.wait(0.02):
            return real(self)
        return not self.core.stop.is_set()
    monkeypatch.setattr(TcpRuntime, "_thread_step", held)
    chs, chc = EventChannel(), EventChannel()
    try:
        lst, port = _listen(chs, "iwarp")
        for _ in range(2):
            cli, _ce = _client(chc, "iwarp", port)
            cli.connect(rc.ConnParam(private_data=b"now"))
            assert chs.pending() == 1
            req = expect(chs, T.CONNECT_REQUEST, timeout=0)
            assert req.private_data == b"now"
            Ep(req.id)
            req.id.accept(rc.ConnParam(private_data=b"back"))
            assert chs.pending() == chc.pending() == 1
            assert expect(chc, T.ESTABLISHED, timeout=0).private_data == b"back"
            expect(chs, T.ESTABLISHED, timeout=0)
            cli.disconnect()
            assert chs.pending() == chc.pending() == 1
            expect(chc, T.DISCONNECTED, timeout=0)
            expect(chs, T.DISCONNECTED, timeout=0)
            for cid in (cli, req.id):
                cid.destroy_qp()
                cid.destroy()
        lst.destroy()
    finally:
        gate.set()


def test_iwarp_connects_not_up_at_once_reuse_one_worker_thread(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: a connect whose TCP connection is not up at once (a remote peer) runs
    the blocking connect in a worker thread, one reused for sequential connects (a thread
    of its own cost about 60 us of CPU and 300 us of latency on a busy host)."""
    ran: list[threading.Thread] = []
    real = iwconnect.connect

    def connect(*a: Any, **kw: Any) -> Any:
        ran.append(threading.current_thread())
        return real(*a, **kw)
    monkeypatch.setattr(iwconnect, "connect", connect)
    monkeypatch.setattr(iwconnect, "start_connect", lambda *a, **k: None)
    _iwarp_rounds(3)
    assert len(ran) == 3
    assert len({id(t) for t in ran}) == 1, [t.name for t in ran]
    assert ran[0].name == "rdma_cm-iw-connect" and ran[0].daemon


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
def test_cm_id_states_follow_linux(env: Path, transport: str) -> None:
    """Issue 23: a CmId walks Linux's enum rdma_cm_state (cma_priv.h), the connection
    manager of its transport is chosen once, and calls in the wrong state still raise
    StateError."""
    S = rc.CmState
    chs, chc = EventChannel(), EventChannel()
    lst = rc.CmId(chs)
    assert lst.state is S.IDLE
    with pytest.raises(StateError):
        lst.listen()
    lst.bind_addr(("127.0.0.1", 0), device=transport)
    assert lst.state is S.ADDR_BOUND
    lst.listen(4)
    assert lst.state is S.LISTEN
    with pytest.raises(StateError, match="already listens"):
        lst.listen()
    assert lst.local_addr is not None
    cli = rc.CmId(chc)
    with pytest.raises(StateError):
        cli.resolve_route()
    with pytest.raises(StateError):
        cli.connect()
    cli.resolve_addr("10.254.254.254", ("10.254.254.1", 1))  # nobody owns the source
    expect(chc, T.ADDR_ERROR)
    assert cli.state is S.IDLE  # an address error leaves the id where it was
    cli.resolve_addr(None, ("127.0.0.1", lst.local_addr[1]), 2000, device=transport)
    expect(chc, T.ADDR_RESOLVED)
    assert cli.state is S.ADDR_RESOLVED
    assert type(cli._cm).__name__ == ("_IwCm" if transport == "iwarp" else "_IbCm")
    cli.resolve_route(2000)
    expect(chc, T.ROUTE_RESOLVED)
    assert cli.state is S.ROUTE_RESOLVED
    with pytest.raises(StateError):
        cli.disconnect()  # not connected
    with pytest.raises(StateError):
        cli.accept()  # no request
    ce = Ep(cli)
    cli.connect(rc.ConnParam())
    assert cli.state is S.CONNECT
    req = expect(chs, T.CONNECT_REQUEST)
    child = req.id
    assert child.state is S.CONNECT and child._cm is cli._cm
    Ep(child)
    child.accept()
    expect(chc, T.ESTABLISHED)
    expect(chs, T.ESTABLISHED)
    assert cli.state is child.state is S.CONNECT  # Linux keeps established ids there
    with pytest.raises(StateError, match="already connecting or connected"):
        cli.connect(rc.ConnParam())
    cli.disconnect()
    assert next_non_timewait(chc).event == T.DISCONNECTED
    assert next_non_timewait(chs).event == T.DISCONNECTED
    assert cli.state is child.state is S.DISCONNECT
    assert ce.qp is not None
    for cid in (cli, child, lst):
        cid.destroy_qp()
        cid.destroy()
        assert cid.state is S.DESTROYING
        with pytest.raises(StateError, match="destroyed"):
            cid.listen()


def test_bad_arguments(env: Path) -> None:
    ch = EventChannel()
    cid = rc.CmId(ch)
    with pytest.raises(SoftRdmaError):
        cid.resolve_addr(None, ("not an ip", 1))
    with pytest.raises(SoftRdmaError):
        cid.resolve_route()
    with pytest.raises(SoftRdmaError):
        cid.connect()
    with pytest.raises(SoftRdmaError):
        cid.listen()
    with pytest.raises(SoftRdmaError):
        rc.CmId(ch, ps=0x1234)
    cid.resolve_addr("10.254.254.254", ("10.254.254.1", 1))  # nobody owns the source
    ev = expect(ch, T.ADDR_ERROR)
    assert ev.status < 0 and "owns" in ev.text


def test_iwarp_listener_closes_a_silent_connection_on_its_mpa_timer(env: Path) -> None:
    """A TCP connection to an rdma_cm iWARP listener that never sends its MPA Request is
    closed when its MPA timer expires (siw's MPA timeout), though no thread waits for
    Requests any more (issue 26); a real connection is served meanwhile and after."""
    chs = EventChannel()
    lst, port = _listen(chs, "iwarp")
    handle = lst._listens[0][2]
    assert isinstance(handle, iwconnect.Listener)
    handle.mpa_timeout = 0.5
    silent = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        silent.settimeout(30)
        t0 = time.monotonic()
        assert silent.recv(100) == b""  # closed by the listener, nothing sent
        assert time.monotonic() - t0 < 20
    finally:
        silent.close()
    assert handle._pending == []
    chc = EventChannel()
    cli, _ce = _client(chc, "iwarp", port)
    cli.connect(rc.ConnParam(private_data=b"real"))
    req = expect(chs, T.CONNECT_REQUEST)
    assert req.private_data == b"real"
    req.id.reject()
    assert expect(chc, T.REJECTED).status == -errno.ECONNREFUSED
    for cid in (cli, req.id, lst):
        cid.destroy()

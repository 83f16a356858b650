"""The tools' completion waits spin as the bench's ping-pong does (issue 26, "the tools
are as fast as the bench"): ``cq.poll`` makes progress itself, so an empty poll needs no
``time.sleep(0)`` (a system call, and a GIL hand-over to nobody, per empty poll: the
latency tools took 3-6x the bench's round trip). Only ``rc-pingpong --loopback``, whose
server is a second application thread in the process, hands over the GIL."""

from __future__ import annotations

import time
import types
from typing import Any

import pytest

from softrdma.tools.ibverbs import pingpong
from softrdma.tools.ibverbs import pingpong_endpoint as pe
from softrdma.tools.perftest import engine


class _CQ:
    """A CQ that is empty ``empties`` times, then returns one completion."""

    def __init__(self, empties: int) -> None:
        self.empties = empties
        self.polls = 0

    def poll(self, n: int = 1) -> tuple[int, list[Any]]:
        self.polls += 1
        if self.empties:
            self.empties -= 1
            return 0, []
        return 1, ["wc"]


def _count_sleeps(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[float]:
    calls: list[float] = []
    monkeypatch.setattr(module.time, "sleep", lambda s: calls.append(s))
    return calls


def test_rc_pingpong_wait_spins_without_sleeping(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = _count_sleeps(monkeypatch, pingpong)
    ep: Any = types.SimpleNamespace(cq=_CQ(5), channel=None, shares_gil=False,
                                    opts=types.SimpleNamespace(timeout=30.0),
                                    _activity=lambda: 0)
    assert pingpong.Endpoint._next_completions(ep, None) == ["wc"]
    assert ep.cq.polls == 6 and sleeps == []


def test_rc_pingpong_loopback_hands_the_gil_to_its_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = _count_sleeps(monkeypatch, pingpong)
    ep: Any = types.SimpleNamespace(cq=_CQ(3), channel=None, shares_gil=True,
                                    opts=types.SimpleNamespace(timeout=30.0),
                                    _activity=lambda: 0)
    assert pingpong.Endpoint._next_completions(ep, None) == ["wc"]
    # the wait starts once the data loop's quick look found nothing: each empty poll
    # of the wait hands the GIL over
    assert ep.cq.polls == 4 and sleeps == [0, 0, 0]


def test_perftest_wait_spins_without_sleeping(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = _count_sleeps(monkeypatch, engine)
    res: Any = types.SimpleNamespace(channel=None, o=types.SimpleNamespace(timeout=30.0),
                                     check_peer=lambda now: None,
                                     expired=lambda deadline, now: now >= deadline)
    cq = _CQ(5)
    assert engine.Resources.poll(res, cq, time.monotonic() + 30.0, "test", 1) == ["wc"]
    assert cq.polls == 6 and sleeps == []


def _calls_inside(fn: Any) -> list[str]:
    """The Python functions ``fn()`` calls (``sys.setprofile``), by name."""
    import sys

    names: list[str] = []

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            names.append(frame.f_code.co_name)
        elif event == "c_call":
            names.append(getattr(arg, "__name__", "?"))

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names[:-1]  # the last: sys.setprofile(None) itself


def test_rc_pingpong_send_is_one_post(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each SEND of the data loop after the first is the prebuilt WR posted: one call
    into the QP and nothing else (an import statement per SEND cost rc-pingpong four
    calls a round trip more than the bench's ping-pong, issue 26); ``-N`` still goes
    through ibv_wr_* each time."""
    posted: list[Any] = []
    qp = types.SimpleNamespace(post_send=posted.append)
    opts = types.SimpleNamespace(ext=types.SimpleNamespace(new_send=False), size=64)
    ep: Any = pingpong.Endpoint.__new__(pingpong.Endpoint)
    ep.__dict__.update(qp=qp, opts=opts, _send_wr="wr", ah=None, remote=None)
    assert _calls_inside(ep.post_send) == ["post_send", "append"]
    assert posted == ["wr"]
    news: list[str] = []
    monkeypatch.setattr(pingpong.Endpoint, "_post_send_new", lambda self: news.append("N"),
                        raising=False)
    ep._send_wr, opts.ext.new_send = None, True
    ep.post_send()
    ep.post_send()
    assert news == ["N", "N"] and posted == ["wr"]


class _LatSendRes:
    """perftest Resources for :func:`loops.run_lat_send` against a simulated peer that
    answers each SEND (the client) or sends first (the server): every message of the
    peer needs a posted receive the moment it may arrive, i.e. from our SEND on."""

    def __init__(self, iters: int, rx_depth: int, client: bool) -> None:
        self.o = types.SimpleNamespace(iters=iters, rx_depth=rx_depth, is_client=client,
                                       cq_mod=1, tx_depth=1, timeout=30.0)
        self.posted = rx_depth  # the runner posts rx_depth before the loop
        self.consumed = 0
        self.recv_posts = 0  # post_recvs calls in the loop
        self.incoming = 0 if client else 1  # peer messages sent and not yet polled
        self.peer_sent = self.incoming
        self.sends = 0
        self.recv_cq = types.SimpleNamespace(poll=self._recv_poll)
        self.send_cq = types.SimpleNamespace(poll=self._send_poll)

    def _arrive(self) -> None:
        assert self.posted - self.consumed >= 1, "a message arrived to an empty queue (RNR)"

    def _recv_poll(self, n: int = 1) -> tuple[int, list[Any]]:
        if not self.incoming:
            return 0, []
        self.incoming -= 1
        self.consumed += 1
        return 1, [types.SimpleNamespace(status=0, byte_len=64)]

    def _send_poll(self, n: int = 1) -> tuple[int, list[Any]]:
        return 1, [types.SimpleNamespace(status=0)]

    def poll(self, cq: Any, deadline: Any, what: Any, n: int = 16) -> list[Any]:
        got, wcs = cq.poll(n)
        assert got, f"the loop waits for a message the peer never sends: {what}"
        return wcs

    def send_wr(self, i: int, rem: Any, size: int) -> str:
        return "wr"

    def recv_len(self, size: int) -> int:
        return size

    def post(self, i: int, wr: Any, signaled: bool) -> None:
        self.sends += 1
        if self.peer_sent < self.o.iters:  # the peer answers this SEND
            self._arrive()
            self.peer_sent += 1
            self.incoming += 1

    def post_recvs(self, i: int, count: int, size: int) -> None:
        self.posted += count
        self.recv_posts += 1


@pytest.mark.parametrize("client", [True, False], ids=["client", "server"])
@pytest.mark.parametrize("iters,rx_depth", [(2500, 512), (200, 2), (60, 1), (100, 17),
                                            (40, 40), (700, 100)])
def test_send_lat_reposts_receives_in_batches(client: bool, iters: int,
                                              rx_depth: int) -> None:
    """send-lat owes perftest's receives (one per message while ``rcnt + rx_depth <=
    iters``, the same total) and posts them in batches after the next SEND, not one per
    message before it (issue 26); a receive is posted whenever the peer's next message
    may arrive, up to the last one."""
    from softrdma.tools.perftest import loops

    res: Any = _LatSendRes(iters, rx_depth, client)
    prog: Any = types.SimpleNamespace(update=lambda n: None)
    assert len(loops.run_lat_send(res, 64, prog)) == iters
    assert res.sends == iters and res.consumed == iters
    assert res.posted == max(iters, rx_depth)
    reposts = max(iters - rx_depth, 0)
    if reposts > 2 * loops.RECV_BATCH and rx_depth > loops.RECV_BATCH:
        assert res.recv_posts <= reposts // loops.RECV_BATCH + 2


def _pingpong_run(iters: int, rx_depth: int, client: bool) -> list[tuple[str, int]]:
    """rc-pingpong's data loop (``Endpoint.run``) against a simulated peer that answers
    each SEND (or sends first, to the server) and ACKs it; returns the loop's posts, in
    order: ("send", receives posted then) and ("recv", how many in one call). A peer's
    message may arrive as soon as our SEND left: a receive must be posted then."""
    done: list[Any] = []
    log: list[tuple[str, int]] = []
    peer = {"sent": 0 if client else 1}
    if not client:
        done.append(types.SimpleNamespace(status=0, wr_id=pe.RECV_WRID, byte_len=64))

    def poll(n: int = 1) -> tuple[int, list[Any]]:
        out = done[:n]
        del done[:n]
        return len(out), out

    ep: Any = pingpong.Endpoint.__new__(pingpong.Endpoint)
    ep.__dict__.update(opts=types.SimpleNamespace(iters=iters, chk=False, timeout=30.0,
                                                  rx_depth=rx_depth),
                       channel=None, cq=types.SimpleNamespace(poll=poll), routs=rx_depth,
                       recv_clock=None)

    def post_send() -> None:
        log.append(("send", ep.routs))
        assert peer["sent"] == iters or ep.routs >= 1, "the answer finds no receive (RNR)"
        done.append(types.SimpleNamespace(status=0, wr_id=pe.SEND_WRID, byte_len=0))
        if peer["sent"] < iters:
            peer["sent"] += 1
            done.append(types.SimpleNamespace(status=0, wr_id=pe.RECV_WRID,
                                              byte_len=64))

    def post_recv(n: int, refill: bool = False) -> int:
        log.append(("recv", n))
        return n

    ep.post_send, ep.post_recv = post_send, post_recv
    ep._next_completions = lambda abort: poll(2)[1]
    ep.run(client)
    assert peer["sent"] == iters and not done
    return log


@pytest.mark.parametrize("client", [True, False], ids=["client", "server"])
@pytest.mark.parametrize("rx_depth", [1, 2, 3, 17, 500])
def test_rc_pingpong_refills_after_its_send(client: bool, rx_depth: int) -> None:
    """rc-pingpong tops its receive queue up right after a SEND, in batches of up to
    RECV_BATCH, while the answer is on its way; only a queue down to one receive is
    refilled before the SEND (``rc_pingpong.c``'s rule, which with ``-r 500`` put a post
    of 499 receives, ~0.5 ms, on one round trip in 499; issue 26)."""
    log = _pingpong_run(1200, rx_depth, client)
    assert sum(1 for k, _ in log if k == "send") == 1200
    for i, (kind, n) in enumerate(log):
        if kind == "recv" and rx_depth > pe.RECV_BATCH + 1:
            assert n <= pe.RECV_BATCH
            assert i and log[i - 1][0] == "send", "a refill on the round trip"


def test_a_failed_refill_says_why_when_the_device_failed() -> None:
    """A receive post that fails because the device failed (its devd died: the runtime's
    ``fatal``) reports that reason, not only ``Couldn't post receive (N)``: which of the
    two the ping-pong hits first when devd dies is a race (an error completion reports
    it as well)."""
    runtime = types.SimpleNamespace(fatal=None)
    ep = types.SimpleNamespace(ctx=types.SimpleNamespace(runtime=runtime))
    err = pe.Endpoint._post_failed(ep, 484)  # type: ignore[arg-type]
    assert str(err) == "Couldn't post receive (484)"
    runtime.fatal = "devd closed the link: the device is no longer usable (IBV_EVENT_DEVICE_FATAL)"
    assert str(pe.Endpoint._post_failed(ep, 484)) == runtime.fatal  # type: ignore[arg-type]

"""Coalesced ACKs held back while the machine is contended (issue 25, the contended ping-pong).

Beside a busy process both ends of a ping-pong share one core and a round trip costs all
of both sides' work, each SEND's ACK included. While a busy poll finds the machine
contended, ``roce.AckHold`` holds the pending ACKs back briefly, so one ACK answers several
requests (IBA 9.7.5.1.1); a peer that waits for its ACKs gets them at once again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness.verbs_pair import Side, udp_rc_pair

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.runtime import pacer as pacing
from softrdma.drivers.runtime import roce
from softrdma.drivers.runtime.roce import AckHold, Runtime

ROUNDS = 64
SEND = int(e.IBV_WC_SEND)
RECV = int(e.IBV_WC_RECV)


class _Qp:
    """A QP with a coalesced ACK pending (``Port.ack_pending``)."""

    def __init__(self, psn: int) -> None:
        self.ack_psn = psn

    def flush_ack(self) -> None:
        self.ack_psn = -1


def test_held_only_while_contended_and_until_the_hold_ends() -> None:
    hold = AckHold()
    qp = _Qp(5)
    assert hold.go([], 10.0, True, 0) is True  # nothing pending
    assert hold.go([qp], 10.0, False, 0) is True and hold.until == 0.0  # an idle machine
    assert hold.go([qp], 10.0, True, 0) is False and hold.until == 10.0 + roce.ACK_HOLD
    qp.ack_psn = 6  # the peer's next request came in
    assert hold.go([qp], 10.0 + roce.ACK_HOLD / 2, True, 0) is False
    assert hold.go([qp], 10.0 + roce.ACK_HOLD, True, 0) is True and hold.until == 0.0
    assert not hold.prompt and not hold.stale
    # a bulk sender: ACK_HOLD_RX datagrams end the hold before its time
    assert hold.go([qp], 20.0, True, 0) is False
    hold.rx = roce.ACK_HOLD_RX
    assert hold.go([qp], 20.0, True, 0) is True


def test_a_pingpong_hold_lasts_while_as_many_packets_are_sent() -> None:
    """The peer of a ping-pong sends one request per request of ours: while the datagrams
    received exceed the packets sent by less than ACK_HOLD_RX, the hold lasts up to
    ACK_HOLD_RX_MAX datagrams. A bulk sender (nothing sent back) ends it at ACK_HOLD_RX."""
    hold = AckHold()
    qp = _Qp(5)
    assert hold.go([qp], 10.0, True, 0, 100) is False
    hold.rx = roce.ACK_HOLD_RX
    assert hold.go([qp], 10.0, True, 0, 100 + roce.ACK_HOLD_RX - 1) is False  # our answers
    hold.rx = roce.ACK_HOLD_RX_MAX
    assert hold.go([qp], 10.0, True, 0, 100 + roce.ACK_HOLD_RX_MAX) is True
    assert hold.go([qp], 20.0, True, 0, 200) is False
    hold.rx = roce.ACK_HOLD_RX
    assert hold.go([qp], 20.0, True, 0, 200) is True  # nothing sent meanwhile


def test_a_peer_that_waits_for_its_acks_gets_them_at_once() -> None:
    """A QP whose PSN did not move during ACK_STALE holds in a row: its peer waits for the
    ACK before it sends more; no hold for it during ACK_PROMPT. One such hold alone (a
    descheduled peer) does not count, nor do holds during which its peer sent on."""
    hold = AckHold()
    waiter, sender = _Qp(1), _Qp(1)
    now = 100.0
    for k in range(roce.ACK_STALE):
        assert hold.go([waiter, sender], now, True, 0) is False
        sender.ack_psn += 1
        if k == 1:  # the waiter sent on once: its streak starts again
            waiter.ack_psn += 1
        now += roce.ACK_HOLD
        assert hold.go([waiter, sender], now, True, 0) is True
    assert not hold.prompt and hold.stale == {id(waiter): 1}
    for _ in range(roce.ACK_STALE - 1):
        assert hold.go([waiter], now, True, 0) is False
        now += roce.ACK_HOLD
        assert hold.go([waiter], now, True, 0) is True
    assert set(hold.prompt) == {id(waiter)} and not hold.stale
    assert hold.go([sender, waiter], now, True, 0) is True  # prompt: not held
    assert hold.go([sender], now, True, 0) is False  # the other one still is
    hold.go([sender], now + roce.ACK_HOLD, True, 0)
    now += roce.ACK_PROMPT + roce.ACK_HOLD
    assert hold.go([waiter], now, True, 0) is False  # the prompt period is over


def test_a_duplicate_request_ends_the_hold() -> None:
    """A duplicate request while ACKs are held: the requester's transport timer ran out
    first (a short Local ACK Timeout). The ACK leaves at once, and its QP is not held
    again during ACK_PROMPT (its retries would otherwise eat its retry count)."""
    hold = AckHold()
    qp = _Qp(3)
    assert hold.go([qp], 1.0, True, 7) is False
    assert hold.go([qp], 1.0, True, 7) is False
    assert hold.go([qp], 1.0, True, 8) is True and hold.until == 0.0
    assert set(hold.prompt) == {id(qp)}
    assert hold.go([qp], 1.0, True, 8) is True


@pytest.fixture()
def pair() -> Iterator[tuple[Side, Side]]:
    """Two RC sides on UDP loopback with manual progress (no thread that sends ACKs)."""
    with udp_rc_pair("manual") as (a, b, _la, _lb):
        yield a, b


def _contended(s: Side, shared: bool = False) -> Runtime:
    rt = s.ctx.runtime
    assert isinstance(rt, Runtime)
    if shared:  # as after slow request sends: the peer shares our core
        rt._pacer.shared_until = float("inf")
    else:
        rt._pacer.calm_until = float("inf")  # as after a spin that lost the CPU
    return rt


def _poll(s: Side, rt: Runtime) -> list[Any]:
    """The application's busy poll: a progress step, then the CQ."""
    rt.progress_nonblocking()
    wcs = s.cq.poll(16)[1]
    for wc in wcs:
        assert wc.status == 0, wc
    return wcs


def _pingpong(a: Side, b: Side, rounds: int, wait_send: bool,
              shared: bool = False) -> dict[str, int]:
    """``rounds`` 64 B SEND ping-pongs driven from this thread; with ``wait_send`` each
    side awaits its SEND's completion (the peer's ACK) before its next SEND. Returns the
    ACKs each side sent. ``shared``: contended by a shared core (slow request sends)."""
    rts = {"a": _contended(a, shared), "b": _contended(b, shared)}
    for s in (a, b):
        for _ in range(16):
            s.qp.post_recv(v.RecvWR(wr_id=1, num_sge=1, sg=[s.sge(0, 64)]))
    wr = {s: v.SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[s.sge(64, 64)],
                      send_flags=e.IBV_SEND_SIGNALED) for s in (a, b)}
    sent0 = {k: rt.port.counters.sent_pkts for k, rt in rts.items()}
    done = {a: 0, b: 0}  # send completions
    deadline = time.monotonic() + 60.0
    for i in range(rounds):
        for src, dst, dst_rt in ((a, b, rts["b"]), (b, a, rts["a"])):
            src.qp.post_send(wr[src])
            got = False
            while not got or (wait_send and done[src] <= i):
                assert time.monotonic() < deadline, f"round {i}: no answer in 60 s"
                for s, rt in ((dst, dst_rt), (src, rts["a" if src is a else "b"])):
                    for wc in _poll(s, rt):
                        if wc.opcode == RECV:
                            assert s is dst
                            got = True
                            s.qp.post_recv(v.RecvWR(wr_id=1, num_sge=1, sg=[s.sge(0, 64)]))
                        else:
                            assert wc.opcode == SEND
                            done[s] += 1
    while done[a] < rounds or done[b] < rounds:  # the last ACKs: at the latest when held
        assert time.monotonic() < deadline, f"send completions {done} of {rounds} in 60 s"
        for s, rt in ((a, rts["a"]), (b, rts["b"])):
            for wc in _poll(s, rt):
                assert wc.opcode == SEND
                done[s] += 1
    return {k: rt.port.counters.sent_pkts - sent0[k] - rounds for k, rt in rts.items()}


def test_a_contended_pingpong_sends_one_ack_for_several_sends(
        pair: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every SEND still completes, with far fewer ACKs than SENDs (one per SEND before).
    The hold's time is made long, so that ACK_HOLD_RX datagrams end it whatever the load."""
    monkeypatch.setattr(roce, "ACK_HOLD", 30.0)
    acks = _pingpong(*pair, ROUNDS, wait_send=False)
    assert all(0 < n <= ROUNDS // 2 for n in acks.values()), acks


def test_a_pingpong_on_a_shared_core_holds_its_acks_too(
        pair: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer sharing our core preempts our request's send and gives the core back when
    it waits, so no spin is seen losing the CPU (calm_now stays False); slow sends mark
    the core shared (PollPacer.hold_acks), and ACKs are held as when contended."""
    monkeypatch.setattr(roce, "ACK_HOLD", 30.0)
    monkeypatch.setattr(pacing, "PREEMPTED", float("inf"))  # no spin is seen preempted
    a, b = pair
    acks = _pingpong(a, b, ROUNDS, wait_send=False, shared=True)
    assert all(0 < n <= ROUNDS // 2 for n in acks.values()), acks
    for s in (a, b):
        rt = s.ctx.runtime
        assert isinstance(rt, Runtime) and not rt._pacer.calm_now()


def test_post_send_times_its_request_send(pair: tuple[Side, Side]) -> None:
    """Runtime.post_send gives the pacer the start of its request's send: with a clock
    that makes every send slow, SHARED_SENDS SENDs mark the core shared."""
    a, b = pair
    rt = a.ctx.runtime
    assert isinstance(rt, Runtime)
    pacer = rt._pacer
    ticks = [0.0]

    def clock() -> float:  # each reading 1 ms after the last: every send looks slow
        ticks[0] += 0.001
        return ticks[0]

    pacer.clock = clock
    for _ in range(16):
        b.qp.post_recv(v.RecvWR(wr_id=1, num_sge=1, sg=[b.sge(0, 64)]))
    wr = v.SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[a.sge(64, 64)])
    for k in range(pacing.SHARED_SENDS):
        assert not pacer.hold_acks()
        a.qp.post_send(wr)
        assert pacer.lost == k + 1
    assert pacer.hold_acks() and pacer.shared == 1


def test_a_contended_pingpong_that_waits_for_its_acks_gets_them_at_once(
        pair: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each side awaits its SEND's ACK: after ACK_STALE holds that ran out, its ACKs leave
    at once (one per SEND, as without holds), so the rest of the run waits for no hold."""
    monkeypatch.setattr(roce, "ACK_HOLD", 0.002)
    monkeypatch.setattr(roce, "ACK_PROMPT", 3600.0)
    a, b = pair
    acks = _pingpong(a, b, ROUNDS, wait_send=True)
    for s in (a, b):
        rt = s.ctx.runtime
        assert isinstance(rt, Runtime)
        assert list(rt._ack_hold.prompt) == [id(rt.port.qps[s.qp.qp_num])]
        assert rt._ack_hold.ran_out <= roce.ACK_STALE
    assert acks == {"a": ROUNDS, "b": ROUNDS}

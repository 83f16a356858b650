"""Issue 25: a perftest twin's ``--timeout`` does not end a run whose peer is alive and
answering, only slowly (a loaded host, 4 MiB WRITEs with cq_mod 100: the first completion
needs 400 MiB delivered); a peer that has gone silent still ends it."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from softrdma.tools.perftest import engine
from softrdma.tools.perftest.options import PerftestError


class _Clock:
    def __init__(self, step: float) -> None:
        self.t = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def _waiter(rcvd: list[int], timeout: float) -> Any:
    """A Resources waiting on an empty send CQ (no completion channel); ``rcvd[0]`` is
    this process's rcvd_pkts."""
    res: Any = object.__new__(engine.Resources)
    res.ctx = SimpleNamespace(counters=lambda: {"rcvd_pkts": rcvd[0]})
    res.o = SimpleNamespace(timeout=timeout)
    res.channel = None
    res.peer_gone = None
    res._peer_checked = 0.0
    res._peer_gone_at = None
    res._rcvd_seen = -1
    res._quiet = 0
    res._rcvd_sample = 0.0
    return res


class _SlowCQ:
    """Empty for ``empty`` polls, while ACKs keep arriving (``rcvd`` grows), then one
    completion."""

    def __init__(self, rcvd: list[int], empty: int, acking: bool) -> None:
        self.rcvd = rcvd
        self.left = empty
        self.acking = acking

    def poll(self, n: int) -> tuple[int, list[str]]:
        if self.left > 0:
            self.left -= 1
            if self.acking:
                self.rcvd[0] += 3
            return 0, []
        return 1, ["wc"]


def test_a_slow_but_answering_peer_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(0.25)
    monkeypatch.setattr(engine, "time", SimpleNamespace(monotonic=clock, sleep=time.sleep))
    rcvd = [0]
    res = _waiter(rcvd, timeout=2.0)
    cq = _SlowCQ(rcvd, empty=40, acking=True)  # the completion comes after ~10 s
    deadline = clock.t + 2.0
    assert engine.Resources.poll(res, cq, deadline, "sending") == ["wc"]


def test_a_silent_peer_still_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(0.25)
    monkeypatch.setattr(engine, "time", SimpleNamespace(monotonic=clock, sleep=time.sleep))
    rcvd = [0]
    res = _waiter(rcvd, timeout=2.0)
    cq = _SlowCQ(rcvd, empty=10_000, acking=False)
    deadline = clock.t + 2.0
    with pytest.raises(PerftestError, match="no completion for 2 s while sending"):
        engine.Resources.poll(res, cq, deadline, "sending")
    assert clock.t - (deadline - 2.0) < 2.0 + 3.0  # about --timeout, not STALL_LIMIT times


def test_an_answering_peer_that_never_completes_is_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock(0.25)
    monkeypatch.setattr(engine, "time", SimpleNamespace(monotonic=clock, sleep=time.sleep))
    rcvd = [0]
    res = _waiter(rcvd, timeout=2.0)
    cq = _SlowCQ(rcvd, empty=10_000, acking=True)
    deadline = clock.t + 2.0
    with pytest.raises(PerftestError):
        engine.Resources.poll(res, cq, deadline, "sending")
    waited = clock.t - (deadline - 2.0)
    assert engine.STALL_LIMIT * 2.0 <= waited < engine.STALL_LIMIT * 2.0 + 1.0


def test_time_not_scheduled_is_not_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    """One poll after the process was descheduled for 5 s (past the deadline, no ACK
    read meanwhile because nothing ran) does not end the wait."""
    clock = _Clock(0.0)
    monkeypatch.setattr(engine, "time", SimpleNamespace(monotonic=clock, sleep=time.sleep))
    rcvd = [7]
    res = _waiter(rcvd, timeout=2.0)
    start = clock.t
    assert not res.expired(start + 2.0, start)  # the first read: 7
    clock.t = start + 5.0  # not scheduled for 5 s
    assert not res.expired(start + 2.0, clock.t)  # one quiet read: 0.5 s of silence

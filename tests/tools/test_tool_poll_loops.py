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

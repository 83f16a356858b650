"""The progress core (softrdma.drivers.runtime.progress) and the two runtimes that compose it.

* :class:`ProgressCore`: engine calls under the lock with the housekeeping after them,
  deferred calls, the closed / failed errors, the thread's start, stand-back and join;
* :class:`VirtualTimer`: only the earliest deadline is armed on the virtual clock;
* the RoCE :class:`Runtime`'s four progress modes, chosen from the link and ``mode``;
* the iWARP :class:`TcpRuntime`: composed, not a ``Runtime``; connection setup
  (:mod:`softrdma.drivers.cm.iwconnect`) waits on events: no sleeps, a closed listener wakes its
  waiter at once, and it works with manual progress on both sides.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.links.udp import UdpLink
from softrdma.drivers.runtime import progress as pg
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.drivers.runtime.roce import Runtime
from softrdma.drivers.runtime.tcp import TcpRuntime
from softrdma.errors import ClosedError, DeviceError, InvalidArgument
from softrdma.ib.port import Port
from softrdma.wire.gid import ip_to_gid

ACC = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)


# ---- ProgressCore ------------------------------------------------------------------------
def _core(threaded: bool = False) -> tuple[pg.ProgressCore, list[bool]]:
    afters: list[bool] = []
    core = pg.ProgressCore(threaded=threaded, now=lambda: 42.0, after=afters.append)
    return core, afters


def test_call_runs_under_the_lock_then_the_housekeeping() -> None:
    core, afters = _core()
    assert core.call(lambda x: (core.lock.locked(), x), 7) == (True, 7)
    assert afters == [False]  # call: coalesced ACKs stay pending
    assert core.call_now(lambda x, now: (x, now), "a") == ("a", 42.0)
    assert afters == [False, True]
    with pytest.raises(ZeroDivisionError):
        core.call(lambda: 1 // 0)
    assert afters == [False, True, False] and not core.lock.locked()


def test_deferred_calls_run_at_the_next_operation_and_at_close() -> None:
    core, _ = _core()
    ran: list[str] = []
    core.defer(lambda: ran.append("one"))
    assert ran == []
    with core.lock:
        core.run_deferred()
    assert ran == ["one"]
    core.defer(lambda: ran.append("two"))
    def fails() -> None:
        raise ZeroDivisionError

    core.defer(fails)  # a failing deferred call does not stop the close
    core.defer(lambda: ran.append("three"))
    drained: list[bool] = []
    core.close(lambda: drained.append(core.lock.locked()))
    assert ran == ["one", "two", "three"] and drained == [True]


def test_closed_and_failed_calls_raise() -> None:
    core, _ = _core()
    core.fatal = "devd died"
    with pytest.raises(DeviceError, match="devd died"):
        core.call(lambda: None)
    core.fatal = None
    core.close()
    with pytest.raises(ClosedError):
        core.call_now(lambda now: None)


def test_thread_steps_stands_back_while_polled_and_is_joined() -> None:
    core, _ = _core(threaded=True)
    steps: list[float] = []
    woken = threading.Event()
    core.on_wake(woken.set)

    def step() -> bool:
        steps.append(time.monotonic())
        time.sleep(0.001)
        return True

    core.start(step, "test-progress")
    deadline = time.monotonic() + 5
    while not steps and time.monotonic() < deadline:
        time.sleep(0.001)
    assert steps
    # an application thread busy-polls: the thread stands back (no steps meanwhile)
    assert core.try_lock()
    core.lock.release()
    assert core.standing_back()
    core.kick()
    assert woken.is_set() and not core.standing_back()
    core.close()
    n = len(steps)
    time.sleep(0.02)
    assert len(steps) == n  # the thread has ended


def test_standing_back_waits_grow_while_the_polls_go_on() -> None:
    """While an application thread keeps busy-polling, each wait of the standing-back
    thread is twice the last, from POLL_GRACE up to STAND_BACK_MAX (a thread that woke
    every 5 ms took the GIL from the poller each time); once nobody polled for
    POLL_GRACE it resumes, and its next stand-back starts again at POLL_GRACE. A kick
    ends a wait at once and the thread resumes."""
    core, _ = _core()
    waits: list[float] = []

    class _Kicked:
        def wait(self, timeout: float) -> bool:
            waits.append(timeout)
            return False

        def clear(self) -> None:
            pass

        def set(self) -> None:
            pass

    core.kicked = _Kicked()  # type: ignore[assignment]
    for _ in range(6):
        assert core.try_lock()
        core.lock.release()
        assert core.standing_back()
    g, top = pg.POLL_GRACE, pg.STAND_BACK_MAX
    assert waits == [min(g * 2 ** i, top) for i in range(6)]
    assert waits[-1] == top > g
    core.last_poll -= g  # nobody polled for POLL_GRACE: the thread resumes
    assert not core.standing_back()
    assert core.try_lock()
    core.lock.release()
    assert core.standing_back() and waits[-1] == g  # afresh
    core.kick()
    assert not core.standing_back() and core.back_wait == g


def test_input_left_unread_through_a_stand_back_makes_the_thread_serve() -> None:
    """A stand-back that ran out (no kick) followed by a step that took input: that
    input waited unread through it. The second time within SERVE_S, the application
    polls its CQ but not for that input (ib_write_lat spins on the memory its peer
    writes): for SERVE_S the thread does not stand back, however recent the last poll;
    then it stands back again. A step that took nothing, or one after a kick (the
    program is about to block), changes nothing; once, or twice SERVE_S apart, is no
    such program."""
    core, _ = _core()
    outcomes: list[bool] = []  # what each stand-back's wait returns: True, kicked

    class _Kicked:
        def wait(self, timeout: float) -> bool:
            return outcomes.pop(0)

        def clear(self) -> None:
            pass

        def set(self) -> None:
            pass

    core.kicked = _Kicked()  # type: ignore[assignment]

    def polled() -> None:
        assert core.try_lock()
        core.lock.release()

    polled()
    outcomes.append(False)
    assert core.standing_back()  # ran out
    core.took(0)  # nothing waited: no change
    polled()
    outcomes.append(True)
    assert core.standing_back()  # kicked
    core.took(3)  # after a kick: no change
    polled()
    assert core.serve_until == 0.0
    for _ in range(2):  # once, and again SERVE_S later: no serving
        outcomes.append(False)
        assert core.standing_back()  # ran out
        core.took(1)  # then the step took a datagram that waited
        assert core.serve_until == 0.0
        core.waited_at -= pg.SERVE_S
        polled()
    core.waited_at += pg.SERVE_S
    outcomes.append(False)
    assert core.standing_back()
    core.took(2)  # the second time within SERVE_S
    assert core.serve_until > time.monotonic()
    polled()  # the application polls again: the thread serves all the same
    assert not core.standing_back() and not outcomes
    until = core.serve_until
    core.took(5)  # a step while serving (no stand-back before it) does not prolong it
    assert core.serve_until == until
    core.serve_until = time.monotonic() - 0.001  # SERVE_S later
    polled()
    outcomes.append(False)
    assert core.standing_back()  # it stands back again


def test_about_to_block_kicks_only_after_a_busy_poll() -> None:
    """A C program about to block in ibv_get_cq_event: a progress thread standing back
    after its busy polls is kicked (it resumes at once and sends the ACKs they left
    pending); without a busy poll since the last kick nothing is woken (an event-driven
    program would pay a wake-up per event)."""
    core, _ = _core()
    woken: list[int] = []
    core.on_wake(lambda: woken.append(1))
    core.about_to_block()
    assert not woken and not core.kicked.is_set()
    assert core.try_lock()
    core.lock.release()
    core.about_to_block()
    assert woken == [1] and core.kicked.is_set() and core.last_poll == 0.0
    core.about_to_block()
    assert woken == [1]


def test_a_thread_that_polls_another_runtime_lets_the_first_ones_thread_resume() -> None:
    """One application thread busy-polls the CQs of two devices in turn (rdma-core's XRC
    traffic tests: a client and a server context in one process): once it polls ``b``,
    ``a``'s progress thread stops standing back at once, as after :meth:`kick` (before, it
    stood back for the rest of :data:`POLL_GRACE` while nobody polled ``a``: about 2.5 ms
    per message, 22 s per test). ``a``'s input waiter is not woken for it; polling the
    same runtime again changes nothing; another thread's polls are its own."""
    (a, _), (b, _) = _core(), _core()
    woken = threading.Event()
    a.on_wake(woken.set)
    for _ in range(2):
        assert a.try_lock()
        a.lock.release()
        assert a.last_poll > 0 and not a.kicked.is_set()
    assert b.try_lock()
    b.lock.release()
    assert a.kicked.is_set() and not a.standing_back() and not woken.is_set()
    assert b.last_poll > 0 and not b.kicked.is_set()
    def poll_a() -> None:
        assert a.try_lock()
        a.lock.release()

    other = threading.Thread(target=poll_a)
    other.start()
    other.join()
    assert b.last_poll > 0 and not b.kicked.is_set()  # not this thread's switch
    assert b.try_lock()
    b.lock.release()
    assert not b.kicked.is_set()
    assert a.try_lock()  # back to a: now b's thread resumes
    a.lock.release()
    assert b.kicked.is_set() and not b.standing_back()


def test_a_step_returning_false_ends_the_thread() -> None:
    core, _ = _core(threaded=True)
    calls: list[int] = []
    def once() -> bool:
        calls.append(1)
        return False

    core.start(once, "test-progress")
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.02)
    assert calls == [1]
    core.close()


def test_modes_are_checked_and_named() -> None:
    with pytest.raises(InvalidArgument, match="progress"):
        pg.check_mode("busy")
    assert pg.progress_mode(True, True, False) is pg.ProgressMode.THREAD_SELECT
    assert pg.progress_mode(True, False, True) is pg.ProgressMode.THREAD_EVENT
    assert pg.progress_mode(False, True, False) is pg.ProgressMode.MANUAL
    assert pg.progress_mode(False, False, True) is pg.ProgressMode.VIRTUAL


def test_virtual_timer_arms_only_the_earliest_deadline() -> None:
    clock = VirtualClock()
    fired: list[float] = []
    vt = pg.VirtualTimer(clock, lambda: fired.append(clock.now()))
    vt.arm(None)
    vt.arm(2.0)
    vt.arm(3.0)  # later than the armed one: nothing new
    vt.arm(1.0)  # earlier: armed too
    clock.run()
    assert fired == [1.0, 2.0]
    vt.arm(5.0)  # after firing, a new deadline is armed again
    clock.run()
    assert fired == [1.0, 2.0, 5.0]


def test_waiters_wake_up() -> None:
    ev = pg.EventWaiter()
    ev.wake()
    t0 = time.monotonic()
    assert ev.wait(5.0) and time.monotonic() - t0 < 1.0
    pipe = pg.WakePipe()
    link = UdpLink("127.0.0.1", 0)
    try:
        fd = link.fileno()
        assert fd is not None
        sw = pg.SelectWaiter(fd, pipe)
        sw.wake()
        t0 = time.monotonic()
        assert sw.wait(5.0) and time.monotonic() - t0 < 1.0
        sw.close()
    finally:
        link.close()


# ---- the RoCE runtime's four modes ----------------------------------------------------------
def _port(ip: bytes) -> Port:
    return Port([ip_to_gid(ip)])


@pytest.mark.parametrize(("mode", "fabric", "expected"), [
    ("thread", False, pg.ProgressMode.THREAD_SELECT),
    ("manual", False, pg.ProgressMode.MANUAL),
    ("thread", True, pg.ProgressMode.THREAD_EVENT),
    ("manual", True, pg.ProgressMode.VIRTUAL),
])
def test_runtime_modes(mode: str, fabric: bool, expected: pg.ProgressMode) -> None:
    link: Any = (Fabric(VirtualClock()).link("10.9.0.1") if fabric
                 else UdpLink("127.0.0.1", 0))
    rt = Runtime(_port(bytes([10, 9, 0, 1])), link, mode=mode)
    try:
        assert rt.mode is expected
        assert rt.threaded == (mode == "thread")
        assert rt.call(lambda: rt.lock.locked())
        assert rt.progress(0.01) == 0
    finally:
        rt.close()
    assert rt.closed
    with pytest.raises(ClosedError):
        rt.progress()
    rt.close()  # idempotent


def test_runtime_has_no_dead_entry_points() -> None:
    assert not hasattr(Runtime, "flush_tx") and not hasattr(Runtime, "poll_rx")


# ---- the TCP runtime and event-driven connection setup --------------------------------------
def test_tcp_runtime_is_composed_not_a_roce_runtime() -> None:
    assert not issubclass(TcpRuntime, Runtime)
    ctx = v.Context(transport="iwarp")
    try:
        rt = ctx.runtime
        assert isinstance(rt, TcpRuntime) and rt.link is None
        assert rt.call(lambda: rt.lock.locked())
    finally:
        ctx.close()
    assert rt.closed


class _Ep:
    def __init__(self, ctx: v.Context) -> None:
        self.pd = v.PD(ctx)
        self.cq = v.CQ(ctx, 16)
        self.qp = v.QP(self.pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                             cap=v.QPCap(4, 4, 1, 1)))
        self.qp.to_init(v.QPAttr(qp_access_flags=ACC))


def _connect(progress: str, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Connect two QPs of two contexts, the server accepting 0.2 s late; returns the
    sleeps and ``select.select`` timeouts (polls) taken meanwhile."""
    ca, cb = v.Context(transport="iwarp", progress=progress), \
        v.Context(transport="iwarp", progress=progress)
    sleeps: list[float] = []
    real_sleep = time.sleep

    real_select = select.select

    def spy(s: float) -> None:
        sleeps.append(s)
        real_sleep(s)

    def spy_select(r: Any, w: Any, x: Any, timeout: float | None = None) -> Any:
        sleeps.append(-1.0 if timeout is None else timeout)
        return real_select(r, w, x, timeout)

    try:
        a, b = _Ep(ca), _Ep(cb)
        lst = iwconnect.listen(cb, 0)
        got: dict[str, Any] = {}
        late = threading.Event()

        def serve() -> None:
            try:
                late.wait(0.2)  # the client waits for the MPA Reply meanwhile
                got["b"] = lst.accept(b.qp, b"srv", timeout=20)
            except BaseException as exc:  # noqa: BLE001 - reported below
                got["err"] = exc

        monkeypatch.setattr(time, "sleep", spy)
        monkeypatch.setattr(select, "select", spy_select)
        t = threading.Thread(target=serve)
        t.start()
        conn = iwconnect.connect(a.qp, "127.0.0.1", lst.port, b"cli", timeout=20)
        t.join(20)
        monkeypatch.setattr(time, "sleep", real_sleep)
        monkeypatch.setattr(select, "select", real_select)
        lst.close()
        assert "err" not in got, got.get("err")
        assert conn.private_data == b"srv" and got["b"].private_data == b"cli"
        assert a.qp.qp_state == b.qp.qp_state == e.IBV_QPS_RTS
    finally:
        monkeypatch.setattr(time, "sleep", real_sleep)
        monkeypatch.setattr(select, "select", real_select)
        ca.close()
        cb.close()
    return sleeps


@pytest.mark.parametrize("progress", ["thread", "manual"])
def test_connection_setup_waits_on_events_not_sleeps(progress: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = _connect(progress, monkeypatch)
    assert [s for s in sleeps if s != 0] == []


def test_closing_a_listener_wakes_its_waiter_at_once() -> None:
    ctx = v.Context(transport="iwarp")
    try:
        lst = iwconnect.listen(ctx, 0)
        got: dict[str, BaseException] = {}

        def wait() -> None:
            try:
                lst.get_request(timeout=None)
            except BaseException as exc:  # noqa: BLE001 - checked below
                got["err"] = exc

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.1)
        t0 = time.monotonic()
        lst.close()
        t.join(5)
        assert not t.is_alive() and time.monotonic() - t0 < 0.5
        assert isinstance(got.get("err"), iwconnect.ConnectError)
    finally:
        ctx.close()


def _wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_listener_accepts_while_nobody_waits() -> None:
    """The runtime watches the listening socket: a connection is accepted (and starts
    MPA) by the progress thread before anyone calls get_request."""
    ctx = v.Context(transport="iwarp")
    try:
        lst = iwconnect.listen(ctx, 0)
        peer = socket.create_connection(("127.0.0.1", lst.port), timeout=5)
        try:
            rt = ctx.runtime
            assert isinstance(rt, TcpRuntime)
            assert _wait_for(lambda: rt.sockets() == 1)
        finally:
            peer.close()
            lst.close()
    finally:
        ctx.close()


def _left_unread_then_served(core: pg.ProgressCore, fd: int,
                             post_write: Callable[[int], None],
                             landed: Callable[[int], bool],
                             completed: Callable[[int], bool]) -> None:
    """A program polls its CQ (``try_lock``, as every busy poll does) but not for the
    peer's WRITE, which it awaits in memory (``ib_write_lat``): the progress thread stands
    back meanwhile and the WRITE waits in the socket ``fd``. Once the polls stop, the
    thread takes it when its stand-back runs out: the WRITE lands (``landed``) and the
    peer's WRITE completes. The second such WRITE makes the thread serve (``took``).
    SERVE_S is a minute here: a loaded machine may take more than the real second
    between the two WRITEs (the rule itself is checked on the clock above)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pg, "SERVE_S", 60.0)
        for i in range(2):
            _one_left_unread(core, fd, partial(post_write, i), partial(landed, i),
                             partial(completed, i))
            assert (core.serve_until > 0.0) == (i == 1) and core.serving() == (i == 1)


def _one_left_unread(core: pg.ProgressCore, fd: int, post_write: Callable[[], None],
                     landed: Callable[[], bool], completed: Callable[[], bool]) -> None:
    stop = threading.Event()
    standing = threading.Event()

    class _Spy(threading.Event):  # the thread waits here only while it stands back
        def wait(self, timeout: float | None = None) -> bool:
            standing.set()
            return super().wait(timeout)

    core.kicked = _Spy()

    def polls() -> None:  # CQ polls that take no input
        while not stop.is_set():
            if core.try_lock():
                core.lock.release()
            stop.wait(0.0005)

    poller = threading.Thread(target=polls)
    poller.start()
    try:
        assert _wait_for(standing.is_set, 10.0), "the progress thread never stood back"
        post_write()
        assert select.select([fd], [], [], 10.0)[0], "the WRITE never reached the socket"
        assert not landed() and core.serve_until == 0.0  # waiting unread
        stop.set()
        poller.join(10)
        assert _wait_for(landed, 10.0)
        assert _wait_for(completed, 10.0)
    finally:
        stop.set()
        poller.join(10)


def _write_done(cq: v.CQ) -> Callable[[int], bool]:
    """Whether WRITE ``i`` (wr_id ``i``) completed, successfully, on ``cq``."""
    got: list[Any] = []

    def completed(i: int) -> bool:
        got.extend(cq.poll(1)[1])
        if len(got) > i:
            assert got[i].wr_id == i and got[i].status == e.IBV_WC_SUCCESS
        return len(got) > i
    return completed


def _words(i: int) -> bytes:
    return b"written%d" % i


def test_a_write_left_unread_through_a_stand_back_is_taken_and_the_thread_serves() -> None:
    """RoCE: :func:`_left_unread_then_served` (the thread step reports what its receive
    took)."""
    from harness.verbs_pair import udp_rc_pair

    with udp_rc_pair("thread") as (a, b, la, _lb):

        def post_write(i: int) -> None:
            b.buf[:8] = _words(i)
            wr = v.SendWR(wr_id=i, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[b.sge(0, 8)],
                          send_flags=e.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(a.mr.rkey, a.mr.addr)
            b.qp.post_send(wr)

        fd = la.fileno()
        assert fd is not None
        roce: Any = a.ctx.runtime  # the RoCE Runtime
        _left_unread_then_served(roce.core, fd, post_write,
                                 lambda i: bytes(a.buf[:8]) == _words(i), _write_done(b.cq))


def test_an_iwarp_write_left_unread_through_a_stand_back_makes_the_thread_serve() -> None:
    """iWARP: :func:`_left_unread_then_served` (the thread step looks at its sockets
    without waiting after a stand-back ran out); C polls then sleep (``serving``)."""
    from harness.iwarp_tcp import Ep
    from harness.iwarp_tcp import connect as iw_connect

    ca, cb = v.Context(transport="iwarp"), v.Context(transport="iwarp")
    try:
        a, b = Ep(ca, 4096), Ep(cb, 4096)
        iw_connect(ca, cb, a, b)
        rt = ca.runtime
        assert isinstance(rt, TcpRuntime) and rt.sockets() == 1 and not rt.serving()
        fd = next(iter(rt._socks))  # a's connection

        def post_write(i: int) -> None:
            b.mr.buf[:8] = _words(i)
            b.send(int(e.IBV_WR_RDMA_WRITE), 8, i, remote=a)

        _left_unread_then_served(rt.core, fd, post_write,
                                 lambda i: bytes(a.mr.buf[:8]) == _words(i), _write_done(b.cq))
        assert rt.serving()
    finally:
        ca.close()
        cb.close()

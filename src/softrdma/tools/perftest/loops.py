"""perftest's measured loops (perftest_resources.c ``run_iter_*``) on an
:class:`~.engine.Resources` (every wait bounded by ``--timeout``; an error completion,
a wrong length or a latency counter that never arrives is a :class:`PerftestError`):

* :func:`run_bw` (``run_iter_bw``): up to ``-t`` WRs in flight per QP, one signaled
  every ``-Q``; the time of every post and of every covered completion;
* :func:`run_bw_server` (``run_iter_bw_server``, send-bw): ``-r`` receives per QP,
  re-posted while more messages are due;
* :func:`run_lat_write` (``run_iter_lat_write``): RDMA WRITE ping-pong, each side polls
  the last byte of its own slot for the peer's counter (the server writes first);
* :func:`run_lat_send` (``run_iter_lat_send``): SEND ping-pong, the client sends first;
* :func:`run_lat` (``run_iter_lat``): one READ or atomic at a time (client only).
* :func:`run_bi` (``-b``), :func:`run_bw_infinitely` / :func:`receive_infinitely`
  (``--run_infinitely``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from typing import Any

from ... import enums as e
from ... import verbs as v
from .engine import (
    DURATION_GRACE_S,
    UNRELIABLE_IDLE_S,
    Resources,
    wc_fail,
)
from .oob import ZERO_DEST, Dest
from .options import PerftestError
from .report import Progress

_SUCCESS = int(e.IBV_WC_SUCCESS)

__all__ = ["run_bw", "run_bi", "run_bw_server", "run_lat_write", "run_lat_send", "run_lat",
           "run_bw_infinitely", "receive_infinitely"]


# ---- BW ----------------------------------------------------------------------------------

def run_bw(res: Resources, rem: list[Dest], size: int, progress: Progress) -> tuple[
        list[float], list[float]]:
    """The client's BW loop; returns the post and completion times (seconds)."""
    o = res.o
    nq = o.num_qps
    iters = o.iters
    end = time.monotonic() + o.duration if o.duration else None
    sends = _Sends(res, rem, size)
    scnt, ccnt = sends.scnt, sends.ccnt
    deadline = time.monotonic() + o.timeout
    stop = False
    granted = 0
    while True:
        if end is not None and not stop and time.monotonic() >= end:
            stop = True
            deadline = min(deadline, time.monotonic() + DURATION_GRACE_S)
        for i in range(nq):
            target = scnt[i] if stop else (iters if end is None else scnt[i] + o.tx_depth)
            sends.post(i, target, end is not None)
        if all(c >= s for c, s in zip(ccnt, scnt, strict=True)) and (
                stop or (end is None and all(c >= iters for c in ccnt))):
            break
        try:
            if res.credits:  # credits arrive by RDMA WRITE, without a completion here
                wcs = list(res.send_cq.poll(16)[1])
                if not wcs:
                    if time.monotonic() >= deadline:
                        raise PerftestError(f"no completion and no credit for {o.timeout:g} s "
                                            f"({sum(ccnt)} completed): is the peer still "
                                            "running?")
                    grant = sum(res.credit(i) for i in range(nq))
                    if grant != granted:
                        granted = grant
                        deadline = time.monotonic() + o.timeout
                    time.sleep(0)
                    continue
            else:
                wcs = res.poll(res.send_cq, deadline, f"sending ({sum(ccnt)}/"
                               f"{iters * nq if end is None else sum(scnt)} completed)")
        except PerftestError:
            if stop:
                break  # duration mode: the tail that did not complete is not counted
            raise
        sends.complete(wcs)
        deadline = time.monotonic() + o.timeout if not stop else deadline
        progress.update(sum(ccnt))
    return sends.times()


class _Sends:
    """The send side of a BW loop (:func:`run_bw`, :func:`run_bi`): per QP the sends
    posted (``scnt``) and completed (``ccnt``), the counts of its signalled sends awaiting
    their completion (``-Q``: one signalled send in ``cq_mod``), and the post and
    completion times."""

    def __init__(self, res: Resources, rem: list[Dest], size: int) -> None:
        nq = res.o.num_qps
        self.res = res
        self.wrs = [res.send_wr(i, rem[i], size) for i in range(nq)]
        self.scnt = [0] * nq
        self.ccnt = [0] * nq
        self.pending: list[collections.deque[int]] = [collections.deque() for _ in range(nq)]
        self.tposted: list[float] = []
        self.tcompleted: list[float] = []

    def post(self, i: int, target: int, signal_all: bool) -> None:
        """Post on QP ``i`` up to ``target`` sends in all, within the send queue depth
        (and, over iWARP, the receives the peer granted); every send is signalled with
        ``signal_all``, else one in ``cq_mod`` and the last."""
        res = self.res
        o = res.o
        scnt, ccnt, wr = self.scnt, self.ccnt, self.wrs[i]
        while scnt[i] < target and scnt[i] - ccnt[i] < o.tx_depth:
            if res.credits and scnt[i] + 1 - res.credit(i) >= o.rx_depth:
                break  # the receiver has no receive posted for more
            scnt[i] += 1
            sig = scnt[i] % o.cq_mod == 0 or scnt[i] == o.iters or signal_all
            self.tposted.append(time.perf_counter())
            res.post(i, wr, sig)
            if sig:
                self.pending[i].append(scnt[i])

    def complete(self, wcs: Iterable[v.WC]) -> None:
        """Count the send completions ``wcs`` (polled now): a signalled completion of QP i
        completes its sends up to the count recorded in ``pending[i]`` when it was
        posted; an error completion ends the run."""
        now = time.perf_counter()
        scnt, ccnt = self.scnt, self.ccnt
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                raise wc_fail(wc, f"scnt={sum(scnt)}, ccnt={sum(ccnt)}")
            i = int(wc.wr_id)
            upto = self.pending[i].popleft()
            self.tcompleted.extend([now] * (upto - ccnt[i]))
            ccnt[i] = upto

    def times(self) -> tuple[list[float], list[float]]:
        """The post and completion times of the sends that completed."""
        return self.tposted[:len(self.tcompleted)], self.tcompleted


def _received(res: Resources, wc: Any, size: int, rcnt: list[int]) -> int:
    """A receive completion checked (status, length) and counted in ``rcnt``; returns
    its QP's index."""
    if wc.status != e.IBV_WC_SUCCESS:
        raise wc_fail(wc, f"rcnt={sum(rcnt)}")
    if int(wc.byte_len) != res.recv_len(size):
        raise PerftestError(f"data mismatch: received {int(wc.byte_len)} bytes, "
                            f"expected {res.recv_len(size)}")
    i = int(wc.wr_id)
    rcnt[i] += 1
    return i


def run_bi(res: Resources, rem: list[Dest], size: int, progress: Progress) -> tuple[
        list[float], list[float]]:
    """``run_iter_bi`` (send-bw ``-b``): send ``iters`` messages per QP as :func:`run_bw`
    does while receiving the peer's as many, re-posting receives; neither CQ is waited
    on alone (each side's sends need the other's receives). Returns the send side's post
    and completion times. A UC/UD side stops waiting for lost messages once its sends
    are done, nothing arrived for a while and the peer is done too."""
    o = res.o
    nq = o.num_qps
    iters = o.iters
    sends = _Sends(res, rem, size)
    ccnt = sends.ccnt
    rcnt = [0] * nq
    deadline = time.monotonic() + o.timeout
    idle_since = time.monotonic()
    while any(c < iters for c in ccnt) or any(r < iters for r in rcnt):
        for i in range(nq):
            sends.post(i, iters, False)
        wcs = list(res.send_cq.poll(16)[1])
        rwcs = list(res.recv_cq.poll(16)[1])
        sends.complete(wcs)
        for wc in rwcs:
            i = _received(res, wc, size, rcnt)
            if rcnt[i] + o.rx_depth <= iters:
                res.post_recvs(i, 1, size)
        mono = time.monotonic()
        if wcs or rwcs:
            deadline = mono + o.timeout
            idle_since = mono
        else:
            if (not res.reliable and all(c >= iters for c in ccnt)
                    and mono - idle_since >= UNRELIABLE_IDLE_S
                    and res.peer_done is not None and res.peer_done()):
                break  # the peer is done: the messages still missing were lost
            if res.expired(deadline, mono):
                raise PerftestError(f"no completion for {o.timeout:g} s ({sum(ccnt)} sent, "
                                    f"{sum(rcnt)} received): is the peer still running?")
            res.check_peer(mono)
            time.sleep(0)
        progress.update(sum(ccnt))
    return sends.times()


def run_bw_server(res: Resources, rem: list[Dest], size: int, progress: Progress
                  ) -> tuple[list[float], list[float]]:
    """The send-bw server: receive ``iters`` messages per QP (or for ``-D`` seconds),
    granting credits over iWARP (see :data:`CREDIT`)."""
    o = res.o
    credit_cnt = max(o.rx_depth // 3, 1)
    writes = 0
    nq = o.num_qps
    iters = o.iters
    rcnt = [0] * nq
    tcompleted: list[float] = []
    clock = time.perf_counter
    first = 0.0
    end: float | None = None
    deadline = time.monotonic() + o.timeout
    while any(r < iters for r in rcnt) if o.duration is None else (
            end is None or time.monotonic() < end):
        wait_until = deadline if end is None else min(deadline, end)
        if not res.reliable:  # UC/UD: look now and then whether the sender is done
            wait_until = min(wait_until, time.monotonic() + UNRELIABLE_IDLE_S)
        try:
            wcs = res.poll(res.recv_cq, wait_until,
                           f"receiving ({sum(rcnt)}/{iters * nq} received)")
        except PerftestError:
            if end is not None:
                break
            if not res.reliable and res.peer_done is not None and res.peer_done():
                break  # the sender is done: the messages still missing were lost
            if not res.reliable and time.monotonic() < deadline:
                continue
            raise
        now = clock()
        for wc in wcs:
            i = _received(res, wc, size, rcnt)
            if not tcompleted:
                first = now
                if o.duration:
                    end = time.monotonic() + o.duration
            tcompleted.append(now)
            if o.duration or rcnt[i] + o.rx_depth <= iters:
                res.post_recvs(i, 1, size)
            if res.credits and (rcnt[i] % o.rx_depth) % credit_cnt == 0:
                while writes >= o.tx_depth:
                    writes -= _reap(res, res.poll(res.send_cq, time.monotonic() + o.timeout,
                                                  "granting credits"))
                res.post_credit(i, rem[i], rcnt[i])
                writes += 1
        if writes:
            writes -= _reap(res, list(res.send_cq.poll(16)[1]))
        deadline = time.monotonic() + o.timeout
        progress.update(sum(rcnt))
    while writes > 0:
        writes -= _reap(res, res.poll(res.send_cq, time.monotonic() + o.timeout,
                                      "granting credits"))
    return [first] * len(tcompleted), tcompleted


def _reap(res: Resources, wcs: list[Any]) -> int:
    for wc in wcs:
        if wc.status != e.IBV_WC_SUCCESS:
            raise wc_fail(wc, "a credit RDMA WRITE")
    return len(wcs)


# ---- latency -----------------------------------------------------------------------------

def run_lat_write(res: Resources, rem: Dest, size: int, progress: Progress) -> list[float]:
    """RDMA WRITE ping-pong on QP 0; returns the post times."""
    o = res.o
    wr = res.send_wr(0, rem, size)
    post_off = res.base + size - 1
    poll_off = res.base + o.num_qps * res.buff + size - 1
    buf = res.buf
    iters = o.iters
    server = not o.is_client
    tposted: list[float] = []
    clock = time.perf_counter
    scnt = rcnt = ccnt = 0
    recv_poll, send_poll = res.recv_cq.poll, res.send_cq.poll
    monotonic = time.monotonic
    post = res.post
    while scnt < iters or ccnt < iters or rcnt < iters:
        if rcnt < iters and not (scnt < 1 and server):
            rcnt += 1
            want = rcnt & 0xFF
            deadline = 0.0  # set at the first look that finds the byte not yet written
            while buf[poll_off] != want:
                now = monotonic()
                if not deadline:
                    deadline = now + o.timeout
                elif now >= deadline:
                    raise PerftestError(f"the peer's write #{rcnt} never arrived "
                                        f"(after {o.timeout:g} s)")
                res.check_peer(now)
                # busy-polling a CQ (empty here) drives the receive path in this thread,
                # which places the peer's WRITE (softrdma.drivers.runtime.roce)
                recv_poll(1)
        if scnt < iters:
            tposted.append(clock())
            scnt += 1
            buf[post_off] = scnt & 0xFF
            post(0, wr, True)
        if ccnt < iters:
            got, wcs = send_poll(1)
            if not got:
                wcs = res.poll(res.send_cq, None, "writing", 1)
            for wc in wcs:
                if wc.status != _SUCCESS:
                    raise wc_fail(wc, f"scnt={scnt}, ccnt={ccnt}")
                ccnt += 1
        progress.update(scnt)
    return tposted


#: receives a SEND latency loop owes at most before it posts them in one call
RECV_BATCH = 16


def run_lat_send(res: Resources, size: int, progress: Progress,
                 rem: Dest = ZERO_DEST) -> list[float]:
    """SEND ping-pong on QP 0 (client first); returns the post times.

    perftest posts a receive after each message received while more are due (``rcnt +
    rx_depth <= iters``: the same total here). They are posted in batches of up to
    :data:`RECV_BATCH`, right after the next SEND, while its answer is on the way (not
    before it, on the round trip), so the queue keeps at least ``rx_depth`` minus a
    batch; the last ones as soon as they are due; a queue of one is refilled before the
    SEND, as perftest does."""
    o = res.o
    iters = o.iters
    rx_depth = o.rx_depth
    client = o.is_client
    tposted: list[float] = []
    clock = time.perf_counter
    scnt = rcnt = 0
    unsignaled = 0
    owed = 0  # receives due and not posted yet
    batch = max(1, min(RECV_BATCH, rx_depth - 1))
    wr = res.send_wr(0, rem, size)  # (UD: the peer's QPN goes in every SEND)
    recv_poll, send_poll = res.recv_cq.poll, res.send_cq.poll
    want_len = res.recv_len(size)
    post = res.post

    def waiting() -> str:
        return f"waiting for message {rcnt + 1}/{iters}"

    while scnt < iters or rcnt < iters:
        if rcnt < iters and not (scnt < 1 and client):
            got, wcs = recv_poll(1)
            if not got:
                wcs = res.poll(res.recv_cq, None, waiting, 1)
            for wc in wcs:
                if wc.status != _SUCCESS:
                    raise wc_fail(wc, f"rcnt={rcnt}")
                if wc.byte_len != want_len:
                    raise PerftestError(f"data mismatch: received {int(wc.byte_len)} "
                                        f"bytes, expected {want_len}")
                rcnt += 1
                if rcnt + rx_depth <= iters:
                    owed += 1
            if owed >= rx_depth:  # the queue is empty: refill it before the SEND
                res.post_recvs(0, owed, size)
                owed = 0
        if scnt < iters:
            tposted.append(clock())
            scnt += 1
            unsignaled += 1
            sig = scnt % o.cq_mod == 0 or scnt == iters or unsignaled >= o.tx_depth
            post(0, wr, sig)
            if owed and (owed >= batch or rcnt + rx_depth >= iters or scnt == iters):
                res.post_recvs(0, owed, size)
                owed = 0
            if sig:
                unsignaled = 0
                got, wcs = send_poll(1)
                if not got:
                    wcs = res.poll(res.send_cq, None, "sending", 1)
                for wc in wcs:
                    if wc.status != _SUCCESS:
                        raise wc_fail(wc, f"scnt={scnt}")
        elif owed:
            res.post_recvs(0, owed, size)
            owed = 0
        progress.update(scnt)
    return tposted


def run_lat(res: Resources, rem: Dest, size: int, progress: Progress) -> list[float]:
    """One READ or atomic at a time on QP 0; returns the post times (plus the last
    completion, so every operation has a gap)."""
    o = res.o
    wr = res.send_wr(0, rem, size)
    tposted: list[float] = []
    clock = time.perf_counter
    send_poll = res.send_cq.poll
    post = res.post
    n = 0

    def waiting() -> str:
        return f"waiting for completion {n + 1}/{o.iters}"

    for n in range(o.iters):
        tposted.append(clock())
        post(0, wr, True)
        got, wcs = send_poll(1)
        if not got:
            wcs = res.poll(res.send_cq, None, waiting, 1)
        for wc in wcs:
            if wc.status != _SUCCESS:
                raise wc_fail(wc, f"scnt={n + 1}")
        progress.update(n + 1)
    return tposted


# ---- --run_infinitely -------------------------------------------------------------------

def run_bw_infinitely(res: Resources, rem: list[Dest], size: int, every: float,
                      on_period: Callable[[int, float], None]) -> None:
    """``run_iter_bw_infinitely``: post for ever (up to ``-t`` in flight per QP, one
    signaled every ``-Q``) and call ``on_period(messages completed, seconds)`` every
    ``every`` seconds; ends only by an error or KeyboardInterrupt (Ctrl-C)."""
    o = res.o
    nq = o.num_qps
    wrs = [res.send_wr(i, rem[i], size) for i in range(nq)]
    scnt = [0] * nq
    ccnt = [0] * nq
    pending: list[collections.deque[int]] = [collections.deque() for _ in range(nq)]
    clock = time.perf_counter
    start = clock()
    shown = 0
    deadline = time.monotonic() + o.timeout
    while True:
        for i in range(nq):
            while scnt[i] - ccnt[i] < o.tx_depth:
                if res.credits and scnt[i] + 1 - res.credit(i) >= o.rx_depth:
                    break
                scnt[i] += 1
                sig = scnt[i] % o.cq_mod == 0
                res.post(i, wrs[i], sig)
                if sig:
                    pending[i].append(scnt[i])
        wcs = list(res.send_cq.poll(16)[1])
        now_m = time.monotonic()
        if wcs:
            deadline = now_m + o.timeout
        elif res.expired(deadline, now_m):
            raise PerftestError(f"no completion for {o.timeout:g} s ({sum(ccnt)} completed): "
                                "is the peer still running?")
        else:
            res.check_peer(now_m)
            time.sleep(0)
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                raise wc_fail(wc, f"scnt={sum(scnt)}, ccnt={sum(ccnt)}")
            i = int(wc.wr_id)
            ccnt[i] = pending[i].popleft()
        now = clock()
        if now - start >= every:
            done = sum(ccnt)
            on_period(done - shown, now - start)
            shown = done
            start = now


def receive_infinitely(res: Resources, size: int, every: float,
                       on_period: Callable[[int, float], None]) -> None:
    """``run_iter_bw_infinitely_server`` (send-bw): receive for ever, re-posting each
    receive, and report every ``every`` seconds; ends when the sender leaves."""
    o = res.o
    clock = time.perf_counter
    start = clock()
    count = 0
    while True:
        try:
            wcs = res.poll(res.recv_cq, time.monotonic() + every, "receiving")
        except PerftestError:
            if res.peer_gone is not None and res.peer_gone():
                return
            wcs = []
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                raise wc_fail(wc, f"rcnt={count}")
            count += 1
            res.post_recvs(int(wc.wr_id), 1, size)
        now = clock()
        if now - start >= every:
            on_period(count, now - start)
            count = 0
            start = now
        if o.timeout and res.peer_gone is not None and not wcs and res.peer_gone():
            return

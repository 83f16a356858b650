"""The work queues both transports' QPs share: the receive queue (a QP's own or an SRQ),
the checks of posting, and the flush to ERR (IBA 10.8 work queues; IBA 10.3.1.7 and
11.4.1.1: in ERR every outstanding and newly posted WR completes with
IBV_WC_WR_FLUSH_ERR).

An IB :class:`~softrdma.ib.qp.EngineQP` and an iWARP :class:`~softrdma.iwarp.qp.IwarpQP`
each own a :class:`ReceiveQueue` and call :func:`check_post_send`; their send queues stay
their own (the IB requester's go-back-N queue, RDMAP's ordered queue, RFC 5040 §5.5).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from ..enums import ibv_wc_opcode as _WCO
from ..enums import ibv_wc_status as _WCS
from ..errors import ClosedError, ResourceError, StateError
from .events import AsyncEventType, EventQueue
from .states import ERR, INIT, RESET, RTR, state_name
from .types import SGE, CompletionSink, RecvWQE, SendWQE, WorkCompletion

__all__ = ["EngineSRQ", "QPInit", "ReceiveQueue", "RecvFeed", "check_post_send", "error_events",
           "take_done", "FLUSH_ERR", "WC_RECV"]

FLUSH_ERR = int(_WCS.IBV_WC_WR_FLUSH_ERR)
WC_RECV = int(_WCO.IBV_WC_RECV)
_NOT_YET = (RESET, INIT, RTR)


class _Fed(Protocol):
    """A queue of receive WQEs ``q`` that may have a :class:`RecvFeed`: ``fed`` while the
    feed is open (it may hold receives, posted after every WQE in ``q``)."""

    q: deque[RecvWQE]
    feed: RecvFeed | None
    fed: bool


def _set_feed(owner: _Fed, feed: RecvFeed | None) -> None:
    """Attach ``feed`` to ``owner`` (closed until a post succeeds), or detach the feed: its
    stored receives are taken into the queue first."""
    if owner.feed is not None:
        _pull(owner, 0, close=True)
    owner.feed = feed
    owner.fed = False


def _pull(owner: _Fed, most: int, close: bool = False) -> None:
    """Take up to ``most`` (0: all) of ``owner``'s fed receives into its queue, oldest
    first (``close``: the feed stores no more until it is opened again)."""
    feed = owner.feed
    if owner.fed and feed is not None:
        if close:
            owner.fed = False
        q = owner.q
        for wr_id, addr, length, lkey in feed.drain(len(q), most, close):
            q.append(RecvWQE(wr_id, [SGE(addr, length, lkey)]))


@dataclass(eq=False, repr=False)
class EngineSRQ:
    """A shared receive queue (IBA 10.2.9): receive WQEs taken by any QP attached to it.

    ``events`` is the device's event queue (SRQ_LIMIT_REACHED goes there). ``feed``
    (:class:`RecvFeed`, none by default) holds receives posted after the queue's WQEs,
    as a QP's :class:`ReceiveQueue` does: taken when the queue runs empty, and all of them
    before a post, a resize or :meth:`level`. The feed stays closed while a limit is
    armed, so that :meth:`take` sees the exact level when it checks the limit, and while
    ``max_wr`` is below ``feed_cap``, the capacity the feed checks against."""

    events: EventQueue
    pd: object
    max_wr: int
    max_sge: int
    srq_limit: int = 0
    q: deque[RecvWQE] = field(default_factory=deque, init=False)
    closed: bool = field(default=False, init=False)
    error: bool = field(default=False, init=False)
    feed: RecvFeed | None = field(default=None, init=False)
    fed: bool = field(default=False, init=False)  # the feed is open (may hold receives)
    feed_cap: int = field(default=0, init=False)

    def __len__(self) -> int:
        return len(self.q)

    def level(self) -> int:
        """The WQEs queued, the feed's included (they are taken into the queue)."""
        self._pull(0)
        return len(self.q)

    def set_feed(self, feed: RecvFeed | None, cap: int = 0) -> None:
        """Attach ``feed``, which stores receives while they and the queue's length stay
        below ``cap`` (closed until a post succeeds), or detach the feed: its stored
        receives are taken into the queue first."""
        _set_feed(self, feed)
        self.feed_cap = cap

    def _pull(self, most: int, close: bool = False) -> None:
        _pull(self, most, close)

    def _reopen(self) -> None:
        """After a post: the feed stores receives again, unless a limit is armed or the
        queue is smaller than the capacity the feed checks against."""
        feed = self.feed
        if feed is not None and not self.srq_limit and self.max_wr >= self.feed_cap:
            feed.reopen(len(self.q))
            self.fed = True

    def post_recv(self, rwqe: RecvWQE) -> None:
        if self.closed:
            raise ClosedError("SRQ is destroyed")
        if self.fed:
            self._pull(0)  # the fed receives were posted first
        if len(self.q) >= self.max_wr:
            raise ResourceError(f"SRQ full ({self.max_wr} WQEs)")
        self.q.append(rwqe)
        if self.feed is not None:
            self._reopen()

    def post_recvs(self, rwqes: list[RecvWQE]) -> None:
        """:meth:`post_recv` of each, in order (the ones before a refused one stay);
        appended at once when all fit, no fed receives come first and :meth:`post_recv` is
        this class's own (a subclass's may do more per WQE)."""
        if (self.closed or self.fed or len(self.q) + len(rwqes) > self.max_wr or not rwqes
                or type(self).post_recv is not EngineSRQ.post_recv):
            for rwqe in rwqes:
                self.post_recv(rwqe)
            return
        self.q.extend(rwqes)
        if self.feed is not None:
            self._reopen()

    def modify(self, max_wr: int | None = None, srq_limit: int | None = None) -> None:
        """Resize and/or arm the limit (the feed's receives are taken in first, and the
        feed closes; a post opens it again when it may)."""
        self._pull(0, close=True)
        if max_wr is not None:
            self.max_wr = max_wr
        if srq_limit is not None:
            self.srq_limit = srq_limit

    def take(self) -> RecvWQE | None:
        """Next receive WQE; fires SRQ_LIMIT_REACHED once when the level drops below the limit."""
        q = self.q
        if not q:
            if not self.fed:
                return None
            self._pull(FEED_BATCH)
            if not q:
                return None
        rwqe = q.popleft()
        if self.srq_limit and len(q) < self.srq_limit:
            self.srq_limit = 0  # IBA 10.2.9.6: the limit is disarmed when it fires
            self.events.raise_event(AsyncEventType.SRQ_LIMIT_REACHED, self)
        return rwqe

    def push_front(self, rwqe: RecvWQE) -> None:
        self.q.appendleft(rwqe)


@dataclass(frozen=True, slots=True)
class QPInit:
    """The creation attributes of a QP (IBA 11.2.4.1 Create QP; ``ibv_qp_init_attr``, the
    capacities already checked against the device limits by the verbs layer): its type,
    protection domain, the CQs' completion sinks, its SRQ, the queue capacities and
    whether every send WR is signaled."""

    qp_type: int
    pd: object
    send_cq: CompletionSink
    recv_cq: CompletionSink
    srq: EngineSRQ | None
    max_send_wr: int
    max_recv_wr: int
    max_send_sge: int
    max_recv_sge: int
    max_inline_data: int
    sq_sig_all: bool

    @property
    def cap(self) -> tuple[int, int, int, int, int]:
        """``ibv_qp_cap`` as ``(max_send_wr, max_recv_wr, max_send_sge, max_recv_sge,
        max_inline_data)``."""
        return (self.max_send_wr, self.max_recv_wr, self.max_send_sge, self.max_recv_sge,
                self.max_inline_data)


class RecvFeed(Protocol):
    """Receives posted where the engine does not run, as a NIC's receive ring: a C
    program's ``ibv_post_recv`` stores one-SGE receives in C memory without entering
    Python (softrdma.capi), and the :class:`ReceiveQueue` takes them when it needs them.
    Entries are ``(wr_id, addr, length, lkey)``, oldest first, all posted after every WQE
    already in the queue.

    The producer stores a receive only while the feed is *open* and its entries plus
    the queue's length (as last told, an upper bound: the queue only shrinks between)
    stay below the queue's capacity; otherwise it posts through
    :meth:`ReceiveQueue.post`, which gives the exact answer (IBA 11.4.1.2)."""

    def drain(self, qlen: int, most: int, close: bool) -> list[tuple[int, int, int, int]]:
        """Up to ``most`` stored receives (0: all), oldest first; the queue holds ``qlen``
        WQEs before they are added. ``close``: store no more (posts come through
        :meth:`ReceiveQueue.post` until :meth:`reopen`)."""
        ...

    def reopen(self, qlen: int) -> None:
        """Store receives again; the queue holds ``qlen`` WQEs."""
        ...


#: how many fed receives a WQE taken from an empty queue brings in at once
FEED_BATCH = 32


class ReceiveQueue:
    """A QP's receive side: its own queue of ``max_wr`` WQEs, or the SRQ it is attached
    to (IBA 10.2.9: then receives are posted to the SRQ, not to the QP).

    ``feed`` (:class:`RecvFeed`, none by default) holds receives posted after the
    queue's WQEs: the queue takes them when it runs empty, and all of them before a
    post (posting order), a flush or a reset."""

    __slots__ = ("q", "srq", "max_wr", "cq", "qpn", "feed", "fed")

    def __init__(self, qpn: int, init: QPInit) -> None:
        self.q: deque[RecvWQE] = deque()
        self.srq = init.srq
        self.max_wr = init.max_recv_wr
        self.cq = init.recv_cq
        self.qpn = qpn
        self.feed: RecvFeed | None = None
        self.fed = False  # the feed is open (may hold receives)

    def __len__(self) -> int:
        return len(self.q)

    def set_feed(self, feed: RecvFeed | None) -> None:
        """Attach ``feed`` (closed until a post succeeds), or detach the feed: its
        stored receives are taken into the queue first."""
        _set_feed(self, feed)

    def _pull(self, most: int, close: bool = False) -> None:
        _pull(self, most, close)

    def take(self) -> RecvWQE | None:
        """The next receive WQE (from the SRQ if the QP has one), or None."""
        srq = self.srq
        if srq is not None:
            return srq.take()
        q = self.q
        if not q and self.fed:
            self._pull(FEED_BATCH)
        return q.popleft() if q else None

    def give_back(self, rwqe: RecvWQE) -> None:
        """Put back a WQE taken for a message that was not delivered (RNR, dropped)."""
        if self.srq is not None:
            self.srq.push_front(rwqe)
        else:
            self.q.appendleft(rwqe)

    def flush_wc(self, rwqe: RecvWQE) -> WorkCompletion:
        """The completion of a receive WQE flushed by ERR (IBA 10.3.1.7)."""
        return WorkCompletion(rwqe.wr_id, FLUSH_ERR, WC_RECV, self.qpn)

    def post(self, rwqe: RecvWQE, state: int, destroyed: bool) -> None:
        """``ibv_post_recv`` on the QP (IBA 11.4.1.2): refused when destroyed, attached to
        an SRQ, in RESET or full; completed at once with a flush error in ERR."""
        if destroyed:
            raise ClosedError("QP is destroyed")
        if self.srq is not None:
            raise StateError("the QP is attached to an SRQ: post receives to the SRQ")
        if state == RESET:
            raise StateError("post_recv in state RESET")
        if self.fed:
            self._pull(0)  # the fed receives were posted first
        if len(self.q) >= self.max_wr:
            raise ResourceError(f"receive queue full ({self.max_wr} WQEs)")
        if state == ERR:
            self.cq(self.flush_wc(rwqe))
            return
        self.q.append(rwqe)
        feed = self.feed
        if feed is not None:
            feed.reopen(len(self.q))
            self.fed = True

    def post_many(self, rwqes: list[RecvWQE], state: int, destroyed: bool) -> None:
        """:meth:`post` of each, in order: the ones before a refused one stay posted.
        When :meth:`post` would take every one (a QP of its own queue, neither RESET nor
        ERR, no fed receives to take first, room for all), they are appended at once."""
        q = self.q
        if (destroyed or self.srq is not None or state == RESET or state == ERR or self.fed
                or len(q) + len(rwqes) > self.max_wr or not rwqes):
            post = self.post
            for rwqe in rwqes:
                post(rwqe, state, destroyed)
            return
        q.extend(rwqes)
        feed = self.feed
        if feed is not None:
            feed.reopen(len(q))
            self.fed = True

    def flush(self) -> None:
        """Complete every queued WQE with IBV_WC_WR_FLUSH_ERR, oldest first (an SRQ's
        WQEs stay for the other QPs attached to it); the feed closes, so later posts
        are flushed as they come (IBA 10.3.1.7)."""
        self._pull(0, close=True)
        q = self.q
        push = self.cq
        while q:
            push(self.flush_wc(q.popleft()))

    def clear(self) -> None:
        """To RESET: the queue is emptied without completions (IBA 10.3.1), the feed's
        receives with it, and the feed closes (a post in RESET is refused)."""
        self._pull(0, close=True)
        self.q.clear()


def check_post_send(state: int, destroyed: bool, depth: int, max_wr: int, needs: str) -> None:
    """The checks of ``ibv_post_send`` both transports make (IBA 11.4.1.1): not
    destroyed, past RTR (``needs`` says what the QP lacks), room in the send queue."""
    if destroyed:
        raise ClosedError("QP is destroyed")
    if state in _NOT_YET:
        raise StateError(f"post_send in state {state_name(state)}: {needs}")
    if depth >= max_wr:
        raise ResourceError(f"send queue full ({max_wr} WQEs)")


def take_done(queue: deque[SendWQE], done: int) -> Iterator[SendWQE]:
    """Pop the finished WQEs (``state == done``) at the head of a send queue, oldest
    first: send completions are reported in posting order (IBA 10.8.3.1 for an RC send
    queue; RFC 5040 §5.5 rule 15), so one that is done waits for those before it."""
    while queue and queue[0].state == done:
        yield queue.popleft()


def error_events(events: EventQueue, qp: object, srq: EngineSRQ | None,
                 event: AsyncEventType | None) -> None:
    """The events of a QP that just entered ERR: QP_LAST_WQE_REACHED when it is on an
    SRQ (IBA 10.3.1.7, 11.6.3.1), then the event that caused the error, if any."""
    if srq is not None:
        events.raise_event(AsyncEventType.QP_LAST_WQE_REACHED, qp)
    if event is not None:
        events.raise_event(event, qp)

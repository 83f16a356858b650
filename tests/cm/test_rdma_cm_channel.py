"""The rdma_cm event channel (librdmacm ``rdma_event_channel``) over its driver queue
(:mod:`softrdma.drivers.cm.cm_channel`): the descriptor counts the pending events, events
leave with their id (``rdma_destroy_id``, ``rdma_migrate_id``) in order, and a destroyed
channel answers every wait with :class:`ClosedError` (issue 23 moved the waits out of
``cm``)."""

from __future__ import annotations

import asyncio
import select
import threading

import pytest

from softrdma.cm.rdma_events import EventChannel, RdmaCmEvent, RdmaCmEventType
from softrdma.errors import ClosedError

T = RdmaCmEventType
DEADLINE = 30.0  # generous: the machine is shared


def _readable(ch: EventChannel[object], timeout: float = 0.0) -> bool:
    return bool(select.select([ch.fileno()], [], [], timeout)[0])


def test_descriptor_follows_the_events_taken_and_dropped() -> None:
    ch: EventChannel[object] = EventChannel()
    a, b, lst = object(), object(), object()
    try:
        assert not _readable(ch)
        ch.post(RdmaCmEvent(T.ADDR_RESOLVED, a))
        ch.post(RdmaCmEvent(T.CONNECT_REQUEST, b, lst))
        ch.post(RdmaCmEvent(T.ROUTE_RESOLVED, a))
        ch.post(RdmaCmEvent(T.ESTABLISHED, lst))
        assert ch.pending() == 4 and _readable(ch)
        # rdma_destroy_id(lst): its own event and its child's request go, the child is named
        assert ch.drop_for(lst) == [b]
        assert ch.pending() == 2 and _readable(ch)
        moved = ch.take_events_of(a)  # rdma_migrate_id(a)
        assert [ev.event for ev in moved] == [T.ADDR_RESOLVED, T.ROUTE_RESOLVED]
        assert ch.pending() == 0 and not _readable(ch)
        ch.post(RdmaCmEvent(T.DISCONNECTED, a))
        ev = ch.get_cm_event(timeout=DEADLINE)
        assert ev.event is T.DISCONNECTED and ch.unacked == 1
        ch.ack(ev)
        assert ch.unacked == 0 and not _readable(ch)
        with pytest.raises(TimeoutError):
            ch.get_cm_event(timeout=0.01)
    finally:
        ch.close()


def test_a_destroyed_channel_answers_every_wait_with_closed_error() -> None:
    ch: EventChannel[object] = EventChannel()
    got: list[BaseException] = []

    def waiter() -> None:
        try:
            ch.get_cm_event()
        except BaseException as exc:  # noqa: BLE001 - recorded for the assert
            got.append(exc)

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    ch.close()  # wakes the waiter (blocked by now, or about to be)
    ch.post(RdmaCmEvent(T.ADDR_RESOLVED, object()))  # dropped, no error
    t.join(DEADLINE)
    assert not t.is_alive()
    assert len(got) == 1 and isinstance(got[0], ClosedError), got
    with pytest.raises(ClosedError):
        ch.get_cm_event(timeout=1)
    with pytest.raises(ClosedError):  # was a ValueError from select() on descriptor -1
        ch.poll(0.01)
    assert ch.pending() == 0
    ch.close()  # twice: nothing


def test_poll_and_asyncio_see_an_event_posted_from_another_thread() -> None:
    ch: EventChannel[object] = EventChannel()
    cid = object()
    try:
        assert not ch.poll(0)
        threading.Timer(0.01, ch.post, (RdmaCmEvent(T.ESTABLISHED, cid),)).start()
        assert ch.poll(DEADLINE)

        async def main() -> RdmaCmEvent[object]:
            threading.Timer(0.01, ch.post, (RdmaCmEvent(T.DISCONNECTED, cid),)).start()
            first = await asyncio.wait_for(ch.next_event(), DEADLINE)
            assert first.event is T.ESTABLISHED
            return await asyncio.wait_for(ch.next_event(), DEADLINE)

        assert asyncio.run(main()).event is T.DISCONNECTED
        assert ch.unacked == 2 and not _readable(ch)
    finally:
        ch.close()


def test_the_descriptor_is_made_when_asked_for_and_counts_what_is_queued() -> None:
    """Issue 26: every event wrote a byte to the channel's descriptor and every take read
    it (two system calls per event) though an application that only calls
    get_cm_event never looks at it; the descriptor is now made on first use, holding one
    byte per event queued by then."""
    ch: EventChannel[object] = EventChannel()
    a = object()
    try:
        for _ in range(3):
            ch.post(RdmaCmEvent(T.ADDR_RESOLVED, a))
        assert ch._queue._bell is None  # nothing written for these
        ch.ack(ch.get_cm_event(timeout=DEADLINE))
        fd = ch.fileno()  # made now: two events are pending
        assert _readable(ch)
        ch.ack(ch.get_cm_event(timeout=DEADLINE))
        assert _readable(ch)
        ch.ack(ch.get_cm_event(timeout=DEADLINE))
        assert not _readable(ch) and ch.fileno() == fd
        ch.post(RdmaCmEvent(T.ROUTE_RESOLVED, a))
        assert _readable(ch) and ch.poll(0)
    finally:
        ch.close()

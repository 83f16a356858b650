"""softrdma.capi's ``ibv_get_async_event`` (``bridge._get_async_event``): an event about a
QP, CQ or SRQ the program destroyed after the event was posted is dropped, as the kernel
drops a destroyed object's events; a port event carries its port number.

Before, such an event came out with the QP's event type and ``element.port_num`` 1, and
UCX's async thread read ``element.qp->qp_num`` at address 0x35 (a segfault seen in
``test_ucx_perftest_rc_verbs``). The C half (``ibv_destroy_*`` waiting for the acks of
events reported) is checked by ``tests/capi/verbs_check.c``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cffi
import pytest

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.capi import bridge
from softrdma.capi import handles as hd
from softrdma.drivers.links.udp import UdpLink


@pytest.fixture()
def ctx_handle() -> Iterator[tuple[v.Context, int]]:
    ctx = v.Context(link=UdpLink("127.0.0.1", 0))
    h = hd._add(ctx)
    try:
        yield ctx, h
    finally:
        hd._forget(h)
        ctx.close()


def _get(h: int) -> tuple[int, int, Any, int]:
    """(returned, event type, element pointer, port number) of one call."""
    f = cffi.FFI()
    et, el, port = f.new("int *"), f.new("void **"), f.new("int *")
    r = bridge._get_async_event(h, et, el, port)
    return r, et[0], el[0], port[0]


def test_an_event_of_a_destroyed_object_is_dropped_and_a_port_event_kept(
        ctx_handle: tuple[v.Context, int]) -> None:
    ctx, h = ctx_handle
    f = cffi.FFI()
    cq = v.CQ(ctx, 4)
    live = f.new("char[8]")  # a stand-in for the CQ's C wrapper
    hcq = hd._add(cq, live)
    gone = v.CQ(ctx, 4)  # a CQ whose wrapper was destroyed (no handle left)
    try:
        fatal = int(e.IBV_EVENT_CQ_ERR)
        for ev in (v.AsyncEvent(fatal, gone), v.AsyncEvent(fatal, cq),
                   v.AsyncEvent(fatal, gone), v.AsyncEvent(int(e.IBV_EVENT_PORT_ACTIVE), 1)):
            ctx._post_event(ev)
        r, et, el, _port = _get(h)  # the destroyed CQ's event is skipped
        assert (r, et) == (1, fatal) and el == f.cast("void *", live)
        r, et, el, port = _get(h)  # and so is the second one
        assert (r, et, port) == (1, int(e.IBV_EVENT_PORT_ACTIVE), 1)
        assert el == f.NULL
        assert _get(h)[0] == 0  # none left
    finally:
        hd._forget(hcq)
        gone.close()
        cq.close()

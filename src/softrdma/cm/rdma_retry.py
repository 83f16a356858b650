"""A connect that finds nobody listening, made again for a while: opt-in, with
``SOFTRDMA_CM_RETRY_NO_LISTENER=SECONDS`` (default 0: off).

A REQ for a Service ID nobody listens on gets REJ 8 Invalid Service ID (IBA 12.6.7,
Annex A11 CA11-8; Linux ``ib_cm``: ``cm_match_req``), and Linux rdma_cm reports
REJECTED with status 8 at once: neither ``ib_cm``, ``rdma_cm`` nor librdmacm tries
again. softrdma does the same by default.

Some programs connect when their peer may not listen yet. perftest's ``-R`` makes two
rdma_cm connections: after a handshake over the first, its server creates, binds and
listens on a new id while its client resolves and connects at once, so nothing orders
the second REQ after the second listen. Upstream perftest retries the connect (ten
times, 100 ms apart; made to work in 3d9d8d0); 4.5-0.17 (Debian's) cannot, its retry
reuses the ids it freed. A Linux client wins that race only by being slower than its
server; softrdma's client against the lab's emulated (TCG) rxe guest never does.

With the variable set, a REJ 8 that comes back within that many seconds of the connect
is answered by sending the same REQ again :data:`PACE_S` later (perftest's own pace),
on the same IB CM id with the QP reset first (:meth:`IpCmClient.again`); the application
sees only the outcome: ESTABLISHED, any other answer, or, once the time is up, the
REJECTED 8 that Linux would have reported first. Other rejections and UD (SIDR) are
unchanged.

On iWARP the same race ends in a TCP RST to the connect (nobody listens on the port:
RFC 9293 §3.10.7.1; Linux siw's ``siw_connect`` returns ``-ECONNREFUSED`` and rdma_cm
reports REJECTED with that status). With the variable set, such a refusal within the
window makes the TCP connect and MPA Request again :data:`PACE_S` later
(:class:`RefusedRetry`); the QP is untouched by a refused connect (no MPA state yet). A
consumer's refusal (an MPA Reply with R set, RFC 5044 §7.1.2) is an answer, never
retried.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from collections.abc import Callable
from functools import partial

from ..drivers.cm.deadlines import Deadlines
from ..drivers.cm.iwconnecting import ConnectError
from ..errors import InvalidArgument, SoftRdmaError
from ..ibcm.events import CmEvent, CmEventType, lock_free
from ..ibcm.ipcm import IpCmClient
from ..wire.cm import RejReason

__all__ = ["ENV", "PACE_S", "window_s", "NoListenerRetry", "RefusedRetry"]

ENV = "SOFTRDMA_CM_RETRY_NO_LISTENER"
PACE_S = 0.1  # between a REJ 8 and the next REQ (s; perftest's own retry pace)
_LOG = logging.getLogger("softrdma.cm")
_timers = Deadlines("rdma_cm-retry")


def window_s() -> float:
    """``$SOFTRDMA_CM_RETRY_NO_LISTENER`` in seconds (unset or empty: 0, off); another
    value than a number >= 0 is :class:`InvalidArgument` naming the variable."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0.0 <= value < math.inf:
        raise InvalidArgument(ENV, f"{raw!r} is not a number of seconds >= 0")
    return value


class NoListenerRetry:
    """The IB CM handler of one RoCE connect that sends its REQ again after a REJ 8 until
    ``until`` (monotonic); every other event, and the last REJ 8, go to ``forward``.
    ``live(client)`` says whether the connect is still the id's (not destroyed, not
    replaced) when a retry is due."""

    def __init__(self, forward: Callable[[CmEvent], None],
                 live: Callable[[IpCmClient], bool], until: float) -> None:
        self.forward = forward
        self.live = live
        self.until = until
        self.client: IpCmClient | None = None  # set once the client is made
        self.tries = 0

    @lock_free  # it only queues: the CM may run it under its lock, at the event's time
    def handler(self, ev: CmEvent) -> None:
        """The IB CM id's handler."""
        rej = ev.reject
        if (ev.type == CmEventType.REJECTED and rej is not None
                and rej.reason == RejReason.INVALID_SERVICE_ID and self.client is not None
                and time.monotonic() + PACE_S < self.until):
            self.tries += 1
            _LOG.debug("REJ 8 (nobody listens): the REQ again in %.0f ms (retry %d, %s)",
                       PACE_S * 1e3, self.tries, ENV)
            _timers.at(time.monotonic() + PACE_S, partial(self._again, ev))
            return
        self.forward(ev)

    def _again(self, rejected: CmEvent) -> None:
        client = self.client
        if client is None or not self.live(client):
            return  # the application destroyed the id meanwhile: nobody to tell
        try:
            client.again()
        except SoftRdmaError:  # the device went away: the REJ stands
            self.forward(rejected)


class RefusedRetry:
    """The failure path of one iWARP connect that makes the connect again after a TCP
    refusal (RST: nobody listens) until ``until`` (monotonic): ``again()`` starts it
    anew, :data:`PACE_S` later, while ``live()`` says the connect is still the id's;
    every other failure, and the last refusal, go to ``forward``."""

    def __init__(self, forward: Callable[[SoftRdmaError], None], again: Callable[[], None],
                 live: Callable[[], bool], until: float) -> None:
        self.forward = forward
        self.again = again
        self.live = live
        self.until = until
        self.tries = 0

    def failed(self, exc: SoftRdmaError) -> None:
        """The connect's failure: a TCP refusal inside the window is tried again."""
        if (isinstance(exc, ConnectError) and exc.errno == errno.ECONNREFUSED
                and time.monotonic() + PACE_S < self.until):
            self.tries += 1
            _LOG.debug("TCP connect refused (nobody listens): the connect again in %.0f ms "
                       "(retry %d, %s)", PACE_S * 1e3, self.tries, ENV)
            _timers.at(time.monotonic() + PACE_S, partial(self._again, exc))
            return
        self.forward(exc)

    def _again(self, refused: SoftRdmaError) -> None:
        if not self.live():
            return  # the application destroyed the id meanwhile: nobody to tell
        try:
            self.again()
        except SoftRdmaError:  # cannot start again (the device went away): it stands
            self.forward(refused)

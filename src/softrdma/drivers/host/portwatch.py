"""Port events from the network interface (``IBV_EVENT_PORT_ACTIVE``/``PORT_ERR``/
``GID_CHANGE``, IBA 11.6.3.3; rxe posts them from its netdev notifier: the port goes
DOWN with the interface or its carrier, ACTIVE again with both, and the GID table
follows the interface's addresses).

:class:`PortState` is the sans-I/O part: feed it interface snapshots, it returns the
events the change means. :class:`PortWatch` samples the interface (``drivers.host.netdev``)
from a daemon thread whenever rtnetlink reports a link or address change
(:class:`~.ifwatch.ChangeWatch`, as rxe hears of them from the netdev notifier), and hands
each event to a callback (the Context's async queue). Between changes the thread sleeps
in ``select``: it never wakes on its own, so it takes no turn at the GIL from a program
that is busy (a C program under ``softrdma run`` spinning on ``ibv_poll_cq``, issue 22).
Where rtnetlink is unavailable it samples every ``interval`` seconds instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ... import enums as e
from ..runtime.fdwait import Readable
from ..runtime.progress import WakePipe
from ..runtime.threads import QuietThread
from . import netdev as _netdev
from .ifwatch import ChangeWatch

__all__ = ["PortState", "PortWatch", "DEFAULT_INTERVAL_S"]

DEFAULT_INTERVAL_S = 0.2


@dataclass(slots=True)
class PortState:
    """The last state seen: port up and the interface's addresses (the GIDs)."""

    up: bool | None = None
    ips: tuple[bytes, ...] = ()

    def update(self, up: bool, ips: tuple[bytes, ...]) -> list[int]:
        """The events (``ibv_event_type``) going from the last state to this one."""
        out: list[int] = []
        if self.up is not None:
            if up != self.up:
                out.append(int(e.IBV_EVENT_PORT_ACTIVE if up else e.IBV_EVENT_PORT_ERR))
            if set(ips) != set(self.ips):
                out.append(int(e.IBV_EVENT_GID_CHANGE))
        self.up = up
        self.ips = ips
        return out


class PortWatch:
    """Watches interface ``name``; ``post(event_type)`` for each change (a vanished
    interface counts as down, without addresses). The interface is sampled when rtnetlink
    reports a change, or every ``interval`` seconds where rtnetlink is unavailable."""

    def __init__(self, name: str, post: Callable[[int], None],
                 interval: float = DEFAULT_INTERVAL_S) -> None:
        self.name = name
        self.interval = interval
        self._post = post
        self._state = PortState()
        self._stop = threading.Event()
        self.samples = 0  # how many times the interface was sampled (tests, diagnostics)
        try:  # subscribed before the first sample: no change falls between the two
            self._watch: ChangeWatch | None = ChangeWatch()
        except OSError:
            self._watch = None
        self._wake = WakePipe()
        self._ready = None if self._watch is None else Readable([self._watch.fileno(),
                                                                  self._wake.r])
        self._sample()
        self._thread = QuietThread(target=self._run, name=f"portwatch-{name}", daemon=True)
        self._thread.start()

    def _sample(self) -> list[int]:
        self.samples += 1
        try:
            nd = _netdev.get(self.name)
            up, ips = nd.up, nd.ips
        except Exception:  # noqa: BLE001 - the interface is gone: the port is down
            up, ips = False, ()
        return self._state.update(up, ips)

    def _wait(self) -> bool:
        """Until something changed (True) or :meth:`stop` (False)."""
        watch, ready = self._watch, self._ready
        if watch is None or ready is None:
            return not self._stop.wait(self.interval)
        while not self._stop.is_set():
            try:
                if self._wake.r in ready.wait(None):
                    return False
            except (OSError, ValueError):  # closed under us
                return False
            if watch.changed():
                return True
        return False

    def _run(self) -> None:
        try:
            while self._wait():
                for ev in self._sample():
                    self._post(ev)
        finally:
            if self._watch is not None:
                self._watch.close()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        if not self._thread.is_alive():  # its wait is over: the pipe is no one's
            self._wake.close()

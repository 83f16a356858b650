"""Port events from the network interface (``IBV_EVENT_PORT_ACTIVE``/``PORT_ERR``/
``GID_CHANGE``, IBA 11.6.3.3; rxe posts them from its netdev notifier: the port goes
DOWN with the interface or its carrier, ACTIVE again with both, and the GID table
follows the interface's addresses).

:class:`PortState` is the sans-I/O part: feed it interface snapshots, it returns the
events the change means. :class:`PortWatch` polls the interface (``drivers.host.netdev``)
from a daemon thread and hands each event to a callback (the Context's async queue).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ... import enums as e
from . import netdev as _netdev

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
    """Polls interface ``name`` every ``interval`` seconds; ``post(event_type)`` for
    each change (a vanished interface counts as down, without addresses)."""

    def __init__(self, name: str, post: Callable[[int], None],
                 interval: float = DEFAULT_INTERVAL_S) -> None:
        self.name = name
        self.interval = interval
        self._post = post
        self._state = PortState()
        self._stop = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, name=f"portwatch-{name}",
                                        daemon=True)
        self._thread.start()

    def _sample(self) -> list[int]:
        try:
            nd = _netdev.get(self.name)
            up, ips = nd.up, nd.ips
        except Exception:  # noqa: BLE001 - the interface is gone: the port is down
            up, ips = False, ()
        return self._state.update(up, ips)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for ev in self._sample():
                self._post(ev)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

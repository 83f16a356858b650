"""Interface and address changes as they happen: an rtnetlink socket subscribed to the
link and address multicast groups (``RTMGRP_LINK``, ``RTMGRP_IPV4_IFADDR``,
``RTMGRP_IPV6_IFADDR``; rtnetlink(7)), the notifications Linux's netdev notifier chain
turns into events for rxe (``rxe_notify``: ``NETDEV_UP``, ``NETDEV_DOWN``,
``NETDEV_CHANGE``) and into GID table updates (``NETDEV_CHANGEADDR``, inet and inet6
address notifiers).

A change (``ip link set DEV down``, ``ip addr add``) has its message queued on the socket
by the time the command returns. Nothing has to be polled: a reader waits on
:meth:`ChangeWatch.fileno` and asks :meth:`ChangeWatch.changed`. Used by the rdma_cm
device list (:mod:`softrdma.drivers.cm.cm_devices`) and the port events of a verbs
context (:mod:`softrdma.drivers.host.portwatch`). Subscribing needs no privilege; the
socket sees the network namespace it was created in.
"""

from __future__ import annotations

import socket

__all__ = ["ChangeWatch"]


class ChangeWatch:
    """An rtnetlink socket on the link and address multicast groups: :meth:`changed` is
    True when an interface or address changed since the last call (or messages were
    lost: ``ENOBUFS``). :class:`OSError` from the constructor where rtnetlink is not
    available."""

    _GROUPS = 0x1 | 0x10 | 0x100  # RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK
                             | socket.SOCK_CLOEXEC, 0)  # NETLINK_ROUTE
        try:
            sock.bind((0, self._GROUPS))
        except OSError:
            sock.close()
            raise
        self.sock = sock

    def fileno(self) -> int:
        """The socket's descriptor: readable while a notification is queued."""
        return self.sock.fileno()

    def changed(self) -> bool:
        """Read every queued notification: True if there was one (or some were lost)."""
        seen = False
        while True:
            try:
                if not self.sock.recv(1 << 16):
                    return seen
            except BlockingIOError:
                return seen
            except OSError:  # ENOBUFS: notifications were lost; anything may have changed
                return True
            seen = True

    def close(self) -> None:
        self.sock.close()

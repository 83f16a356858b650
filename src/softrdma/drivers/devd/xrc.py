"""XRC domains shared by processes, in ``devd`` (IBA 9.8.5, Annex A14; the protocol:
:mod:`.proto`, XRCD_OPEN .. XRC_LOOKUP and the XRC hand-over record).

An XRC domain opened on a file is one domain for every process that opens that file on
the device (the kernel's ``ib_uverbs_open_xrcd`` names it by the file's inode): a TGT
QP in one process delivers into the XRC SRQs the other processes created in it. The
transport engine runs in the process owning the QP (design.md "Devices shared by
processes"), so the TGT QP keeps its PSNs and ACKs, and a SEND naming an SRQ of another
process is handed over, packet by packet, through the daemon to the SRQ's owner, which
places it in its receive WQE and completes it on the SRQ's CQ (:mod:`softrdma.ib.xrc`).

The daemon names a domain by the ``(st_dev, st_ino)`` of a descriptor the client passes
(XRCD_OPEN): a client can only join a domain whose file it has open, as with the kernel.
It hands a record over only from a client that has the domain open to the client that
registered the SRQ in that domain (XRC_SRQ, for a QPN it owns). A credit record
(:data:`XF_CREDIT`, the owner returning consumed packets, ``softrdma.ib.xrc``'s flow
control) goes the other way: only from the SRQ's owner, to the client owning the TGT QPN
it names, in the same domain.

A record is never dropped for a full channel: the TGT QP acknowledged its packet, and a
credit lost would shrink its sender's window for good. A record for a client whose data
channel is full waits in that client's backlog, in order, and leaves when the channel
is writable again (:meth:`XrcRouting._xrc_flush`). The credits bound the backlog; past
:data:`MAX_XRC_BACKLOG` bytes (a client ignoring them) a record is dropped
(``client_full``).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import stat
from collections import deque

from softrdma.drivers.devd.proto import XHDR, Client, close_fds

__all__ = ["XrcRouting", "MAX_XRC_DOMAINS", "MAX_XRC_BACKLOG", "XF_CREDIT"]

MAX_XRC_DOMAINS = 4096  # XRC domains open on one device at once (files)
#: bytes of records one client's backlog holds (module docstring)
MAX_XRC_BACKLOG = 64 << 20
#: ``softrdma.ib.xrc.XF_CREDIT`` (the daemon does not load the engine): a credit record
XF_CREDIT = 0x40


class XrcRouting:
    """XRC domains, their SRQs and the hand-over, mixed into ``Devd``."""

    counters: dict[str, int]
    _owners: dict[int, Client]
    _clients: list[Client]
    _sel: selectors.BaseSelector | None

    def _xrc_init(self) -> None:
        self._xrc_ids: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> domain id
        self._xrc_keys: dict[int, tuple[int, int]] = {}  # domain id -> (st_dev, st_ino)
        self._xrc_next = 1
        self._xrc_srqs: dict[int, tuple[int, Client]] = {}  # SRQ number -> (domain, owner)
        #: records waiting for a full data channel, and their bytes, by client
        self._xrc_backlog: dict[Client, tuple[deque[bytes], list[int]]] = {}

    def _xrcd_open(self, c: Client, fds: list[int]) -> tuple[int, int]:
        """XRCD_OPEN with the descriptors passed (closed here): (errno, domain id)."""
        try:
            if len(fds) != 1:
                return errno.EINVAL, 0
            try:
                st = os.fstat(fds[0])
            except OSError:
                return errno.EBADF, 0
            if stat.S_ISSOCK(st.st_mode) or stat.S_ISFIFO(st.st_mode):
                return errno.EBADF, 0
        finally:
            close_fds(fds)
        key = (st.st_dev, st.st_ino)
        ident = self._xrc_ids.get(key)
        if ident is None:
            if len(self._xrc_ids) >= MAX_XRC_DOMAINS:
                return errno.ENOSPC, 0
            ident = self._xrc_next
            self._xrc_next = ident % 0xFFFFFFFF + 1
            while ident in self._xrc_keys:
                ident = ident % 0xFFFFFFFF + 1
            self._xrc_ids[key] = ident
            self._xrc_keys[ident] = key
        c.xrcds[ident] = c.xrcds.get(ident, 0) + 1
        return 0, ident

    def _xrcd_close(self, c: Client, ident: int) -> int:
        n = c.xrcds.get(ident, 0)
        if not n:
            return errno.ENOENT
        if n > 1:
            c.xrcds[ident] = n - 1
            return 0
        del c.xrcds[ident]
        for srqn in [s for s, (d, o) in self._xrc_srqs.items() if d == ident and o is c]:
            del self._xrc_srqs[srqn]
        self._xrc_forget(ident)
        return 0

    def _xrc_forget(self, ident: int) -> None:
        """Drop domain ``ident`` once no live client has it open."""
        if any(ident in c.xrcds for c in self._clients if not c.dead):
            return
        key = self._xrc_keys.pop(ident, None)
        if key is not None:
            self._xrc_ids.pop(key, None)

    def _xrc_srq(self, c: Client, srqn: int, ident: int) -> int:
        """XRC_SRQ: ``c``'s SRQ ``srqn`` (a QPN it owns) in domain ``ident``."""
        if ident not in c.xrcds:
            return errno.EACCES
        if self._owners.get(srqn) is not c:
            return errno.ENOENT
        self._xrc_srqs[srqn] = (ident, c)
        return 0

    def _xrc_lookup(self, c: Client, srqn: int, ident: int) -> int:
        """XRC_LOOKUP: 0 if SRQ ``srqn`` of another live client is in domain ``ident``."""
        if ident not in c.xrcds:
            return errno.EACCES
        return 0 if self._xrc_target(c, srqn, ident) is not None else errno.ENOENT

    def _xrc_target(self, c: Client, srqn: int, ident: int) -> Client | None:
        got = self._xrc_srqs.get(srqn)
        if got is None:
            return None
        dom, owner = got
        if dom != ident or owner is c or owner.dead or self._owners.get(srqn) is not owner:
            return None
        return owner

    def _xrc_qpn_freed(self, qpn: int) -> None:
        """A QPN left its owner: it no longer names an XRC SRQ."""
        self._xrc_srqs.pop(qpn, None)

    def _xrc_client_left(self, c: Client) -> None:
        self._xrc_backlog.pop(c, None)
        for srqn in [s for s, (_, o) in self._xrc_srqs.items() if o is c]:
            del self._xrc_srqs[srqn]
        idents = list(c.xrcds)
        c.xrcds.clear()
        for ident in idents:
            self._xrc_forget(ident)

    def _xrc_forward(self, c: Client, msg: bytes) -> None:
        """An XRC hand-over record from ``c``: to the SRQ's owner, if ``c`` may; a credit
        record: from the SRQ's owner to the TGT QP's."""
        if len(msg) < XHDR.size:
            self.counters["malformed"] += 1
            return
        _, flags, _, ident, srqn, tgt_qpn, _, _ = XHDR.unpack_from(msg)
        if flags & XF_CREDIT:
            to = self._owners.get(tgt_qpn)
            if self._xrc_srqs.get(srqn) != (ident, c) or to is None or to is c \
                    or to.dead or ident not in to.xrcds:
                to = None
        else:
            to = self._xrc_target(c, srqn, ident) if ident in c.xrcds else None
        if to is None:
            self.counters["xrc_refused"] += 1
            return
        self._xrc_send(to, msg)

    def _xrc_send(self, to: Client, msg: bytes) -> None:
        """Send ``msg`` to ``to`` now, or after the records already waiting for it."""
        waiting = self._xrc_backlog.get(to)
        if waiting is None:
            try:
                to.data.send(msg, socket.MSG_DONTWAIT)
            except BlockingIOError:
                waiting = self._xrc_backlog[to] = (deque(), [0])
                self._xrc_watch(to, True)
            except OSError:
                to.dead = True
                return
            else:
                self.counters["xrc_forwarded"] += 1
                return
        queue, size = waiting
        if size[0] + len(msg) > MAX_XRC_BACKLOG:
            self.counters["client_full"] += 1
            return
        queue.append(msg)
        size[0] += len(msg)

    def _xrc_flush(self, c: Client) -> None:
        """``c``'s data channel is ready: send the records waiting for it, in order."""
        waiting = self._xrc_backlog.get(c)
        if waiting is None:
            return
        queue, size = waiting
        while queue:
            try:
                c.data.send(queue[0], socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                c.dead = True
                return
            size[0] -= len(queue.popleft())
            self.counters["xrc_forwarded"] += 1
        del self._xrc_backlog[c]
        self._xrc_watch(c, False)

    def _xrc_watch(self, c: Client, writable: bool) -> None:
        """Have the selector report ``c``'s data channel writable too (a backlog) or not."""
        sel = self._sel
        if sel is None or c.dead:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writable else 0)
        try:
            sel.modify(c.data, events, ("data", c))
        except (KeyError, ValueError, OSError):
            c.dead = True

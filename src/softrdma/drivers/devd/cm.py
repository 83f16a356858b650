"""CM MAD routing of a shared device's QP1 in ``devd`` (the "CM MAD routing" rules of
:mod:`softrdma.drivers.devd.proto`; IBA 12.6, 13.4)."""

from __future__ import annotations

import errno
import select
import time
from collections.abc import Sequence

from softrdma.drivers.devd.cm_reject import RejLimiter, answer_for, sane_request
from softrdma.drivers.devd.proto import (
    ATTR_DREQ,
    ATTR_REJ,
    ATTR_REQ,
    ATTR_SIDR_REP,
    ATTR_SIDR_REQ,
    CM_CLASS,
    MAD_OFF,
    MAD_SIZE,
    Client,
)
from softrdma.drivers.devd.v1 import send_reversible_v1
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.links.rawether import RawEtherLink
from softrdma.drivers.links.udp import UdpLink
from softrdma.errors import SoftRdmaError
from softrdma.wire.roce import udp_send_icrc


def _gone(c: Client) -> bool:
    """True if ``c``'s process has closed its end of the control channel (exited), though
    devd may not have read that end-of-file yet."""
    if c.dead:
        return True
    p = select.poll()
    p.register(c.ctrl, select.POLLIN)  # POLLHUP and POLLERR are always reported
    try:
        return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))
    except OSError:
        return True


class CmRouting:
    """The daemon's CM state: slots (the top byte of a client's comm IDs) and listens."""

    counters: dict[str, int]
    udp_port: int
    _qp1: list[Client]
    _slots: dict[int, Client]
    _next_slot: int
    _cm_listeners: dict[tuple[int, int], Client]
    _rej_limiter: RejLimiter

    def _cm_slot(self, c: Client) -> tuple[int, int]:
        if not c.cm_slot:
            for _ in range(255):
                slot = self._next_slot
                self._next_slot = slot % 255 + 1
                if slot not in self._slots:
                    break
            else:
                return errno.ENOSPC, 0
            c.cm_slot = slot
            self._slots[slot] = c
            c.qp1_refs += 1
            if c not in self._qp1:
                self._qp1.append(c)
        return 0, c.cm_slot

    def _cm_listen(self, c: Client, raw: bytes, add: bool) -> int:
        sid, mask = int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big")
        key = (sid & mask, mask)
        if not c.cm_slot:
            return errno.EINVAL
        cur = self._cm_listeners.get(key)
        if add:
            if cur is not None and cur is not c:
                if not _gone(cur):
                    return errno.EADDRINUSE
                # its process has exited, and its end-of-file waits in this select batch
                # or the next: its listens go now (the rest when the main loop drops it)
                cur.dead = True
                self._cm_release(cur)
            self._cm_listeners[key] = c
            c.cm_listens.add(key)
            return 0
        if cur is not c:
            return errno.ENOENT
        del self._cm_listeners[key]
        c.cm_listens.discard(key)
        return 0

    def _cm_release(self, c: Client) -> None:
        if c.cm_slot and self._slots.get(c.cm_slot) is c:
            del self._slots[c.cm_slot]
        c.cm_slot = 0
        for key in c.cm_listens:
            if self._cm_listeners.get(key) is c:
                del self._cm_listeners[key]
        c.cm_listens.clear()

    def _cm_listener(self, sid: int) -> Client | None:
        best: tuple[int, Client] | None = None
        for (value, mask), c in self._cm_listeners.items():
            if sid & mask == value and (best is None or mask > best[0]):
                best = (mask, c)
        return None if best is None else best[1]

    def _route_qp1(self, link: UdpLink | RawEtherLink, dg: Datagram) -> Sequence[Client]:
        """The clients a QP1 datagram goes to (see "CM MAD routing" above)."""
        d = dg.data
        mad = MAD_OFF
        if len(d) < mad + MAD_SIZE or d[mad + 1] != CM_CLASS or not self._slots:
            return self._qp1
        legacy = [c for c in self._qp1 if not c.cm_slot]
        attr = int.from_bytes(d[mad + 16 : mad + 18], "big")
        if attr in (ATTR_REQ, ATTR_SIDR_REQ):
            owner = self._cm_listener(int.from_bytes(d[mad + 32 : mad + 40], "big"))
            if owner is not None:
                self.counters["cm_routed"] += 1
                return (owner,)
            if not legacy:
                self._reject_unlistened(link, dg, attr)
            return legacy
        slot = d[mad + 24] if attr == ATTR_SIDR_REP else d[mad + 28]
        owner = self._slots.get(slot)
        if owner is not None:
            self.counters["cm_routed"] += 1
            return (owner,)
        if attr == ATTR_DREQ and not legacy:  # its process has gone: DREP
            self._reject_unlistened(link, dg, attr)
        return self._qp1 if attr == ATTR_REJ else legacy

    def _reject_unlistened(self, link: UdpLink | RawEtherLink, dg: Datagram, attr: int) -> None:
        """REJ 8 (SIDR_REP status 1) for a REQ (SIDR_REQ) nobody listens for (DREP for a
        DREQ of a slot nobody holds), only for a
        REQ with a correct ICRC from a plausible source, and rate-limited per source
        (:mod:`softrdma.drivers.devd.cm_reject`). On RoCEv1 the REJ takes the reversible path
        of A16.4.4."""
        if not sane_request(dg, self.udp_port):
            self.counters["cm_bad_req"] += 1
            return
        answer = answer_for(dg)
        if answer is None:
            self.counters["cm_bad_req"] += 1
            return
        if not self._rej_limiter.allow(dg.src_ip, time.monotonic()):
            self.counters["cm_rej_limited"] += 1
            return
        hdr, mad = answer
        if isinstance(link, RawEtherLink):  # RoCEv1: the reversible path of A16.4.4
            try:
                send_reversible_v1(link, dg, [hdr, mad])
            except (OSError, SoftRdmaError):
                return
            self.counters["cm_rejected"] += 1
            return
        sport = link.effective_sport(0)
        try:
            icrc = udp_send_icrc(dg.dst_ip, dg.src_ip, sport, self.udp_port, [hdr, mad])
            link.send(dg.src_ip, self.udp_port, sport, [hdr, mad, icrc])
        except (OSError, SoftRdmaError):
            return
        self.counters["cm_rejected"] += 1

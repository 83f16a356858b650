"""QPN allocation and the direct receive path of ``devd`` (:mod:`softrdma.drivers.devd.reuseport`).

design.md "Devices shared by processes": QP numbers are unique per device because the
daemon allocates them (IBA 10.2.4: a QPN names one QP of a CA). A client on the direct
path owns a slot, and the QPNs of its slot's range; the daemon keeps one
:class:`~softrdma.drivers.devd.reuseport.Group` per reuseport group (the device's first address
of each family) and re-attaches the BPF program whenever the set of slots, their socket
indices, or the exceptions (QPNs asked for by number inside another client's range)
change. Clients join one at a time (JOIN ... JOINED), so the daemon knows the bind order.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time

from softrdma.drivers.devd.proto import (
    OP_JOIN,
    QPN_FIRST,
    QPN_LAST,
    REP,
    Client,
    close_fds,
    with_seq,
)
from softrdma.drivers.devd.reuseport import (
    SLOT_LAST,
    SLOT_SHIFT,
    Group,
    assemble,
    attach,
    check_program_fits,
    slot_of,
    slot_range,
)
from softrdma.drivers.host.sockdiag import udp_bound_count
from softrdma.drivers.links.link import ip_text
from softrdma.drivers.links.udp import UdpLink

MAX_EXCEPTIONS = 1024  # QPNs asked for by number inside another client's range
#: How many QPNs of destroyed QPs devd remembers (the latest; ``QpnRouting._closed_qpns``).
#: Packets to them are dropped like those to a QPN never allocated (IBA 9.6.1.4: no such
#: destination QP) but counted ``closed_qpn``, not ``unknown_qpn``: a peer's requests and
#: retransmissions still in flight when an application tears its QPs down (as
#: ``ibv_srq_pingpong``'s sends beyond ``-n``, which arrive after the other side exited)
#: end a conversation; they are not a routing fault.
CLOSED_KEPT = 4096
JOIN_TIMEOUT = 5.0  # seconds a client may hold the JOIN turn (binding takes milliseconds)
#: while a departure waits (see ``QpnRouting._direct_leave``), how often devd looks again
LEAVE_RECHECK = 0.02


def _sock_ip(sock: socket.socket) -> tuple[bytes, int]:
    host, port = sock.getsockname()[:2]
    return socket.inet_pton(sock.family, str(host).split("%", 1)[0]), int(port)


class QpnRouting:
    """QPN ownership (``_owners``) and the reuseport groups, mixed into ``Devd``."""

    counters: dict[str, int]
    _owners: dict[int, Client]
    _next_qpn: int
    _links: list[UdpLink]

    join_timeout: float

    def _qpn_init(self) -> None:
        self._groups_rp: list[tuple[UdpLink, Group]] = []
        self._slot_clients: dict[int, Client] = {}
        self._slot_use: dict[int, int] = {}  # slot -> QPNs owned inside its range
        self._next_slot_rp = 1
        self._exceptions: dict[int, Client] = {}
        self._join_holder: Client | None = None
        self._join_slot = 0
        self._join_deadline = 0.0
        self._join_queue: list[Client] = []
        # Direct clients that left while another client could be binding (a JOIN turn
        # held, or the kernel's groups not as mirrored): their sockets stay in the groups
        # (devd's copies) and their slots go to devd until :meth:`_settle_leaves`.
        self._leaving: list[Client] = []
        self._leaving_since = 0.0
        # QPNs of QPs destroyed (or of clients gone) lately, oldest first (CLOSED_KEPT)
        self._closed_qpns: dict[int, None] = {}

    # -- the reuseport groups -----------------------------------------------------------

    def _direct_setup(self) -> None:
        """One group per address family (the first address of each, as clients bind):
        attach the empty program at once, so a client's socket gets nothing it does not
        own (without a program the kernel would spread datagrams by hash)."""
        seen: set[int] = set()
        for link in self._links:
            if len(link.ip) in seen or link._rx is None:
                continue
            seen.add(len(link.ip))
            try:
                attach(link._rx, assemble({}))
            except OSError:
                self.counters["bpf_failed"] += 1
                continue
            self.counters["bpf_attached"] += 1
            self._groups_rp.append((link, Group()))

    def _direct_close(self) -> None:
        for _, group in self._groups_rp:
            group.close()
        self._groups_rp.clear()

    def _regen(self, hide: frozenset[Client] = frozenset()) -> None:
        """Attach each group's program for the current members (``hide``: route these
        clients' slots to devd for the moment)."""
        hide = hide.union(self._leaving)
        slots = {c: s for s, c in self._slot_clients.items() if c not in hide}
        for link, group in self._groups_rp:
            exc = {}
            for qpn, owner in self._exceptions.items():
                index = group.index_of(owner) if owner not in hide else None
                exc[qpn] = index or 0
            assert link._rx is not None
            try:
                attach(link._rx, assemble(group.routes(slots), exc))
            except OSError:
                self.counters["bpf_failed"] += 1
            else:
                self.counters["bpf_attached"] += 1

    def _direct_leave(self, c: Client) -> None:
        """A direct client left. Its sockets leave the groups at once (:meth:`_leave_now`)
        unless another client may be binding: a JOIN turn is held, or a group has a
        socket our mirror lacks (one bound after its turn expired, or refused and not
        closed yet). The kernel would then move that unmirrored socket, the group's last,
        into the hole where the mirror moves its last member: every later datagram of
        the two clients would go to the other one (issue 25: rdma-core's traffic tests
        timed out, packets of live QPs counted ``rcvd_unknown_qp`` by the wrong
        process). Such a departure waits (its slot routed to devd) for
        :meth:`_settle_leaves`, at the end of the turn or at the latest after
        ``join_timeout``."""
        if self._join_holder is c:
            self._join_holder, self._join_slot = None, 0  # the turn is released below
        elif c in self._join_queue:
            self._join_queue.remove(c)
        if c.slot:
            if not self._leaving:
                self._leaving_since = time.monotonic()
            self._leaving.append(c)
        self._join_release()
        if c in self._leaving:
            self._regen()  # its slot to devd while it waits

    def _settle_leaves(self, now: float) -> bool:
        """Take the waiting departures out of the groups if no client may be binding (no
        JOIN turn held, each kernel group as mirrored), or once they waited
        ``join_timeout``; True when none waits any more."""
        if not self._leaving:
            return True
        if now - self._leaving_since < self.join_timeout and (
                self._join_holder is not None or not self._groups_as_mirrored(0)):
            return False
        while self._leaving:
            self._leave_now(self._leaving.pop(0))
        return True

    def _leave_now(self, c: Client) -> None:
        """Route ``c``'s slot and the last member's to devd, close our copy of its sockets
        (the kernel moves each group's last socket into the hole), then attach the
        programs for the new order. No datagram for a live client takes the hash
        fallback meanwhile: the moved client's go through devd's socket."""
        moved = {last for _, g in self._groups_rp if isinstance(last := g.last(), Client)}
        self._regen(frozenset({c, *moved}))
        for _, group in self._groups_rp:
            group.leave(c)
        del self._slot_clients[c.slot]
        c.slot = 0
        for qpn in [q for q, o in self._exceptions.items() if o is c]:
            del self._exceptions[qpn]
        self._regen()

    # -- JOIN / JOINED ---------------------------------------------------------------------

    def _free_slot(self) -> int:
        for _ in range(SLOT_LAST):
            slot = self._next_slot_rp
            self._next_slot_rp = slot % SLOT_LAST + 1
            if (slot not in self._slot_clients and not self._slot_use.get(slot)
                    and slot != self._join_slot):
                return slot
        return 0

    def _join(self, c: Client, op: int) -> bytes | None:
        """OP_JOIN: the slot (the reply waits while another client binds, or a departure
        waits: :meth:`_direct_leave`)."""
        if not self._groups_rp or c.join_expired:  # one expired turn: no second one
            return REP.pack(op, errno.EOPNOTSUPP, 0)
        if c.slot or self._join_holder is c:
            return REP.pack(op, errno.EALREADY, 0)
        if self._join_holder is not None or self._leaving:
            self._join_queue.append(c)
            return None
        if not check_program_fits(len(self._slot_clients) + 1, len(self._exceptions)):
            return REP.pack(op, errno.EOPNOTSUPP, 0)
        slot = self._free_slot()
        if not slot:
            return REP.pack(op, errno.EOPNOTSUPP, 0)
        self._join_holder, self._join_slot = c, slot
        self._join_deadline = time.monotonic() + self.join_timeout
        return REP.pack(op, 0, slot)

    def _check_joined_fds(self, n: int, fds: list[int]) -> tuple[list[socket.socket] | None,
                                                                   str]:
        """The sockets a JOINED passed, or None and why (all of ``fds`` closed) unless
        there are ``n`` of them and each is a UDP socket, bound with ``SO_REUSEPORT`` to
        the port and address of its group (HELLO order) when there is one per group."""
        if n != len(fds):
            close_fds(fds)
            return None, f"JOINED of {n} sockets passed {len(fds)} descriptors"
        for i, fd in enumerate(fds):
            try:
                ok = stat.S_ISSOCK(os.fstat(fd).st_mode)
            except OSError:
                ok = False
            if not ok:
                close_fds(fds)
                return None, f"JOINED descriptor {i} is not a socket"
        socks: list[socket.socket] = []
        try:
            for fd in fds:
                socks.append(socket.socket(fileno=fd))
        except OSError as exc:
            close_fds(fds[len(socks) :])
            for s in socks:
                s.close()
            return None, f"JOINED descriptor {len(socks)}: {exc.strerror}"
        why = ""
        for i, s in enumerate(socks):
            try:
                why = self._joined_socket_problem(i, s, len(socks))
            except OSError as exc:
                why = f"JOINED descriptor {i}: {exc.strerror or exc}"
            if why:
                for s2 in socks:
                    s2.close()
                return None, why
        return socks, ""

    def _joined_socket_problem(self, i: int, s: socket.socket, n: int) -> str:
        """What is wrong with the ``i``-th of ``n`` sockets a JOINED passed ("": nothing)."""
        if (s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_DGRAM
                or s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) != socket.IPPROTO_UDP):
            return f"JOINED descriptor {i} is not a UDP socket"
        if n == len(self._groups_rp):
            link = self._groups_rp[i][0]
            if (s.family != link.family or _sock_ip(s) != (link.ip, link.port)
                    or not s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)):
                return (f"JOINED socket {i} is not bound with SO_REUSEPORT to the "
                        f"device's {ip_text(link.ip)} port {link.port}")
        return ""

    def _joined(self, c: Client, op: int, socks: list[socket.socket]) -> bytes:
        """OP_JOINED: the client bound ``socks`` (checked by :meth:`_check_joined_fds`)."""
        if self._join_holder is not c:
            for s in socks:
                s.close()
            if c.join_expired:  # too late: its turn went to the next client
                return REP.pack(op, 0, 0)
            return REP.pack(op, errno.EPROTO, 0)
        slot = self._join_slot
        n = len(socks)
        # Before the next client may bind: a socket the kernel has and we do not know
        # of (one bound by a client whose turn expired) would shift the order.
        refuse = not n or n != len(self._groups_rp) or not self._groups_as_mirrored(1)
        self._join_holder, self._join_slot = None, 0
        if refuse:
            for s in socks:
                s.close()
            self.counters["direct_refused"] += 1
            self._join_release()
            return REP.pack(op, 0, 0)  # slot 0: the client stays on the forwarded path
        for (_, group), s in zip(self._groups_rp, socks, strict=True):
            group.join(c, s)
        c.slot = slot
        c.next_qpn = slot_range(slot)[0]
        self._slot_clients[slot] = c
        self.counters["direct_clients"] += 1
        self._regen()
        self._join_release()  # mirrored first: departures may settle, the next may bind
        return REP.pack(op, 0, slot)

    def _groups_as_mirrored(self, extra: int) -> bool:
        """Whether each kernel reuseport group has as many sockets as our mirror of it,
        plus ``extra`` (a socket being joined); True when the kernel does not say."""
        for link, group in self._groups_rp:
            assert link.port is not None
            count = udp_bound_count(link.ip, link.port)
            if count is not None and count != len(group.members) + extra:
                return False
        return True

    def _join_expire(self, now: float) -> float | None:
        """Take the JOIN turn from a client that held it past ``join_timeout`` (its late
        JOINED is answered 0: forwarded path), settle waiting departures; the next
        deadline, or None."""
        holder = self._join_holder
        if holder is None:
            if self._leaving:
                self._join_release(now)
                if self._leaving:
                    return now + LEAVE_RECHECK
            return None
        if now < self._join_deadline:
            return self._join_deadline
        holder.join_expired = True
        self.counters["join_timeouts"] += 1
        self._join_holder, self._join_slot = None, 0
        self._join_release(now)
        if self._join_holder is not None:
            return self._join_deadline
        return now + LEAVE_RECHECK if self._leaving else None

    def _join_release(self, now: float | None = None) -> None:
        """No JOIN turn is held (the binder finished, died or ran out of time): waiting
        departures settle, then the next queued client may bind."""
        if self._join_holder is not None:
            return
        self._join_slot = 0
        if not self._settle_leaves(time.monotonic() if now is None else now):
            return  # the serve loop tries again (``_join_expire``)
        while self._join_queue and self._join_holder is None:
            nxt = self._join_queue.pop(0)
            if nxt.dead:
                continue
            reply = self._join(nxt, OP_JOIN)
            if reply is None:
                return
            try:
                nxt.ctrl.send(with_seq(reply, nxt.join_seq))
            except OSError:
                nxt.dead = True
                if self._join_holder is nxt:
                    self._join_holder, self._join_slot = None, 0

    # -- QPN ownership ---------------------------------------------------------------------

    def _own(self, c: Client, qpn: int) -> int:
        """Record ``c`` as the owner of ``qpn``; an errno when the program cannot route it."""
        slot = slot_of(qpn)
        holder = self._slot_clients.get(slot)
        if holder is not None and holder is not c:
            if len(self._exceptions) >= MAX_EXCEPTIONS:
                return errno.ENOSPC
            self._exceptions[qpn] = c
        self._owners[qpn] = c
        self._closed_qpns.pop(qpn, None)
        c.qpns.add(qpn)
        self._slot_use[slot] = self._slot_use.get(slot, 0) + 1
        if holder is not None and holder is not c:
            self._regen()
        return 0

    def _disown(self, qpn: int) -> None:
        c = self._owners.pop(qpn)
        c.qpns.discard(qpn)
        self._closed_qpns[qpn] = None
        if len(self._closed_qpns) > CLOSED_KEPT:
            del self._closed_qpns[next(iter(self._closed_qpns))]
        slot = slot_of(qpn)
        left = self._slot_use.get(slot, 1) - 1
        if left:
            self._slot_use[slot] = left
        else:
            self._slot_use.pop(slot, None)
        if self._exceptions.pop(qpn, None) is not None:
            self._regen()

    def _alloc_any(self, c: Client) -> tuple[int, int]:
        """Any free QPN: from the client's slot range on the direct path, else upwards
        from QPN_FIRST skipping the ranges of live slots."""
        owners = self._owners
        if c.slot:
            first, last = slot_range(c.slot)
            qpn = c.next_qpn
            for _ in range(last - first + 1):
                if qpn not in owners:
                    c.next_qpn = qpn + 1 if qpn < last else first
                    return self._own(c, qpn), qpn
                qpn = qpn + 1 if qpn < last else first
            return errno.ENOSPC, 0
        live = {*self._slot_clients, self._join_slot} - {0}
        span = QPN_LAST - QPN_FIRST + 1
        if len(owners) >= span:
            return errno.ENOSPC, 0
        qpn = self._next_qpn
        for _ in range(span + 1):
            if qpn not in owners and slot_of(qpn) not in live:
                break
            if slot_of(qpn) in live:  # skip the whole range
                qpn = (slot_of(qpn) + 1) << SLOT_SHIFT
            else:
                qpn += 1
            if qpn > QPN_LAST:
                qpn = QPN_FIRST
        else:
            return errno.ENOSPC, 0
        self._next_qpn = qpn + 1 if qpn < QPN_LAST else QPN_FIRST
        return self._own(c, qpn), qpn

"""devd's control channel (:class:`~softrdma.drivers.devd.daemon.Devd`): each client's
control records (:mod:`.proto`), checked (a malformed one drops that client only) and
answered: QPNs, multicast groups, CM routing, the direct path's JOIN, counter and
resource reports, and the device's counters and clients for ``softrdma stats`` and
``softrdma res show``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softrdma.drivers.devd import proto
from softrdma.drivers.devd.forward import Forwarding
from softrdma.drivers.devd.mcast import McastRouting
from softrdma.drivers.devd.proto import (
    MAX_CTRL,
    QPN_GSI,
    QPN_LAST,
    REP,
    REQ,
    SEQ_OFFSET,
    STAT_NAMES,
    U64,
    Client,
    close_fds,
    recv_fds,
    with_seq,
)
from softrdma.drivers.devd.qpn import QpnRouting
from softrdma.drivers.devd.xrc import XrcRouting
from softrdma.drivers.host.port_totals import write_counters
from softrdma.drivers.host.registry import DeviceRecord
from softrdma.seam.counters import Counters

__all__ = ["Control", "MAX_JOIN_FDS", "MAX_LOGGED_MALFORMED"]

MAX_JOIN_FDS = 4  # sockets a JOINED may carry (one per address family)
MAX_LOGGED_MALFORMED = 16  # malformed control messages logged (all are counted)



def _json_table(raw: bytes, value_ok: Callable[[object], bool]) -> dict[str, Any] | None:
    """A client's JSON report: an object whose values all pass ``value_ok``; None for
    anything else (not JSON, another type, a bad value), which the caller refuses
    with EINVAL."""
    try:
        got = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(got, dict) or not all(isinstance(k, str) and value_ok(v)
                                            for k, v in got.items()):
        return None
    return got


class Control(Forwarding, McastRouting, QpnRouting, XrcRouting):
    """The control-channel half of :class:`~softrdma.drivers.devd.daemon.Devd` (which
    sets these attributes)."""

    record: DeviceRecord
    counters_path: Path
    _clients: list[Client]
    _qp1: list[Client]
    _retired: Counters

    def _on_ctrl(self, c: Client) -> None:
        while not c.dead:
            try:
                msg, fds, flags = recv_fds(c.ctrl, MAX_CTRL, MAX_JOIN_FDS)  # close-on-exec
            except BlockingIOError:
                return
            except OSError:
                c.dead = True
                return
            if not msg:
                close_fds(fds)
                c.dead = True
                return
            seq = msg[SEQ_OFFSET] if len(msg) > SEQ_OFFSET else 0
            try:
                reply = self._on_request(c, msg, fds, flags)
            except Exception as exc:  # noqa: BLE001 - one client's message never ends devd
                reply = None
                self._malformed(c, f"{type(exc).__name__}: {exc}")
            if c.dead or reply is None:
                continue  # dropped, or a JOIN answered when the client before it has bound
            try:
                c.ctrl.send(with_seq(reply, seq))
            except OSError:
                c.dead = True
                return

    def _malformed(self, c: Client, why: str) -> None:
        """A control message devd cannot accept: drop that client only (the descriptors it
        passed are closed by the caller)."""
        n = self.counters["ctrl_malformed"] = self.counters["ctrl_malformed"] + 1
        c.dead = True
        if n <= MAX_LOGGED_MALFORMED:  # a client reconnecting in a loop fills no disk
            more = " (no more such messages are logged)" if n == MAX_LOGGED_MALFORMED else ""
            print(f"devd {self.record.name}: dropped a client (uid {c.uid}): malformed "
                  f"control message: {why}{more}", file=sys.stderr)

    def _on_request(self, c: Client, msg: bytes, fds: list[int], flags: int) -> bytes | None:
        """One control record; descriptors only with a well-formed JOINED or XRCD_OPEN
        (closed here otherwise, and the client dropped)."""
        if flags & socket.MSG_CTRUNC or (fds and (msg[0] not in (proto.OP_JOINED,
                                                                 proto.OP_XRCD_OPEN)
                                                  or len(msg) != REQ.size)):
            close_fds(fds)
            self._malformed(c, "descriptors passed with op "
                            f"{msg[0]}{' (truncated)' if flags & socket.MSG_CTRUNC else ''}")
            return None
        if msg[0] == proto.OP_JOINED and len(msg) == REQ.size:
            socks, why = self._check_joined_fds(REQ.unpack(msg)[1], fds)
            if socks is None:
                self._malformed(c, why)
                return None
            return self._joined(c, proto.OP_JOINED, socks)
        if msg[0] == proto.OP_XRCD_OPEN and len(msg) == REQ.size:
            err, value = self._xrcd_open(c, fds)
            return REP.pack(proto.OP_XRCD_OPEN, err, value)
        if msg[0] == proto.OP_JOIN and len(msg) == REQ.size:
            c.join_seq = msg[SEQ_OFFSET]
        return self._handle(c, msg)

    def _handle(self, c: Client, msg: bytes) -> bytes | None:
        if len(msg) > REQ.size and msg[0] == proto.OP_REPORT:
            return REP.pack(proto.OP_REPORT, self._report(c, msg[REQ.size :]), 0)
        if len(msg) > REQ.size and msg[0] == proto.OP_REPORT_RESOURCES:
            return REP.pack(proto.OP_REPORT_RESOURCES,
                            self._report_resources(c, msg[REQ.size :]), 0)
        if len(msg) != REQ.size:
            return REP.pack(msg[0] if msg else 0, errno.EINVAL, 0)
        op, arg, mgid = REQ.unpack(msg)
        if op == proto.OP_ALLOC_QPN:
            err, value = self._alloc(c, arg)
        elif op == proto.OP_FREE_QPN:
            err, value = self._free(c, arg), 0
        elif op == proto.OP_ATTACH_MCAST:
            err, value = self._attach(c, mgid), 0
        elif op == proto.OP_DETACH_MCAST:
            err, value = self._detach(c, mgid), 0
        elif op == proto.OP_CM_SLOT:
            err, value = self._cm_slot(c)
        elif op in (proto.OP_CM_LISTEN, proto.OP_CM_UNLISTEN):
            err, value = self._cm_listen(c, mgid, op == proto.OP_CM_LISTEN), 0
        elif op == proto.OP_JOIN:
            return self._join(c, op)
        elif op == proto.OP_XRCD_CLOSE:
            err, value = self._xrcd_close(c, arg), 0
        elif op in (proto.OP_XRC_SRQ, proto.OP_XRC_LOOKUP):
            ident = int.from_bytes(mgid[:4], "big")
            err = (self._xrc_srq if op == proto.OP_XRC_SRQ else self._xrc_lookup)(c, arg, ident)
            value = 0
        elif op == proto.OP_COUNTERS:
            body = json.dumps({"port": self.port_counters(), "devd": self.counters,
                               "clients": len(self._clients)}).encode()
            return REP.pack(op, 0, len(body)) + body
        elif op == proto.OP_RESOURCES:
            return self._resources(op, arg)
        elif op == proto.OP_STATS:
            return REP.pack(op, 0, len(STAT_NAMES)) + b"".join(
                U64.pack(self.counters[n]) for n in STAT_NAMES
            )
        else:
            err, value = errno.EOPNOTSUPP, 0
        return REP.pack(op, err, value)

    def _report(self, c: Client, raw: bytes) -> int:
        values = _json_table(raw, lambda v: type(v) is int and 0 <= v <= proto.MAX_COUNTER)
        if values is None:
            return errno.EINVAL
        c.port_counters = values
        return 0

    def _report_resources(self, c: Client, raw: bytes) -> int:
        got = _json_table(raw, lambda v: (
            (isinstance(v, list) and all(isinstance(o, dict) for o in v))
            or (isinstance(v, int) and not isinstance(v, bool))))
        if got is None:
            return errno.EINVAL
        c.resources = got
        return 0

    def _resources(self, op: int, index: int) -> bytes:
        """The ``index``-th live client's objects (devd_proto: RESOURCES)."""
        live = [c for c in self._clients if not c.dead]
        if index >= len(live):
            return REP.pack(op, errno.ENOENT, len(live))
        c = live[index]
        comm = ""
        if c.pid > 0:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                comm = Path(f"/proc/{c.pid}/comm").read_text().strip()
        body = json.dumps({"pid": c.pid, "comm": comm, "uid": c.uid,
                           "objects": c.resources}).encode()
        if REP.size + len(body) > MAX_CTRL:  # a forged report cannot make us send more
            body = json.dumps({"pid": c.pid, "comm": comm, "uid": c.uid,
                               "objects": {}}).encode()
        return REP.pack(op, 0, len(live)) + body

    def port_counters(self) -> dict[str, int]:
        """The device's port counters: retired + live clients' reports + devd's drops."""
        total = Counters()
        total.add(self._retired.as_dict())
        for c in self._clients:
            total.add(c.port_counters)
        own = self.counters
        total.rcvd_unknown_qp += own["unknown_qpn"] + own["closed_qpn"]
        total.rcvd_malformed += own["malformed"]
        total.rcvd_no_buffer += own["client_full"]
        # the kernel's drops on devd's own receive sockets (SO_RXQ_OVFL; issue 25)
        total.rcvd_rx_overflow += sum(link.stats.rx_overflow for link in self._links)
        total.rcvd_pkts += (own["unknown_qpn"] + own["closed_qpn"] + own["malformed"]
                            + own["client_full"])
        return total.as_dict()

    def _save_counters(self) -> None:
        """Write :meth:`port_counters` to ``NAME.counters.json`` (:mod:`softrdma.drivers.host.port_totals`)."""
        write_counters(self.counters_path, self.port_counters())

    def _alloc(self, c: Client, want: int) -> tuple[int, int]:
        if want == QPN_GSI:
            c.qp1_refs += 1
            if c not in self._qp1:
                self._qp1.append(c)
            return 0, QPN_GSI
        if want:
            if not 2 <= want <= QPN_LAST:
                return errno.EINVAL, 0
            if want in self._owners:
                return errno.EBUSY, 0
            return self._own(c, want), want
        return self._alloc_any(c)

    def _free(self, c: Client, qpn: int) -> int:
        if qpn == QPN_GSI:
            if c.qp1_refs == 0:
                return errno.ENOENT
            c.qp1_refs -= 1
            if c.qp1_refs == 0:
                self._qp1.remove(c)
                self._cm_release(c)
            return 0
        if self._owners.get(qpn) is not c:
            return errno.ENOENT
        self._disown(qpn)
        self._xrc_qpn_freed(qpn)
        return 0

"""The control requests of a devd client (:class:`~softrdma.drivers.devd.client.DevdLink`):
one request record on the control channel, one answer matched by its sequence number
(:mod:`.proto`), for QPNs, multicast groups, CM routing, counters and resources.

QPNs of the QPs a process creates and destroys (:meth:`DevdRequests.lease_qpn`,
:meth:`DevdRequests.release_qpn`) need no exchange each (issue 26: two per QP, each a
wake-up of devd and a wait for it to be scheduled, 0.1 to 2 ms on a busy machine):
QPNs are taken :data:`QPN_LEASE` at a time (the next lease asked for when half of one
is used, so its answers are there when it is needed), and the numbers of destroyed QPs
are given back in the same exchange (or once :data:`QPN_LEASE` wait), their FREE and
ALLOC records sent back to back and at most the ALLOCs waited for (devd handles a client's records in
order; the answers of these pipelined records are matched by their sequence numbers
whenever the channel is next read). devd still hands out every QPN (its round robin, so
a number is not reused soon, IBA 12.9.8.3) and knows each one's owner; a destroyed QP's
number stays this process's (its packets come here and are dropped as for no QP) until
it is given back.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from softrdma.drivers.devd.proto import (
    MAX_CTRL,
    OP_ALLOC_QPN,
    OP_ATTACH_MCAST,
    OP_CM_LISTEN,
    OP_CM_SLOT,
    OP_CM_UNLISTEN,
    OP_COUNTERS,
    OP_DETACH_MCAST,
    OP_FREE_QPN,
    OP_REPORT,
    OP_REPORT_RESOURCES,
    OP_RESOURCES,
    OP_STATS,
    OP_XRC_LOOKUP,
    OP_XRC_SRQ,
    OP_XRCD_CLOSE,
    OP_XRCD_OPEN,
    QPN_LAST,
    REP,
    REQ,
    SEQ_OFFSET,
    STAT_NAMES,
    U64,
    with_seq,
)
from softrdma.drivers.host.registry import DeviceRecord
from softrdma.errors import ClosedError, DeviceError, InvalidArgument

__all__ = ["DevdRequests", "QPN_LEASE", "MAX_UNANSWERED"]

#: QPNs :meth:`DevdRequests.lease_qpn` takes from devd in one exchange
QPN_LEASE = 16
#: pipelined records (ALLOCs of a lease, FREEs) left unanswered at most
MAX_UNANSWERED = 64


class _Pipelined:
    """The records sent without waiting for their answers, and what their answers gave."""

    __slots__ = ("sent", "spare", "freed", "alloc_err", "free_errors")

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}  # sequence number -> op
        self.spare: deque[int] = deque()  # leased QPNs not handed out yet
        self.freed: list[int] = []  # released QPNs not given back yet
        self.alloc_err = 0  # the errno of the last refused ALLOC of a lease
        self.free_errors = 0  # FREEs devd refused (a QPN not ours: a bug, counted)

    def allocs(self) -> int:
        return sum(1 for op in self.sent.values() if op == OP_ALLOC_QPN)


class DevdRequests:
    """The control requests of :class:`~softrdma.drivers.devd.client.DevdLink` (a part of
    it, which sets these attributes when it connects)."""

    record: DeviceRecord
    daemon_pid: int
    daemon_gone: bool
    ctrl_timeout: float
    stale_replies: int
    last_report: dict[str, int]
    last_resources: dict[str, Any]
    _closed: bool
    _closed_why: str
    _ctrl_lock: threading.Lock
    _ctrl: socket.socket
    _seq: int
    #: devd numbers its answers (seen on an answer): records may then be pipelined
    _numbered = False
    _pipe: _Pipelined | None = None

    def _request(self, op: int, arg: int = 0, mgid: bytes = bytes(16),
                 fds: Sequence[int] = (), body: bytes = b"") -> tuple[int, bytes]:
        """Send one request and wait for its answer, at most :attr:`ctrl_timeout` seconds
        (then DeviceError ETIMEDOUT, or EAGAIN if it could not even be sent; the daemon
        may be stalled, not gone). Answers are
        matched by the request's sequence number (:mod:`.proto`): a late answer to
        an earlier request that timed out is dropped when it comes."""
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: {self._closed_why}")
        with self._ctrl_lock:
            self._seq = seq = self._seq % 0xFF + 1
            record = with_seq(REQ.pack(op, arg, mgid), seq) + body
            deadline = time.monotonic() + self.ctrl_timeout
            sent = False
            try:
                self._ctrl.settimeout(self.ctrl_timeout)
                if fds:
                    socket.send_fds(self._ctrl, [record], list(fds), socket.MSG_NOSIGNAL)
                else:
                    self._ctrl.send(record, socket.MSG_NOSIGNAL)
                sent = True
                while True:
                    self._ctrl.settimeout(max(deadline - time.monotonic(), 1e-3))
                    rep = self._ctrl.recv(MAX_CTRL)
                    if len(rep) < REP.size or rep[SEQ_OFFSET] in (seq, 0):
                        break  # 0: a daemon that does not number its answers
                    if not self._settle(rep):
                        self.stale_replies += 1
                if len(rep) >= REP.size and rep[SEQ_OFFSET] == seq:
                    self._numbered = True
            except TimeoutError as exc:
                what = "answer" if sent else "take"
                raise DeviceError(
                    f"device {self.record.name!r}: devd (pid {self.daemon_pid}) did not "
                    f"{what} request op {op} within {self.ctrl_timeout:g} s",
                    errno=errno.ETIMEDOUT if sent else errno.EAGAIN,
                ) from exc
            except OSError as exc:
                self.daemon_gone = True
                raise DeviceError(f"device {self.record.name!r}: devd: {exc}") from exc
        if len(rep) < REP.size:
            self.daemon_gone = True
            raise DeviceError(f"device {self.record.name!r}: devd closed the connection")
        rop, err, value = REP.unpack_from(rep)
        if rop != op:
            raise DeviceError(f"device {self.record.name!r}: devd answered op {rop} to {op}")
        if err:
            raise DeviceError(
                f"device {self.record.name!r}: devd: {os.strerror(err)}", errno=err
            )
        return value, rep[REP.size :]

    def alloc_qpn(self, want: int = 0) -> int:
        """A fresh QPN unique on the device (``want=1``: register for QP1 MADs)."""
        if not 0 <= want <= QPN_LAST:
            raise InvalidArgument("want", f"QPN {want:#x} out of range")
        return self._request(OP_ALLOC_QPN, want)[0]

    def free_qpn(self, qpn: int) -> None:
        """Give ``qpn`` back (DeviceError ENOENT if this client does not own it). Once the
        daemon is gone there is nothing to give back: a no-op (QPs can be destroyed)."""
        if not 0 <= qpn <= QPN_LAST:
            raise InvalidArgument("qpn", f"QPN {qpn:#x} out of range")
        self._release_request(OP_FREE_QPN, qpn)

    def _release_request(self, op: int, arg: int) -> None:
        """A request that gives something back: nothing to do once the daemon is gone,
        and ETIMEDOUT is no error (devd is stalled; it has the request and acts on it
        when it resumes, its late answer dropped), so a QP or XRCD can still be
        destroyed."""
        if self.daemon_gone:
            return
        try:
            self._request(op, arg)
        except DeviceError as exc:
            if not self.daemon_gone and exc.errno != errno.ETIMEDOUT:
                raise

    # ---- pipelined QPN requests (see the module docstring) ------------------------------
    def lease_qpn(self) -> int:
        """A fresh QPN unique on the device, as :meth:`alloc_qpn`, from a lease of
        :data:`QPN_LEASE` taken in one exchange, the next one asked for when half of it
        is used (a daemon that does not number its answers: :meth:`alloc_qpn`)."""
        if not self._numbered:
            return self.alloc_qpn()
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: {self._closed_why}")
        with self._ctrl_lock:
            pipe = self._pipeline()
            with self._ctrl_errors("ALLOC_QPN"):
                if not pipe.spare:  # the answers that came meanwhile
                    self._collect(None)
                if len(pipe.spare) <= QPN_LEASE // 2 and not pipe.allocs():
                    # the next lease, asked for before it is needed
                    self._give_back(pipe)
                    for _ in range(QPN_LEASE):
                        self._send_pipelined(OP_ALLOC_QPN, 0)
                if not pipe.spare:
                    self._collect(lambda: bool(pipe.spare) or not pipe.allocs())
            if pipe.spare:
                return pipe.spare.popleft()
            err, pipe.alloc_err = pipe.alloc_err or errno.ENOSPC, 0
        raise DeviceError(f"device {self.record.name!r}: devd: {os.strerror(err)}", errno=err)

    def release_qpn(self, qpn: int) -> None:
        """Give ``qpn`` back as :meth:`free_qpn`, at the next lease or once
        :data:`QPN_LEASE` numbers wait, without waiting for devd's answer (a refusal is
        counted in :attr:`qpn_free_errors`)."""
        if not 0 <= qpn <= QPN_LAST:
            raise InvalidArgument("qpn", f"QPN {qpn:#x} out of range")
        if not self._numbered or self._closed:
            self.free_qpn(qpn)
            return
        if self.daemon_gone:
            return
        with self._ctrl_lock:
            pipe = self._pipeline()
            pipe.freed.append(qpn)
            if len(pipe.freed) < QPN_LEASE:
                return
            try:
                with self._ctrl_errors("FREE_QPN"):
                    self._collect(None)
                    self._give_back(pipe)
            except DeviceError:
                # devd is stalled (it frees the QPNs when it resumes, if it took the
                # records) or gone: a QP can still be destroyed, as with free_qpn
                if not self.daemon_gone:
                    pipe.free_errors += 1

    def _give_back(self, pipe: _Pipelined) -> None:
        """Send the FREEs of the released QPNs (under ``_ctrl_lock``)."""
        if len(pipe.sent) + len(pipe.freed) > MAX_UNANSWERED:
            self._collect(lambda: len(pipe.sent) + len(pipe.freed) <= MAX_UNANSWERED)
        while pipe.freed:
            self._send_pipelined(OP_FREE_QPN, pipe.freed[-1])
            pipe.freed.pop()

    @property
    def qpn_free_errors(self) -> int:
        """FREEs of :meth:`release_qpn` that devd refused or that could not be sent."""
        return self._pipe.free_errors if self._pipe is not None else 0

    def _pipeline(self) -> _Pipelined:
        if self._pipe is None:
            self._pipe = _Pipelined()
        return self._pipe

    def _send_pipelined(self, op: int, arg: int) -> None:
        """Send one record whose answer is taken later (under ``_ctrl_lock``)."""
        pipe = self._pipeline()
        self._seq = seq = self._seq % 0xFF + 1
        self._ctrl.settimeout(self.ctrl_timeout)
        self._ctrl.send(with_seq(REQ.pack(op, arg, bytes(16)), seq), socket.MSG_NOSIGNAL)
        pipe.sent[seq] = op

    def _settle(self, rep: bytes) -> bool:
        """Take the answer ``rep`` if it is a pipelined record's (under ``_ctrl_lock``)."""
        pipe = self._pipe
        if pipe is None or len(rep) < REP.size:
            return False
        op = pipe.sent.pop(rep[SEQ_OFFSET], None)
        if op is None:
            return False
        rop, err, value = REP.unpack_from(rep)
        if rop != op:
            err = err or errno.EPROTO
        if op == OP_ALLOC_QPN:
            if err:
                pipe.alloc_err = err
            else:
                pipe.spare.append(value)
        elif err:
            pipe.free_errors += 1
        return True

    def _collect(self, until: Callable[[], bool] | None) -> None:
        """Read the answers of pipelined records (under ``_ctrl_lock``): those already
        there (``until`` None), else until ``until()`` holds, at most
        :attr:`ctrl_timeout` seconds (TimeoutError)."""
        pipe = self._pipeline()
        deadline = time.monotonic() + self.ctrl_timeout
        while pipe.sent:
            if until is None:
                self._ctrl.settimeout(0.0)  # non-blocking (a timeout would poll first)
                try:
                    rep = self._ctrl.recv(MAX_CTRL)
                except BlockingIOError:
                    return
            else:
                if until():
                    return
                self._ctrl.settimeout(max(deadline - time.monotonic(), 1e-3))
                rep = self._ctrl.recv(MAX_CTRL)
            if len(rep) < REP.size:
                raise ConnectionResetError(errno.ECONNRESET, "devd closed the connection")
            if not self._settle(rep):
                self.stale_replies += 1

    def _ctrl_errors(self, what: str) -> _CtrlErrors:
        return _CtrlErrors(self, what)

    def attach_mcast(self, mgid: bytes) -> None:
        """Receive datagrams to DestQP 0xFFFFFF whose destination GID is ``mgid``."""
        self._request(OP_ATTACH_MCAST, 0, _check_mgid(mgid))

    def detach_mcast(self, mgid: bytes) -> None:
        """Undo one :meth:`attach_mcast`."""
        self._request(OP_DETACH_MCAST, 0, _check_mgid(mgid))

    def cm_slot(self) -> int:
        """Become a routed CM client of the device (a QP1 registration, undone by
        ``free_qpn(1)``); the slot byte for the top of this client's comm IDs."""
        return self._request(OP_CM_SLOT)[0]

    def cm_listen(self, service_id: int, mask: int, listen: bool = True) -> None:
        """Route REQs/SIDR_REQs for ``service_id`` under ``mask`` here (``listen``
        False: stop). DeviceError EADDRINUSE if another process listens on it."""
        for name, val in (("service_id", service_id), ("mask", mask)):
            if not 0 <= val < 1 << 64:
                raise InvalidArgument(name, "must be a 64-bit value")
        raw = service_id.to_bytes(8, "big") + mask.to_bytes(8, "big")
        self._request(OP_CM_LISTEN if listen else OP_CM_UNLISTEN, 0, raw)

    # ---- XRC domains shared by processes (:mod:`.xrc`) ---------------------------------
    def xrcd_open(self, fd: int) -> int:
        """Join the XRC domain of the file open on ``fd`` (XRCD_OPEN): its id on the
        device, the same in every process that opens the same file."""
        return self._request(OP_XRCD_OPEN, fds=[fd])[0]

    def xrcd_close(self, domain: int) -> None:
        """Undo one :meth:`xrcd_open` (a no-op once the daemon is gone)."""
        if not self._closed:
            self._release_request(OP_XRCD_CLOSE, domain)

    def xrc_srq(self, domain: int, srqn: int) -> None:
        """Register this process's XRC SRQ ``srqn`` (a QPN it holds) in ``domain``."""
        self._request(OP_XRC_SRQ, srqn, _xrc_domain(domain))

    def xrc_lookup(self, domain: int, srqn: int) -> bool:
        """Whether another process registered XRC SRQ ``srqn`` in ``domain``."""
        try:
            self._request(OP_XRC_LOOKUP, srqn, _xrc_domain(domain))
        except DeviceError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def report_counters(self, values: dict[str, int]) -> None:
        """Tell the daemon this process's port counters (cumulative; see the module
        docstring, "Port counters of a shared device")."""
        body = json.dumps(values, separators=(",", ":")).encode()
        try:
            self._request(OP_REPORT, body=body)
        except DeviceError as exc:
            if exc.errno != errno.EINVAL:
                raise
            raise DeviceError(f"device {self.record.name!r}: devd refused the counter "
                              "report", errno=exc.errno) from exc
        self.last_report = dict(values)

    def report_resources(self, objects: dict[str, Any]) -> None:
        """Tell the daemon this process's objects on the device (the module docstring of
        :mod:`softrdma.drivers.host.resources`); ``softrdma res show`` lists them."""
        body = json.dumps(objects, separators=(",", ":")).encode()
        if REQ.size + len(body) > MAX_CTRL:
            raise InvalidArgument("objects", f"{len(body)} bytes do not fit a control record")
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: {self._closed_why}")
        with self._ctrl_lock:
            try:
                if self._pipe is not None:  # this exchange's answer is not numbered
                    self._collect(lambda: False)
                self._ctrl.send(REQ.pack(OP_REPORT_RESOURCES, 0, bytes(16)) + body,
                                socket.MSG_NOSIGNAL)
                rep = self._ctrl.recv(4096)
            except OSError as exc:
                raise DeviceError(f"device {self.record.name!r}: devd: {exc}") from exc
        if len(rep) < REP.size or REP.unpack_from(rep)[1]:
            raise DeviceError(f"device {self.record.name!r}: devd refused the resource report")
        self.last_resources = objects

    def resources(self) -> list[dict[str, Any]]:
        """Every live client's objects on the device, as devd knows them (RESOURCES):
        ``[{"pid": P, "comm": NAME, "uid": U, "objects": {...}}, ...]``."""
        out: list[dict[str, Any]] = []
        index = 0
        while index < 1 << 16:
            try:
                _, rest = self._request(OP_RESOURCES, index)
            except DeviceError as exc:
                if exc.errno == errno.ENOENT:
                    return out
                raise
            try:
                got = json.loads(rest)
            except ValueError as exc:
                raise DeviceError(f"device {self.record.name!r}: bad RESOURCES answer") from exc
            if isinstance(got, dict):
                out.append(got)
            index += 1
        return out

    def device_counters(self) -> dict[str, int]:
        """The device's port counters as the daemon aggregates them (every process's last
        report, the processes that left, the daemon's own drops)."""
        _, rest = self._request(OP_COUNTERS)
        try:
            got = json.loads(rest)
            port = got["port"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DeviceError(f"device {self.record.name!r}: bad COUNTERS answer") from exc
        return {str(k): int(v) for k, v in port.items()}

    def stats(self) -> dict[str, int]:
        """The daemon's counters (:data:`STAT_NAMES`)."""
        n, rest = self._request(OP_STATS)
        return {
            name: U64.unpack_from(rest, i * 8)[0]
            for i, name in enumerate(STAT_NAMES[: min(n, len(rest) // 8)])
        }


def _xrc_domain(domain: int) -> bytes:
    if not 0 < domain <= 0xFFFFFFFF:
        raise InvalidArgument("domain", f"XRC domain id {domain!r} out of range")
    return domain.to_bytes(4, "big") + bytes(12)


class _CtrlErrors:
    """Turns the control channel's failures during pipelined requests into
    :class:`DeviceError` (ETIMEDOUT: devd is stalled; else it is gone)."""

    def __init__(self, link: DevdRequests, what: str) -> None:
        self.link = link
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        link = self.link
        if isinstance(exc, TimeoutError):
            raise DeviceError(f"device {link.record.name!r}: devd (pid {link.daemon_pid}) "
                              f"did not answer {self.what} within {link.ctrl_timeout:g} s",
                              errno=errno.ETIMEDOUT) from exc
        if isinstance(exc, OSError):
            link.daemon_gone = True
            raise DeviceError(f"device {link.record.name!r}: devd: {exc}") from exc


def _check_mgid(mgid: bytes) -> bytes:
    if not isinstance(mgid, (bytes, bytearray)) or len(mgid) != 16:
        raise InvalidArgument("mgid", "an MGID is 16 bytes")
    return bytes(mgid)


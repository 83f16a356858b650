"""``devd``: the per-device demultiplexer process, and its client link.

design.md "Devices shared by processes": the transport engine runs in the process that
owns the QP; one ``devd`` per device owns the device's UDP port (4791, Annex A17; ../shared/specs/roce.md §1) on
every IP address of its netdev and forwards each received datagram, unmodified, to the
process that owns the BTH DestQP (bytes 5-7 of the UDP payload, IBA 9.2). Processes send
directly from their own UDP sockets, so only the receive path pays the extra local hop.
``devd`` also allocates the device's QP numbers, so they are unique per device.

Running it::

    python -m softrdma.drivers.devd NAME [--state-dir DIR] [--idle-timeout S]
                                         [--netdev IF] [--port N] [--ip ADDR ...] [--daemonize]

or in-process (tests): ``Devd(record, state_dir).serve_forever()`` in a thread, stopped by
:meth:`Devd.shutdown`. :func:`ensure_devd` starts a detached daemon if none is running.

Files in the state directory (:func:`softrdma.drivers.registry.state_dir`):

* ``NAME.sock``: the Unix ``SOCK_SEQPACKET`` listening socket;
* ``NAME.devd.lock``: ``flock``-ed by the live daemon for its whole life. Whoever gets
  the lock knows that any ``NAME.sock`` left behind belongs to a dead daemon (stale), and
  replaces it;
* ``NAME.spawn.lock``: serialises :func:`ensure_devd` calls so two starts don't race;
* ``NAME.pid``: the daemon's pid; ``NAME.log``: a detached daemon's stderr.

The daemon exits by itself ``idle_timeout`` seconds (default 5) after its last client
left (or after it started, if no client ever came), removing its socket and pid file.

Protocol (all integers big-endian, every message one SEQPACKET record)
-----------------------------------------------------------------------

On accepting a control connection the daemon creates a SEQPACKET socket pair, sends the
client one end with ``SCM_RIGHTS`` inside the HELLO, and keeps the other: that is the
client's **data channel**. Control requests and replies never mix with data, so a
progress thread can drain data while another thread allocates QPNs.

``HELLO`` (daemon -> client, control, carries the data fd)::

    _HELLO "!4sHHIH": magic b"SRDV", version 1, udp_port, daemon pid, n_ips
    then n_ips x 16 bytes: the addresses the daemon listens on (IPv4 as ::ffff:a.b.c.d)

Requests (client -> daemon, control), one fixed-size record::

    _REQ "!BxxxI16s": op, arg, mgid
      ALLOC_QPN    1  arg 0: any free QPN, allocated upwards from 0x11, wrapping, skipping
                         QPNs in use; arg 1: register for QP1 (several clients may; QP1 MADs
                         go to all of them); other arg: that QPN if it is free
      FREE_QPN     2  arg = QPN (for QP1: drop one QP1 registration)
      ATTACH_MCAST 3  mgid = the 16-byte MGID (Annex A17; ../shared/specs/roce.md §4: IPv4 group as ::ffff:a.b.c.d);
                      the first attachment makes the daemon join the IP group on its
                      socket of that family (EINVAL: not a multicast GID; EAFNOSUPPORT: no
                      address of that family; EADDRNOTAVAIL: the kernel refused the join)
      DETACH_MCAST 4  mgid (the last detachment leaves the IP group)
      STATS        5  (no argument)
      CM_SLOT      6  make this client a routed CM client (implies a QP1 registration) and
                      give it a slot byte 1..255, unique on the device, as the value: its
                      CM puts it in the top byte of its communication and SIDR request IDs
      CM_LISTEN    7  mgid = Service ID (8 bytes) + mask (8 bytes): REQs and SIDR_REQs
                      matching it go to this client (EADDRINUSE if another client has
                      the same Service ID and mask)
      CM_UNLISTEN  8  mgid as for CM_LISTEN
      REPORT       9  followed by JSON {name: value}: this client's port counters
                      (cumulative, :class:`softrdma.seam.counters.Counters`); the daemon keeps
                      the last report of each client and adds it to the device's retired
                      total when the client leaves
      COUNTERS    10  (no argument): the device's port counters, aggregated

Replies (daemon -> client, control)::

    _REP "!BxHI": op (echoed), errno (0 = success), value (the QPN for ALLOC_QPN,
    else 0; for STATS the number of counters, followed by that many "!Q" in the order
    of STAT_NAMES; for COUNTERS followed by JSON {"port": {...}, "devd": {...},
    "clients": N})

Port counters of a shared device (``softrdma stats``, ``Context.query_port_counters``):
each process counts its own packets in its engine and reports them to the daemon at
most every :data:`~softrdma.drivers.runtime.REPORT_INTERVAL` seconds and when it closes;
the daemon's COUNTERS answer is the sum of the retired clients' totals, the live
clients' last reports, and the daemon's own drops (``unknown_qpn`` ->
``rcvd_unknown_qp``, ``malformed`` -> ``rcvd_malformed``, ``client_full`` ->
``rcvd_no_buffer``, each also a received packet).

Data (daemon -> client, data channel): ``_DHDR`` followed by the UDP payload as
received (BTH .. ICRC)::

    _DHDR "!BBBxHH16s16s": ip version (4 or 6), tos, ttl, sport, dport, src, dst
    (addresses as 16 bytes, IPv4 as ::ffff:a.b.c.d)

Delivery rules: DestQP 1 -> CM MADs are routed (below), other QP1 MADs go to every client
registered for QP1; DestQP 0xFFFFFF (multicast,
IBA 10.5) -> every client that attached the MGID equal to the datagram's destination GID
(Annex A17; ../shared/specs/roce.md §4; as rxe_rcv_mcast_pkt); any other DestQP -> its owner. Datagrams shorter
than a BTH are counted ``malformed``; unknown DestQPs ``unknown_qpn``; a client whose
data channel is full loses the datagram (``client_full``), like a NIC that is out of
receive buffers. When a client disconnects (either channel), its QPNs, QP1
registrations and multicast attachments are freed.

CM MAD routing (QP1, management class 0x07; ../shared/specs/ib-cm.md §7, IBA 12.6): a REQ or SIDR_REQ goes
to the client listening on its Service ID (most specific mask), a SIDR_REP to the client
whose slot is the top byte of its Request ID, any other CM message to the client whose
slot is the top byte of its Remote Communication ID. QP1 clients registered without a
slot (``ALLOC_QPN 1``) still receive every CM MAD nobody else claims. A REQ no one can
take (no listener, no unrouted client) is answered by the daemon itself: REJ reason 8,
Invalid Service ID (a SIDR_REQ: SIDR_REP status 1), as a CM without a listener would
(IBA 12.6.7, A11 CA11-8). A REJ whose slot is unknown (a Timeout REJ naming its target
by GUID) goes to every QP1 client.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from softrdma.drivers import netdev as _netdev
from softrdma.drivers.admission import (
    MAX_CLIENTS_PER_UID,
    DevdRefused,
    Spare,
    out_of_descriptors,
    peer_uid,
    per_uid_cap,
    raise_nofile,
    refusal_reason,
    refuse,
)
from softrdma.drivers.cm_reject import RejLimiter, answer_for, sane_request
from softrdma.drivers.devd_v1 import V1_VERSION, send_reversible_v1, v1_datagram
from softrdma.drivers.link import (
    Datagram,
    GidEntry,
    gid_entries,
    ip_bytes,
    ip_text,
)
from softrdma.drivers.mcast import is_mgid, mgid_to_group
from softrdma.drivers.rawether import RawEtherLink
from softrdma.drivers.registry import DeviceRecord, Registry, ensure_state_dir, open_state_file
from softrdma.drivers.registry import state_dir as default_state_dir
from softrdma.drivers.udp import UdpLink
from softrdma.errors import ClosedError, DeviceError, InvalidArgument, SoftRdmaError
from softrdma.seam.counters import Counters
from softrdma.wire.gid import gid_to_ip, ip_to_gid
from softrdma.wire.roce import udp_send_icrc
from softrdma.wire.rocev1 import GRH_SIZE, is_multicast_gid

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "STAT_NAMES",
    "Devd",
    "DevdLink",
    "ensure_devd",
    "main",
    "socket_path",
]

DEFAULT_IDLE_TIMEOUT = 5.0
PROTOCOL_VERSION = 1
MAGIC = b"SRDV"

OP_ALLOC_QPN = 1
OP_FREE_QPN = 2
OP_ATTACH_MCAST = 3
OP_DETACH_MCAST = 4
OP_STATS = 5
OP_CM_SLOT = 6
OP_CM_LISTEN = 7
OP_CM_UNLISTEN = 8
OP_REPORT = 9
OP_COUNTERS = 10

_HELLO = struct.Struct("!4sHHIH")
_REQ = struct.Struct("!BxxxI16s")
_REP = struct.Struct("!BxHI")
_DHDR = struct.Struct("!BBBxHH16s16s")
_U64 = struct.Struct("!Q")

QPN_GSI = 1  # IBA 3.5.8 / ../shared/specs/roce.md §6
QPN_MULTICAST = 0xFFFFFF  # IBA 10.5
QPN_FIRST = 0x11
QPN_LAST = 0xFFFFFE
BTH_SIZE = 12

STAT_NAMES = ("rx", "forwarded", "unknown_qpn", "malformed", "client_full", "clients",
              "cm_routed", "cm_rejected", "clients_refused", "cm_bad_req", "cm_rej_limited")

# CM MADs on QP1: BTH (12) + DETH (8), then the 256-byte MAD (IBA 13.4; ../shared/specs/ib-cm.md §7)
_MAD_OFF = BTH_SIZE + 8
_MAD_SIZE = 256
_CM_CLASS = 0x07
_ATTR_REQ, _ATTR_REJ, _ATTR_SIDR_REQ, _ATTR_SIDR_REP = 0x0010, 0x0012, 0x0017, 0x0018
_UD_SEND_ONLY = 0x64
_BTH_DETH = struct.Struct("!BBHIIII")

MAX_DATAGRAM = 16384  # the largest UDP payload the daemon receives and forwards
_MAX_CTRL = 65536  # the largest control record (a REPORT carries JSON)
_DATA_SNDBUF = 4 << 20
_RECV_BATCH = 64


def socket_path(name: str, directory: Path | str | None = None) -> Path:
    """``<state_dir>/<name>.sock``."""
    return Path(directory if directory is not None else default_state_dir()) / f"{name}.sock"


def _device_addresses(netdev: str) -> list[bytes]:
    """The netdev's usable addresses: IPv4, then IPv6 global, then IPv6 link-local."""
    nd = _netdev.get(netdev)
    v6 = [a for a in nd.ipv6 if a.usable]
    v6.sort(key=lambda a: a.scope == _netdev.IPV6_SCOPE_LINK)
    return list(nd.ipv4) + [a.address for a in v6]


def _bind_text(ip: bytes, netdev: str) -> str:
    """An address as UdpLink wants it; IPv6 link-local ones carry ``%netdev`` (scope)."""
    text = ip_text(ip)
    if len(ip) == 16 and ip[0] == 0xFE and ip[1] & 0xC0 == 0x80:
        text += f"%{netdev}"
    return text


@contextlib.contextmanager
def _flock(path: Path, timeout: float, what: str) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path``, waiting at most ``timeout`` seconds."""
    fd = open_state_file(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise DeviceError(f"{what}: {path} is locked by another process") from None
                time.sleep(0.01)
        yield fd
    finally:
        os.close(fd)


# -------------------------------------------------------------------------------------
# the daemon
# -------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Client:
    ctrl: socket.socket
    data: socket.socket
    qpns: set[int] = field(default_factory=set)
    qp1_refs: int = 0
    mcast: dict[bytes, int] = field(default_factory=dict)
    dead: bool = False
    cm_slot: int = 0
    cm_listens: set[tuple[int, int]] = field(default_factory=set)
    port_counters: dict[str, int] = field(default_factory=dict)
    uid: int = -1


def _client_recv(c: _Client, sock: socket.socket, size: int) -> bytes | None:
    """The next message on one of ``c``'s sockets; None when none is waiting, or when the
    client is gone (then ``c`` is marked dead)."""
    try:
        msg = sock.recv(size)
    except BlockingIOError:
        return None
    except OSError:
        c.dead = True
        return None
    if not msg:
        c.dead = True
        return None
    return msg


class Devd:
    """The demultiplexer of one device (see the module docstring for the protocol).

    ``record``: the device (roce only). ``state_dir``: where the socket, lock and pid
    files go (default :func:`~softrdma.drivers.registry.state_dir`). ``idle_timeout``:
    seconds without clients before :meth:`serve_forever` returns. ``ips``: serve these
    addresses instead of the netdev's (tests). ``lock_wait``: how long :meth:`start`
    waits for a previous daemon of the same device to finish exiting.
    A ``record.udp_port`` of 0 binds an ephemeral port (tests); :attr:`udp_port` tells it.
    """

    def __init__(
        self,
        record: DeviceRecord,
        state_dir: Path | str | None = None,
        *,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        ips: Sequence[str | bytes] | None = None,
        lock_wait: float = 2.0,
        max_clients_per_uid: int = MAX_CLIENTS_PER_UID,
    ) -> None:
        if record.type != "roce":
            raise DeviceError(f"device {record.name!r}: devd serves roce devices only")
        if idle_timeout < 0:
            raise InvalidArgument("idle_timeout", "must be >= 0")
        self.record = record
        self.directory = ensure_state_dir(
            Path(state_dir) if state_dir is not None else default_state_dir()
        )
        self.idle_timeout = idle_timeout
        self.lock_wait = lock_wait
        self._ips_override = [ip_bytes(ip, "ips") for ip in ips] if ips is not None else None
        self.socket_path = socket_path(record.name, self.directory)
        self.pid_path = self.directory / f"{record.name}.pid"
        self.lock_path = self.directory / f"{record.name}.devd.lock"
        self.udp_port = record.udp_port
        self.ips: tuple[bytes, ...] = ()
        self.counters: dict[str, int] = dict.fromkeys(STAT_NAMES, 0)
        self._links: list[UdpLink] = []
        self._raw: RawEtherLink | None = None  # RoCEv1 (Annex A16), roce_ver 1 or both
        self._listener: socket.socket | None = None
        self._lock_fd = -1
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel: selectors.BaseSelector | None = None
        self._clients: list[_Client] = []
        self._owners: dict[int, _Client] = {}
        self._qp1: list[_Client] = []
        self._groups: dict[bytes, list[_Client]] = {}
        self._slots: dict[int, _Client] = {}
        self._next_slot = 1
        self._cm_listeners: dict[tuple[int, int], _Client] = {}
        self._next_qpn = QPN_FIRST
        self._retired = Counters()  # port counters of clients that left
        self.max_clients_per_uid = max_clients_per_uid
        self._uid_cap = max_clients_per_uid
        self._per_uid: dict[int, int] = {}
        self._spare: Spare | None = None
        self._rej_limiter = RejLimiter()
        self._stop = False
        self._started = False
        self._closed = False
        self.ready = threading.Event()

    # -- start / stop ------------------------------------------------------------------

    def _device_ips(self) -> list[bytes]:
        ips = (
            list(self._ips_override)
            if self._ips_override is not None
            else _device_addresses(self.record.netdev)
        )
        if not ips:
            raise DeviceError(
                f"device {self.record.name!r}: netdev {self.record.netdev!r} has no IP address"
            )
        return ips

    def start(self) -> None:
        """Take the device lock, bind UDP and the control socket; DeviceError on failure."""
        if self._started:
            return
        name = self.record.name
        try:
            self._lock_fd = open_state_file(self.lock_path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise DeviceError(f"devd {name}: cannot open {self.lock_path}: {exc}") from exc
        try:
            deadline = time.monotonic() + self.lock_wait  # a previous daemon may be exiting
            while True:
                try:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise DeviceError(
                            f"devd {name}: another devd already serves this device"
                        ) from None
                    time.sleep(0.01)
            self._uid_cap = per_uid_cap(raise_nofile(), self.max_clients_per_uid)
            self._spare = Spare()
            if self.record.roce_v2:
                self._bind_udp()
            else:  # RoCEv1 only: no UDP port; the addresses are still GIDs (Annex A16; ../shared/specs/roce.md §4)
                self.ips = tuple(_device_addresses(self.record.netdev))
            if self.record.roce_v1:
                self._raw = RawEtherLink(self.record.netdev, vlan=self.record.vlan)
            self._bind_unix()
            pid_fd = open_state_file(self.pid_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(pid_fd, f"{os.getpid()}\n".encode())
            finally:
                os.close(pid_fd)
        except OSError as exc:
            self._cleanup()
            raise DeviceError(f"devd {name}: {exc}") from exc
        except BaseException:
            self._cleanup()
            raise
        self._sel = sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        assert self._listener is not None
        sel.register(self._listener, selectors.EVENT_READ, ("accept", None))
        links: list[UdpLink | RawEtherLink] = [*self._links]
        if self._raw is not None:
            links.append(self._raw)
        for link in links:
            fd = link.fileno()
            assert fd is not None
            sel.register(fd, selectors.EVENT_READ, ("udp", link))
        self._started = True
        self.ready.set()

    def _bind_udp(self) -> None:
        port = self.record.udp_port
        ips = self._device_ips()
        for ip in ips:
            try:
                link = UdpLink(_bind_text(ip, self.record.netdev), port, max_datagram=MAX_DATAGRAM)
            except SoftRdmaError as exc:
                raise DeviceError(f"devd {self.record.name}: {exc}") from exc
            except OSError as exc:
                raise DeviceError(
                    f"devd {self.record.name}: cannot bind UDP port {port} on {ip_text(ip)}: "
                    f"{exc.strerror or exc}"
                ) from exc
            self._links.append(link)
            if port == 0 and link.port is not None:
                port = link.port  # ephemeral (tests): every address uses the first one's port
        self.udp_port = port
        self.ips = tuple(ips)

    def _bind_unix(self) -> None:
        path = self.socket_path
        # We hold the device lock, so no live daemon owns the socket: whatever is there
        # is stale (its daemon died) and is replaced.
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(path))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise DeviceError(f"devd {self.record.name}: cannot listen on {path}: {exc}") from exc
        sock.setblocking(False)
        self._listener = sock

    def shutdown(self) -> None:
        """Ask :meth:`serve_forever` to return (thread- and signal-safe)."""
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _cleanup(self) -> None:
        if self._closed:
            return
        self._closed = True
        for c in list(self._clients):
            self._drop_client(c)
        for link in self._links:
            link.close()
        self._links.clear()
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            with contextlib.suppress(FileNotFoundError):
                self.pid_path.unlink()
        if self._sel is not None:
            self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._spare is not None:
            self._spare.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- main loop ---------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` or ``idle_timeout`` seconds without clients."""
        self.start()
        idle_since: float | None = time.monotonic()
        try:
            while not self._stop:
                timeout: float | None = None
                if idle_since is not None:
                    timeout = idle_since + self.idle_timeout - time.monotonic()
                    if timeout <= 0:
                        break
                assert self._sel is not None
                for key, _ in self._sel.select(timeout):
                    kind, obj = key.data
                    if kind == "udp":
                        assert isinstance(obj, (UdpLink, RawEtherLink))
                        self._on_udp(obj)
                    elif kind == "ctrl":
                        assert isinstance(obj, _Client)
                        self._on_ctrl(obj)
                    elif kind == "data":
                        assert isinstance(obj, _Client)
                        self._on_data_hup(obj)
                    elif kind == "accept":
                        self._on_accept()
                    else:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                for c in [c for c in self._clients if c.dead]:
                    self._drop_client(c)
                if self._clients:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
        finally:
            self._cleanup()

    def _on_accept(self) -> None:
        """Accept clients; refuse (never fail on) one over its uid's cap or when the
        descriptors run out (``softrdma.drivers.admission``)."""
        assert self._listener is not None
        while True:
            try:
                ctrl, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if out_of_descriptors(exc) and self._spare is not None:
                    if self._spare.shed(self._listener, f"devd out of descriptors: {exc.strerror}"):
                        self.counters["clients_refused"] += 1
                        continue
                return
            uid = peer_uid(ctrl)
            if self._per_uid.get(uid, 0) >= self._uid_cap:
                self.counters["clients_refused"] += 1
                refuse(ctrl, f"too many clients of uid {uid} (at most {self._uid_cap})")
                continue
            try:
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            except OSError as exc:
                self.counters["clients_refused"] += 1
                refuse(ctrl, f"devd cannot create a data channel: {exc.strerror}")
                continue
            ctrl.setblocking(False)
            with contextlib.suppress(OSError):
                mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _DATA_SNDBUF)
            mine.setblocking(False)
            hello = _HELLO.pack(MAGIC, PROTOCOL_VERSION, self.udp_port, os.getpid(), len(self.ips))
            hello += b"".join(ip_to_gid(ip) for ip in self.ips)
            try:
                socket.send_fds(ctrl, [hello], [theirs.fileno()])
            except OSError:
                ctrl.close()
                mine.close()
                continue
            finally:
                theirs.close()
            client = _Client(ctrl, mine, uid=uid)
            self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            self._clients.append(client)
            self.counters["clients"] += 1
            assert self._sel is not None
            self._sel.register(ctrl, selectors.EVENT_READ, ("ctrl", client))
            self._sel.register(mine, selectors.EVENT_READ, ("data", client))

    def _on_data_hup(self, c: _Client) -> None:
        """The data channel is readable: the client left, or it sends a self-addressed
        RoCEv1 packet (CA16-22), which is routed as if it had arrived from the wire."""
        while (msg := _client_recv(c, c.data, _DHDR.size + MAX_DATAGRAM)) is not None:
            dg = v1_datagram(msg, _DHDR.size)
            if dg is None or self._raw is None:
                self.counters["malformed"] += 1
                continue
            self._route(self._raw, [dg])

    def _drop_client(self, c: _Client) -> None:
        for qpn in c.qpns:
            if self._owners.get(qpn) is c:
                del self._owners[qpn]
        c.qpns.clear()
        if c in self._qp1:
            self._qp1.remove(c)
        self._cm_release(c)
        for mgid in c.mcast:
            members = self._groups.get(mgid)
            if members is not None and c in members:
                members.remove(c)
                if not members:
                    del self._groups[mgid]
                    self._leave_group(mgid)
        c.mcast.clear()
        self._retired.add(c.port_counters)
        c.port_counters = {}
        for s in (c.ctrl, c.data):
            if self._sel is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(s)
            s.close()
        if c in self._clients:
            self._clients.remove(c)
            left = self._per_uid.get(c.uid, 1) - 1
            if left > 0:
                self._per_uid[c.uid] = left
            else:
                self._per_uid.pop(c.uid, None)

    # -- control -----------------------------------------------------------------------

    def _on_ctrl(self, c: _Client) -> None:
        while (msg := _client_recv(c, c.ctrl, _MAX_CTRL)) is not None:
            reply = self._handle(c, msg)
            try:
                c.ctrl.send(reply)
            except OSError:
                c.dead = True
                return

    def _handle(self, c: _Client, msg: bytes) -> bytes:
        if len(msg) > _REQ.size and msg[0] == OP_REPORT:
            return _REP.pack(OP_REPORT, self._report(c, msg[_REQ.size :]), 0)
        if len(msg) != _REQ.size:
            return _REP.pack(msg[0] if msg else 0, errno.EINVAL, 0)
        op, arg, mgid = _REQ.unpack(msg)
        if op == OP_ALLOC_QPN:
            err, value = self._alloc(c, arg)
        elif op == OP_FREE_QPN:
            err, value = self._free(c, arg), 0
        elif op == OP_ATTACH_MCAST:
            err, value = self._attach(c, mgid), 0
        elif op == OP_DETACH_MCAST:
            err, value = self._detach(c, mgid), 0
        elif op == OP_CM_SLOT:
            err, value = self._cm_slot(c)
        elif op in (OP_CM_LISTEN, OP_CM_UNLISTEN):
            err, value = self._cm_listen(c, mgid, op == OP_CM_LISTEN), 0
        elif op == OP_COUNTERS:
            body = json.dumps({"port": self.port_counters(), "devd": self.counters,
                               "clients": len(self._clients)}).encode()
            return _REP.pack(op, 0, len(body)) + body
        elif op == OP_STATS:
            return _REP.pack(op, 0, len(STAT_NAMES)) + b"".join(
                _U64.pack(self.counters[n]) for n in STAT_NAMES
            )
        else:
            err, value = errno.EOPNOTSUPP, 0
        return _REP.pack(op, err, value)

    def _report(self, c: _Client, raw: bytes) -> int:
        try:
            values = json.loads(raw)
        except ValueError:
            return errno.EINVAL
        if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in values.items()
        ):
            return errno.EINVAL
        c.port_counters = values
        return 0

    def port_counters(self) -> dict[str, int]:
        """The device's port counters: retired + live clients' reports + devd's drops."""
        total = Counters()
        total.add(self._retired.as_dict())
        for c in self._clients:
            total.add(c.port_counters)
        own = self.counters
        total.rcvd_unknown_qp += own["unknown_qpn"]
        total.rcvd_malformed += own["malformed"]
        total.rcvd_no_buffer += own["client_full"]
        total.rcvd_pkts += own["unknown_qpn"] + own["malformed"] + own["client_full"]
        return total.as_dict()

    def _alloc(self, c: _Client, want: int) -> tuple[int, int]:
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
            self._owners[want] = c
            c.qpns.add(want)
            return 0, want
        span = QPN_LAST - QPN_FIRST + 1
        if len(self._owners) >= span:
            return errno.ENOSPC, 0
        qpn = self._next_qpn
        while qpn in self._owners:
            qpn = qpn + 1 if qpn < QPN_LAST else QPN_FIRST
        self._next_qpn = qpn + 1 if qpn < QPN_LAST else QPN_FIRST
        self._owners[qpn] = c
        c.qpns.add(qpn)
        return 0, qpn

    def _free(self, c: _Client, qpn: int) -> int:
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
        del self._owners[qpn]
        c.qpns.discard(qpn)
        return 0

    # -- CM routing ------------------------------------------------------------------

    def _cm_slot(self, c: _Client) -> tuple[int, int]:
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

    def _cm_listen(self, c: _Client, raw: bytes, add: bool) -> int:
        sid, mask = int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big")
        key = (sid & mask, mask)
        if not c.cm_slot:
            return errno.EINVAL
        cur = self._cm_listeners.get(key)
        if add:
            if cur is not None and cur is not c:
                return errno.EADDRINUSE
            self._cm_listeners[key] = c
            c.cm_listens.add(key)
            return 0
        if cur is not c:
            return errno.ENOENT
        del self._cm_listeners[key]
        c.cm_listens.discard(key)
        return 0

    def _cm_release(self, c: _Client) -> None:
        if c.cm_slot and self._slots.get(c.cm_slot) is c:
            del self._slots[c.cm_slot]
        c.cm_slot = 0
        for key in c.cm_listens:
            if self._cm_listeners.get(key) is c:
                del self._cm_listeners[key]
        c.cm_listens.clear()

    def _cm_listener(self, sid: int) -> _Client | None:
        best: tuple[int, _Client] | None = None
        for (value, mask), c in self._cm_listeners.items():
            if sid & mask == value and (best is None or mask > best[0]):
                best = (mask, c)
        return None if best is None else best[1]

    def _route_qp1(self, link: UdpLink | RawEtherLink, dg: Datagram) -> Sequence[_Client]:
        """The clients a QP1 datagram goes to (see "CM MAD routing" above)."""
        d = dg.data
        mad = _MAD_OFF
        if len(d) < mad + _MAD_SIZE or d[mad + 1] != _CM_CLASS or not self._slots:
            return self._qp1
        legacy = [c for c in self._qp1 if not c.cm_slot]
        attr = int.from_bytes(d[mad + 16 : mad + 18], "big")
        if attr in (_ATTR_REQ, _ATTR_SIDR_REQ):
            owner = self._cm_listener(int.from_bytes(d[mad + 32 : mad + 40], "big"))
            if owner is not None:
                self.counters["cm_routed"] += 1
                return (owner,)
            if not legacy:
                self._reject_unlistened(link, dg, attr)
            return legacy
        slot = d[mad + 24] if attr == _ATTR_SIDR_REP else d[mad + 28]
        owner = self._slots.get(slot)
        if owner is not None:
            self.counters["cm_routed"] += 1
            return (owner,)
        return self._qp1 if attr == _ATTR_REJ else legacy

    def _reject_unlistened(self, link: UdpLink | RawEtherLink, dg: Datagram, attr: int) -> None:
        """REJ 8 (SIDR_REP status 1) for a REQ (SIDR_REQ) nobody listens for, only for a
        REQ with a correct ICRC from a plausible source, and rate-limited per source
        (:mod:`softrdma.drivers.cm_reject`). On RoCEv1 the REJ takes the reversible path
        of A16.4.4."""
        if not sane_request(dg, self.udp_port):
            self.counters["cm_bad_req"] += 1
            return
        answer = answer_for(dg)
        if answer is None:
            self.counters["cm_bad_req"] += 1
            return
        if not self._rej_limiter.allow(dg.src_ip):
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

    def _attach(self, c: _Client, mgid: bytes) -> int:
        """A client attaches ``mgid``; the first one makes the daemon join the group on
        its socket of that address family (Annex A17; ../shared/specs/roce.md §4, :mod:`.mcast`)."""
        if mgid not in self._groups:
            link = self._group_link(mgid)
            v1 = self._raw if self._raw is not None and is_multicast_gid(mgid) else None
            if link is None and v1 is None:
                return errno.EAFNOSUPPORT if is_mgid(mgid) else errno.EINVAL
            try:
                if link is not None:
                    link.attach_mcast(mgid)
                if v1 is not None:  # RoCEv1: the MGID's Ethernet multicast MAC
                    v1.attach_mcast(mgid)
            except (OSError, SoftRdmaError):
                return errno.EADDRNOTAVAIL
            self._groups[mgid] = []
        c.mcast[mgid] = c.mcast.get(mgid, 0) + 1
        members = self._groups[mgid]
        if c not in members:
            members.append(c)
        return 0

    def _group_link(self, mgid: bytes) -> UdpLink | None:
        """The receive link that joins ``mgid``'s IP group (its family's first address)."""
        if not is_mgid(mgid):
            return None
        size = len(mgid_to_group(mgid))
        return next((link for link in self._links if len(link.ip) == size), None)

    def _leave_group(self, mgid: bytes) -> None:
        link = self._group_link(mgid)
        if link is not None and mgid in link.mcast_groups:
            link.detach_mcast(mgid)
        if self._raw is not None and is_multicast_gid(mgid):
            with contextlib.suppress(OSError, SoftRdmaError):
                self._raw.detach_mcast(mgid)

    def _detach(self, c: _Client, mgid: bytes) -> int:
        refs = c.mcast.get(mgid, 0)
        if refs == 0:
            return errno.ENOENT
        if refs > 1:
            c.mcast[mgid] = refs - 1
            return 0
        del c.mcast[mgid]
        members = self._groups[mgid]
        members.remove(c)
        if not members:
            del self._groups[mgid]
            self._leave_group(mgid)
        return 0

    # -- data --------------------------------------------------------------------------

    def _on_udp(self, link: UdpLink | RawEtherLink) -> None:
        self._route(link, link.recv_batch(_RECV_BATCH))

    def _route(self, link: UdpLink | RawEtherLink, dgrams: Sequence[Datagram]) -> None:
        """Forward datagrams (RoCEv2) and RoCEv1 frames (``dg.grh``) to their owners."""
        counters = self.counters
        owners = self._owners
        for dg in dgrams:
            counters["rx"] += 1
            d = dg.data
            if len(d) < BTH_SIZE:
                counters["malformed"] += 1
                continue
            qpn = int.from_bytes(d[5:8], "big")
            if qpn == QPN_GSI:
                targets: Sequence[_Client] = self._route_qp1(link, dg)
            elif qpn == QPN_MULTICAST:
                targets = self._groups.get(ip_to_gid(dg.dst_ip), ())
            else:
                owner = owners.get(qpn)
                targets = (owner,) if owner is not None else ()
            if not targets:
                counters["unknown_qpn"] += 1
                continue
            hdr = _DHDR.pack(
                V1_VERSION if dg.grh else 4 if len(dg.src_ip) == 4 else 6,
                dg.tos,
                dg.ttl,
                dg.sport,
                dg.dport,
                ip_to_gid(dg.src_ip),
                ip_to_gid(dg.dst_ip),
            )
            for c in targets:
                self._forward(c, hdr, d, dg.grh)

    def _forward(self, c: _Client, hdr: bytes, payload: memoryview, grh: bytes = b"") -> None:
        if c.dead:
            return
        try:
            c.data.sendmsg([hdr, grh, payload] if grh else [hdr, payload], [],
                           socket.MSG_DONTWAIT)
        except BlockingIOError:
            self.counters["client_full"] += 1
        except OSError:
            c.dead = True
        else:
            self.counters["forwarded"] += 1


# -------------------------------------------------------------------------------------
# spawning
# -------------------------------------------------------------------------------------


class DevdVanished(DeviceError):
    """The daemon was started (or found) but accepts no connection any more: it exited
    (idle) in between; the caller starts another one."""


def _probe(path: Path) -> bool:
    """True if a daemon accepts connections on ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        s.connect(str(path))
    except OSError:
        return False
    finally:
        s.close()
    return True


# how long a client waits for a daemon it starts (or that another client is starting) to
# answer: a daemon that cannot start says so at once; this bounds a slow start on a busy host
DEVD_START_TIMEOUT = 20.0


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def ensure_devd(
    record: DeviceRecord,
    *,
    state_dir: Path | str | None = None,
    idle_timeout: float | None = None,
    timeout: float = DEVD_START_TIMEOUT,
) -> str:
    """Start the device's daemon as a detached process unless one runs; its socket path.

    A lock file keeps two concurrent starts from racing. :class:`DeviceError` if the
    daemon cannot start (UDP port taken, netdev gone ...) or is not ready in ``timeout``.
    """
    if record.type != "roce":
        raise DeviceError(f"device {record.name!r}: devd serves roce devices only")
    directory = ensure_state_dir(
        Path(state_dir) if state_dir is not None else default_state_dir()
    )
    path = socket_path(record.name, directory)
    if _probe(path):
        return str(path)
    with _flock(directory / f"{record.name}.spawn.lock", timeout, f"devd {record.name}"):
        if _probe(path):
            return str(path)
        cmd = [
            sys.executable, "-m", "softrdma.drivers.devd", record.name,
            "--state-dir", str(directory), "--netdev", record.netdev,
            "--port", str(record.udp_port), "--roce-ver", record.roce_ver, "--daemonize",
        ]  # fmt: skip
        if record.vlan is not None:
            cmd += ["--vlan", str(record.vlan)]
        if idle_timeout is not None:
            cmd += ["--idle-timeout", repr(float(idle_timeout))]
        env = dict(os.environ)
        root = _package_root()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DeviceError(
                f"devd {record.name}: did not start within {timeout:g} s"
            ) from None
        except OSError as exc:
            raise DeviceError(f"devd {record.name}: cannot run {sys.executable}: {exc}") from exc
        if proc.returncode != 0:
            lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            why = why.removeprefix(f"devd {record.name}: ")
            # the daemon's own errno is in its last line (cannot bind ...: strerror)
            code = errno.EADDRINUSE if os.strerror(errno.EADDRINUSE) in why else None
            raise DeviceError(f"cannot start devd {record.name}: {why}", errno=code)
        if not _probe(path):
            raise DevdVanished(f"devd {record.name}: started but {path} accepts no connection")
    return str(path)


# -------------------------------------------------------------------------------------
# the client link
# -------------------------------------------------------------------------------------


class DevdLink:
    """A :class:`~softrdma.drivers.link.Link` whose receive side is the device's devd.

    Received datagrams come from the daemon over the data channel (a SEQPACKET socket,
    drained without blocking into a preallocated ring: a datagram's ``data`` view stays
    valid until the next :meth:`recv_batch`). Sends go straight out of this process's own
    send-only :class:`UdpLink` per address family (``bind_port=False``).
    """

    def __init__(
        self,
        record: DeviceRecord,
        *,
        state_dir: Path | str | None = None,
        spawn: bool = True,
        idle_timeout: float | None = None,
        timeout: float = DEVD_START_TIMEOUT,
        ring: int = _RECV_BATCH,
    ) -> None:
        if ring < 1:
            raise InvalidArgument("ring", "must be >= 1")
        self.record = record
        directory = Path(state_dir) if state_dir is not None else default_state_dir()
        self._ctrl_lock = threading.Lock()
        self._closed = False
        self.daemon_pid = 0
        self.daemon_gone = False  # the control or data channel found the daemon dead
        ctrl: socket.socket | None = None
        data: socket.socket | None = None
        last_err = "no answer"
        for _ in range(3):  # a daemon that is just exiting closes us: start a new one
            if spawn:
                try:
                    path = Path(
                        ensure_devd(
                            record, state_dir=directory, idle_timeout=idle_timeout,
                            timeout=timeout,
                        )
                    )
                except DevdVanished as exc:
                    # the daemon we found or started went idle and exited before we
                    # connected (it lingered after its last client): replace it
                    last_err = str(exc)
                    path = socket_path(record.name, directory)
                    continue
            else:
                path = socket_path(record.name, directory)
            try:
                ctrl, data, hello = self._connect(path, timeout)
                break
            except OSError as exc:
                last_err = exc.strerror or str(exc)
                if not spawn or isinstance(exc, DevdRefused):
                    break
        else:
            hello = b""
        if ctrl is None or data is None:
            raise DeviceError(f"device {record.name!r}: cannot reach devd at {path}: {last_err}")
        self._ctrl = ctrl
        self._data = data
        _, _, port, pid, n_ips = _HELLO.unpack_from(hello)
        self.udp_port: int = port
        self.daemon_pid = pid
        raw = hello[_HELLO.size :]
        self._local_ips = tuple(gid_to_ip(raw[i * 16 : i * 16 + 16]) for i in range(n_ips))
        self._senders: dict[int, UdpLink] = {}
        self._raw: RawEtherLink | None = None
        self.gid_entries: tuple[GidEntry, ...] = ()  # () : every GID RoCE v2
        try:
            if record.roce_v2:
                for ip in self._local_ips:
                    if len(ip) not in self._senders:
                        self._senders[len(ip)] = UdpLink(
                            _bind_text(ip, record.netdev), port, bind_port=False
                        )
            if record.roce_v1:  # sends go out of our own raw socket; devd receives
                v1link = RawEtherLink(record.netdev, vlan=record.vlan, receive=False)
                self._raw = v1link
                v2 = tuple(ip_to_gid(ip) for ip in self._local_ips) if record.roce_v2 else ()
                self.gid_entries = gid_entries(record.roce_ver, v1link.mac, v1link.local_ips, v2)
                self.mtu = v1link.mtu
        except BaseException:
            self.close()
            raise
        slot = _DHDR.size + MAX_DATAGRAM
        self._slot = slot
        ring_view = memoryview(bytearray(slot * ring))
        self._slots = [ring_view[i * slot : (i + 1) * slot] for i in range(ring)]
        self.counters: dict[str, int] = {"rx": 0, "bad_header": 0}
        self.last_report: dict[str, int] = {}

    @staticmethod
    def _connect(path: Path, timeout: float) -> tuple[socket.socket, socket.socket, bytes]:
        ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            ctrl.settimeout(timeout)
            ctrl.connect(str(path))
            msg, fds, _, _ = socket.recv_fds(ctrl, 4096, 1)
            reason = refusal_reason(msg)
            if reason is not None:
                raise DevdRefused(errno.ECONNREFUSED, f"devd refused this client: {reason}")
            if not msg or not fds:
                for fd in fds:
                    os.close(fd)
                raise ConnectionResetError(errno.ECONNRESET, "devd closed the connection")
            data = socket.socket(fileno=fds[0])
            for fd in fds[1:]:
                os.close(fd)
            if len(msg) < _HELLO.size or msg[:4] != MAGIC:
                data.close()
                raise ConnectionError(errno.EPROTO, "not a devd HELLO")
            if _HELLO.unpack_from(msg)[1] != PROTOCOL_VERSION:
                data.close()
                raise ConnectionError(errno.EPROTO, "devd protocol version mismatch")
        except BaseException:
            ctrl.close()
            raise
        data.setblocking(False)
        with contextlib.suppress(OSError):
            data.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _DATA_SNDBUF)
        return ctrl, data, msg

    # -- Link protocol -----------------------------------------------------------------

    @property
    def local_ips(self) -> tuple[bytes, ...]:
        return self._local_ips

    def _sender(self, family_len: int) -> UdpLink:
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: link closed")
        try:
            return self._senders[family_len]
        except KeyError:
            raise InvalidArgument(
                "dst_ip", f"device {self.record.name!r} has no IPv{4 if family_len == 4 else 6} address"
            ) from None

    def effective_sport(self, requested: int) -> int:
        if not self._senders:
            return requested  # RoCEv1 only: no UDP
        return self._sender(len(self._local_ips[0])).effective_sport(requested)

    def send_v1(self, dgid: bytes, parts: Sequence[ReadableBuffer], sl: int = 0) -> None:
        """A RoCEv1 packet (GRH, BTH .. pad, ICRC): out of this process's raw socket, or,
        self-addressed (CA16-22), up the data channel for devd to route."""
        raw = self._raw
        if raw is None or self._closed:
            raise ClosedError(f"device {self.record.name!r}: no RoCEv1 link")
        if not raw.is_own(bytes(dgid)):
            raw.send_v1(dgid, parts, sl)
            return
        frame = b"".join(bytes(p) for p in parts)
        hdr = _DHDR.pack(V1_VERSION, ((frame[0] & 0x0F) << 4) | (frame[1] >> 4), frame[7], 0,
                         0, frame[8:24], bytes(dgid))
        with contextlib.suppress(BlockingIOError):  # full: lost, as on a busy wire
            self._data.sendmsg([hdr, frame], [], socket.MSG_DONTWAIT)

    def send(
        self,
        dst_ip: bytes,
        dport: int,
        sport: int,
        parts: Sequence[ReadableBuffer],
        tos: int = 0,
        ttl: int = 64,
    ) -> None:
        self._sender(len(dst_ip)).send(dst_ip, dport, sport, parts, tos, ttl)

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: link closed")
        out: list[Datagram] = []
        recv_into = self._data.recv_into
        slot, hsize = self._slot, _DHDR.size
        unpack = _DHDR.unpack_from
        for buf in self._slots[: max(max_n, 0)]:
            try:
                n = recv_into(buf, slot, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # ECONNRESET: the daemon died
                self.daemon_gone = True
                raise DeviceError(f"device {self.record.name!r}: its devd (pid "
                                  f"{self.daemon_pid}) is gone: {exc.strerror}") from exc
            if n == 0:
                self.daemon_gone = True
                raise DeviceError(f"device {self.record.name!r}: its devd (pid "
                                  f"{self.daemon_pid}) is gone")
            if n < hsize:
                self.counters["bad_header"] += 1
                continue
            ver, tos, ttl, sport, dport, src, dst = unpack(buf)
            if ver == V1_VERSION:  # RoCEv1: the GRH, then BTH .. ICRC
                if n < hsize + GRH_SIZE:
                    self.counters["bad_header"] += 1
                    continue
                out.append(Datagram(buf[hsize + GRH_SIZE:n], bytes(src), bytes(dst), 0, 0, tos,
                                    ttl, bytes(buf[hsize:hsize + GRH_SIZE])))
                continue
            out.append(
                Datagram(buf[hsize:n], gid_to_ip(src), gid_to_ip(dst), sport, dport, tos, ttl)
            )
        self.counters["rx"] += len(out)
        return out

    def fileno(self) -> int | None:
        return None if self._closed else self._data.fileno()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for link in getattr(self, "_senders", {}).values():
            link.close()
        v1link: RawEtherLink | None = getattr(self, "_raw", None)
        if v1link is not None:
            v1link.close()
        self._data.close()
        self._ctrl.close()

    # -- control -----------------------------------------------------------------------

    def _request(self, op: int, arg: int = 0, mgid: bytes = bytes(16)) -> tuple[int, bytes]:
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: link closed")
        with self._ctrl_lock:
            try:
                self._ctrl.send(_REQ.pack(op, arg, mgid))
                rep = self._ctrl.recv(_MAX_CTRL)
            except OSError as exc:
                self.daemon_gone = True
                raise DeviceError(f"device {self.record.name!r}: devd: {exc}") from exc
        if len(rep) < _REP.size:
            self.daemon_gone = True
            raise DeviceError(f"device {self.record.name!r}: devd closed the connection")
        rop, err, value = _REP.unpack_from(rep)
        if rop != op:
            raise DeviceError(f"device {self.record.name!r}: devd answered op {rop} to {op}")
        if err:
            raise DeviceError(
                f"device {self.record.name!r}: devd: {os.strerror(err)}", errno=err
            )
        return value, rep[_REP.size :]

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
        if self.daemon_gone:
            return
        try:
            self._request(OP_FREE_QPN, qpn)
        except DeviceError:
            if not self.daemon_gone:
                raise

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

    def report_counters(self, values: dict[str, int]) -> None:
        """Tell the daemon this process's port counters (cumulative; see the module
        docstring, "Port counters of a shared device")."""
        body = json.dumps(values, separators=(",", ":")).encode()
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: link closed")
        with self._ctrl_lock:
            try:
                self._ctrl.send(_REQ.pack(OP_REPORT, 0, bytes(16)) + body)
                rep = self._ctrl.recv(4096)
            except OSError as exc:
                raise DeviceError(f"device {self.record.name!r}: devd: {exc}") from exc
        if len(rep) < _REP.size or _REP.unpack_from(rep)[1]:
            raise DeviceError(f"device {self.record.name!r}: devd refused the counter report")
        self.last_report = dict(values)

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
            name: _U64.unpack_from(rest, i * 8)[0]
            for i, name in enumerate(STAT_NAMES[: min(n, len(rest) // 8)])
        }

    def __enter__(self) -> DevdLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_mgid(mgid: bytes) -> bytes:
    if not isinstance(mgid, (bytes, bytearray)) or len(mgid) != 16:
        raise InvalidArgument("mgid", "an MGID is 16 bytes")
    return bytes(mgid)


# -------------------------------------------------------------------------------------
# command line
# -------------------------------------------------------------------------------------


def _daemonize(devd: Devd) -> int:
    """Fork; the child starts ``devd`` and reports readiness through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(r)
        code = 0
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            try:
                log = open_state_file(
                    devd.directory / f"{devd.record.name}.log",
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                )
                devd.start()
            except (SoftRdmaError, OSError) as exc:
                os.write(w, f"E{exc}".encode())
                os._exit(1)
            os.write(w, b"OK")
            os.close(w)
            os.dup2(log, 2)
            _install_signals(devd)
            devd.serve_forever()
        except BaseException as exc:  # noqa: BLE001 - the daemon reports and exits
            with contextlib.suppress(OSError):
                os.write(2, f"devd {devd.record.name}: {exc!r}\n".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    answer = b"".join(chunks).decode("utf-8", "replace")
    if answer == "OK":
        return 0
    print(answer[1:] if answer.startswith("E") else f"devd {devd.record.name}: died", file=sys.stderr)
    return 1


def _install_signals(devd: Devd) -> None:
    def stop(signum: int, frame: object) -> None:
        devd.shutdown()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def main(argv: list[str] | None = None) -> int:
    """``python -m softrdma.drivers.devd NAME ...``."""
    p = argparse.ArgumentParser(prog="softrdma-devd", description="softrdma device demultiplexer")
    p.add_argument("name")
    p.add_argument("--state-dir", default=None)
    p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT)
    p.add_argument("--netdev", default=None, help="override the registry record")
    p.add_argument("--port", type=int, default=None, help="override the registry record")
    p.add_argument("--ip", action="append", default=None, help="serve only this address")
    p.add_argument("--roce-ver", default="2", choices=("1", "2", "both"),
                   help="with --netdev: the RoCE version(s) (Annex A16 RoCEv1: raw Ethernet)")
    p.add_argument("--vlan", type=int, default=None, help="with --netdev: RoCEv1 VLAN ID")
    p.add_argument("--daemonize", action="store_true", help="detach; exit 0 once ready")
    a = p.parse_args(argv)
    try:
        if a.netdev is not None:
            record = DeviceRecord(a.name, a.netdev, "roce", 4791 if a.port is None else a.port,
                                  a.roce_ver, a.vlan)
        else:
            record = Registry(a.state_dir).get(a.name)
            if a.port is not None:
                record = dataclasses.replace(record, udp_port=a.port)
        devd = Devd(record, a.state_dir, idle_timeout=a.idle_timeout, ips=a.ip)
        if a.daemonize:
            return _daemonize(devd)
        devd.start()
    except SoftRdmaError as exc:
        print(f"devd {a.name}: {exc}", file=sys.stderr)
        return 1
    _install_signals(devd)
    devd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

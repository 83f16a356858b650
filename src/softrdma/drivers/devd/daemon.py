"""``devd``: the per-device demultiplexer process.

design.md "Devices shared by processes": the transport engine runs in the process that
owns the QP; one ``devd`` per device owns the device's UDP port (4791, Annex A17) on
every IP address of its netdev and forwards each received datagram, unmodified, to the
process that owns the BTH DestQP (bytes 5-7 of the UDP payload, IBA 9.2), or lets the
kernel deliver it to that process directly (below). Processes send directly from their
own UDP sockets.
``devd`` also allocates the device's QP numbers, so they are unique per device.

Running it::

    python -m softrdma.drivers.devd.daemon NAME [--state-dir DIR] [--idle-timeout S]
                                         [--first-client-wait S] [--netdev IF] [--port N] [--ip ADDR ...] [--daemonize]

or in-process (tests): ``Devd(record, state_dir).serve_forever()`` in a thread, stopped by
:meth:`Devd.shutdown`. :func:`ensure_devd` starts a detached daemon if none is running.

Files in the state directory (:func:`softrdma.drivers.host.registry.state_dir`):

* ``NAME.sock``: the Unix ``SOCK_SEQPACKET`` listening socket;
* ``NAME.devd.lock``: ``flock``-ed by the live daemon for its whole life. Whoever gets
  the lock knows that any ``NAME.sock`` left behind belongs to a dead daemon (stale), and
  replaces it;
* ``NAME.spawn.lock``: serialises :func:`ensure_devd` calls so two starts don't race;
* ``NAME.pid``: the daemon's pid; ``NAME.log``: a detached daemon's stderr;
* ``NAME.counters.json``: the device's port counters when its last daemon exited (and
  whenever a client left), added back by the next daemon: like the kernel's, a device's
  counters last as long as the device and never go backwards (:func:`saved_counters`).

The daemon exits by itself ``idle_timeout`` seconds (default 5) after its last client
left (or after it started, if no client ever came, but not before ``--first-client-wait``
seconds: the client that starts it waits that long and must find it), removing its socket
and pid file.

The receive path (design.md "Devices shared by processes", :mod:`.reuseport`): each
client process binds its own socket to the device's port with ``SO_REUSEPORT`` and the
daemon's BPF program steers each datagram to the owner of its DestQP, so the data path
is client to client through the kernel; the daemon's own socket (the group's first) gets
QP1 MADs, multicast and unknown QPNs, and so does every datagram of a client on the
forwarded path (``SOFTRDMA_DEVD_DIRECT=0``, or refused), which the daemon forwards over
the client's data channel. Protocol: :mod:`.proto`; client: :mod:`.client`;
start on first use: :mod:`.spawn`; QPNs and the direct path: :mod:`.qpn`;
CM routing: :mod:`.cm`; multicast: :mod:`.mcast`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import selectors
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from softrdma.drivers.devd.admission import (
    MAX_CLIENTS_PER_UID,
    Spare,
    out_of_descriptors,
    peer_pid,
    peer_uid,
    per_uid_cap,
    raise_nofile,
    refuse,
)
from softrdma.drivers.devd.cm_reject import RejLimiter
from softrdma.drivers.devd.control import Control
from softrdma.drivers.devd.proto import (
    DATA_SNDBUF,
    DEFAULT_IDLE_TIMEOUT,
    HELLO,
    MAGIC,
    MAX_DATAGRAM,
    PROTOCOL_VERSION,
    QPN_FIRST,
    STAT_NAMES,
    Client,
    bind_text,
    device_addresses,
    socket_path,
)
from softrdma.drivers.devd.qpn import JOIN_TIMEOUT
from softrdma.drivers.devd.reuseport import direct_enabled
from softrdma.drivers.devd.spawn import (
    daemonize,
    install_signals,
)
from softrdma.drivers.host.port_totals import counters_path, saved_counters
from softrdma.drivers.host.registry import DeviceRecord, Registry, ensure_state_dir, open_state_file
from softrdma.drivers.host.registry import state_dir as default_state_dir
from softrdma.drivers.host.unix_path import bind_unix
from softrdma.drivers.links.link import ip_bytes, ip_text
from softrdma.drivers.links.rawether import RawEtherLink
from softrdma.drivers.links.udp import UdpLink
from softrdma.errors import DeviceError, InvalidArgument, SoftRdmaError
from softrdma.seam.counters import Counters
from softrdma.wire.gid import ip_to_gid

__all__ = ["Devd", "main"]

class Devd(Control):
    """The demultiplexer of one device (see the module docstring for the protocol).

    ``record``: the device (roce only). ``state_dir``: where the socket, lock and pid
    files go (default :func:`~softrdma.drivers.host.registry.state_dir`). ``idle_timeout``:
    seconds without clients before :meth:`serve_forever` returns. ``ips``: serve these
    addresses instead of the netdev's (tests). ``lock_wait``: how long :meth:`start`
    waits for a previous daemon of the same device to finish exiting.
    ``first_client_wait``: until its first client comes, the daemon serves at least this
    many seconds from its start, however short ``idle_timeout`` is: a daemon started for
    a client waits for that client (which, on a busy host, may take long to connect).
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
        join_timeout: float = JOIN_TIMEOUT,
        first_client_wait: float = 0.0,
    ) -> None:
        if record.type != "roce":
            raise DeviceError(f"device {record.name!r}: devd serves roce devices only")
        if idle_timeout < 0:
            raise InvalidArgument("idle_timeout", "must be >= 0")
        if first_client_wait < 0:
            raise InvalidArgument("first_client_wait", "must be >= 0")
        if not join_timeout > 0:
            raise InvalidArgument("join_timeout", "must be > 0")
        self.join_timeout = join_timeout
        self.record = record
        self.directory = ensure_state_dir(
            Path(state_dir) if state_dir is not None else default_state_dir()
        )
        self.idle_timeout = idle_timeout
        self.first_client_wait = first_client_wait
        self._had_client = False
        self.lock_wait = lock_wait
        self._ips_override = [ip_bytes(ip, "ips") for ip in ips] if ips is not None else None
        self.socket_path = socket_path(record.name, self.directory)
        self.pid_path = self.directory / f"{record.name}.pid"
        self.lock_path = self.directory / f"{record.name}.devd.lock"
        self.counters_path = counters_path(record.name, self.directory)
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
        self._clients: list[Client] = []
        self._owners: dict[int, Client] = {}
        self._qp1: list[Client] = []
        self._groups: dict[bytes, list[Client]] = {}
        self._slots: dict[int, Client] = {}
        self._next_slot = 1
        self._cm_listeners: dict[tuple[int, int], Client] = {}
        self._next_qpn = QPN_FIRST
        self._qpn_init()
        self._xrc_init()
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
            else device_addresses(self.record.netdev)
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
            # we hold the lock: the previous daemon, if any, has saved its totals
            self._retired.add(saved_counters(name, self.directory))
            self._uid_cap = per_uid_cap(raise_nofile(), self.max_clients_per_uid)
            self._spare = Spare()
            if self.record.roce_v2:
                self._bind_udp()
                if direct_enabled():
                    self._direct_setup()
            else:  # RoCEv1 only: no UDP port; the addresses are still GIDs (Annex A16)
                self.ips = tuple(device_addresses(self.record.netdev))
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
                link = UdpLink(bind_text(ip, self.record.netdev), port, max_datagram=MAX_DATAGRAM,
                               reuseport=direct_enabled())
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
        # The socket is bound under a temporary name and renamed onto ``path`` once it
        # listens: a client that finds ``path`` can connect (a connect between bind and
        # listen would be refused).
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        for stale in (path, tmp):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            bind_unix(sock, tmp)
            sock.listen(64)
            os.replace(tmp, path)
        except OSError as exc:
            sock.close()
            with contextlib.suppress(OSError):
                tmp.unlink()
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
        if self._lock_fd >= 0 and self._started:
            self._save_counters()
        self._direct_close()
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
        first_by = time.monotonic() + self.first_client_wait
        idle_since: float | None = time.monotonic()
        try:
            while not self._stop:
                timeout: float | None = None
                now = time.monotonic()
                if idle_since is not None:
                    exit_at = idle_since + self.idle_timeout
                    if not self._had_client:
                        exit_at = max(exit_at, first_by)
                    timeout = exit_at - now
                    if timeout <= 0:
                        break
                join_deadline = self._join_expire(now)
                if join_deadline is not None:
                    left = max(join_deadline - now, 0.0)
                    timeout = left if timeout is None else min(timeout, left)
                assert self._sel is not None
                for key, _ in self._sel.select(timeout):
                    kind, obj = key.data
                    if kind == "udp":
                        assert isinstance(obj, (UdpLink, RawEtherLink))
                        self._on_udp(obj)
                    elif kind == "ctrl":
                        assert isinstance(obj, Client)
                        self._on_ctrl(obj)
                    elif kind == "data":
                        assert isinstance(obj, Client)
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
        descriptors run out (``softrdma.drivers.devd.admission``)."""
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
                mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, DATA_SNDBUF)
            mine.setblocking(False)
            hello = HELLO.pack(MAGIC, PROTOCOL_VERSION, self.udp_port, os.getpid(), len(self.ips))
            hello += b"".join(ip_to_gid(ip) for ip in self.ips)
            try:
                socket.send_fds(ctrl, [hello], [theirs.fileno()])
            except OSError:
                ctrl.close()
                mine.close()
                continue
            finally:
                theirs.close()
            client = Client(ctrl, mine, uid=uid, pid=peer_pid(ctrl))
            self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            self._clients.append(client)
            self._had_client = True
            self.counters["clients"] += 1
            assert self._sel is not None
            self._sel.register(ctrl, selectors.EVENT_READ, ("ctrl", client))
            self._sel.register(mine, selectors.EVENT_READ, ("data", client))

    def _drop_client(self, c: Client) -> None:
        self._direct_leave(c)
        for qpn in list(c.qpns):
            if self._owners.get(qpn) is c:
                self._disown(qpn)
        c.qpns.clear()
        self._xrc_client_left(c)
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
        left_counts = bool(c.port_counters)
        self._retired.add(c.port_counters)
        c.port_counters = {}
        if left_counts and not self._closed:
            self._save_counters()
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


def main(argv: list[str] | None = None) -> int:
    """``python -m softrdma.drivers.devd.daemon NAME ...``."""
    p = argparse.ArgumentParser(prog="softrdma-devd", description="softrdma device demultiplexer")
    p.add_argument("name")
    p.add_argument("--state-dir", default=None)
    p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT)
    p.add_argument("--first-client-wait", type=float, default=0.0,
                   help="until the first client, serve at least this long from the start")
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
        devd = Devd(record, a.state_dir, idle_timeout=a.idle_timeout, ips=a.ip,
                    first_client_wait=a.first_client_wait)
        if a.daemonize:
            return daemonize(devd)
        devd.start()
    except SoftRdmaError as exc:
        print(f"devd {a.name}: {exc}", file=sys.stderr)
        return 1
    install_signals(devd)
    devd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The client side of a shared device: :class:`DevdLink` (design.md "Devices shared by
processes"; protocol: :mod:`softrdma.drivers.devd.proto`; direct receive path:
:mod:`softrdma.drivers.devd.reuseport`)."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from softrdma.drivers.devd.admission import DevdRefused, refusal_reason
from softrdma.drivers.devd.proto import (
    DATA_SNDBUF,
    DHDR,
    HELLO,
    MAGIC,
    MAX_DATAGRAM,
    OP_JOIN,
    OP_JOINED,
    PROTOCOL_VERSION,
    RECV_BATCH,
    XHDR,
    XRC_RECORD,
    bind_text,
    recv_fds,
    socket_path,
)
from softrdma.drivers.devd.requests import DevdRequests
from softrdma.drivers.devd.reuseport import direct_enabled
from softrdma.drivers.devd.spawn import DEVD_START_TIMEOUT, DevdVanished, ensure_devd
from softrdma.drivers.devd.v1 import V1_VERSION
from softrdma.drivers.host.registry import DeviceRecord, check_state_dir
from softrdma.drivers.host.registry import state_dir as default_state_dir
from softrdma.drivers.host.unix_path import connect_unix
from softrdma.drivers.links.link import Datagram, GidEntry, LinkState, gid_entries
from softrdma.drivers.links.rawether import RawEtherLink
from softrdma.drivers.links.udp import UdpLink
from softrdma.errors import ClosedError, DeviceError, InvalidArgument, SoftRdmaError
from softrdma.wire.gid import gid_to_ip, ip_to_gid
from softrdma.wire.rocev1 import GRH_SIZE

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["DevdLink"]

#: the data channel's sends: never blocking (full: lost, as on a busy wire) and, devd gone,
#: EPIPE rather than SIGPIPE (a C program's SIGPIPE is its own under ``softrdma run``)
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL

# Links of this process that hold devd's sockets, closed in a child after fork() (below).
_LIVE: weakref.WeakSet[DevdLink] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A child created by ``fork()`` without ``exec`` gives up the device links it
    inherited: its copies of the control and data channels and of the direct-path
    reuseport sockets are closed (the parent's stay open; nothing is sent to devd).

    A copy left open would keep the parent's socket in the kernel's reuseport group after
    devd let it go, and devd's mirror of the group's order (:mod:`.reuseport`) would no
    longer match the kernel's; it would also hide the parent's exit from devd. As with
    rdma-core without fork support, the child opens its own device (a new ``Context``);
    the inherited one raises :class:`ClosedError`, naming fork, when used.
    """
    for link in list(_LIVE):
        link.abandon_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class DevdLink(DevdRequests, LinkState):
    """A :class:`~softrdma.drivers.links.link.Link` whose receive side is the device's devd.

    On the direct path (``direct``, default :func:`.reuseport.direct_enabled`), the
    link binds its own :class:`UdpLink` per address family (the device's first address of
    each) to the device's UDP port with ``SO_REUSEPORT``; devd's BPF program steers the
    datagrams of this process's QPNs to it (:mod:`.reuseport`), and sends leave from it.
    Everything else (QP1 MADs, multicast, datagrams to the device's other addresses, all
    of them when the direct path is refused) comes from the daemon over the data channel
    (a SEQPACKET socket, drained without blocking into a preallocated ring: a datagram's
    ``data`` view stays valid until the next :meth:`recv_batch`); sends then go straight
    out of a send-only :class:`UdpLink` per address family (``bind_port=False``).
    """

    shared = True  # QPNs, counters and objects through devd
    gso = True  # sends leave from this process's own UdpLink (GsoLink)
    roce_v1 = True  # through its own raw socket when the device runs RoCEv1
    multicast = True
    xrc = True  # XRC domains shared by processes (xrcd_open, xrc_send; :mod:`.xrc`)

    def __init__(
        self,
        record: DeviceRecord,
        *,
        state_dir: Path | str | None = None,
        spawn: bool = True,
        idle_timeout: float | None = None,
        timeout: float = DEVD_START_TIMEOUT,
        ring: int = RECV_BATCH,
        direct: bool | None = None,
    ) -> None:
        if ring < 1:
            raise InvalidArgument("ring", "must be >= 1")
        self.record = record
        directory = Path(state_dir) if state_dir is not None else default_state_dir()
        if not spawn:  # ensure_devd checks it otherwise
            check_state_dir(directory)
        self._ctrl_lock = threading.Lock()
        self._closed = False
        self._closed_why = "link closed"
        self._owner_pid = os.getpid()
        self.daemon_pid = 0
        self.daemon_gone = False  # the control or data channel found the daemon dead
        self.ctrl_timeout = timeout  # seconds a control request waits for its answer
        self._seq = 0  # the sequence number of the last control request
        self.stale_replies = 0  # late answers to requests that had timed out, dropped
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
        _, _, port, pid, n_ips = HELLO.unpack_from(hello)
        self.udp_port: int = port
        #: the device's UDP port (as :attr:`UdpLink.port`; a ``Context`` given this link
        #: sends to it)
        self.port: int | None = port
        self.daemon_pid = pid
        raw = hello[HELLO.size :]
        self._local_ips = tuple(gid_to_ip(raw[i * 16 : i * 16 + 16]) for i in range(n_ips))
        self._senders: dict[int, UdpLink] = {}
        self._direct: tuple[UdpLink, ...] = ()
        self._ep: select.epoll | None = None
        self._direct_fds: dict[int, UdpLink] = {}  # the direct path's sockets, by fd
        self.slot = 0  # the QPN slot on the direct path; 0: every datagram through devd
        self._raw: RawEtherLink | None = None
        self.gid_entries: tuple[GidEntry, ...] = ()  # () : every GID RoCE v2
        try:
            if record.roce_v2 and (direct_enabled() if direct is None else direct):
                self._join(port)
            if record.roce_v2:
                for ip in self._local_ips:
                    if len(ip) not in self._senders:
                        self._senders[len(ip)] = UdpLink(
                            bind_text(ip, record.netdev), port, bind_port=False
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
        slot = DHDR.size + MAX_DATAGRAM
        self._slot = slot
        ring_view = memoryview(bytearray(slot * ring))
        self._slots = [ring_view[i * slot : (i + 1) * slot] for i in range(ring)]
        self.counters: dict[str, int] = {"rx": 0, "bad_header": 0, "rx_direct": 0,
                                         "xrc_rx": 0}
        #: takes each XRC hand-over record received, under the engine's lock, as
        #: ``(flags, srqn, tgt_qpn, src_qp, word, payload)`` (the payload a view valid
        #: during the call): the XRC SRQs' owner side (``softrdma.ib.xrc``); None: such
        #: records are counted in ``bad_header``
        self.xrc_sink: Callable[[int, int, int, int, int, memoryview], None] | None = None
        self.last_report: dict[str, int] = {}
        self.last_resources: dict[str, Any] = {}
        _LIVE.add(self)

    @staticmethod
    def _connect(path: Path, timeout: float) -> tuple[socket.socket, socket.socket, bytes]:
        ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            ctrl.settimeout(timeout)
            connect_unix(ctrl, path)
            msg, fds, _ = recv_fds(ctrl, 4096, 1)  # close-on-exec
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
            if len(msg) < HELLO.size or msg[:4] != MAGIC:
                data.close()
                raise ConnectionError(errno.EPROTO, "not a devd HELLO")
            if HELLO.unpack_from(msg)[1] != PROTOCOL_VERSION:
                data.close()
                raise ConnectionError(errno.EPROTO, "devd protocol version mismatch")
        except BaseException:
            ctrl.close()
            raise
        data.setblocking(False)
        with contextlib.suppress(OSError):
            data.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, DATA_SNDBUF)
        return ctrl, data, msg

    # -- Link protocol -----------------------------------------------------------------

    @property
    def local_ips(self) -> tuple[bytes, ...]:
        return self._local_ips

    def _sender(self, family_len: int) -> UdpLink:
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: {self._closed_why}")
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

    # ---- UDP GSO (link.GsoLink): sends leave from this process's own UdpLink ----------
    def gso_limit(self, dst_ip: bytes) -> int:
        """As :meth:`UdpLink.gso_limit` of the sender for ``dst_ip``'s family (0: none)."""
        link = self._senders.get(len(dst_ip))
        return 0 if link is None or self._closed else link.gso_limit(dst_ip)

    def send_gso(self, dst_ip: bytes, dport: int, sport: int, parts: Sequence[ReadableBuffer],
                 seg_size: int, nseg: int, tos: int = 0, ttl: int = 64) -> bool:
        """:meth:`UdpLink.send_gso` from this process's sender (design.md, "RoCEv2
        batching")."""
        return self._sender(len(dst_ip)).send_gso(dst_ip, dport, sport, parts, seg_size,
                                                  nseg, tos, ttl)

    def note_rx_ids(self, hint_misses: int, failures: int) -> None:
        """Counted on the direct-path socket, whose coalesced reads carry the hints."""
        if self._direct:
            self._direct[0].note_rx_ids(hint_misses, failures)

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
        hdr = DHDR.pack(V1_VERSION, ((frame[0] & 0x0F) << 4) | (frame[1] >> 4), frame[7], 0,
                        0, 0, frame[8:24], bytes(dgid))
        with contextlib.suppress(BlockingIOError):  # full: lost, as on a busy wire
            self._data.sendmsg([hdr, frame], [], _SEND_FLAGS)

    def xrc_send(self, flags: int, domain: int, srqn: int, tgt_qpn: int, src_qp: int,
                 word: int, payload: ReadableBuffer) -> bool:
        """Hand one SEND packet over to the process owning XRC SRQ ``srqn`` (through the
        daemon, :mod:`.xrc`); False when the data channel is full or gone: the caller
        has the peer send it again (an RNR NAK)."""
        if self._closed:
            return False
        hdr = XHDR.pack(XRC_RECORD, flags, 0, domain, srqn, tgt_qpn, src_qp, word)
        try:
            self._data.sendmsg([hdr, payload], [], _SEND_FLAGS)
        except OSError:
            return False
        return True

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

    @property
    def direct(self) -> bool:
        """Whether this process receives its QPs' datagrams on its own reuseport socket."""
        return bool(self._direct)

    @property
    def fast_rc_meta(self) -> bool:
        return all(link.fast_rc_meta for link in self._direct)

    @fast_rc_meta.setter
    def fast_rc_meta(self, value: bool) -> None:
        for link in self._direct:
            link.fast_rc_meta = value  # UdpLink.fast_rc_meta: RC/UC skip ancillary data

    def _first_of_family(self) -> list[bytes]:
        seen: dict[int, bytes] = {}
        for ip in self._local_ips:
            seen.setdefault(len(ip), ip)
        return list(seen.values())

    def _join(self, port: int) -> None:
        """Take the direct path (OP_JOIN, bind, OP_JOINED with the sockets); stay on the
        forwarded one when devd or the kernel refuses."""
        try:
            slot = self._request(OP_JOIN)[0]
        except DeviceError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                return
            raise
        links: list[UdpLink] = []
        try:
            for ip in self._first_of_family():
                links.append(UdpLink(bind_text(ip, self.record.netdev), port, reuseport=True,
                                     max_datagram=MAX_DATAGRAM))
        except (OSError, SoftRdmaError):
            for link in links:
                link.close()
            links = []
        fds = [rx.fileno() for link in links if (rx := link._rx) is not None]
        try:
            joined = self._request(OP_JOINED, len(fds), fds=fds)[0]
        except BaseException:
            for link in links:
                link.close()
            raise
        if not joined:  # devd refused the sockets (or none were bound): forwarded path
            for link in links:
                link.close()
            return
        self.slot = slot
        self._direct = tuple(links)
        for link in links:
            self._senders[len(link.ip)] = link
        ep = self._ep = select.epoll()
        ep.register(self._data.fileno(), select.EPOLLIN)
        for link in links:
            fd = link.fileno()
            assert fd is not None
            ep.register(fd, select.EPOLLIN)
            self._direct_fds[fd] = link

    def recv_batch(self, max_n: int = 64) -> list[Datagram]:
        if self._closed:
            raise ClosedError(f"device {self.record.name!r}: {self._closed_why}")
        ep = self._ep
        if ep is not None:  # the direct path
            # One question to the epoll of every socket (0.3 us) says which have input: a
            # busy poll, most often empty, makes one system call, not one per socket
            # (the direct path's UdpLink of each address family, the data channel).
            ready = ep.poll(0)
            if not ready:
                return []
            got: list[Datagram] = []
            forwarded = False
            links = self._direct_fds
            for fd, _ in ready:
                link = links.get(fd)
                if link is None:
                    forwarded = True  # the data channel
                elif len(got) < max_n:  # with UDP GRO a read may return more than asked
                    got += link.recv_batch(max_n - len(got), readable=True)
            if got:  # the data channel next time (epoll is level-triggered)
                self.counters["rx_direct"] += len(got)
                return got
            if not forwarded:
                return got
        return self._recv_forwarded(max_n)

    def _recv_forwarded(self, max_n: int) -> list[Datagram]:
        out: list[Datagram] = []
        recv_into = self._data.recv_into
        slot, hsize = self._slot, DHDR.size
        unpack = DHDR.unpack_from
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
            if n and buf[0] == XRC_RECORD:
                sink = self.xrc_sink
                if sink is None or n < XHDR.size:
                    self.counters["bad_header"] += 1
                else:
                    self.counters["xrc_rx"] += 1
                    _, flags, _, _, srqn, tgt, src, word = XHDR.unpack_from(buf)
                    sink(flags, srqn, tgt, src, word, buf[XHDR.size:n])
                continue
            if n < hsize:
                self.counters["bad_header"] += 1
                continue
            ver, tos, ttl, seg, sport, dport, src, dst = unpack(buf)
            if ver == V1_VERSION:  # RoCEv1: the GRH, then BTH .. ICRC
                if n < hsize + GRH_SIZE:
                    self.counters["bad_header"] += 1
                    continue
                out.append(Datagram(buf[hsize + GRH_SIZE:n], bytes(src), bytes(dst), 0, 0, tos,
                                    ttl, bytes(buf[hsize:hsize + GRH_SIZE])))
                continue
            out.append(
                Datagram(buf[hsize:n], gid_to_ip(src), gid_to_ip(dst), sport, dport, tos, ttl,
                         ident=seg - 1)
            )
        self.counters["rx"] += len(out)
        return out

    def fileno(self) -> int | None:
        if self._closed:
            return None
        return self._ep.fileno() if self._ep is not None else self._data.fileno()

    def abandon_after_fork(self) -> None:
        """In a child after ``fork()``: close this process's copies of the link's
        descriptors (see :func:`_after_fork_in_child`)."""
        if not self._closed:
            self._closed_why = (f"opened by process {self._owner_pid} before fork(); "
                                "open the device again in this process")
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        for link in getattr(self, "_senders", {}).values():
            link.close()
        v1link: RawEtherLink | None = getattr(self, "_raw", None)
        if v1link is not None:
            v1link.close()
        if self._ep is not None:
            self._ep.close()
        self._data.close()
        self._ctrl.close()

    def __enter__(self) -> DevdLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

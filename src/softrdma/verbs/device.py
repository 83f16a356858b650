"""Devices, the device context, GIDs and the device/port attributes (IBA 11.2.1).

A :class:`Context` is one opened softrdma device: an engine
:class:`~softrdma.ib.port.Port` bound to a packet link by a
:class:`~softrdma.drivers.runtime.roce.Runtime`, composed by the drivers' entry point
(:func:`softrdma.drivers.opening.open_device`). The limits reported by
:meth:`Context.query_device` are rxe's (``rxe_param.h``) so that tools sized for rxe
behave the same; the GID table holds one RoCE v2 GID per IP address of the netdev
(Annex A16; docs/protocols.md §3): the IPv6 link-local address first (as rxe's index 0), then the IPv4
addresses as ``::ffff:a.b.c.d``, then the other IPv6 addresses.
"""

from __future__ import annotations

import errno
import os
import time
import weakref
from collections.abc import Callable
from typing import Self

from .. import enums as e
from ..drivers.host.portwatch import PortWatch
from ..drivers.links.link import Link
from ..drivers.opening import mpa_crc_wish, open_device
from ..drivers.runtime.fdwait import readable
from ..drivers.runtime.progress import DeviceRuntime
from ..errors import DeviceError, InvalidArgument
from ..seam.events import AsyncEventType, EngineEvent
from ..seam.protocols import DeviceEngine
from ._args import seconds
from ._args import timeout as check_timeout
from ._object import VerbsObject
from .context_file import DeviceFile, lookup
from .counters import PortCounters
from .device_attr import (
    DEVICE_CAP_FLAGS,
    GID_TABLE_LEN,
    MAX_CQE,
    MAX_INLINE_DATA,
    MAX_QP_RD_ATOM,
    MAX_QP_WR,
    MAX_SGE,
    MAX_SRQ_SGE,
    MAX_SRQ_WR,
    MW_CAP_FLAGS,
    PORT_CAP_FLAGS,
    RXE_MAX_HDR_LENGTH,
    XRC_CAP_FLAGS,
    AsyncEvent,
    DeviceAttr,
    DeviceInfo,
    PortAttr,
    guid_from_mac,
    mtu_enum_for_netdev_mtu,
)
from .device_list import (
    IWARP_LOOPBACK,
    LOOPBACK_IPS,
    all_devices,
    get_device_list,
    netdev_of_ips,
    netdev_snapshot,
    open_registry_device,
    registered_devices,
    transport_of,
)
from .gids import GID, gid_table
from .limits import (
    LIMITS,
    ObjectCounts,
    counts_for,
    max_mr_size,
)

__all__ = [
    "GID", "DeviceInfo", "DeviceAttr", "PortAttr", "AsyncEvent", "Context", "IWARP_LOOPBACK",
    "all_devices", "registered_devices",
    "get_device_list", "gid_table", "mtu_enum_for_netdev_mtu", "GID_TABLE_LEN", "gid_table_len",
    # rxe_param.h limits and flags (.device_attr), imported from here by the other verbs
    "MAX_CQE", "MAX_INLINE_DATA", "MAX_QP_RD_ATOM", "MAX_QP_WR", "MAX_SGE", "MAX_SRQ_SGE",
    "MAX_SRQ_WR", "PORT_CAP_FLAGS",
]

#: the libibverbs event of each engine event type (IBA 11.6.3; equal values)
_ENGINE_EVENTS = {t: e.ibv_event_type(int(t)) for t in AsyncEventType}


#: what an imported context copies from the context that opened the device
_SHARED_ATTRS = ("transport", "name", "netdev", "node_guid", "active_mtu", "port", "runtime",
                 "progress_mode", "objects")


def gid_table_len(ctx: Context) -> int:
    """The size of ``ctx``'s GID table (see :data:`GID_TABLE_LEN`)."""
    return GID_TABLE_LEN if ctx.transport != "iwarp" else len(ctx.port.gids)

class Context(VerbsObject):
    """An opened device (``ibv_open_device``; pyverbs ``Context``).

    ``fabric`` is a link of the in-memory fabric (progress is then manual and time is the
    fabric's virtual clock). ``link`` is any :class:`~softrdma.drivers.links.link.Link`
    (an addition to pyverbs, for tests and tools that build their own link). ``pcap``
    (default ``$SOFTRDMA_PCAP``) writes what a RoCE device sends and receives to that
    pcap file (:mod:`softrdma.drivers.capture.tap`).
    """

    def __init__(self, name: str | None = None, *, shared: bool | None = None,
                 fabric: Link | None = None, progress: str = "thread", link: Link | None = None,
                 clock: Callable[[], float] | None = None, transport: str | None = None,
                 pcap: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        self._retained: list[object] = []
        if progress not in ("thread", "manual"):
            raise InvalidArgument("progress", f"must be 'thread' or 'manual', got {progress!r}")
        if fabric is not None and link is not None:
            raise InvalidArgument("fabric", "give either fabric or link, not both")
        self.transport = transport_of(name, transport, fabric, link)
        if self.transport == "iwarp":
            self._open_iwarp(name, progress, clock, pcap)
            self.progress_mode = progress
            self._init_events()
            return
        netdev: str | None = None
        mtu: int | None = None
        mac = b""
        given = link if link is not None else fabric
        udp_port = (given.port if given is not None else None) or 4791
        if fabric is not None:
            link = fabric
            progress = "manual"
            dev_name = name or "softrdma_fabric"
        elif link is not None:
            dev_name = name or "softrdma0"
            nd = netdev_of_ips(tuple(link.local_ips))
            if nd is not None:
                netdev, mtu, mac = nd.name, nd.mtu, nd.mac
        else:
            info, link = open_registry_device(name, shared)
            dev_name = info.name
            netdev = info.netdev
            nd = netdev_snapshot(info.netdev) if info.netdev else None
            mtu = nd.mtu if nd is not None else None
            mac = nd.mac if nd is not None else b""
            udp_port = info.udp_port
        assert link is not None
        if link.mtu is not None:
            mtu = link.mtu
        if mtu is None:
            mtu = 4096 + RXE_MAX_HDR_LENGTH if fabric is not None else 1500
        try:
            # A link that carries RoCEv1 (link.V1Link) gives its own typed GID table
            # (Annex A16; v1 GIDs from the MAC by modified EUI-64); otherwise every GID
            # is a RoCE v2 one of the link's addresses.
            entries = link.gid_entries
            if entries:
                gids = [bytes(g) for g, _t in entries]
                gid_types: list[int] | None = [int(t) for _g, t in entries]
            else:
                gids = gid_table(tuple(link.local_ips))
                gid_types = None
            if not gids:
                raise DeviceError(f"device {dev_name!r} has no IP address, so no GID")
            self.active_mtu = mtu_enum_for_netdev_mtu(mtu)
        except BaseException:
            link.close()
            raise
        self.name = dev_name
        self.netdev = netdev
        self.node_guid = guid_from_mac(mac)
        try:
            opened = open_device("roce", dev_name, gids, max_mtu=128 << self.active_mtu,
                                 link=link, gid_types=gid_types, udp_port=udp_port,
                                 progress=progress, clock=clock, pcap=pcap)
        except BaseException:
            link.close()
            raise
        self.port: DeviceEngine = opened.engine
        self.runtime: DeviceRuntime = opened.runtime
        self.progress_mode = progress
        self._init_events()

    def _open_iwarp(self, name: str | None, progress: str,
                    clock: Callable[[], float] | None,
                    pcap: str | os.PathLike[str] | None = None) -> None:
        """The iWARP branch: an :class:`~softrdma.iwarp.qp.IwarpDevice` driven over TCP
        sockets by a :class:`~softrdma.drivers.runtime.tcp.TcpRuntime` (always in-process:
        a TCP connection belongs to the process that owns the QP). ``name`` None or
        :data:`IWARP_LOOPBACK` is the built-in loopback device (127.0.0.1 and ::1)."""
        netdev: str | None = "lo"
        mac = b""
        crc_setting = False  # the registry record's mpa_crc (the built-in device: off)
        if name is None or name == IWARP_LOOPBACK:
            dev_name = IWARP_LOOPBACK
            ips: tuple[bytes, ...] = LOOPBACK_IPS
            nd = netdev_snapshot("lo")
        else:
            found = [d for d in registered_devices() if d.name == name]
            if not found:
                raise DeviceError(f"no softrdma device named {name!r}")
            info = found[0]
            if info.type != "iwarp":
                raise DeviceError(f"device {name!r} is {info.type}, not iwarp")
            dev_name, netdev, ips = info.name, info.netdev, info.ips
            nd = netdev_snapshot(info.netdev) if info.netdev else None
            crc_setting = info.record is not None and info.record.mpa_crc
        #: ask for the MPA CRC on every connection (siw mpa_crc_required; RFC 5044 §7.1)
        self.mpa_crc = mpa_crc_wish(crc_setting)
        if nd is not None:
            mac = nd.mac
        mtu = nd.mtu if nd is not None and nd.mtu else 65536
        gids = gid_table(ips)
        if not gids:
            raise DeviceError(f"device {dev_name!r} has no IP address, so no GID")
        self.active_mtu = mtu_enum_for_netdev_mtu(mtu)
        self.name = dev_name
        self.netdev = netdev
        self.node_guid = guid_from_mac(mac)
        opened = open_device("iwarp", dev_name, gids, max_mtu=128 << self.active_mtu,
                             progress=progress, clock=clock, pcap=pcap)
        self.port = opened.engine
        self.runtime = opened.runtime

    def _init_events(self) -> None:
        self._portwatch: PortWatch | None = None
        #: the device's object counts in this process (its limits: .limits)
        self.objects: ObjectCounts = counts_for(self.transport, self.name)
        ev_r, ev_w = os.pipe()
        os.set_blocking(ev_r, False)
        os.set_blocking(ev_w, False)
        # the opened device: runtime, async events, handles (shared with imported contexts)
        file: DeviceFile[EngineEvent | AsyncEvent] = DeviceFile(self.runtime, ev_r, ev_w)
        file.attrs = {k: getattr(self, k) for k in _SHARED_ATTRS}
        self._attach(file, ev_r)
        self.port.events.subscribe(file.post)

    def _attach(self, file: DeviceFile[EngineEvent | AsyncEvent], ev_r: int) -> None:
        """Refer to ``file`` through the command FD ``ev_r`` (this context owns it)."""
        self._file = file
        self._ev_r = ev_r
        # engine events recorded under the engine lock, turned into AsyncEvents (the
        # verbs owner looked up) by get_async_event in the application's thread
        self._events = file.events
        self._ev_lock = file.ev_lock
        self._owners = file.owners
        self._finalizer = weakref.finalize(self, file.release, ev_r)

    @classmethod
    def import_device(cls, cmd_fd: int) -> Self:
        """``ibv_import_device``: a second context on the device opened by the context whose
        command FD (:meth:`async_fileno`) ``cmd_fd`` is, usually ``os.dup`` of it. It shares
        that context's objects (PDs, MRs, QPs, CQs ... by handle), engine and async events,
        and takes ownership of ``cmd_fd`` (closing it closes the descriptor). The device
        stays open until every context on it is closed, as a uverbs file stays open until
        its last descriptor is. Within this process only: another process's descriptor
        gives :class:`~softrdma.errors.NotSupported` (EOPNOTSUPP)."""
        ctx = cls.__new__(cls)
        VerbsObject.__init__(ctx)
        ctx._init_import(cmd_fd)
        return ctx

    def _init_import(self, cmd_fd: int) -> None:
        self._retained = []
        file = lookup(cmd_fd)
        file.add_user()
        for k, v in file.attrs.items():
            setattr(self, k, v)
        self._portwatch = None
        self._attach(file, cmd_fd)

    # ---- attributes -------------------------------------------------------------------------
    def _check(self) -> None:
        """Closed, or the device failed (its devd died): :class:`DeviceError` then."""
        super()._check()
        fatal = getattr(self.runtime, "fatal", None)
        if fatal is not None:
            raise DeviceError(fatal)

    def query_device(self) -> DeviceAttr:
        self._check()
        if self.transport == "iwarp":  # siw: no atomics, no multicast, no memory windows
            attr = DeviceAttr(node_guid=self.node_guid, sys_image_guid=self.node_guid,
                              max_pkeys=len(self.port.pkeys), atomic_caps=0, max_mcast_grp=0,
                              max_mcast_qp_attach=0, max_total_mcast_qp_attach=0)
        else:
            attr = DeviceAttr(node_guid=self.node_guid, sys_image_guid=self.node_guid,
                              max_pkeys=len(self.port.pkeys),
                              device_cap_flags=int(DEVICE_CAP_FLAGS | MW_CAP_FLAGS
                                                   | XRC_CAP_FLAGS))
        for limit, value in LIMITS.items():  # what creation enforces (.limits)
            setattr(attr, limit, value)
        if self.transport == "iwarp":
            attr.max_mw = 0
        attr.max_mr_size = max_mr_size()
        return attr

    def query_port(self, port_num: int = 1) -> PortAttr:
        self._check()
        _check_port(port_num)
        return PortAttr(active_mtu=self.active_mtu, gid_tbl_len=gid_table_len(self),
                        pkey_tbl_len=len(self.port.pkeys),
                        bad_pkey_cntr=self.port.counters.rcvd_bad_pkey & 0xFFFF,
                        qkey_viol_cntr=self.port.counters.rcvd_bad_qkey & 0xFFFF)

    def query_gid(self, port_num: int = 1, index: int = 0) -> GID:
        self._check()
        _check_port(port_num)
        gids = self.port.gids
        size = gid_table_len(self)
        if not isinstance(index, int) or not 0 <= index < size:
            raise InvalidArgument("index", f"GID index {index!r} is outside the GID table "
                                           f"(0..{size - 1})")
        # an empty entry reads as the zero GID, as ibv_query_gid reads rxe's sysfs table
        return GID(gids[index]) if index < len(gids) else GID(bytes(16))

    def query_gid_type(self, port_num: int = 1, index: int = 0) -> int:
        """``ibv_query_gid_type``: ``IBV_GID_TYPE_ROCE_V1`` ("IB/RoCE v1", Annex A16) or
        ``IBV_GID_TYPE_ROCE_V2`` for a RoCE device, chosen per GID as Linux does;
        ENODATA for an empty entry (Linux ``rdma_query_gid`` on an invalid entry)."""
        self.query_gid(port_num, index)
        if index >= len(self.port.gids):
            raise InvalidArgument("index", f"GID index {index} is empty", errno=errno.ENODATA)
        types = getattr(self.port, "gid_types", None)
        if types:
            return int(types[index])
        return int(e.IBV_GID_TYPE_ROCE_V2)

    def query_pkey(self, port_num: int = 1, index: int = 0) -> int:
        self._check()
        _check_port(port_num)
        pkeys = self.port.pkeys
        if not isinstance(index, int) or not 0 <= index < len(pkeys):
            raise InvalidArgument("index", f"P_Key index {index!r} not in 0..{len(pkeys) - 1}")
        return pkeys[index]

    @property
    def gids(self) -> list[GID]:
        return [GID(g) for g in self.port.gids]

    def gid_index(self, gid: GID | str | bytes) -> int:
        """Index of ``gid`` in the GID table (InvalidArgument if absent)."""
        raw = GID(gid).raw
        try:
            return self.port.gids.index(raw)
        except ValueError:
            raise InvalidArgument("gid", f"{GID(raw)} is not a GID of {self.name}") from None

    def progress(self, timeout: float = 0.0) -> int:
        """Run the engine once (receive, timers, transmit); wait up to ``timeout`` s."""
        self._check()
        return self.runtime.progress(seconds(timeout, "timeout"))

    def counters(self) -> dict[str, int]:
        """This process's port counters by name (see :meth:`query_port_counters`)."""
        self._check()
        return self.port.counters.as_dict()

    def query_port_counters(self, port_num: int = 1) -> PortCounters:
        """The port's counters (``rdma statistic show link DEV/PORT``): packets, bytes,
        retransmissions, RNR NAKs, ICRC errors and drops by reason (CA16-23). On a
        shared device they are the device's, every process's included."""
        self._check()
        _check_port(port_num)
        if self.transport == "iwarp":
            return PortCounters.from_values(self.name, port_num, self.port.counters.as_dict())
        rt = self.runtime
        shared = rt.link is not None and rt.link.shared
        return PortCounters.from_values(self.name, port_num, rt.device_counters(), shared)

    # ---- asynchronous events -----------------------------------------------------------------
    def _register_owner(self, engine_obj: object, verbs_obj: object) -> None:
        self._owners[id(engine_obj)] = weakref.ref(verbs_obj)

    def _unregister_owner(self, engine_obj: object) -> None:
        """The verbs object of ``engine_obj`` is destroyed: forget it, and drop the async
        events still pending about it (Linux ``ib_uverbs_release_uevent``), so that an
        application that never reads async events does not keep destroyed QPs alive."""
        ref = self._owners.pop(id(engine_obj), None)
        owner = ref() if ref is not None else None
        with self._ev_lock:
            if not self._events:
                return
            keep = [ev for ev in self._events
                    if getattr(ev, "element", None) is not engine_obj
                    and (owner is None or getattr(ev, "element", None) is not owner)]
            dropped = len(self._events) - len(keep)
            self._events.clear()  # in place: imported contexts share the queue
            self._events.extend(keep)
        if dropped:
            try:
                os.read(self._ev_r, dropped)  # one pipe byte per pending event
            except OSError:
                pass

    def _as_async_event(self, ev: EngineEvent | AsyncEvent) -> AsyncEvent:
        """The verbs event of an engine event: its element is the verbs object (QP, SRQ)
        that owns the engine object, if it is still alive."""
        if isinstance(ev, AsyncEvent):
            return ev
        obj = ev.element
        ref = self._owners.get(id(obj))
        element = ref() if ref is not None else obj
        return AsyncEvent(int(_ENGINE_EVENTS[ev.type]), element)

    def _post_event(self, ev: EngineEvent | AsyncEvent) -> None:
        """Record an event (under the engine lock for engine events: no other work)."""
        self._file.post(ev)

    def watch_port(self, interval: float = 0.2) -> None:
        """Post ``IBV_EVENT_PORT_ERR``/``PORT_ACTIVE``/``GID_CHANGE`` (element: the port
        number, 1) when the device's interface goes down or up or changes addresses, as
        rxe does from its netdev notifier (``drivers.host.portwatch``: told by rtnetlink,
        until the context closes; where rtnetlink is unavailable the interface is polled
        every ``interval`` seconds)."""
        self._check()
        interval = seconds(interval, "interval")
        if self.netdev is None or self._portwatch is not None:
            return
        # the watch's thread refers to the device file, not to this context (a running
        # thread is a root: the context would never be collected), and it stops when
        # the context is closed or collected
        post = self._file.post
        watch = PortWatch(self.netdev, lambda et: post(AsyncEvent(et, 1)), interval)
        self._portwatch = watch
        weakref.finalize(self, watch.stop)

    def async_fileno(self) -> int:
        """A descriptor that polls readable while async events are pending."""
        VerbsObject._check(self)  # events stay readable after a device failure
        return self._ev_r

    def get_async_event(self, timeout: float | None = None) -> AsyncEvent:
        """The next asynchronous event (``ibv_get_async_event``); TimeoutError after
        ``timeout`` seconds (None: wait forever)."""
        VerbsObject._check(self)  # events stay readable after a device failure
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        manual = not self.runtime.threaded
        while True:
            with self._ev_lock:
                ev = self._events.popleft() if self._events else None
            if ev is not None:
                try:
                    os.read(self._ev_r, 1)
                except BlockingIOError:
                    pass
                return self._as_async_event(ev)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("no asynchronous event")
            if manual:
                self.runtime.progress()
                wait = 0.001 if left is None else min(left, 0.001)
            else:
                wait = 0.1 if left is None else min(left, 0.1)
            readable([self._ev_r], wait)

    def ack_async_event(self, event: AsyncEvent) -> None:
        """``ibv_ack_async_event`` (nothing to release in softrdma)."""
        if not isinstance(event, AsyncEvent):
            raise InvalidArgument("event", f"expected an AsyncEvent, got {type(event).__name__}")

    # ---- lifetime --------------------------------------------------------------------------------
    def retain(self, service: object) -> Callable[[], None]:
        """Keep ``service`` alive as long as this context is open: something bound to the
        device that the engine refers to only weakly, such as the IB CM's binding on QP1
        (:meth:`softrdma.drivers.cm.gsi.CmBinding.attach`). The engine's port lives as long
        as the device file, which the context's finalizer holds, so a strong reference
        from the port would keep the service, and through its connections the context,
        alive after the application dropped them (docs/verbs-api.md, "Lifetime").
        Returns the call that lets go of it (the service's own ``close``)."""
        self._check()
        self._retained.append(service)
        ref = weakref.ref(self)

        def let_go() -> None:
            ctx = ref()
            if ctx is not None and service in ctx._retained:
                ctx._retained.remove(service)
        return let_go

    def _release(self) -> None:
        self._retained.clear()
        self._finalizer.detach()
        if self._portwatch is not None:
            self._portwatch.stop()
        self._file.release(self._ev_r)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<Context {self.name}{state}>"


def _check_port(port_num: int) -> None:
    if port_num != 1:
        raise InvalidArgument("port_num", f"softrdma devices have one port (1), not {port_num!r}")

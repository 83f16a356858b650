"""Which softrdma device an IP address belongs to, and the devices the rdma_cm layer opened.

Address resolution (librdmacm ``rdma_resolve_addr`` / ``rdma_bind_addr``): the candidate
devices are the registry's (``softrdma link``; each owns its netdev's addresses) plus the
built-in iWARP loopback device ``softrdma_iw_lo`` (127.0.0.1 and ::1). A source address
picks the devices owning it; without one, the kernel's route to the destination gives the
source address (as Linux's address resolution) and the device owning it (a loopback
destination, 127.0.0.0/8 or ::1, only a device on ``lo``). As Linux's ``addr_handler``
(drivers/infiniband/core/cma.c) there is no other fallback: no route is
``ENETUNREACH`` (or the route lookup's own errno, e.g. ``EHOSTUNREACH``), a route from
an address no softrdma device owns is ``ENODEV`` (``cma_acquire_dev_by_src_ip``); the
rdma_cm layer reports either as ``RDMA_CM_EVENT_ADDR_ERROR`` with that status. Only an
IPv6 link-local destination, which the kernel cannot route without its scope, picks a
device with a link-local address. ``prefer`` narrows the choice: a device name, or a transport ``"roce"`` /
``"iwarp"`` (default: the first candidate, registry order, so RoCE before the built-in
iWARP device). The transport then comes from the device type. ``rdma_bind_addr`` of a
loopback address that no device of the preference owns binds no device
(:func:`bind_device`; the kernel's ``cma_any_addr``).

The candidate list is read once (the registry file and ``/sys``) and kept until the
registry file or a network interface changes: an rtnetlink socket subscribed to the link
and address groups (``RTMGRP_LINK``, ``RTMGRP_IPV4_IFADDR``, ``RTMGRP_IPV6_IFADDR``)
has a message queued by the time a change (``ip addr add``) returns, and the registry
file is replaced, never rewritten in place (a new inode). Without rtnetlink nothing is
kept. So a connection's address resolution costs one route lookup, as in Linux. The
route lookup, the rtnetlink watch and the locked tables are I/O, in
:mod:`softrdma.drivers.cm.cm_devices`; this module holds the choice.

Like librdmacm, a device is opened once per process (one verbs ``Context``, and for RoCE
one :class:`~softrdma.drivers.cm.gsi.CmBinding` on its QP1) and stays open until
:func:`release_devices`.
"""

from __future__ import annotations

import errno
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..drivers.cm.cm_devices import KeptList, OpenTable, route_source
from ..drivers.cm.gsi import CmBinding
from ..errors import DeviceError, InvalidArgument
from ..ibcm.params import CmConfig
from ..verbs.device import IWARP_LOOPBACK, Context, get_device_list
from ..wire.ipcm import IpAddress

__all__ = ["DeviceEntry", "OpenDevice", "candidates", "find_device", "open_device",
           "open_devices", "release_devices", "configure", "Options", "options", "is_loopback",
           "bind_device"]


@dataclass(slots=True)
class DeviceEntry:
    """A device the rdma_cm layer may use."""

    name: str
    transport: str  # "roce" | "iwarp"
    netdev: str | None
    ips: tuple[bytes, ...]


@dataclass(slots=True)
class Options:
    """Process-wide settings of the rdma_cm layer (:func:`configure`)."""

    cm_config: CmConfig | None = None
    iwarp_timeout: float = 10.0
    shared: bool | None = None
    #: builds the verbs Context of a device the layer opens, from its name and transport
    #: (the pyverbs compatibility layer gives its own Context class); None: verbs.Context
    context_factory: Callable[[str, str], Any] | None = None


options = Options()


@dataclass(slots=True, eq=False)
class OpenDevice:
    """An opened device: its verbs Context, the CM on QP1 (RoCE), the ids using it."""

    entry: DeviceEntry
    ctx: Any
    binding: CmBinding | None
    ids: set[Any] = field(default_factory=set)


_open: OpenTable[OpenDevice] = OpenTable()


def configure(*, cm_config: CmConfig | None = None, iwarp_timeout: float | None = None,
              shared: bool | None = None) -> None:
    """Set the IB CM timers/retries (applied to open and future RoCE devices), the iWARP
    connect timeout (seconds) and whether RoCE devices are opened through devd."""
    if iwarp_timeout is not None:
        if not iwarp_timeout > 0:
            raise InvalidArgument("iwarp_timeout", "must be > 0")
        options.iwarp_timeout = iwarp_timeout
    if shared is not None:
        options.shared = shared
    if cm_config is not None:
        options.cm_config = cm_config

        def apply(dev: OpenDevice) -> None:
            if dev.binding is not None:
                dev.binding.agent.config = cm_config
        _open.each(apply)


def is_loopback(ip: IpAddress) -> bool:
    return ip.is_loopback


def bind_device(ip: IpAddress, prefer: str | None) -> DeviceEntry | None:
    """The device ``rdma_bind_addr`` binds a specific address ``ip`` to: the one that owns
    it (:func:`find_device`). A loopback address that no device (of ``prefer``) owns binds
    none, as the kernel's ``cma_any_addr`` counts every loopback address as a wildcard:
    libfabric's verbs provider binds "localhost" to learn which devices a passive
    endpoint may use, and takes an id without a device as "all of them". A softrdma
    device on ``lo`` (``softrdma_lo``) owns 127.0.0.1 and ::1, so a program binding
    those gets it, which a program on Linux, whose devices sit on other interfaces,
    cannot. Any other address no device owns is :class:`DeviceError` (EADDRNOTAVAIL)."""
    try:
        return find_device(ip, None, prefer)[0]
    except DeviceError:
        if ip.is_loopback:
            return None
        raise


def _read_candidates() -> list[DeviceEntry]:
    out = [DeviceEntry(d.name, d.type, d.netdev, tuple(d.ips)) for d in get_device_list()]
    if all(d.name != IWARP_LOOPBACK for d in out):
        out.append(DeviceEntry(IWARP_LOOPBACK, "iwarp", "lo",
                               (bytes([127, 0, 0, 1]), bytes(15) + b"\x01")))
    return out


_candidates: KeptList[DeviceEntry] = KeptList(_read_candidates)


def candidates() -> list[DeviceEntry]:
    """Every device: the registry's, then the built-in iWARP loopback device (kept
    until the registry or an interface changes, see the module docstring)."""
    return _candidates.get()


def _matches(prefer: str | None, d: DeviceEntry) -> bool:
    return prefer is None or prefer in (d.name, d.transport)


def find_device(src: IpAddress | None, dst: IpAddress | None,
                prefer: str | None = None) -> tuple[DeviceEntry, IpAddress]:
    """The device for a connection from ``src`` (None: chosen) to ``dst``, and the
    source address to use (see the module docstring); :class:`DeviceError` if none."""
    if prefer is not None and not isinstance(prefer, str):
        raise InvalidArgument("device", "a device name, 'roce' or 'iwarp'")
    devs = [d for d in candidates() if _matches(prefer, d)]
    if src is not None and not src.is_unspecified:
        for d in devs:
            if src.packed in d.ips:
                return d, src
        raise DeviceError(f"no softrdma device{'' if prefer is None else ' ' + repr(prefer)} "
                          f"owns {src}", errno=99)  # EADDRNOTAVAIL
    if dst is None:
        raise InvalidArgument("dst", "a destination address is needed without a source")
    # The kernel's route to dst names the source address, and so the device, as Linux
    # rdma_resolve_addr does (addr_resolve, then cma_acquire_dev_by_src_ip).
    where = '' if prefer is None else ' ' + repr(prefer)
    fam = 4 if dst.version == 4 else 16
    if dst.version == 6 and dst.is_link_local:
        for d in devs:
            own = [ip for ip in d.ips if len(ip) == fam]
            if dst.packed in own:
                return d, dst
            if own:
                return d, ipaddress.ip_address(_pick_source(dst, own))
        raise DeviceError(f"no softrdma device{where} has an IPv6 address to reach {dst}",
                          errno=errno.ENODEV)
    kern = route_source(dst)
    if isinstance(kern, int):
        raise DeviceError(f"no route to {dst}: {os.strerror(kern)}", errno=kern)
    for d in devs:
        if kern in d.ips and (d.netdev == "lo" or not dst.is_loopback):
            return d, ipaddress.ip_address(kern)
    raise DeviceError(f"the route to {dst} leaves from {ipaddress.ip_address(kern)}, which no "
                      f"softrdma device{where} owns", errno=errno.ENODEV)


def _pick_source(dst: IpAddress, own: list[bytes]) -> bytes:
    """The device address to use towards ``dst``: the kernel's route source if the device
    owns it, else one of the same IPv6 scope (a global destination is not reached from
    a link-local source: its ICRC and replies would use the wrong address), else the
    first."""
    routed = route_source(dst)
    if isinstance(routed, bytes) and routed in own:
        return routed
    link_local = dst.version == 6 and dst.is_link_local
    same = [ip for ip in own if len(ip) == 4 or ipaddress.ip_address(ip).is_link_local == link_local]
    return (same or own)[0]


def devices_for_wildcard(version: int, prefer: str | None) -> list[DeviceEntry]:
    """The devices a listener bound to the wildcard address listens on: those of the
    preferred transport (default RoCE) with an address of the IP version."""
    want = prefer if prefer is not None else "roce"
    fam = 4 if version == 4 else 16
    return [d for d in candidates() if _matches(want, d) and any(len(ip) == fam for ip in d.ips)]


def open_device(entry: DeviceEntry) -> OpenDevice:
    """The process's open instance of ``entry`` (opened on first use)."""
    return _open.get_or_open(entry.name, lambda: _open_new(entry))


def _open_new(entry: DeviceEntry) -> OpenDevice:
    factory = options.context_factory
    binding: CmBinding | None = None
    if factory is not None:
        ctx = factory(entry.name, entry.transport)
    elif entry.transport == "iwarp":
        ctx = Context(entry.name, transport="iwarp")
    else:
        ctx = Context(entry.name, shared=options.shared)
    if entry.transport != "iwarp":
        try:
            binding = CmBinding.attach(ctx, config=options.cm_config)
        except BaseException:
            ctx.close()
            raise
    return OpenDevice(entry, ctx, binding)


def open_devices() -> list[OpenDevice]:
    """The devices this process opened (a copy of the list: ``softrdma res``)."""
    return _open.values()


def release_devices(name: str | None = None) -> None:
    """Close the devices (all, or ``name``): every id still using one gets
    ``RDMA_CM_EVENT_DEVICE_REMOVAL`` first (its QP and the device are then unusable)."""
    for dev in _open.pop(name):
        for cid in list(dev.ids):
            cid.device_removed()
        if dev.binding is not None:
            dev.binding.close()
        try:
            dev.ctx.close()
        except Exception:  # noqa: BLE001 - already closed by its owner
            pass

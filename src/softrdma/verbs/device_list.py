"""The devices a program can open (``ibv_get_device_list``) and how a registry device's
link is opened (the devd client, or the process's own RoCEv2 UDP sockets and RoCEv1 raw
Ethernet link; Annex A16, A17): the part of :class:`~.device.Context` that chooses a
device's link. Re-exported by :mod:`.device`.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from ..drivers.devd.client import DevdLink
from ..drivers.host import netdev as _netdev
from ..drivers.host import registry
from ..drivers.links.dual import DualLink
from ..drivers.links.link import Link
from ..drivers.links.rawether import RawEtherLink
from ..drivers.links.udp import UdpLink
from ..drivers.links.udp_multi import MultiUdpLink
from ..errors import DeviceError, InvalidArgument, SoftRdmaError
from .device_attr import DeviceInfo, guid_from_mac
from .gids import is_link_local


def netdev_snapshot(netdev: str) -> _netdev.NetDev | None:
    try:
        return _netdev.get(netdev)
    except Exception:  # noqa: BLE001 - a vanished interface: the device is listed without IPs
        return None


def netdev_of_ips(ips: tuple[bytes, ...]) -> _netdev.NetDev | None:
    """The interface that holds one of ``ips`` (for a Context built on an explicit link)."""
    try:
        names = _netdev.list_names()
    except Exception:  # noqa: BLE001 - no /sys: unknown netdev
        return None
    for n in names:
        nd = netdev_snapshot(n)
        if nd is not None and any(ip in nd.ips for ip in ips):
            return nd
    if any((len(ip) == 4 and ip[0] == 127) or ip == bytes(15) + b"\x01" for ip in ips):
        return netdev_snapshot("lo")  # all of 127.0.0.0/8 is on the loopback interface
    return None


def state_directory() -> Path:
    """The directory of this user's device registry and devds (``$SOFTRDMA_STATE_DIR``,
    else root's ``/run/softrdma`` or the user's runtime directory)."""
    return registry.state_dir()


def registered_devices() -> list[DeviceInfo]:
    """The registered softrdma devices (``softrdma link add``), registry order; without
    the built-in iWARP loopback device (see :func:`get_device_list`)."""
    out = []
    for rec in registry.list_devices():
        nd = netdev_snapshot(rec.netdev)
        out.append(DeviceInfo(
            name=rec.name,
            netdev=rec.netdev,
            type=rec.type,
            node_guid=guid_from_mac(nd.mac if nd is not None else b""),
            udp_port=rec.udp_port,
            ips=tuple(nd.ips) if nd is not None else (),
            record=rec,
        ))
    return out


IWARP_LOOPBACK = "softrdma_iw_lo"  # the built-in iWARP device on the loopback interface
LOOPBACK_IPS = (bytes([127, 0, 0, 1]), bytes(15) + b"\x01")


def get_device_list() -> list[DeviceInfo]:
    """Every device a program can open (``ibv_get_device_list``): the registry's, then
    the built-in iWARP loopback device :data:`IWARP_LOOPBACK` (unless a registered device
    has its name), as ``softrdma link``, ``devinfo`` and ``devices`` list them; each opens
    with :class:`Context`."""
    out = registered_devices()
    if all(d.name != IWARP_LOOPBACK for d in out):
        nd = netdev_snapshot("lo")
        out.append(DeviceInfo(name=IWARP_LOOPBACK, netdev="lo", type="iwarp",
                              node_guid=guid_from_mac(nd.mac if nd is not None else b""),
                              udp_port=0, ips=LOOPBACK_IPS))
    return out


all_devices = get_device_list  # the name the tools used before get_device_list listed everything


def unknown_device(name: str) -> str | None:
    """Why ``name`` names no device a program could open (:func:`get_device_list`), or
    None: what a launcher's device option (``softrdma run -d``, ``softrdma pyverbs
    --dev``) says before the program starts, as ``ibv_devinfo -d`` refuses a device that
    is not there, rather than the program meeting it later."""
    try:
        names = [d.name for d in get_device_list()]
    except SoftRdmaError as exc:
        return f"cannot list the softrdma devices: {exc}"
    if name in names:
        return None
    return f"no softrdma device named {name!r} (devices: {', '.join(names) or 'none'})"


def transport_of(name: str | None, transport: str | None, fabric: Link | None,
                  link: Link | None) -> str:
    """"iwarp" or "roce": the ``transport`` argument, else the registry device's type."""
    if transport is not None:
        if transport not in ("roce", "iwarp"):
            raise InvalidArgument("transport", f"must be 'roce' or 'iwarp', got {transport!r}")
        if transport == "iwarp" and (fabric is not None or link is not None):
            raise InvalidArgument("transport", "an iWARP device runs over TCP: no fabric or link")
        return transport
    if fabric is not None or link is not None:
        return "roce"
    if name == IWARP_LOOPBACK:
        return "iwarp"
    devices = registered_devices()
    found = [d for d in devices if d.name == name] if name is not None else devices[:1]
    return "iwarp" if found and found[0].type == "iwarp" else "roce"


def shared_default() -> bool:
    return os.environ.get("SOFTRDMA_SHARED", "1").strip().lower() not in ("0", "no", "false", "off")


def open_registry_device(name: str | None, shared: bool | None) -> tuple[DeviceInfo, Link]:
    """Resolve ``name`` in the registry and open its link (devd client or own UDP socket)."""
    devices = registered_devices()
    if name is None:
        if not devices:
            raise DeviceError("no softrdma device (add one with `softrdma link add NAME netdev IFACE`)")
        info = devices[0]
    else:
        found = [d for d in devices if d.name == name]
        if not found:
            raise DeviceError(f"no softrdma device named {name!r}")
        info = found[0]
    if info.type != "roce":
        raise DeviceError(f"device {info.name!r} is {info.type}; verbs.Context drives RoCE devices")
    if shared is None:
        shared = shared_default()
    rec = info.record  # registry devices always have one
    if shared and rec is not None:
        return info, DevdLink(rec)
    if rec is not None and rec.roce_v1:
        # Annex A16: RoCEv1 on the netdev itself (raw Ethernet, EtherType 0x8915)
        raw = RawEtherLink(rec.netdev, vlan=rec.vlan)
        if not rec.roce_v2:
            return info, raw
        try:
            return info, DualLink(open_udp(info), raw)
        except BaseException:
            raw.close()
            raise
    return info, open_udp(info)


def open_udp(info: DeviceInfo) -> Link:
    """The in-process RoCEv2 link of a registry device: a socket on each of its netdev's
    addresses, so that its GID table is the one the device has through devd (every
    address, Annex A17; ``::1`` beside ``127.0.0.1`` on
    ``lo``). The first IPv4 address (else the first IPv6 one) must bind; another that
    cannot (its port taken there) is left out of the table."""
    if not info.ips:
        raise DeviceError(f"device {info.name!r}: netdev {info.netdev!r} has no IP address")
    v4 = [ip for ip in info.ips if len(ip) == 4]
    first = v4[0] if v4 else info.ips[0]
    links = [UdpLink(bind_target(first, info.netdev), port=info.udp_port)]
    try:
        for ip in info.ips:
            if ip == first:
                continue
            try:
                links.append(UdpLink(bind_target(ip, info.netdev), port=info.udp_port))
            except (OSError, SoftRdmaError):
                continue
    except BaseException:
        for link in links:
            link.close()
        raise
    return links[0] if len(links) == 1 else MultiUdpLink(links)


def bind_target(ip: bytes, netdev: str | None) -> str | bytes:
    """An address as UdpLink binds it (an IPv6 link-local one with its ``%netdev`` scope)."""
    if is_link_local(ip) and netdev:
        return f"{ipaddress.IPv6Address(ip)}%{netdev}"
    return ip


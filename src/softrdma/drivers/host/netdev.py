"""Network interfaces: names, addresses, MTU, MAC, link state (Linux).

A softrdma device sits on a netdev (``softrdma link add NAME netdev IFACE``, design.md
"Devices shared by processes"); its GIDs are the netdev's IP addresses (Annex A17) and
its active MTU follows the netdev MTU (see :func:`softrdma.drivers.host.registry.ib_mtu_for`).

Sources, all without a subprocess:

* names, MTU, MAC, flags, carrier: ``/sys/class/net/IF/{ifindex,mtu,address,flags,carrier}``
  (``carrier`` is unreadable, EINVAL, while the interface is administratively down);
* IPv4 addresses: ``ioctl(SIOCGIFCONF)``, which lists every IPv4 address of every
  interface (aliases carry the label ``IF:N``); ``ioctl(SIOCGIFADDR)`` (primary address
  only) is the fallback;
* IPv6 addresses: ``/proc/net/if_inet6`` (address, ifindex, prefix length, scope,
  flags, name).

An unknown interface raises :class:`~softrdma.errors.DeviceError`.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from softrdma.errors import DeviceError

__all__ = [
    "IFF_UP",
    "IPV6_SCOPE_GLOBAL",
    "IPV6_SCOPE_HOST",
    "IPV6_SCOPE_LINK",
    "Ipv6Address",
    "NetDev",
    "exists",
    "get",
    "ipv4_addresses",
    "ipv6_addresses",
    "list_names",
]

SYS_CLASS_NET = Path("/sys/class/net")
PROC_IF_INET6 = Path("/proc/net/if_inet6")

SIOCGIFCONF = 0x8912
SIOCGIFADDR = 0x8915
IFNAMSIZ = 16
_IFREQ_SIZE = 40  # struct ifreq on 64-bit Linux: 16-byte name + 24-byte union
_IFCONF = struct.Struct("iL")  # struct ifconf { int ifc_len; char *ifc_buf; }

IFF_UP = 0x1

# /proc/net/if_inet6 scope values (IPV6_ADDR_SCOPE_* >> 4 as the kernel prints them)
IPV6_SCOPE_GLOBAL = 0x00
IPV6_SCOPE_HOST = 0x10
IPV6_SCOPE_LINK = 0x20
_IFA_F_TENTATIVE = 0x40
_IFA_F_DADFAILED = 0x08


@dataclass(frozen=True, slots=True)
class Ipv6Address:
    """One line of ``/proc/net/if_inet6``."""

    address: bytes  # 16 bytes
    prefixlen: int
    scope: int  # IPV6_SCOPE_*
    flags: int  # IFA_F_*
    ifindex: int

    @property
    def usable(self) -> bool:
        """False while duplicate address detection runs or after it failed."""
        return not self.flags & (_IFA_F_TENTATIVE | _IFA_F_DADFAILED)

    def __str__(self) -> str:
        return socket.inet_ntop(socket.AF_INET6, self.address)


@dataclass(frozen=True, slots=True)
class NetDev:
    """A snapshot of one interface."""

    name: str
    index: int
    mtu: int
    mac: bytes  # 6 bytes for Ethernet (and all-zero for lo); may be empty for odd link types
    flags: int  # dev->flags (IFF_UP ...); IFF_RUNNING is not in sysfs, see ``carrier``
    carrier: bool
    ipv4: tuple[bytes, ...]  # 4-byte addresses
    ipv6: tuple[Ipv6Address, ...]

    @property
    def up(self) -> bool:
        """Administratively up and running (carrier): rxe's ``netif_running && carrier_ok``."""
        return bool(self.flags & IFF_UP) and self.carrier

    @property
    def ips(self) -> tuple[bytes, ...]:
        """Every usable address, IPv4 (4 bytes) first, then IPv6 (16 bytes)."""
        return self.ipv4 + tuple(a.address for a in self.ipv6 if a.usable)


def _check_name(name: str) -> None:
    if not name or len(name) >= IFNAMSIZ or "/" in name or name in (".", ".."):
        raise DeviceError(f"netdev {name!r}: not a valid interface name")


def exists(name: str) -> bool:
    """True if interface ``name`` exists."""
    try:
        _check_name(name)
    except DeviceError:
        return False
    return (SYS_CLASS_NET / name).exists()


def list_names() -> list[str]:
    """All interface names, sorted by ifindex."""
    names: list[tuple[int, str]] = []
    try:
        entries = os.listdir(SYS_CLASS_NET)
    except OSError as exc:
        raise DeviceError(f"cannot list network interfaces: {exc}") from exc
    for entry in entries:
        try:
            index = int((SYS_CLASS_NET / entry / "ifindex").read_text())
        except (OSError, ValueError):
            continue
        names.append((index, entry))
    return [n for _, n in sorted(names)]


def _read_sys(name: str, attr: str) -> str:
    _check_name(name)
    try:
        return (SYS_CLASS_NET / name / attr).read_text().strip()
    except FileNotFoundError as exc:
        raise DeviceError(f"netdev {name!r}: no such network interface") from exc
    except OSError as exc:
        raise DeviceError(f"netdev {name!r}: cannot read {attr}: {exc}") from exc


def _ipv4_ifconf() -> list[tuple[str, bytes]]:
    """Every (label, IPv4 address) pair from ``SIOCGIFCONF``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        count = 64
        while True:
            buf = array.array("B", bytes(count * _IFREQ_SIZE))
            addr, _ = buf.buffer_info()
            ifc = bytearray(_IFCONF.pack(len(buf), addr))
            fcntl.ioctl(s.fileno(), SIOCGIFCONF, ifc)
            used = _IFCONF.unpack(ifc)[0]
            if used < len(buf):
                break
            count *= 4  # the buffer may have been too small: grow and ask again
        raw = buf.tobytes()
    out: list[tuple[str, bytes]] = []
    for off in range(0, used, _IFREQ_SIZE):
        label = raw[off : off + IFNAMSIZ].split(b"\0", 1)[0].decode("ascii", "replace")
        family = struct.unpack_from("=H", raw, off + IFNAMSIZ)[0]
        if family == socket.AF_INET:
            out.append((label, raw[off + IFNAMSIZ + 4 : off + IFNAMSIZ + 8]))
    return out


def _ipv4_primary(name: str) -> list[bytes]:
    """The primary IPv4 address from ``SIOCGIFADDR`` (fallback path)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16s24x", name.encode())
        try:
            res = fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return []
            if exc.errno == errno.ENODEV:
                raise DeviceError(f"netdev {name!r}: no such network interface") from exc
            raise DeviceError(f"netdev {name!r}: SIOCGIFADDR failed: {exc}") from exc
    return [res[IFNAMSIZ + 4 : IFNAMSIZ + 8]]


def ipv4_addresses(name: str) -> list[bytes]:
    """The interface's IPv4 addresses (4 bytes each), primary first."""
    _read_sys(name, "ifindex")  # DeviceError if unknown
    try:
        pairs = _ipv4_ifconf()
    except OSError:
        return _ipv4_primary(name)
    out: list[bytes] = []
    for label, addr in pairs:
        if label.split(":", 1)[0] == name and addr not in out:
            out.append(addr)
    return out


def ipv6_addresses(name: str) -> list[Ipv6Address]:
    """The interface's IPv6 addresses from ``/proc/net/if_inet6`` (empty if IPv6 is off)."""
    _read_sys(name, "ifindex")
    try:
        text = PROC_IF_INET6.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise DeviceError(f"cannot read {PROC_IF_INET6}: {exc}") from exc
    out: list[Ipv6Address] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6 or fields[5] != name:
            continue
        try:
            out.append(
                Ipv6Address(
                    address=bytes.fromhex(fields[0]),
                    ifindex=int(fields[1], 16),
                    prefixlen=int(fields[2], 16),
                    scope=int(fields[3], 16),
                    flags=int(fields[4], 16),
                )
            )
        except ValueError:
            continue  # a malformed line is skipped rather than trusted
    return out


def get(name: str) -> NetDev:
    """A snapshot of interface ``name``; :class:`DeviceError` if there is none."""
    index = int(_read_sys(name, "ifindex"))
    try:
        mtu = int(_read_sys(name, "mtu"))
        flags = int(_read_sys(name, "flags"), 16)
    except ValueError as exc:
        raise DeviceError(f"netdev {name!r}: unreadable sysfs attribute: {exc}") from exc
    try:
        carrier = _read_sys(name, "carrier") == "1"
    except DeviceError:
        carrier = False  # EINVAL while down
    mac_text = _read_sys(name, "address")
    try:
        mac = bytes.fromhex(mac_text.replace(":", ""))
    except ValueError:
        mac = b""
    return NetDev(
        name=name,
        index=index,
        mtu=mtu,
        mac=mac,
        flags=flags,
        carrier=carrier,
        ipv4=tuple(ipv4_addresses(name)),
        ipv6=tuple(ipv6_addresses(name)),
    )

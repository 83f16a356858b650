"""A Linux TUN device (``/dev/net/tun``, ``IFF_TUN | IFF_NO_PI``): whole IP packets in
and out, and the iproute2 calls that give it addresses, an MTU and the up state.

The kernel does no ARP or ND on it (a TUN device is ``IFF_NOARP``); the IPoIB runtime
resolves next hops itself (as measured on Linux; see the kernel's
Documentation/networking/tuntap.rst).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import struct
import subprocess
from collections.abc import Sequence

from ..errors import DeviceError, InvalidArgument

__all__ = ["TunDevice", "IFNAMSIZ"]

TUN_PATH = "/dev/net/tun"
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFNAMSIZ = 16
_IFREQ = struct.Struct(f"{IFNAMSIZ}sH22x")
IP_TIMEOUT_S = 30


def _ip(*args: str) -> None:
    try:
        res = subprocess.run(["ip", *args], capture_output=True, text=True,
                             timeout=IP_TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise DeviceError("iproute2's `ip` is needed to configure the TUN device") from exc
    if res.returncode != 0:
        raise DeviceError(f"ip {' '.join(args)}: {res.stderr.strip() or res.returncode}")


class TunDevice:
    """An open TUN interface ``name`` in the current network namespace."""

    def __init__(self, name: str) -> None:
        if not name or len(name) >= IFNAMSIZ or "/" in name or name.strip() != name:
            raise InvalidArgument("name", f"{name!r} is not a valid interface name "
                                          f"(1..{IFNAMSIZ - 1} characters)")
        try:
            fd = os.open(TUN_PATH, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise DeviceError(f"cannot open {TUN_PATH}: {exc.strerror}", errno=exc.errno) from exc
        try:
            fcntl.ioctl(fd, TUNSETIFF, _IFREQ.pack(name.encode(), IFF_TUN | IFF_NO_PI))
        except OSError as exc:
            os.close(fd)
            raise DeviceError(f"cannot create TUN device {name}: {exc.strerror}",
                              errno=exc.errno) from exc
        os.set_blocking(fd, False)
        self.name = name
        self.fd = fd

    def configure(self, mtu: int, addresses: Sequence[ipaddress.IPv4Interface |
                                                       ipaddress.IPv6Interface]) -> None:
        """Set the MTU, add the addresses (no DAD: the link has no ND of the kernel's),
        bring the interface up."""
        _ip("link", "set", "dev", self.name, "mtu", str(mtu))
        for a in addresses:
            extra = ("nodad",) if a.version == 6 else ()
            _ip("addr", "add", str(a), "dev", self.name, *extra)
        _ip("link", "set", "dev", self.name, "up")

    def fileno(self) -> int:
        return self.fd

    def read_into(self, buf: memoryview) -> int:
        """One packet into ``buf``; 0 when none is waiting."""
        try:
            return os.readv(self.fd, [buf])
        except BlockingIOError:
            return 0

    def write(self, packet: bytes | memoryview) -> bool:
        """Hand one packet to the kernel; False if it was refused (counted by the caller)."""
        try:
            os.write(self.fd, packet)
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

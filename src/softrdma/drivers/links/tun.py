"""A Linux TUN device (``/dev/net/tun``, ``IFF_TUN | IFF_NO_PI | IFF_VNET_HDR``): whole IP
packets in and out, and the iproute2 calls that give it addresses, an MTU and the up state.

Every packet crosses the device behind a ``struct virtio_net_hdr`` (10 bytes, host byte
order; the kernel's include/uapi/linux/virtio_net.h). No offload is enabled
(``TUNSETOFFLOAD`` 0): the kernel computes and verifies every checksum itself, and hands
over no GSO packet, so the header read with a packet says nothing and is skipped. The
header written with a plain packet carries ``hdr_len``, the part of the packet the kernel copies
into the socket buffer's linear area, the rest going into page fragments; with a zero
``hdr_len`` (or a plain TUN device) a 64 KiB IPoIB-CM packet is copied into one linear
buffer. Measured (issue 26, iperf3 in connected mode on a loaded 2-core machine): 3.6-4.1
CPU s/GB in each IPoIB process with ``hdr_len``, 4.4-4.5 without (four runs); the memory
charged to a receiving UDP socket for a 65000-byte datagram is about 130 KB either way.

Packets the other way may be coalesced TCP (:mod:`softrdma.ipoib.gro`, :meth:`write_gso`):
the header then gives GSO type TCPV4/TCPV6 and the segment size, no checksum flag, so
the kernel still verifies the merged packet's TCP checksum over all of it. That check is
not what a write costs: written as checksum-partial instead (``VIRTIO_NET_HDR_F_NEEDS_CSUM``
at the TCP checksum, which local delivery takes as verified), connected mode ran no
faster (alternated, 4 pairs: 4,420 against 5,055 Mbit/s median), so checksums stay end
to end, as Linux IPoIB-CM keeps them (no checksum offload in connected mode).

Why no TSO/checksum offload on reads: the kernel would then hand over partial checksums,
and completing one in Python (RFC 1071 over the packet) costs about 12 us per 4 KB and
over 300 us per 64 KB on this machine kind, as much as the whole per-message cost of the
RC path (about 250 us per 64 KB); in connected mode TCP's segments are already 64 KiB
(the MTU is 65212), and in datagram mode the kernel cuts and sums the 4 KB segments for
less.
"""

from __future__ import annotations

import fcntl
import io
import ipaddress
import os
import struct
import subprocess
from collections.abc import Sequence

from ...errors import DeviceError, InvalidArgument

__all__ = ["TunDevice", "IFNAMSIZ", "VNET_HDR_LEN"]

TUN_PATH = "/dev/net/tun"
TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
TUNSETVNETHDRSZ = 0x400454D8
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
VNET_HDR = struct.Struct("=BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start/offset
VNET_HDR_LEN = VNET_HDR.size
LINEAR_LEN = 128  # bytes of a written packet in the linear area (IP + TCP headers fit)
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
            fcntl.ioctl(fd, TUNSETIFF,
                        _IFREQ.pack(name.encode(), IFF_TUN | IFF_NO_PI | IFF_VNET_HDR))
            fcntl.ioctl(fd, TUNSETVNETHDRSZ, struct.pack("i", VNET_HDR_LEN))
            fcntl.ioctl(fd, TUNSETOFFLOAD, 0)
        except OSError as exc:
            os.close(fd)
            raise DeviceError(f"cannot create TUN device {name}: {exc.strerror}",
                              errno=exc.errno) from exc
        os.set_blocking(fd, False)
        self.name = name
        self.fd = fd
        self._file = io.FileIO(fd, "r", closefd=False)  # read_framed's unbuffered read
        self._tx_hdrs = [VNET_HDR.pack(0, 0, n, 0, 0, 0) for n in range(LINEAR_LEN + 1)]

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

    def read_framed(self, buf: memoryview) -> int:
        """One packet into ``buf`` behind the header (``buf[VNET_HDR_LEN:]``), whose
        :data:`VNET_HDR_LEN` bytes it overwrites; the packet's length is returned, 0
        when none is waiting. One buffer for the ``read``: a ``readv`` of the header's own
        buffer and the packet's cost about 0.25 us more a packet, the per-packet read of
        datagram mode."""
        n = self._file.readinto(buf)  # None: nothing waiting (non-blocking)
        return n - VNET_HDR_LEN if n is not None and n > VNET_HDR_LEN else 0

    def write(self, packet: bytes | bytearray | memoryview) -> bool:
        """Hand one packet to the kernel; False if it was refused (counted by the caller)."""
        try:
            os.writev(self.fd, [self._tx_hdrs[min(len(packet), LINEAR_LEN)], packet])
            return True
        except OSError:
            return False

    def write_gso(self, head: bytes, payloads: Sequence[bytes | bytearray | memoryview],
                  gso_type: int, gso_size: int) -> bool:
        """Hand the kernel one coalesced TCP packet (:mod:`softrdma.ipoib.gro`): the IP
        and TCP headers ``head``, then ``payloads`` (segments of ``gso_size`` bytes, the
        last one maybe shorter), gathered by the one ``writev``; False if refused."""
        try:
            os.writev(self.fd, [VNET_HDR.pack(0, gso_type, len(head), gso_size, 0, 0), head,
                                *payloads])
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.fd >= 0:
            self._file.close()  # closefd=False: marks it closed, the fd is closed below
            os.close(self.fd)
            self.fd = -1

"""pcap and pcapng capture files: a reader for both and a writer for classic pcap.

Formats implemented:

* classic pcap (libpcap ``pcap-savefile(5)``; draft-ietf-opsawg-pcap §4-5): a 24-byte
  file header whose magic ``0xA1B2C3D4`` (microsecond) or ``0xA1B23C4D`` (nanosecond)
  also gives the byte order, then 16-byte record headers (ts_sec, ts_frac, incl_len,
  orig_len) each followed by ``incl_len`` bytes. The link type is the low 28 bits of the
  header's ``network`` field (the upper bits carry FCS information).
* pcapng (draft-ietf-opsawg-pcapng §3-4): blocks ``type | total_len | body | total_len``.
  A Section Header Block (§4.1) sets the byte order (by its byte-order magic) and resets
  the interface list; Interface Description Blocks (§4.2) give each interface's link
  type and timestamp resolution (``if_tsresol``, option 9) and offset (``if_tsoffset``,
  option 14); packets come from Enhanced Packet Blocks (§4.3), Simple Packet Blocks
  (§4.4, interface 0) and the obsolete Packet Block (Appendix; type 2). Every other
  block is skipped.

Anything malformed (unknown magic, truncated header or record, inconsistent block
lengths, a packet on an undeclared interface) raises :class:`softrdma.errors.DecodeError`
naming the frame or the file offset. Records are read one at a time, so a large capture
is never held in memory.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import IO, BinaryIO

from ..errors import ClosedError, DecodeError, InvalidArgument

__all__ = [
    "LINKTYPE_NULL", "LINKTYPE_ETHERNET", "LINKTYPE_RAW", "LINKTYPE_IPV4", "LINKTYPE_IPV6",
    "LINKTYPE_LINUX_SLL", "LINKTYPE_LINUX_SLL2", "PcapRecord", "read_pcap", "PcapWriter",
]

# Link types (tcpdump.org/linktypes.html).
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

_MAGIC_USEC = 0xA1B2C3D4
_MAGIC_NSEC = 0xA1B23C4D
_PCAPNG_SHB = 0x0A0D0D0A
_PCAPNG_BOM = 0x1A2B3C4D

# Largest record or block we accept; anything bigger is garbage, not a packet.
MAX_RECORD = 1 << 26


@dataclass(frozen=True, slots=True)
class PcapRecord:
    """One captured frame.

    ``ts`` is the capture time in seconds since the epoch, ``linktype`` the link type of
    the interface it was captured on, ``data`` the captured bytes (possibly fewer than
    ``orig_len`` when the capture snap length cut the frame) and ``index`` the 1-based
    frame number, as tshark counts it.
    """

    ts: float
    linktype: int
    data: bytes
    orig_len: int
    index: int


def _read_exact(f: IO[bytes], n: int, what: str) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise DecodeError(f"truncated {what}: needs {n} bytes, only {len(b)} left")
    return b


def read_pcap(path: str | os.PathLike[str] | BinaryIO) -> Iterator[PcapRecord]:
    """Yield every frame of a classic pcap or pcapng file, in file order.

    ``path`` is a file name or a binary file object opened for reading (not closed
    here). Raises :class:`DecodeError` for anything that is not a well-formed capture;
    an :class:`OSError` from opening the file propagates unchanged.
    """
    if isinstance(path, (str, os.PathLike)):
        with open(path, "rb") as f:
            yield from _read_stream(f)
    else:
        yield from _read_stream(path)


def _read_stream(f: IO[bytes]) -> Iterator[PcapRecord]:
    head = f.read(4)
    if len(head) == 0:
        raise DecodeError("empty file: not a pcap or pcapng capture")
    if len(head) < 4:
        raise DecodeError(f"truncated file header: {len(head)} bytes")
    for order in ("<", ">"):
        magic = struct.unpack(order + "I", head)[0]
        if magic in (_MAGIC_USEC, _MAGIC_NSEC):
            yield from _read_classic(f, order, magic == _MAGIC_NSEC)
            return
    if struct.unpack("<I", head)[0] == _PCAPNG_SHB:
        yield from _read_pcapng(f)
        return
    raise DecodeError(f"not a pcap or pcapng file (magic {head.hex()})")


def _read_classic(f: IO[bytes], order: str, nsec: bool) -> Iterator[PcapRecord]:
    """Classic pcap after its magic (pcap-savefile(5))."""
    _vmaj, _vmin, _zone, _sigfigs, _snaplen, network = struct.unpack(
        order + "HHiIII", _read_exact(f, 20, "pcap file header"))
    linktype = network & 0x0FFFFFFF
    rec = struct.Struct(order + "IIII")
    scale = 1e-9 if nsec else 1e-6
    index = 0
    while True:
        hdr = f.read(16)
        if not hdr:
            return
        index += 1
        if len(hdr) < 16:
            raise DecodeError(f"frame {index}: truncated record header "
                              f"({len(hdr)} of 16 bytes)")
        sec, frac, incl, orig = rec.unpack(hdr)
        if incl > MAX_RECORD:
            raise DecodeError(f"frame {index}: implausible captured length {incl}")
        data = f.read(incl)
        if len(data) != incl:
            raise DecodeError(f"frame {index}: truncated record: {incl} bytes announced, "
                              f"{len(data)} present")
        yield PcapRecord(sec + frac * scale, linktype, data, orig, index)


@dataclass(eq=False, slots=True)
class _Iface:
    """One pcapng interface: its link type, snap length and timestamp scale/offset."""

    linktype: int
    snaplen: int
    scale: float
    offset: int


def _parse_idb(body: bytes, order: str, pos: int) -> _Iface:
    """Interface Description Block body (pcapng §4.2)."""
    if len(body) < 8:
        raise DecodeError(f"offset {pos}: interface description block too short")
    linktype, _resv, snaplen = struct.unpack_from(order + "HHI", body, 0)
    scale = 1e-6
    offset = 0
    off = 8
    while off + 4 <= len(body):
        code, olen = struct.unpack_from(order + "HH", body, off)
        off += 4
        if code == 0:
            break
        if off + olen > len(body):
            raise DecodeError(f"offset {pos}: interface option {code} overruns its block")
        if code == 9 and olen >= 1:  # if_tsresol
            v = body[off]
            scale = 2.0 ** -(v & 0x7F) if v & 0x80 else 10.0 ** -v
        elif code == 14 and olen >= 8:  # if_tsoffset
            offset = struct.unpack_from(order + "q", body, off)[0]
        off += (olen + 3) & ~3
    return _Iface(linktype, snaplen, scale, offset)


def _read_pcapng(f: IO[bytes]) -> Iterator[PcapRecord]:
    """pcapng after the first SHB's block type (pcapng §3.1, §4)."""
    order = ""
    ifaces: list[_Iface] = []
    index = 0
    pos = 0
    shb_raw = struct.pack("<I", _PCAPNG_SHB)  # palindromic: same in both byte orders
    btype_raw = shb_raw
    while True:
        if btype_raw == shb_raw:
            # Section Header Block: byte order from the byte-order magic (§4.1).
            rest = _read_exact(f, 8, f"section header block at offset {pos}")
            if struct.unpack_from("<I", rest, 4)[0] == _PCAPNG_BOM:
                order = "<"
            elif struct.unpack_from(">I", rest, 4)[0] == _PCAPNG_BOM:
                order = ">"
            else:
                raise DecodeError(f"offset {pos}: section header block with a bad "
                                  f"byte-order magic {rest[4:8].hex()}")
            total = struct.unpack_from(order + "I", rest, 0)[0]
            if total < 28 or total % 4 or total > MAX_RECORD:
                raise DecodeError(f"offset {pos}: bad section header block length {total}")
            _read_exact(f, total - 12, f"section header block at offset {pos}")
            ifaces = []
        else:
            btype = struct.unpack(order + "I", btype_raw)[0]
            total = struct.unpack(order + "I", _read_exact(f, 4, f"block length at offset {pos}"))[0]
            if total < 12 or total % 4 or total > MAX_RECORD:
                raise DecodeError(f"offset {pos}: bad block length {total} (block type {btype:#x})")
            body_trail = _read_exact(f, total - 8, f"block of type {btype:#x} at offset {pos}")
            if struct.unpack_from(order + "I", body_trail, total - 12)[0] != total:
                raise DecodeError(f"offset {pos}: block of type {btype:#x}: trailing length "
                                  f"differs from {total}")
            body = body_trail[:total - 12]
            rec = _packet_from_block(btype, body, order, ifaces, pos, index + 1)
            if rec is not None:
                index += 1
                yield rec
        pos += total
        btype_raw = f.read(4)
        if not btype_raw:
            return
        if len(btype_raw) < 4:
            raise DecodeError(f"offset {pos}: truncated block header ({len(btype_raw)} bytes)")


def _packet_from_block(btype: int, body: bytes, order: str, ifaces: list[_Iface],
                       pos: int, index: int) -> PcapRecord | None:
    if btype == 1:
        ifaces.append(_parse_idb(body, order, pos))
        return None
    if btype == 6 or btype == 2:  # EPB (§4.3) / obsolete Packet Block
        if len(body) < 20:
            raise DecodeError(f"frame {index}: packet block too short ({len(body)} bytes)")
        if btype == 6:
            ifid, hi, lo, caplen, origlen = struct.unpack_from(order + "IIIII", body, 0)
        else:
            ifid, _drops, hi, lo, caplen, origlen = struct.unpack_from(order + "HHIIII", body, 0)
        if caplen > len(body) - 20:
            raise DecodeError(f"frame {index}: captured length {caplen} overruns its block")
        if ifid >= len(ifaces):
            raise DecodeError(f"frame {index}: packet on undeclared interface {ifid}")
        ifc = ifaces[ifid]
        ts = ((hi << 32) | lo) * ifc.scale + ifc.offset
        return PcapRecord(ts, ifc.linktype, body[20:20 + caplen], origlen, index)
    if btype == 3:  # SPB (§4.4): interface 0, no timestamp
        if len(body) < 4:
            raise DecodeError(f"frame {index}: simple packet block too short")
        if not ifaces:
            raise DecodeError(f"frame {index}: simple packet block before any interface")
        origlen = struct.unpack_from(order + "I", body, 0)[0]
        ifc = ifaces[0]
        caplen = min(origlen, len(body) - 4)
        if ifc.snaplen:
            caplen = min(caplen, ifc.snaplen)
        return PcapRecord(0.0, ifc.linktype, body[4:4 + caplen], origlen, index)
    return None


class PcapWriter:
    """Write a classic pcap file (microsecond timestamps, host-independent little-endian).

    ``path_or_file`` is a file name (created/truncated, closed by :meth:`close`) or a
    binary file object opened for writing (left open). Usable as a context manager.
    """

    _HDR = struct.Struct("<IHHiIII")
    _REC = struct.Struct("<IIII")

    def __init__(self, path_or_file: str | os.PathLike[str] | BinaryIO, linktype: int = 1,
                 snaplen: int = 262144) -> None:
        if snaplen <= 0:
            raise InvalidArgument("snaplen", f"must be positive, got {snaplen}")
        self._own = isinstance(path_or_file, (str, os.PathLike))
        self._f: IO[bytes] = (open(path_or_file, "wb") if isinstance(path_or_file, (str, os.PathLike))
                              else path_or_file)
        self.linktype = linktype
        self.snaplen = snaplen
        self.count = 0
        self._closed = False
        self._f.write(self._HDR.pack(_MAGIC_USEC, 2, 4, 0, 0, snaplen, linktype))

    def write(self, data: bytes | bytearray | memoryview, ts: float | None = None) -> None:
        """Append one frame captured at ``ts`` (default: now); cut to the snap length."""
        if self._closed:
            raise ClosedError("PcapWriter is closed")
        if ts is None:
            ts = time.time()
        usec_total = round(ts * 1_000_000)
        sec, usec = divmod(usec_total, 1_000_000)
        n = len(data)
        incl = min(n, self.snaplen)
        self._f.write(self._REC.pack(sec & 0xFFFFFFFF, usec, incl, n))
        self._f.write(data if incl == n else memoryview(data)[:incl])
        self.count += 1

    def flush(self) -> None:
        """Flush the underlying file."""
        self._f.flush()

    def close(self) -> None:
        """Flush, and close the file if this writer opened it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._own:
            self._f.close()
        else:
            self._f.flush()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

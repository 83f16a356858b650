"""GIDs and the RoCE GID table (Annex A17; docs/protocols.md §3): :class:`GID` and
:func:`gid_table`, the order rxe gives a netdev's addresses. Re-exported by :mod:`.device`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from ..errors import InvalidArgument
from ..wire.gid import ip_to_gid


class GID:
    """A 16-byte GID; ``GID("::ffff:10.0.0.1")``, ``GID(raw16)`` or ``GID(other_gid)``."""

    __slots__ = ("raw",)

    def __init__(self, value: str | bytes | bytearray | memoryview | GID) -> None:
        if isinstance(value, GID):
            raw = value.raw
        elif isinstance(value, str):
            try:
                raw = ipaddress.IPv6Address(value.split("%", 1)[0]).packed
            except ValueError:
                try:
                    raw = ip_to_gid(ipaddress.IPv4Address(value).packed)
                except ValueError:
                    raise InvalidArgument("gid", f"not a GID: {value!r}") from None
        elif isinstance(value, (bytes, bytearray, memoryview)):
            raw = bytes(value)
            if len(raw) == 4:
                raw = ip_to_gid(raw)
            if len(raw) != 16:
                raise InvalidArgument("gid", f"a GID has 16 bytes, not {len(raw)}")
        else:
            raise InvalidArgument("gid", f"expected str or bytes, got {type(value).__name__}")
        self.raw: bytes = raw

    @property
    def gid(self) -> str:
        """Text form as ``inet_ntop(AF_INET6)`` writes it (``devinfo``, rxe's sysfs), an
        IPv4-mapped GID as ``::ffff:a.b.c.d`` (RFC 4291 §2.5.5.2, RFC 5952 §5)."""
        addr = ipaddress.IPv6Address(self.raw)
        v4 = addr.ipv4_mapped
        return str(addr) if v4 is None else f"::ffff:{v4}"

    def __str__(self) -> str:
        return self.gid

    def __repr__(self) -> str:
        return f"GID({self.gid!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GID):
            return self.raw == other.raw
        if isinstance(other, (bytes, bytearray)):
            return self.raw == bytes(other)
        if isinstance(other, str):
            try:
                return self.raw == GID(other).raw
            except InvalidArgument:
                return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.raw)


def is_link_local(ip: bytes) -> bool:
    return len(ip) == 16 and ip[0] == 0xFE and ip[1] & 0xC0 == 0x80


def gid_table(ips: Sequence[bytes]) -> list[bytes]:
    """The RoCE v2 GID table for a netdev's addresses (Annex A17; docs/protocols.md §3; rxe's order).

    IPv6 link-local first (rxe's index 0 in the captures), then IPv4 as
    ``::ffff:a.b.c.d``, then the other IPv6 addresses; duplicates removed.
    """
    ll = [ip for ip in ips if is_link_local(ip)]
    v4 = [ip for ip in ips if len(ip) == 4]
    v6 = [ip for ip in ips if len(ip) == 16 and not is_link_local(ip)]
    out: list[bytes] = []
    for ip in (*ll, *v4, *v6):
        gid = ip_to_gid(bytes(ip))
        if gid not in out:
            out.append(gid)
    return out


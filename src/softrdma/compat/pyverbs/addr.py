"""``pyverbs.addr``: GIDs, global routes, address-handle attributes and address handles
(IBA 10.5, 11.2.2; rdma-core ``pyverbs/addr.pyx`` API).

A :class:`GID` prints as pyverbs does, eight groups of four hex digits
(``0000:0000:0000:0000:0000:ffff:7f00:0001``). :class:`AH` is a
:class:`softrdma.verbs.AH`: on RoCE an address without a GRH fails with EINVAL
("Failed to create AH"), as the kernel's ``rdma_check_ah_attr`` makes it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from softrdma import verbs as _v
from softrdma.errors import InvalidArgument, SoftRdmaError
from softrdma.wire.gid import ip_to_gid

from .base import Forward, PyverbsCM, PyverbsObject, rdma_error, translate
from .pyverbs_error import PyverbsUserError

__all__ = ["GID", "GRH", "GlobalRoute", "AHAttr", "AH"]


def _raw_gid(val: Any) -> bytes:
    if isinstance(val, _v.GID):
        return val.raw
    if isinstance(val, (bytes, bytearray, memoryview)):
        raw = bytes(val)
        if len(raw) != 16:
            raise PyverbsUserError(f"Invalid GID value ({raw!r})")
        return raw
    if isinstance(val, str):
        groups = val.split(":")
        if len(groups) == 8 and all(len(g) == 4 for g in groups):
            try:
                return bytes.fromhex("".join(groups))
            except ValueError:
                raise PyverbsUserError(f"Invalid GID value ({val})") from None
        try:
            return _v.GID(val).raw
        except InvalidArgument:
            raise PyverbsUserError(f"Invalid GID value ({val})") from None
    raise PyverbsUserError(f"Invalid GID value ({val!r})")


class GID(_v.GID, PyverbsObject):
    """A 16-byte GID (``union ibv_gid``): softrdma's, with pyverbs's text form (eight
    4-digit groups) and its errors (:class:`PyverbsUserError`)."""

    def __init__(self, val: Any = None) -> None:
        self.raw = bytes(16) if val is None else _raw_gid(val)

    @property
    def gid(self) -> str:
        h = self.raw.hex()
        return ":".join(h[i:i + 4] for i in range(0, 32, 4))

    @gid.setter
    def gid(self, val: Any) -> None:
        self.raw = _raw_gid(val)


@dataclass(eq=False)
class GRH(PyverbsObject):
    """A global route header as received in front of UD data (``struct ibv_grh``)."""

    sgid: GID = field(default_factory=GID)
    dgid: GID = field(default_factory=GID)
    version_tclass_flow: int = 0
    paylen: int = 0
    next_hdr: int = 0
    hop_limit: int = 1


class GlobalRoute(_v.GlobalRoute, PyverbsObject):
    """``struct ibv_global_route``: softrdma's, with a pyverbs :class:`GID` and text."""

    def __str__(self) -> str:
        return (f"dgid {self.dgid}, flow label {self.flow_label}, sgid index "
                f"{self.sgid_index}, hop limit {self.hop_limit}, traffic class "
                f"{self.traffic_class}")

    @staticmethod
    def _gid(value: Any) -> GID:
        return GID(value)


class AHAttr(PyverbsObject):
    """``struct ibv_ah_attr``; the GRH fields are also reachable flat (``dgid`` ...).
    ``gr`` is copied in (C struct semantics); None stands for an empty one."""

    def __init__(self, dlid: int = 0, sl: int = 0, src_path_bits: int = 0,
                 static_rate: int = 0, is_global: int = 0, port_num: int = 1,
                 gr: GlobalRoute | None = None) -> None:
        super().__init__()
        self.dlid = dlid
        self.sl = sl
        self.src_path_bits = src_path_bits
        self.static_rate = static_rate
        self.is_global = is_global
        self.port_num = port_num
        self.gr = GlobalRoute() if gr is None else GlobalRoute(
            gr.dgid, gr.flow_label, gr.sgid_index, gr.hop_limit, gr.traffic_class)

    def copy(self) -> AHAttr:
        """A copy, its GRH fields included (C struct assignment)."""
        return AHAttr(self.dlid, self.sl, self.src_path_bits, self.static_rate,
                      self.is_global, self.port_num, self.gr)

    # flat views of the GRH, as pyverbs offers them
    @property
    def dgid(self) -> str:
        return self.gr.dgid.gid

    @dgid.setter
    def dgid(self, val: Any) -> None:
        self.gr.dgid = GID(val)

    flow_label = Forward[int]("gr")
    sgid_index = Forward[int]("gr")
    hop_limit = Forward[int]("gr")
    traffic_class = Forward[int]("gr")

    def to_verbs(self) -> _v.AHAttr:
        """The softrdma :class:`~softrdma.verbs.AHAttr` with the same content."""
        gr = self.gr
        vgr = _v.GlobalRoute(_v.GID(gr.dgid.raw), gr.flow_label, gr.sgid_index, gr.hop_limit,
                             gr.traffic_class) if self.is_global else None
        return _v.AHAttr(port_num=self.port_num, is_global=int(bool(self.is_global)), gr=vgr,
                         dlid=self.dlid, sl=self.sl, src_path_bits=self.src_path_bits,
                         static_rate=self.static_rate)

    def __str__(self) -> str:
        return (f"dlid {self.dlid}, sl {self.sl}, port {self.port_num}, global "
                f"{self.is_global}" + (f", {self.gr}" if self.is_global else ""))


_GRH_LEN = 40
_IPV4_AT = 20  # rxe: a RoCEv2 IPv4 packet's IPv4 header fills the GRH area's last 20 bytes
_RECV_HOP_LIMIT = 0xFF


def ah_attr_from_wc(pd: Any, wc: Any, port_num: int, grh: Any) -> AHAttr:
    """``ibv_init_ah_from_wc``: the address vector back to the sender of the UD receive
    ``wc`` whose 40-byte GRH area is ``grh`` (bytes, or the address of the receive
    buffer, as pyverbs passes ``mr.buf``). The destination GID is the packet's source,
    the source GID index the one of the packet's destination; RoCEv2 over IPv4 carries
    the IPv4 header in the area's last 20 bytes (IBA A17.4.5.1, as rxe writes it)."""
    if isinstance(grh, int):
        raw = ctypes.string_at(grh, _GRH_LEN)
    else:
        raw = bytes(grh)[:_GRH_LEN]
    if len(raw) != _GRH_LEN:
        raise PyverbsUserError(f"AH: the GRH must be {_GRH_LEN} bytes")
    if raw[_IPV4_AT] >> 4 == 4:
        src = ip_to_gid(raw[_IPV4_AT + 12:_IPV4_AT + 16])
        dst = ip_to_gid(raw[_IPV4_AT + 16:_IPV4_AT + 20])
        tclass = raw[_IPV4_AT + 1]
        flow = 0
    else:
        word = int.from_bytes(raw[0:4], "big")
        src, dst = raw[8:24], raw[24:40]
        tclass = (word >> 20) & 0xFF
        flow = word & 0xFFFFF
    gids = list(pd.ctx.port.gids)
    if dst not in gids:
        raise rdma_error("Failed to create AH", SoftRdmaError(
            f"the packet's destination {GID(dst)} is not a GID of the device"))
    gr = GlobalRoute(src, flow, gids.index(dst), _RECV_HOP_LIMIT, tclass)
    return AHAttr(dlid=int(getattr(wc, "slid", 0)), sl=int(getattr(wc, "sl", 0)),
                  is_global=1, port_num=port_num, gr=gr)


class AH(_v.AH, PyverbsCM):
    """An address handle of ``pd`` (``ibv_create_ah``)."""

    def __init__(self, pd: Any, wc: Any = None, port_num: int = 1, grh: Any = None,
                 attr: AHAttr | None = None) -> None:
        PyverbsObject.__init__(self)
        if attr is None:
            if wc is None or grh is None:
                raise PyverbsUserError("AH: pass attr=AHAttr(...), or wc and grh")
            attr = ah_attr_from_wc(pd, wc, port_num, grh)
        if not isinstance(attr, AHAttr):
            raise PyverbsUserError(f"AH: attr must be an AHAttr, got {type(attr).__name__}")
        with translate("Failed to create AH"):
            super().__init__(pd, attr.to_verbs())
        self.ah_attr = attr

    def close(self) -> None:
        _v.AH.close(self)

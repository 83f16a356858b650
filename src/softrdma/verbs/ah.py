"""Address handles and address vectors (IBA 10.5, 11.2.2; ``ibv_create_ah``).

On RoCE every address carries a GRH (``is_global``): the destination GID is the peer's
IP address (Annex A17) and ``sgid_index`` picks the local address. Checks as the kernel
and rxe do (``rdma_check_ah_attr``, ``rxe_av_chk_attr``): port 1 only, GRH required
("RoCE requires GRH", EINVAL), the SGID index must exist, and the destination must be
of the source GID's IP family. Annex A16: the vector is GID-only, no DLID and no path
bits (CA16-17); SL 8-15 are reserved and refused as an invalid address vector (CA16-18);
``static_rate`` is an ``IBV_RATE_*`` value the requester paces to (IBA 9.11,
CA16-15.1.1, :mod:`softrdma.ib.pacing`).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from ..errors import InvalidArgument
from ..ib.pacing import rate_bps
from ..ib.qp import AddressVector
from ..wire.gid import is_v4_mapped
from ._args import U8, U16, uint
from ._object import VerbsObject
from .device import GID, Context, gid_table_len
from .pd import PD, open_pd

__all__ = ["GlobalRoute", "AHAttr", "AH", "address_vector", "ethernet_priority", "MAX_ROCE_SL"]

MAX_ROCE_SL = 7  # A16.8.1: SL 0-7 map to Ethernet priorities 0-7, 8-15 are reserved


class GlobalRoute:
    """The GRH fields of an address (``struct ibv_global_route``)."""

    __slots__ = ("dgid", "flow_label", "sgid_index", "hop_limit", "traffic_class")

    def __init__(self, dgid: GID | str | bytes | None = None, flow_label: int = 0,
                 sgid_index: int = 0, hop_limit: int = 1, traffic_class: int = 0) -> None:
        self.dgid = self._gid(dgid if dgid is not None else bytes(16))
        self.flow_label = flow_label
        self.sgid_index = sgid_index
        self.hop_limit = hop_limit
        self.traffic_class = traffic_class

    def __repr__(self) -> str:
        return (f"GlobalRoute(dgid={self.dgid.gid!r}, flow_label={self.flow_label}, "
                f"sgid_index={self.sgid_index}, hop_limit={self.hop_limit}, "
                f"traffic_class={self.traffic_class})")

    @staticmethod
    def _gid(value: GID | str | bytes) -> GID:
        """``dgid`` as this class holds it (a subclass may hold a subclass of GID)."""
        return GID(value)


@dataclass(eq=False, slots=True)
class AHAttr:
    """An address vector (``struct ibv_ah_attr``)."""

    port_num: int = 1
    is_global: int = 1
    gr: GlobalRoute | None = None
    dlid: int = 0
    sl: int = 0
    src_path_bits: int = 0
    static_rate: int = 0

    @property
    def dgid(self) -> GID | None:
        return None if self.gr is None else self.gr.dgid

    def __repr__(self) -> str:
        return (f"AHAttr(port_num={self.port_num}, is_global={self.is_global}, gr={self.gr!r}, "
                f"dlid={self.dlid}, sl={self.sl})")


def address_vector(ctx: Context, attr: AHAttr, argument: str = "ah_attr") -> AddressVector:
    """Validate ``attr`` for ``ctx`` and build the engine's ``AddressVector``."""
    if not isinstance(attr, AHAttr):
        raise InvalidArgument(argument, f"expected an AHAttr, got {type(attr).__name__}")
    if attr.port_num != 1:
        raise InvalidArgument(f"{argument}.port_num", f"must be 1, got {attr.port_num!r}")
    if not attr.is_global or attr.gr is None:
        raise InvalidArgument(f"{argument}.is_global", "RoCE requires a GRH (is_global=1 and gr)")
    gr = attr.gr
    gids = ctx.port.gids
    sgid_index = uint(gr.sgid_index, U8, f"{argument}.gr.sgid_index")
    if sgid_index >= len(gids):
        # Linux rdma_get_gid_attr: ENODATA for an empty entry of the table (rxe: 1024
        # entries, the populated ones first), EINVAL past its end
        size = gid_table_len(ctx)
        if sgid_index >= size:
            raise InvalidArgument(f"{argument}.gr.sgid_index",
                                  f"GID index {sgid_index} is outside the GID table "
                                  f"({size} entries)")
        raise InvalidArgument(f"{argument}.gr.sgid_index",
                              f"GID index {sgid_index} is empty (the GID table has {size} "
                              f"entries, {len(gids)} populated: 0..{len(gids) - 1})",
                              errno=errno.ENODATA)
    dgid = GID(gr.dgid).raw
    if dgid == bytes(16):
        raise InvalidArgument(f"{argument}.gr.dgid", "the destination GID is zero")
    src_v4 = is_v4_mapped(gids[sgid_index])
    dst_v4 = is_v4_mapped(dgid)
    if src_v4 != dst_v4:
        raise InvalidArgument(f"{argument}.gr.dgid",
                              f"{GID(dgid)} is not of the IP family of source GID {GID(gids[sgid_index])}")
    sl = uint(attr.sl, 0xF, f"{argument}.sl")
    if sl > MAX_ROCE_SL:
        # CA16-18: "An attempt to use an Address Vector for a RoCE port containing a
        # reserved SL value shall result in the Invalid Address Vector verb result."
        raise InvalidArgument(f"{argument}.sl", f"SL {sl} is reserved on RoCE (A16.8.1: "
                              "SL 0-7 map to Ethernet priorities 0-7, 8-15 are reserved): "
                              "invalid address vector")
    # CA16-17: a RoCE address vector holds GIDs only, no LID and no path bits
    if uint(attr.dlid, U16, f"{argument}.dlid"):
        raise InvalidArgument(f"{argument}.dlid", "RoCE address vectors carry no LID "
                              "(CA16-17: GIDs only); use dlid=0")
    if uint(attr.src_path_bits, 0x7F, f"{argument}.src_path_bits"):
        raise InvalidArgument(f"{argument}.src_path_bits", "RoCE address vectors carry no "
                              "path bits (CA16-17); use src_path_bits=0")
    static_rate = attr.static_rate
    rate_bps(static_rate, f"{argument}.static_rate")  # an IBV_RATE_* value (IBA 9.11)
    return AddressVector(
        dgid,
        sgid_index=sgid_index,
        flow_label=uint(gr.flow_label, 0xFFFFF, f"{argument}.gr.flow_label"),
        hop_limit=uint(gr.hop_limit, U8, f"{argument}.gr.hop_limit"),
        traffic_class=uint(gr.traffic_class, U8, f"{argument}.gr.traffic_class"),
        sl=sl,
        dlid=0,
        port_num=1,
        is_global=True,
        static_rate=static_rate,
    )


def ethernet_priority(sl: int) -> int:
    """The Ethernet priority (802.1p PCP) of an SL on a RoCE port: A16.8.1's default
    mapping, SL 0-7 to priorities 0-7 (8-15 are reserved and refused by
    :func:`address_vector`)."""
    if not isinstance(sl, int) or not 0 <= sl <= MAX_ROCE_SL:
        raise InvalidArgument("sl", f"SL {sl!r} has no Ethernet priority (0-7 only, A16.8.1)")
    return sl


class AH(VerbsObject):
    """An address handle of ``pd`` for UD sends (pyverbs ``AH``)."""

    _close_rank = 1

    def __init__(self, pd: PD, attr: AHAttr) -> None:
        super().__init__()
        pd = open_pd(pd)
        self.av = address_vector(pd.ctx, attr, "attr")
        self._count_on(pd.ctx.objects, "max_ah")
        self._depend_on(pd)
        self.pd = pd
        self.attr = attr

    def __repr__(self) -> str:
        return f"<AH dgid={GID(self.av.dgid).gid}>"

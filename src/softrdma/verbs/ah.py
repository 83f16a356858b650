"""Address handles and address vectors (IBA 10.5, 11.2.2; ``ibv_create_ah``).

On RoCE every address carries a GRH (``is_global``): the destination GID is the peer's
IP address (roce.md §4) and ``sgid_index`` picks the local address. Checks as the kernel
and rxe do (``rdma_check_ah_attr``, ``rxe_av_chk_attr``): port 1 only, GRH required
("RoCE requires GRH", EINVAL), the SGID index must exist, and the destination must be
of the source GID's IP family.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument
from ._object import VerbsObject
from .device import GID, Context
from .pd import PD

__all__ = ["GlobalRoute", "AHAttr", "AH", "address_vector"]


class GlobalRoute:
    """The GRH fields of an address (``struct ibv_global_route``)."""

    __slots__ = ("dgid", "flow_label", "sgid_index", "hop_limit", "traffic_class")

    def __init__(self, dgid: GID | str | bytes | None = None, flow_label: int = 0,
                 sgid_index: int = 0, hop_limit: int = 1, traffic_class: int = 0) -> None:
        self.dgid = GID(dgid) if dgid is not None else GID(bytes(16))
        self.flow_label = flow_label
        self.sgid_index = sgid_index
        self.hop_limit = hop_limit
        self.traffic_class = traffic_class

    def __repr__(self) -> str:
        return (f"GlobalRoute(dgid={self.dgid.gid!r}, flow_label={self.flow_label}, "
                f"sgid_index={self.sgid_index}, hop_limit={self.hop_limit}, "
                f"traffic_class={self.traffic_class})")


class AHAttr:
    """An address vector (``struct ibv_ah_attr``)."""

    __slots__ = ("port_num", "is_global", "gr", "dlid", "sl", "src_path_bits", "static_rate")

    def __init__(self, port_num: int = 1, is_global: int = 1, gr: GlobalRoute | None = None,
                 dlid: int = 0, sl: int = 0, src_path_bits: int = 0, static_rate: int = 0) -> None:
        self.port_num = port_num
        self.is_global = is_global
        self.gr = gr
        self.dlid = dlid
        self.sl = sl
        self.src_path_bits = src_path_bits
        self.static_rate = static_rate

    @property
    def dgid(self) -> GID | None:
        return None if self.gr is None else self.gr.dgid

    def __repr__(self) -> str:
        return (f"AHAttr(port_num={self.port_num}, is_global={self.is_global}, gr={self.gr!r}, "
                f"dlid={self.dlid}, sl={self.sl})")


def _u(value: Any, bits: int, argument: str) -> int:
    if not isinstance(value, int) or not 0 <= value < 1 << bits:
        raise InvalidArgument(argument, f"must be a {bits}-bit unsigned int, got {value!r}")
    return value


def address_vector(ctx: Context, attr: AHAttr, argument: str = "ah_attr") -> Any:
    """Validate ``attr`` for ``ctx`` and build the engine's ``AddressVector``."""
    from ..ib.qp import AddressVector  # noqa: PLC0415 - the engine module

    if not isinstance(attr, AHAttr):
        raise InvalidArgument(argument, f"expected an AHAttr, got {type(attr).__name__}")
    if attr.port_num != 1:
        raise InvalidArgument(f"{argument}.port_num", f"must be 1, got {attr.port_num!r}")
    if not attr.is_global or attr.gr is None:
        raise InvalidArgument(f"{argument}.is_global", "RoCE requires a GRH (is_global=1 and gr)")
    gr = attr.gr
    gids = ctx.port.gids
    sgid_index = _u(gr.sgid_index, 8, f"{argument}.gr.sgid_index")
    if sgid_index >= len(gids):
        raise InvalidArgument(f"{argument}.gr.sgid_index",
                              f"no GID at index {sgid_index} (table has {len(gids)})")
    dgid = GID(gr.dgid).raw
    if dgid == bytes(16):
        raise InvalidArgument(f"{argument}.gr.dgid", "the destination GID is zero")
    src_v4 = gids[sgid_index][:12] == b"\0" * 10 + b"\xff\xff"
    dst_v4 = dgid[:12] == b"\0" * 10 + b"\xff\xff"
    if src_v4 != dst_v4:
        raise InvalidArgument(f"{argument}.gr.dgid",
                              f"{GID(dgid)} is not of the IP family of source GID {GID(gids[sgid_index])}")
    return AddressVector(
        dgid,
        sgid_index=sgid_index,
        flow_label=_u(gr.flow_label, 20, f"{argument}.gr.flow_label"),
        hop_limit=_u(gr.hop_limit, 8, f"{argument}.gr.hop_limit"),
        traffic_class=_u(gr.traffic_class, 8, f"{argument}.gr.traffic_class"),
        sl=_u(attr.sl, 4, f"{argument}.sl"),
        dlid=_u(attr.dlid, 16, f"{argument}.dlid"),
        port_num=1,
        is_global=True,
    )


class AH(VerbsObject):
    """An address handle of ``pd`` for UD sends (pyverbs ``AH``)."""

    _close_rank = 1

    def __init__(self, pd: PD, attr: AHAttr) -> None:
        super().__init__()
        if not isinstance(pd, PD):
            raise InvalidArgument("pd", f"expected a PD, got {type(pd).__name__}")
        pd._check()
        self.av = address_vector(pd.ctx, attr, "attr")
        self._depend_on(pd)
        self.pd = pd
        self.attr = attr

    def __repr__(self) -> str:
        return f"<AH dgid={GID(self.av.dgid).gid}>"

"""Two (or more) softrdma devices on the in-memory fabric with a CM on each (tests only).

Every node is a verbs ``Context`` on a :class:`~softrdma.drivers.links.fabric.FabricLink`
(manual progress, virtual clock) with a :class:`~softrdma.drivers.cm.gsi.CmBinding`; its
events are recorded in ``node.events``. :func:`cm_mad` decodes the CM MAD inside a
fabric datagram, so fabric rules can target REQ/REP/RTU/... by attribute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm.gsi import CmBinding
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.links.link import Datagram
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.errors import DecodeError
from softrdma.ibcm.agent import CmConfig, IbCmId
from softrdma.ibcm.events import CmEvent, CmEventType
from softrdma.wire import cm as wcm
from softrdma.wire.gid import ip_to_gid

RC = int(e.IBV_QPT_RC)
UD = int(e.IBV_QPT_UD)
T = CmEventType


def cm_mad(dg: Datagram | bytes | memoryview) -> wcm.CmMad | None:
    """The CM MAD of a RoCE v2 datagram to QP1 (BTH 12 + DETH 8 + MAD 256 + ICRC 4)."""
    data = bytes(dg.data if isinstance(dg, Datagram) else dg)
    if len(data) != 12 + 8 + 256 + 4 or data[0] != 0x64 or data[5:8] != b"\0\0\x01":
        return None
    try:
        return wcm.decode(data[20:276])
    except DecodeError:
        return None


def is_attr(attr: wcm.CmAttr) -> Callable[[Datagram], bool]:
    """A fabric-rule predicate matching CM MADs with this attribute."""
    def pred(dg: Datagram) -> bool:
        m = cm_mad(dg)
        return m is not None and m.hdr.attr_id == attr
    return pred


# The RoCE version of the fabric links a Pair builds (a test module may parametrize it:
# Annex A16 CA16-15, the transport and the CM over RoCEv1 as over v2).
ROCE_VER = "2"


class Node:
    """One device with a CM, a PD and a recorder of events."""

    def __init__(self, fab: Fabric, ip: str, seed: int, config: CmConfig | None = None,
                 roce_ver: str = "2") -> None:
        self.ip = ip
        self.ctx = v.Context(fabric=fab.link(ip, roce_ver=roce_ver))
        self.cm = CmBinding.attach(self.ctx, seed=seed, config=config)
        self.agent = self.cm.agent
        self.pd = v.PD(self.ctx)
        self.gid = ip_to_gid(bytes(int(x) for x in ip.split(".")))
        self.events: list[CmEvent] = []
        self.on: Callable[[CmEvent], None] | None = None

    def record(self, ev: CmEvent) -> None:
        self.events.append(ev)
        if self.on is not None:
            self.on(ev)

    def new_id(self, context: Any = None) -> IbCmId:
        return self.agent.create_id(self.record, context)

    def qp(self, qpt: int = RC, depth: int = 16) -> tuple[Any, Any]:
        cq = v.CQ(self.ctx, 4 * depth)
        qp = v.QP(self.pd, v.QPInitAttr(qp_type=qpt, scq=cq, rcq=cq,
                                        cap=v.QPCap(depth, depth, 1, 1)))
        return qp, cq

    def types(self, cid: IbCmId | None = None) -> list[CmEventType]:
        return [ev.type for ev in self.events if cid is None or ev.cm_id is cid]

    def of(self, kind: CmEventType) -> list[CmEvent]:
        return [ev for ev in self.events if ev.type == kind]


class Pair:
    """Client ``a`` (10.9.0.1) and server ``b`` (10.9.0.2) on one fabric."""

    def __init__(self, seed: int = 1, config_a: CmConfig | None = None,
                 config_b: CmConfig | None = None, roce_ver: str | None = None,
                 **faults: Any) -> None:
        roce_ver = roce_ver or ROCE_VER
        self.clock = VirtualClock()
        self.fab = Fabric(self.clock, seed=seed, **faults)
        self.a = Node(self.fab, "10.9.0.1", seed * 2 + 1, config_a, roce_ver)
        self.b = Node(self.fab, "10.9.0.2", seed * 2 + 2, config_b, roce_ver)
        self.log: list[wcm.CmMad] = []
        self.fab.add_rule(self._log, "drop")  # never matches: only records

    def _log(self, dg: Datagram) -> bool:
        m = cm_mad(dg)
        if m is not None:
            self.log.append(m)
        return False

    def sent(self, attr: wcm.CmAttr) -> list[Any]:
        """Messages of this attribute handed to the fabric, in order."""
        return [m.msg for m in self.log if m.hdr.attr_id == attr]

    def run(self, dt: float = 1.0) -> None:
        self.clock.run_until(self.clock.now() + dt)

    def listen_accepting(self, service_id: int, qp: Any, **accept: Any) -> IbCmId:
        """A listener on ``b`` that accepts the first CONNECT_REQUEST with ``qp``."""
        from softrdma.ibcm.agent import AcceptParams

        lst = self.b.new_id()
        lst.listen(service_id)

        def on(ev: CmEvent) -> None:
            if ev.type == T.CONNECT_REQUEST and ev.listen_id is lst:
                ev.cm_id.accept(qp, AcceptParams(**accept))
        self.b.on = on
        return lst

"""softrdma.verbs: the pyverbs-shaped application API (docs/verbs-api.md).

``from softrdma import verbs as v`` then ``v.Context``, ``v.PD``, ``v.MR``, ``v.CQ``,
``v.CompChannel``, ``v.QP``, ``v.MW`` and the attribute and work-request classes.
"""

from ..seam.types import WorkCompletion as WC
from .ah import AH, AHAttr, GlobalRoute
from .counters import PortCounters
from .cq import CQ, CompChannel, wc_status_str
from .device import (
    GID,
    AsyncEvent,
    Context,
    DeviceAttr,
    DeviceInfo,
    PortAttr,
    get_device_list,
)
from .mr import MR
from .mw import MW, MW_TYPE_1, MW_TYPE_2, MWBindInfo, inc_rkey
from .pd import PD
from .qp import QP, QPAttr, QPCap, QPInitAttr
from .srq import SRQ, SrqAttr, SrqInitAttr
from .wr import SGE, RecvWR, SendWR
from .xrcd import XRCD, XrcSRQ

__all__ = [
    "AH", "AHAttr", "AsyncEvent", "CQ", "CompChannel", "Context", "DeviceAttr", "DeviceInfo",
    "GID", "GlobalRoute", "MR", "MW", "MW_TYPE_1", "MW_TYPE_2", "MWBindInfo", "PD", "PortAttr", "PortCounters", "QP", "QPAttr", "QPCap", "QPInitAttr",
    "RecvWR", "SGE", "SRQ", "SendWR", "SrqAttr", "SrqInitAttr", "WC", "get_device_list",
    "wc_status_str", "inc_rkey", "XRCD", "XrcSRQ",
]

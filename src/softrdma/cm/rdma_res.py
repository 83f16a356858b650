"""This process's rdma_cm IDs, for ``softrdma res show cm_id`` (iproute2's
``rdma resource show cm_id``).

Each open RoCE device's IDs (:class:`~.rdma_devices.OpenDevice` ``ids``) are listed per
port as ``rdma -j res show cm_id`` names the fields: ``lqpn`` and ``qp-type`` when the
ID has a QP, ``state`` (the kernel's ``enum rdma_cm_state`` names: IDLE, ADDR_BOUND,
ADDR_RESOLVED, CONNECT, DISCONNECT, LISTEN), ``ps`` (TCP, UDP; iproute2 names RDMA_PS_IB ids IPoIB), ``src-addr``/``src-port``
and ``dst-addr``/``dst-port``, and ``cm-idn`` (numbered per process in creation order;
softrdma has no device-wide numbers). :mod:`softrdma.drivers.host.resources` adds them to the
snapshot each process reports to its devd; importing this module registers the source.
"""

from __future__ import annotations

from typing import Any

from ..drivers.host.resources import add_cm_id_source, object_number, qp_type_name
from . import rdma_devices
from .rdma_state import CmState

__all__ = ["cm_id_state", "port_cm_ids"]

#: iproute2's names (``cm_id_ps_to_str``, which names RDMA_PS_IB "IPoIB" too), else "---"
_PS = {0x0106: "TCP", 0x0111: "UDP", 0x0002: "IPoIB", 0x013F: "IPoIB"}


def cm_id_state(cid: Any) -> str:
    """The id's state as the kernel's rdma_cm names it (``cm_id_state_to_str``): the
    id's :class:`~.rdma_state.CmState` (a listener is LISTEN, an id with a connection
    under way or up CONNECT, as the kernel keeps established ids there, one whose
    connection ended DISCONNECT)."""
    state = getattr(cid, "state", None)
    return state.value if isinstance(state, CmState) else "IDLE"


def _snapshot(items: Any) -> list[Any]:
    """``list(items)`` of a set or dict view other threads may change meanwhile."""
    for _ in range(5):
        try:
            return list(items)
        except RuntimeError:  # changed size during iteration: try again
            continue
    return []


def port_cm_ids(port: object) -> list[dict[str, Any]]:
    """The rdma_cm IDs of this process on the device whose engine is ``port``."""
    rows: list[dict[str, Any]] = []
    for dev in rdma_devices.open_devices():
        if getattr(dev.ctx, "port", None) is not port:
            continue
        for cid in _snapshot(dev.ids):
            if cm_id_state(cid) == "DESTROYING":
                continue
            rows.append(_row(cid))
    rows.sort(key=lambda r: int(r["cm-idn"]))
    return rows


def _row(cid: Any) -> dict[str, Any]:
    row: dict[str, Any] = {}
    qp = getattr(cid, "qp", None)
    if qp is not None:
        try:
            row["lqpn"] = int(qp.qp_num)
            row["qp-type"] = qp_type_name(int(qp.qp_type))
        except (AttributeError, TypeError, ValueError):
            pass
    row["state"] = cm_id_state(cid)
    row["ps"] = _PS.get(int(getattr(cid, "ps", 0)), "---")
    for key, addr in (("src", cid.local_addr), ("dst", cid.peer_addr)):
        if addr is not None:
            row[f"{key}-addr"] = str(addr[0])
            row[f"{key}-port"] = int(addr[1])
    row["cm-idn"] = object_number("cm_id", cid)
    return row


add_cm_id_source(port_cm_ids)

"""What a process has open on a device, as ``softrdma res show`` lists it.

iproute2's ``rdma resource show`` asks the kernel, which owns every QP, CQ, MR and PD;
a softrdma device's objects live in the processes that use it, so each process sends
its devd a snapshot of its own (:func:`port_resources`, the REPORT_RESOURCES request of
:mod:`softrdma.drivers.devd.proto`) with its port counters, and devd answers ``softrdma res show`` with
every live process's last snapshot, tagged with the pid it got from the kernel
(``SO_PEERCRED``) and that process's command name.

A snapshot is JSON: ``{"qp": [...], "cq": [...], "mr": [...], "pd": [...]}``, each
object a dict named as ``rdma -j res show`` names its fields (``lqpn``, ``rqpn``,
``type``, ``state``, ``rq-psn``, ``sq-psn``, ``path-mig-state``, ``pdn``; ``cqn``,
``cqe``, ``users``; ``mrn``, ``rkey``, ``lkey``, ``mrlen``), and each QP with its own
counters (:class:`~softrdma.seam.counters.QpCounters`). ``pdn``, ``cqn`` and ``mrn``
number the process's objects in the order it created them (softrdma has no
device-wide numbers for them). At most :data:`MAX_OBJECTS` objects of each kind are
sent (a control record is bounded); ``truncated`` then counts the rest.

``cm_id`` lists the process's rdma_cm IDs on the device (``lqpn``, ``qp-type``,
``state``, ``ps``, ``src-addr``, ``src-port``, ``dst-addr``, ``dst-port``, ``cm-idn``):
the rdma_cm layer, above this one, registers the function that lists them
(:func:`add_cm_id_source`, :mod:`softrdma.cm.rdma_res`); they are gathered outside the
engine lock (the rdma_cm takes its own locks, then the engine's).
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ...errors import SoftRdmaError
from ...ib.port import Port
from ...seam.states import ERR, INIT, QPT_RC, QPT_UC, QPT_UD, RESET, RTR, RTS, SQD, SQE
from ..links.link import Link
from ..runtime.locks import acquire

__all__ = ["MAX_OBJECTS", "add_cm_id_source", "object_number", "port_resources",
           "qp_state_name", "qp_type_name", "report_objects"]

#: the most objects of one kind a snapshot carries (a control record is <= 64 KiB)
MAX_OBJECTS = 64

_STATES = {RESET: "RESET", INIT: "INIT", RTR: "RTR", RTS: "RTS", SQD: "SQD", SQE: "SQE",
           ERR: "ERR"}
#: iproute2's names (``qp_types_to_str``, the kernel's ``IB_QPT_*``: XRC_INI 9, XRC_TGT 10,
#: the numbers of verbs' IBV_QPT_XRC_SEND / _RECV)
_TYPES = {QPT_RC: "RC", QPT_UC: "UC", QPT_UD: "UD", 9: "XRC_INI", 10: "XRC_TGT"}


def qp_state_name(state: int) -> str:
    """``RTS`` ... as iproute2 prints QP states (UNKNOWN for anything else)."""
    return _STATES.get(state, "UNKNOWN")


def qp_type_name(qp_type: int) -> str:
    """``RC``/``UC``/``UD``/``XRC_INI``/``XRC_TGT`` (iproute2's names), else ``UNKNOWN``."""
    return _TYPES.get(qp_type, "UNKNOWN")


class _Numbers:
    """A small number per object, in the order objects are first seen (weakly held)."""

    def __init__(self) -> None:
        self._ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._next = 1

    def of(self, obj: object) -> int:
        try:
            n = self._ids.get(obj)
        except TypeError:  # not weakly referenceable: no stable number
            return 0
        if n is None:
            n = self._ids[obj] = self._next
            self._next += 1
        return n


_PDS = _Numbers()
_CQS = _Numbers()
_MRS = _Numbers()
_OTHERS: dict[str, _Numbers] = {}

#: functions listing this process's rdma_cm IDs on a port (the rdma_cm layer adds one)
_CM_ID_SOURCES: list[Callable[[Port], list[dict[str, Any]]]] = []


def object_number(kind: str, obj: object) -> int:
    """The process-wide number of ``obj`` among the ``kind`` objects (``cm-idn`` ...),
    in the order they are first listed."""
    return _OTHERS.setdefault(kind, _Numbers()).of(obj)


def add_cm_id_source(source: Callable[[Port], list[dict[str, Any]]]) -> None:
    """Have snapshots list the rdma_cm IDs ``source(port)`` returns (once per source)."""
    if source not in _CM_ID_SOURCES:
        _CM_ID_SOURCES.append(source)


def cm_ids(port: Port) -> tuple[list[dict[str, Any]], int]:
    """The rdma_cm IDs on ``port`` (at most :data:`MAX_OBJECTS`) and how many more."""
    rows: list[dict[str, Any]] = []
    for source in list(_CM_ID_SOURCES):
        rows.extend(source(port))
    return rows[:MAX_OBJECTS], max(0, len(rows) - MAX_OBJECTS)


def _cq_of(sink: object) -> object:
    """The CQ behind a QP's completion sink (a verbs CQ's ``sink``, or a bound ``push``
    method); the sink itself when there is none (any more)."""
    cq = getattr(sink, "cq", None)
    if cq is None:
        cq = getattr(sink, "__self__", None)
    return sink if cq is None else cq


def port_resources(port: Port) -> dict[str, Any]:
    """A snapshot of the QPs, CQs, MRs and PDs in ``port`` (module docstring)."""
    qps: list[dict[str, Any]] = []
    cqs: dict[int, dict[str, Any]] = {}
    pds: dict[int, dict[str, Any]] = {}
    truncated = 0

    def pd_entry(pd: object) -> int:
        pdn = _PDS.of(pd)
        entry = pds.setdefault(pdn, {"pdn": pdn, "users": 0})
        entry["users"] += 1
        return pdn

    for qpn in sorted(port.qps):
        qp = port.qps[qpn]
        if qp.destroyed:
            continue
        for sink in (qp.complete_send, qp.complete_recv):  # users: as the kernel's usecnt
            cq = _cq_of(sink)
            cqn = _CQS.of(cq)
            entry = cqs.setdefault(cqn, {"cqn": cqn, "cqe": int(getattr(cq, "cqe", 0) or 0),
                                         "users": 0})
            entry["users"] += 1
        pdn = pd_entry(qp.pd)
        if len(qps) >= MAX_OBJECTS:
            truncated += 1
            continue
        obj: dict[str, Any] = {"lqpn": qpn}
        connected = qp.qp_type in (QPT_RC, QPT_UC) and qp.state not in (RESET, INIT)
        if connected:
            obj["rqpn"] = qp.dest_qpn
        # an XRC QP's engine is RC's; its type is the XRC one (softrdma.ib.xrc)
        obj["type"] = qp_type_name(int(getattr(qp, "xrc_qp_type", qp.qp_type)))
        obj["state"] = qp_state_name(qp.state)
        if qp.qp_type != QPT_UD or qp.state != RESET:
            obj["rq-psn"] = qp.resp.epsn
            obj["sq-psn"] = qp.req.next_psn
        if qp.qp_type in (QPT_RC, QPT_UC):
            obj["path-mig-state"] = "MIGRATED"  # softrdma has no alternate path (APM)
        obj["pdn"] = pdn
        if connected and qp.av is not None:
            obj["dgid"] = str(ipaddress.IPv6Address(bytes(qp.av.dgid)))
        obj["counters"] = qp.counters.as_dict()
        qps.append(obj)
    mrs: list[dict[str, Any]] = []
    for mr in list(port.mrs.values()):
        if not mr.valid:
            continue
        if len(mrs) >= MAX_OBJECTS:
            truncated += 1
            continue
        mrs.append({"mrn": _MRS.of(mr), "rkey": mr.rkey, "lkey": mr.lkey, "mrlen": mr.length,
                    "pdn": pd_entry(mr.pd)})
    mrs.sort(key=lambda m: m["mrn"])
    return {"qp": qps, "cq": sorted(cqs.values(), key=lambda c: c["cqn"])[:MAX_OBJECTS],
            "mr": mrs, "pd": sorted(pds.values(), key=lambda p: p["pdn"])[:MAX_OBJECTS],
            "truncated": truncated}


#: how long :func:`report_objects` waits for the engine lock before skipping a round
LOCK_WAIT = 0.2


def report_objects(reporter: Link, port: Port, lock: threading.Lock) -> None:
    """Send ``reporter`` (a :class:`~softrdma.drivers.devd.client.DevdLink`) a snapshot of ``port``'s
    objects if it changed since the last one. Best effort, as the counter reports: a busy
    engine (the lock not free within :data:`LOCK_WAIT`) or a daemon that went away skips
    this round."""
    if not reporter.shared:
        return
    if not acquire(lock, timeout=LOCK_WAIT):
        return
    try:
        objects = port_resources(port)
    finally:
        lock.release()
    objects["cm_id"], more = cm_ids(port)
    objects["truncated"] += more
    if objects == reporter.last_resources:
        return
    with contextlib.suppress(SoftRdmaError, OSError):
        reporter.report_resources(objects)

"""``softrdma res``: the objects open on softrdma devices, as iproute2's ``rdma resource``.

::

    softrdma res [show] [qp|cq|mr|pd|cm_id] [-d DEV] [-j [-p]]
    softrdma res statistic [qp] [-d DEV] [-j [-p]]

``show`` lists every object on each RoCE device across all processes, one line each,
in ``rdma resource show`` form::

    link softrdma_lo/1 lqpn 17 rqpn 18 type RC state RTS rq-psn 5 sq-psn 9 \\
        path-mig-state MIGRATED pdn 1 pid 1234 comm python3 dgid ::ffff:127.0.0.1
    dev softrdma_lo cqn 1 cqe 63 users 2 pid 1234 comm python3
    dev softrdma_lo mrn 1 rkey 0x11 lkey 0x11 mrlen 8192 pdn 1 pid 1234 comm python3
    dev softrdma_lo users 3 pdn 1 pid 1234 comm python3
    link softrdma_lo/1 lqpn 17 qp-type RC state CONNECT ps TCP pid 1234 comm rping \\
        src-addr 127.0.0.1:7174 dst-addr 127.0.0.1:40312 cm-idn 2

(without an object: a per-device summary, ``DEV: N qp M cq ...``). ``statistic`` gives
each QP's own counters (``rdma statistic qp show``): retransmissions, NAKs, RNR NAKs
and the packets it dropped by reason. ``-j``: the same as a JSON array of objects
(``rdma -j res show``; ``-p`` pretty).

Where it comes from: every process using a shared device reports its objects to the
device's devd (:mod:`softrdma.drivers.host.resources`, at most every
:data:`~softrdma.drivers.runtime.roce.REPORT_INTERVAL` seconds), so the list can be that much
behind. A device no process has open has no devd and no objects; contexts opened with
``shared=False`` keep their objects to themselves and are not listed. ``pdn``, ``cqn``,
``mrn`` and ``cm-idn`` are numbered per process (the pid tells them apart). ``cm_id``
lists the rdma_cm IDs (:mod:`softrdma.cm.rdma_res`: state, port space, addresses; in
JSON ``src-addr`` and ``src-port`` apart, as ``rdma -j``); iWARP devices have no devd,
so their IDs are not listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ...drivers.devd.client import DevdLink
from ...drivers.devd.proto import socket_path
from ...errors import DeviceError, InvalidArgument
from ...verbs.device import DeviceInfo, get_device_list

__all__ = ["run", "device_objects", "format_lines"]

PORT = 1
KINDS = ("qp", "cq", "mr", "pd", "cm_id")
#: the kinds printed as ``link DEV/PORT`` (the others: ``dev DEV``)
_LINK_KINDS = ("qp", "cm_id")
#: softrdma's own fields, after iproute2's (which end with pid and comm)
_LAST = ("dgid", "counters")
#: where iproute2 prints pid and comm inside a kind's line (else at the end)
_PID_AFTER = {"cm_id": "ps"}


def _parse(words: list[str]) -> tuple[str, str | None]:
    """``[show|statistic] [KIND]`` -> (verb, kind)."""
    rest = list(words)
    verb = "show"
    if rest and rest[0] in ("show", "statistic", "stat"):
        verb = "statistic" if rest.pop(0).startswith("stat") else "show"
    kind: str | None = None
    if rest:
        kind = rest.pop(0)
        if kind not in KINDS:
            raise InvalidArgument("object", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    if rest:
        raise InvalidArgument("object", f"unexpected {' '.join(rest)!r}")
    if verb == "statistic" and kind not in (None, "qp"):
        raise InvalidArgument("object", "statistic shows QPs only")
    return verb, kind


def device_objects(info: DeviceInfo) -> list[dict[str, Any]]:
    """Every live process's report for one device (empty when no devd runs)."""
    record = info.record
    if record is None or not socket_path(record.name).exists():
        return []
    try:
        with DevdLink(record, spawn=False, timeout=2.0, direct=False) as link:
            return link.resources()
    except DeviceError:
        return []  # the daemon just left: nobody uses the device


def _rows(dev: str, reports: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The ``kind`` objects of ``dev``, each a dict in iproute2's JSON form."""
    rows: list[dict[str, Any]] = []
    for rep in reports:
        objects = rep.get("objects")
        if not isinstance(objects, dict):
            continue
        items = objects.get(kind)
        if not isinstance(items, list):
            continue
        for obj in items:
            if not isinstance(obj, dict):
                continue
            head: dict[str, Any] = {"ifname": dev}
            if kind in _LINK_KINDS:
                head["port"] = PORT
            who = {"pid": rep.get("pid", 0), "comm": rep.get("comm", "")}
            after = _PID_AFTER.get(kind)
            body = [(k, v) for k, v in obj.items() if k not in _LAST]
            at = next((i + 1 for i, (k, _) in enumerate(body) if k == after), len(body))
            row = {**head, **dict(body[:at]), **who, **dict(body[at:])}
            row.update((k, obj[k]) for k in _LAST if k in obj and k != "counters")
            if kind == "qp" and isinstance(obj.get("counters"), dict):
                row["counters"] = obj["counters"]
            rows.append(row)
    return rows


def _word(val: object) -> str:
    """A value as one word of a line: a string a process made up (its comm, or a forged
    report) cannot add lines or words (control characters and spaces come quoted)."""
    text = str(val)
    if isinstance(val, str) and (not text or not all(c.isprintable() and c != " "
                                                      for c in text)):
        return json.dumps(text)
    return text


def _text(row: dict[str, Any], kind: str) -> str:
    """One ``rdma resource show`` line."""
    head = (f"link {row['ifname']}/{row['port']}" if kind in _LINK_KINDS
            else f"dev {row['ifname']}")
    words = [head]
    for k, val in row.items():
        if k in ("ifname", "port", "counters", "src-port", "dst-port"):
            continue
        if k in ("rkey", "lkey") and isinstance(val, int):
            val = f"{val:#x}"
        if kind == "cm_id" and k in ("src-addr", "dst-addr"):  # iproute2: ADDR:PORT
            val = f"{val}:{row.get(k[:3] + '-port', 0)}"
        words.append(f"{_word(k)} {_word(val)}")
    return " ".join(words)


def _stat_row(row: dict[str, Any]) -> dict[str, Any]:
    out = {"ifname": row["ifname"], "port": row["port"], "lqpn": row.get("lqpn"),
           "qp-type": row.get("type"), "pid": row["pid"], "comm": row["comm"]}
    counters = row.get("counters")
    if isinstance(counters, dict):
        out.update(counters)
    return out


def format_lines(dev: str, reports: list[dict[str, Any]], kind: str | None,
                 statistic: bool = False) -> list[str]:
    """The text lines for one device."""
    if statistic:
        return [f"link {r['ifname']}/{r['port']} " + " ".join(
            f"{_word(k)} {_word(v)}" for k, v in r.items() if k not in ("ifname", "port"))
            for r in (_stat_row(x) for x in _rows(dev, reports, "qp"))]
    if kind is None:
        counts = " ".join(f"{len(_rows(dev, reports, k))} {k}" for k in KINDS)
        return [f"{dev}: {counts} pids {_pids(reports)}"]
    return [_text(r, kind) for r in _rows(dev, reports, kind)]


def _pids(reports: list[dict[str, Any]]) -> int:
    """How many processes have objects on the device (``softrdma res`` itself has none)."""
    return len({rep.get("pid") for rep in reports if isinstance(rep.get("objects"), dict)
                and any(rep["objects"].get(k) for k in KINDS)})


def _json_rows(dev: str, reports: list[dict[str, Any]], kind: str | None,
               statistic: bool) -> list[dict[str, Any]]:
    if statistic:
        return [_stat_row(r) for r in _rows(dev, reports, "qp")]
    if kind is None:
        return [{"ifname": dev, **{k: len(_rows(dev, reports, k)) for k in KINDS},
                 "pids": _pids(reports)}]
    return _rows(dev, reports, kind)


def _devices(dev: str | None) -> list[DeviceInfo]:
    devices = [d for d in get_device_list() if d.type == "roce"]
    if dev is not None:
        devices = [d for d in devices if d.name == dev]
        if not devices:
            raise DeviceError(f"no softrdma RoCE device named {dev!r}")
    return devices


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point of ``softrdma res`` (options: :mod:`softrdma.tools.cli`)."""
    out = out if out is not None else sys.stdout
    verb, kind = _parse(list(args.words))
    statistic = verb == "statistic"
    devices = _devices(args.dev)
    if args.json:
        rows: list[dict[str, Any]] = []
        for d in devices:
            rows.extend(_json_rows(d.name, device_objects(d), kind, statistic))
        out.write(json.dumps(rows, indent=2 if args.pretty else None) + "\n")
    else:
        for d in devices:
            for line in format_lines(d.name, device_objects(d), kind, statistic):
                out.write(line + "\n")
    out.flush()
    return 0

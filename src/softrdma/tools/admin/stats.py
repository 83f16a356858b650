"""``softrdma stats``: port counters of softrdma devices, as ``rdma statistic`` shows them.

::

    softrdma stats [show] [link DEV[/PORT]] [-d DEV[/PORT]] [-j [-p]] [-w SECONDS [-n COUNT]]

One line per port, ``link DEV/PORT name value name value ...`` (iproute2's ``rdma
statistic show link``), or with ``-j`` a JSON array of ``{"ifname": DEV, "port": N,
name: value, ...}`` objects (``-p``: pretty). ``-w SECONDS`` watches: the counters again
every SECONDS (``-n`` times, default until interrupted), each round headed by the time.

The counters of a shared device are the device's (every process's, through its devd:
see :mod:`softrdma.drivers.devd.daemon`, "Port counters of a shared device"). A device no
process has open has no devd: its counters are those its last devd saved when it
exited (``NAME.counters.json``), zero if none ever ran; like the kernel's they last as
long as the device (in-process contexts, opened with ``shared=False``, count in their
own process only). An iWARP device's counters are every process's too: each publishes
its own in the state directory (:mod:`softrdma.drivers.host.port_totals`): FPDUs as
packets, MPA stream octets as bytes, Terminates, MPA CRC errors as ``rcvd_icrc_err``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from ...drivers.devd.client import DevdLink
from ...drivers.devd.proto import socket_path
from ...drivers.host.port_totals import device_totals, saved_counters
from ...errors import DeviceError, InvalidArgument
from ...seam.counters import Counters
from ...verbs.counters import PortCounters
from ...verbs.device import DeviceInfo, all_devices
from .link import PORT, split_dev_port

__all__ = ["run", "device_counters", "format_line"]


def _parse_words(words: list[str], dev: str | None) -> tuple[str | None, int | None]:
    """``show [link DEV[/PORT]]`` -> (device, port)."""
    rest = list(words)
    if rest and rest[0] == "show":
        rest.pop(0)
    port: int | None = None
    if rest:
        if rest[0] != "link" or len(rest) != 2:
            raise InvalidArgument("object", f"expected 'show [link DEV[/PORT]]', got "
                                  f"{' '.join(words)!r}")
        name, port = split_dev_port(rest[1], "link")
        if dev is not None and dev != name:
            raise InvalidArgument("link", f"{name!r} differs from -d {dev!r}")
        dev = name
    return dev, port


def device_counters(info: DeviceInfo) -> PortCounters:
    """The counters of one device. RoCE: from its devd if it runs, else those its last
    devd saved (zeros if none did); iWARP: every process's (:mod:`.port_totals`)."""
    if info.type == "iwarp":
        totals = Counters()
        totals.add(device_totals(info.name))
        return PortCounters.from_values(info.name, PORT, totals.as_dict(), True)
    record = info.record
    values = Counters().as_dict()
    if record is not None:
        saved = Counters()
        saved.add(saved_counters(record.name))
        values = saved.as_dict()
    shared = False
    if record is not None and socket_path(record.name).exists():
        try:
            with DevdLink(record, spawn=False, timeout=2.0, direct=False) as link:
                values = link.device_counters()
                shared = True
        except DeviceError:
            pass  # the daemon just left: nobody uses the device
    return PortCounters.from_values(info.name, PORT, values, shared)


def format_line(pc: PortCounters) -> str:
    """``link DEV/PORT name value ...`` (rdma statistic show link)."""
    return f"link {pc.device}/{pc.port_num}" + "".join(
        f" {name} {value}" for name, value in pc.counters.items())


def _as_json(pc: PortCounters) -> dict[str, Any]:
    return {"ifname": pc.device, "port": pc.port_num, **pc.counters}


def _devices(dev: str | None) -> list[DeviceInfo]:
    """The RoCE and iWARP devices (all, or ``dev``)."""
    every = all_devices()
    devices = [d for d in every if d.type in ("roce", "iwarp")]
    if dev is not None:
        devices = [d for d in every if d.name == dev]
        if not devices:
            raise DeviceError(f"no softrdma device named {dev!r}")
    return devices


def _show(devices: list[DeviceInfo], args: argparse.Namespace, out: TextIO) -> None:
    counters = [device_counters(d) for d in devices]
    if args.json:
        out.write(json.dumps([_as_json(pc) for pc in counters],
                             indent=2 if args.pretty else None) + "\n")
    else:
        for pc in counters:
            out.write(format_line(pc) + "\n")
    out.flush()


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point of ``softrdma stats`` (options: :mod:`softrdma.tools.cli`)."""
    out = out if out is not None else sys.stdout
    dev = split_dev_port(args.dev, "dev")[0] if args.dev is not None else None
    dev, _port = _parse_words(list(args.words), dev)
    if args.watch is not None and not args.watch > 0:
        raise InvalidArgument("watch", "must be > 0 seconds")
    if args.count is not None and args.count < 1:
        raise InvalidArgument("count", "must be >= 1")
    devices = _devices(dev)
    if args.watch is None:
        _show(devices, args, out)
        return 0
    rounds = 0
    while True:
        if not args.json:
            out.write(time.strftime("%H:%M:%S\n"))
        _show(devices, args, out)
        rounds += 1
        if args.count is not None and rounds >= args.count:
            return 0
        time.sleep(args.watch)

"""``softrdma link``: list, add and delete devices, like iproute2's ``rdma link``.

Usage::

    softrdma link [show [NAME[/PORT]]] [-d] [-j [-p]]
    softrdma link add NAME netdev IFACE [type roce|iwarp] [port N] [roce_ver 1|2|both] [vlan VID]
                      [mpa_crc on|off]
    softrdma link set NAME mpa_crc on|off
    softrdma link delete NAME
    softrdma link rename OLD NEW

The listing has ``rdma link``'s shape (one line per device, port 1; the built-in
iWARP device ``softrdma_iw_lo`` on ``lo`` included)::

    link softrdma_lo/1 state ACTIVE physical_state LINK_UP netdev lo

A device may be named as rdma-core names a port, ``NAME/PORT`` (softrdma devices have
port 1 only). ``-j`` prints a JSON array of ``{"ifname", "port", "state",
"physical_state", "netdev", ...}`` objects instead (``-p``: pretty), as ``rdma -j link``.

``-d`` appends ``type``, ``mtu`` (the active IB MTU, rxe_set_mtu), ``udp_port`` and, for a
RoCE device, ``roce_ver`` (and ``vlan``). ``roce_ver 1`` is RoCEv1 (Annex A16: the IB
transport with a GRH directly over Ethernet, EtherType 0x8915; needs root for the raw
socket), ``2`` RoCEv2 over UDP (the default, as rxe), ``both`` each GID once per type, as
Linux lists them. ``vlan VID`` makes the RoCEv1 link tag its frames with 802.1Q VLAN
``VID`` on a plain netdev (on a VLAN netdev such as ``eth0.7`` it is implied).
``mpa_crc on`` (an iWARP device; Linux siw's ``mpa_crc_required`` module parameter, per
device) makes the device ask for the MPA CRC: C set in the MPA Request it sends as initiator
and in the Reply it sends as responder, whatever the peer's Request said, so CRC32c is used
in both directions (RFC 5044 §7.1); ``set NAME mpa_crc on|off`` changes it for processes
that open the device afterwards, and ``$SOFTRDMA_MPA_CRC=1``/``0`` overrides it for one
process (the built-in ``softrdma_iw_lo`` has only the variable). ``-d`` shows it on iWARP
devices as ``mpa_crc on|off`` (the stored setting).
``type rxe`` and ``type siw`` (the kernel driver names ``rdma link add`` takes) are
accepted as ``roce`` and ``iwarp``. Exit status: 0 success, 1 the operation failed (unknown
device, duplicate name, unknown netdev ...), 2 usage error; errors are one line on stderr,
``softrdma link: error: ...``.
The records live in the registry (:mod:`softrdma.drivers.host.registry`).
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import TextIO

from softrdma.drivers.devd.proto import socket_path
from softrdma.drivers.host import netdev as _netdev
from softrdma.drivers.host.registry import DEFAULT_UDP_PORT, DeviceRecord, Registry, ib_mtu_for
from softrdma.drivers.host.unix_path import connect_unix
from softrdma.drivers.links.link import ROCE_VERSIONS
from softrdma.errors import DeviceError, InvalidArgument, SoftRdmaError
from softrdma.verbs.device import IWARP_LOOPBACK

__all__ = ["cmd_link", "format_record", "main", "split_dev_port", "PORT"]

PORT = 1  # softrdma devices have one port

USAGE = """\
usage: softrdma link [show [NAME[/PORT]]] [-d] [-j [-p]]
       softrdma link add NAME netdev IFACE [type roce|iwarp] [port N] [roce_ver 1|2|both]
                         [vlan VID] [mpa_crc on|off]
       softrdma link set NAME mpa_crc on|off
       softrdma link delete NAME
       softrdma link rename OLD NEW"""

_TYPE_ALIASES = {"roce": "roce", "rxe": "roce", "iwarp": "iwarp", "siw": "iwarp"}


class _Usage(Exception):
    pass


def split_dev_port(text: str, what: str = "device") -> tuple[str, int | None]:
    """``NAME`` or rdma-core's ``NAME/PORT`` -> (name, port or None). A port other than
    1 raises :class:`~softrdma.errors.InvalidArgument` naming ``what``."""
    name, sep, num = text.partition("/")
    if not sep:
        return text, None
    if not name:
        raise InvalidArgument(what, f"{text!r} names no device (DEV/PORT)")
    if not num.isdigit():
        raise InvalidArgument(what, f"port {num!r} of {text!r} is not a number (DEV/PORT)")
    if int(num) != PORT:
        raise InvalidArgument(what, f"{name} has no port {int(num)} (only port {PORT})")
    return name, PORT


def record_fields(record: DeviceRecord, details: bool = False) -> dict[str, object]:
    """What ``rdma link`` shows of ``record``'s port, in its order and with its names."""
    try:
        nd = _netdev.get(record.netdev)
    except SoftRdmaError:
        nd = None
    up = nd is not None and nd.up
    fields: dict[str, object] = {
        "ifname": record.name, "port": PORT, "state": "ACTIVE" if up else "DOWN",
        "physical_state": "LINK_UP" if up else "DISABLED", "netdev": record.netdev}
    if details:
        fields.update(type=record.type, mtu=ib_mtu_for(nd.mtu) if nd is not None else 0,
                      udp_port=record.udp_port)
        if record.type == "roce":
            fields["roce_ver"] = record.roce_ver
            if record.vlan is not None:
                fields["vlan"] = record.vlan
        else:
            fields["mpa_crc"] = "on" if record.mpa_crc else "off"
    return fields


def format_record(record: DeviceRecord, details: bool = False) -> str:
    """One ``rdma link`` style line for ``record``."""
    fields = record_fields(record, details)
    line = f"link {fields.pop('ifname')}/{fields.pop('port')}"
    return line + "".join(f" {k} {v}" for k, v in fields.items())


def _show(reg: Registry, args: list[str], out: TextIO, json_out: int = 0) -> int:
    """``show``; ``json_out``: 0 text, 1 JSON, 2 pretty JSON."""
    details = False
    names: list[str] = []
    for a in args:
        if a in ("-d", "--details"):
            details = True
        elif a.startswith("-"):
            raise _Usage(f"unknown option {a!r}")
        else:
            names.append(a)
    if len(names) > 1:
        raise _Usage("show takes at most one device name")
    records = reg.list()
    if all(r.name != IWARP_LOOPBACK for r in records):  # the built-in iWARP device
        records.append(DeviceRecord(IWARP_LOOPBACK, "lo", "iwarp", 0))
    if names:
        name, _port = split_dev_port(names[0])
        records = [r for r in records if r.name == name] or [reg.get(name)]
    if json_out:
        print(json.dumps([record_fields(r, details) for r in records],
                         indent=2 if json_out > 1 else None), file=out)
        return 0
    for rec in records:
        print(format_record(rec, details), file=out)
    return 0


def _add(reg: Registry, args: list[str], out: TextIO) -> int:
    if not args:
        raise _Usage("add needs a device NAME")
    name, rest = args[0], args[1:]
    if len(rest) % 2:
        raise _Usage(f"missing value after {rest[-1]!r}")
    opts: dict[str, str] = {}
    for key, value in zip(rest[::2], rest[1::2], strict=True):
        if key not in ("netdev", "type", "port", "roce_ver", "vlan", "mpa_crc"):
            raise _Usage(f"unknown keyword {key!r} (expected netdev, type, port, roce_ver, "
                         "vlan or mpa_crc)")
        if key in opts:
            raise _Usage(f"{key} given twice")
        opts[key] = value
    if "netdev" not in opts:
        raise _Usage("add needs 'netdev IFACE'")
    typ = _TYPE_ALIASES.get(opts.get("type", "roce"))
    if typ is None:
        raise _Usage(f"unknown type {opts['type']!r} (expected roce or iwarp)")
    port = DEFAULT_UDP_PORT
    if "port" in opts:
        try:
            port = int(opts["port"], 10)
        except ValueError:
            raise _Usage(f"port {opts['port']!r} is not a number") from None
    ver = opts.get("roce_ver", "2")
    if ver not in ROCE_VERSIONS:
        raise _Usage(f"roce_ver {ver!r} is not 1, 2 or both")
    vlan: int | None = None
    if "vlan" in opts:
        try:
            vlan = int(opts["vlan"], 10)
        except ValueError:
            raise _Usage(f"vlan {opts['vlan']!r} is not a number") from None
    crc = _on_off(opts["mpa_crc"]) if "mpa_crc" in opts else False
    if crc and typ != "iwarp":
        raise _Usage("mpa_crc applies to an iwarp (siw) device")
    reg.add(name, opts["netdev"], typ, port, ver, vlan, crc)
    return 0


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise _Usage(f"mpa_crc {value!r} is not on or off")
    return value == "on"


def _set(reg: Registry, args: list[str], out: TextIO) -> int:
    """``set NAME mpa_crc on|off`` (siw's ``mpa_crc_required``, per device)."""
    if len(args) != 3 or args[1] != "mpa_crc":
        raise _Usage("set takes a device NAME and 'mpa_crc on|off'")
    reg.set_mpa_crc(args[0], _on_off(args[2]))
    return 0


def _delete(reg: Registry, args: list[str], out: TextIO) -> int:
    if len(args) != 1:
        raise _Usage("delete takes exactly one device NAME")
    reg.delete(args[0])
    return 0


def _rename(reg: Registry, args: list[str], out: TextIO) -> int:
    """``rename OLD NEW`` (``rdma dev set OLD name NEW``): refused while the device's
    devd serves processes (they know it by its old name)."""
    if len(args) != 2:
        raise _Usage("rename takes the device's OLD and NEW names")
    old, new = args
    reg.get(old)
    if _devd_running(old, reg.directory):
        raise DeviceError(f"device {old!r} is in use (its devd serves processes); "
                          "rename it once they have exited")
    reg.rename(old, new)
    return 0


def _devd_running(name: str, directory: Path) -> bool:
    path = socket_path(name, directory)
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            connect_unix(s, path)
        except OSError:
            return False
    return True


def cmd_link(
    args: list[str], *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run ``softrdma link ARGS``; returns the exit status."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE, file=out)
        return 0
    # rdma's global -j (JSON) and -p (pretty), anywhere: they apply to show
    json_out = 2 if any(a in ("-p", "--pretty") for a in args) else int(
        any(a in ("-j", "--json") for a in args))
    args = [a for a in args if a not in ("-j", "--json", "-p", "--pretty")]
    verb, rest = (args[0], args[1:]) if args else ("show", [])
    if verb.startswith("-"):
        verb, rest = "show", args
    reg = Registry()
    try:
        if verb in ("show", "list", "ls"):
            return _show(reg, rest, out, json_out)
        if verb == "add":
            return _add(reg, rest, out)
        if verb == "set":
            return _set(reg, rest, out)
        if verb in ("delete", "del"):
            return _delete(reg, rest, out)
        if verb == "rename":
            return _rename(reg, rest, out)
        raise _Usage(f"unknown command {verb!r}")
    except _Usage as exc:
        print(f"softrdma link: error: {exc} (see 'softrdma link --help')", file=err)
        return 2
    except SoftRdmaError as exc:
        print(f"softrdma link: error: {exc}", file=err)
        return 1


def main() -> None:
    """Entry point for ``python -m softrdma.tools.admin.link``."""
    sys.exit(cmd_link(sys.argv[1:]))


if __name__ == "__main__":
    main()

"""``softrdma devinfo``: rdma-core's ``ibv_devinfo`` for softrdma devices.

Same options (``-d/--ib-dev``, ``-i/--ib-port``, ``-l/--list``, ``-v/--verbose``) and
the same tab-aligned layout as ``libibverbs/examples/devinfo.c``: the device block
(``ibv_query_device``), then one block per port (``ibv_query_port``); ``-v`` adds the
device limits, the port details and the GID table (``GID[  0]:  ::ffff:127.0.0.1,
RoCE v2``, the format of rdma-core >= v30, which prints GIDs with ``inet_ntop`` and their
type; null GIDs are skipped as devinfo's ``null_gid`` does).
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import TYPE_CHECKING, Any, TextIO

from ... import enums as e
from ...errors import DeviceError, SoftRdmaError
from ..argtypes import int_in

if TYPE_CHECKING:
    from ... import verbs as v

_TRANSPORT: dict[str, int] = {"roce": e.IBV_TRANSPORT_IB, "iwarp": e.IBV_TRANSPORT_IWARP}
_TRANSPORT_STR: dict[int, str] = {e.IBV_TRANSPORT_IB: "InfiniBand", e.IBV_TRANSPORT_IWARP: "iWARP",
                  e.IBV_TRANSPORT_USNIC: "usNIC", e.IBV_TRANSPORT_USNIC_UDP: "usNIC UDP"}
_PORT_STATE = {1: "PORT_DOWN", 2: "PORT_INIT", 3: "PORT_ARMED", 4: "PORT_ACTIVE"}
_MTU = {1: "256", 2: "512", 3: "1024", 4: "2048", 5: "4096"}
_LINK_LAYER = {0: "InfiniBand", 1: "InfiniBand", 2: "Ethernet"}
_ATOMIC = {0: "ATOMIC_NONE", 1: "ATOMIC_HCA", 2: "ATOMIC_GLOB"}
_WIDTH = {1: "1", 2: "4", 4: "8", 8: "12", 16: "2"}
_SPEED = {1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps", 16: "14.0 Gbps",
          32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}
_PHYS = {1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION TRAINNING",
         5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY TEST"}
_VL = {1: "1", 2: "2", 3: "4", 4: "8", 5: "15"}
_GID_TYPE: dict[int, str] = {e.IBV_GID_TYPE_IB: "", e.IBV_GID_TYPE_ROCE_V1: ", RoCE v1",
             e.IBV_GID_TYPE_ROCE_V2: ", RoCE v2"}
_CAP_FLAGS = [(int(f), f.name.removeprefix("IBV_DEVICE_")) for f in e.ibv_device_cap_flags
              if f.name is not None]

# devinfo.c's verbose device fields, in its order: (field, format)
_VERBOSE_FIELDS: list[tuple[str, str]] = [
    ("max_mr_size", "\tmax_mr_size:\t\t\t0x{:x}"),
    ("page_size_cap", "\tpage_size_cap:\t\t\t0x{:x}"),
    ("max_qp", "\tmax_qp:\t\t\t\t{}"),
    ("max_qp_wr", "\tmax_qp_wr:\t\t\t{}"),
    ("device_cap_flags", "\tdevice_cap_flags:\t\t0x{:08x}"),
    ("max_sge", "\tmax_sge:\t\t\t{}"),
    ("max_sge_rd", "\tmax_sge_rd:\t\t\t{}"),
    ("max_cq", "\tmax_cq:\t\t\t\t{}"),
    ("max_cqe", "\tmax_cqe:\t\t\t{}"),
    ("max_mr", "\tmax_mr:\t\t\t\t{}"),
    ("max_pd", "\tmax_pd:\t\t\t\t{}"),
    ("max_qp_rd_atom", "\tmax_qp_rd_atom:\t\t\t{}"),
    ("max_ee_rd_atom", "\tmax_ee_rd_atom:\t\t\t{}"),
    ("max_res_rd_atom", "\tmax_res_rd_atom:\t\t{}"),
    ("max_qp_init_rd_atom", "\tmax_qp_init_rd_atom:\t\t{}"),
    ("max_ee_init_rd_atom", "\tmax_ee_init_rd_atom:\t\t{}"),
    ("atomic_caps", "\tatomic_cap:\t\t\t{atomic}"),
    ("max_ee", "\tmax_ee:\t\t\t\t{}"),
    ("max_rdd", "\tmax_rdd:\t\t\t{}"),
    ("max_mw", "\tmax_mw:\t\t\t\t{}"),
    ("max_raw_ipv6_qp", "\tmax_raw_ipv6_qp:\t\t{}"),
    ("max_raw_ethy_qp", "\tmax_raw_ethy_qp:\t\t{}"),
    ("max_mcast_grp", "\tmax_mcast_grp:\t\t\t{}"),
    ("max_mcast_qp_attach", "\tmax_mcast_qp_attach:\t\t{}"),
    ("max_total_mcast_qp_attach", "\tmax_total_mcast_qp_attach:\t{}"),
    ("max_ah", "\tmax_ah:\t\t\t\t{}"),
    ("max_fmr", "\tmax_fmr:\t\t\t{}"),
    ("max_srq", "\tmax_srq:\t\t\t{}"),
    ("max_srq_wr", "\tmax_srq_wr:\t\t\t{}"),
    ("max_srq_sge", "\tmax_srq_sge:\t\t\t{}"),
    ("max_pkeys", "\tmax_pkeys:\t\t\t{}"),
    ("local_ca_ack_delay", "\tlocal_ca_ack_delay:\t\t{}"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``ibv_devinfo``'s options."""
    p.add_argument("-d", "--ib-dev", metavar="DEV",
                   help="use device DEV (default: all devices)")
    p.add_argument("-i", "--ib-port", type=int_in(1, None, "port"), default=0, metavar="PORT",
                   help="use port PORT of the device (default all ports)")
    p.add_argument("-l", "--list", action="store_true", help="print only the device names")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print all the attributes of the device(s)")


def guid_str(guid: int | bytes) -> str:
    """``guid_str``: a 64-bit GUID as ``xxxx:xxxx:xxxx:xxxx``."""
    value = int.from_bytes(guid, "big") if isinstance(guid, bytes | bytearray) else int(guid)
    return ":".join(f"{(value >> s) & 0xFFFF:04x}" for s in (48, 32, 16, 0))


def _name(table: dict[int, str], value: int, default: str) -> str:
    return table.get(int(value), default)


def cap_flag_lines(flags: int) -> list[str]:
    """``print_device_cap_flags``: one indented line per known flag, then the rest."""
    lines = [f"\t\t\t\t\t{name}" for bit, name in _CAP_FLAGS if flags & bit]
    unknown = flags & ~sum(bit for bit, _ in _CAP_FLAGS)
    if unknown:
        lines.append(f"\t\t\t\t\tUnknown flags: 0x{unknown:X}")
    return lines


def device_lines(info: Any, ctx: v.Context, ib_port: int, verbose: bool) -> list[str]:
    """The ``print_hca_cap`` block of one open device."""
    attr = ctx.query_device()
    nports = int(attr.phys_port_cnt)
    if ib_port and ib_port > nports:
        raise DeviceError(f"Invalid port requested for device {info.name} "
                          f"(it has {nports} port{'s' if nports != 1 else ''})")
    transport = int(getattr(ctx, "transport_type",
                            _TRANSPORT.get(str(getattr(info, "type", "roce")), 0)))
    out = [f"hca_id:\t{info.name}",
           f"\ttransport:\t\t\t{_TRANSPORT_STR.get(transport, 'invalid transport')} "
           f"({transport})"]
    fw_ver = str(getattr(attr, "fw_ver", "") or "")
    if fw_ver:
        out.append(f"\tfw_ver:\t\t\t\t{fw_ver}")
    out += [f"\tnode_guid:\t\t\t{guid_str(attr.node_guid)}",
            f"\tsys_image_guid:\t\t\t{guid_str(attr.sys_image_guid)}",
            f"\tvendor_id:\t\t\t0x{int(attr.vendor_id):04x}",
            f"\tvendor_part_id:\t\t\t{int(attr.vendor_part_id)}",
            f"\thw_ver:\t\t\t\t0x{int(attr.hw_ver):X}",
            f"\tphys_port_cnt:\t\t\t{nports}"]
    if verbose:
        out += _verbose_device_lines(attr)
        if transport == e.IBV_TRANSPORT_IWARP:  # softrdma's own line: the MPA CRC request
            crc = bool(getattr(ctx, "mpa_crc", False))  # (link mpa_crc / $SOFTRDMA_MPA_CRC)
            out.append(f"\tmpa_crc:\t\t\t{'on' if crc else 'off'}")
    for port in range(1, nports + 1):
        if ib_port and port != ib_port:
            continue
        out += port_lines(ctx, port, transport, verbose)
    return out


def _verbose_device_lines(attr: Any) -> list[str]:
    out: list[str] = []
    for field, fmt in _VERBOSE_FIELDS:
        value = getattr(attr, field, None)
        if value is None:
            continue
        if field in ("max_srq_wr", "max_srq_sge") and not int(getattr(attr, "max_srq", 0)):
            continue
        if field == "atomic_caps":
            out.append(fmt.format(atomic=f"{_name(_ATOMIC, value, 'invalid atomic capability')}"
                                         f" ({int(value)})"))
            continue
        out.append(fmt.format(int(value)))
        if field == "device_cap_flags":
            out += cap_flag_lines(int(value))
    return out


def port_lines(ctx: v.Context, port: int, transport: int, verbose: bool) -> list[str]:
    """One ``port:`` block (``ibv_query_port``), with details and GIDs when verbose."""
    pa = ctx.query_port(port)
    state, max_mtu, active_mtu = int(pa.state), int(pa.max_mtu), int(pa.active_mtu)
    out = [f"\t\tport:\t{port}",
           f"\t\t\tstate:\t\t\t{_name(_PORT_STATE, state, 'invalid state')} ({state})",
           f"\t\t\tmax_mtu:\t\t{_name(_MTU, max_mtu, 'invalid MTU')} ({max_mtu})",
           f"\t\t\tactive_mtu:\t\t{_name(_MTU, active_mtu, 'invalid MTU')} ({active_mtu})",
           f"\t\t\tsm_lid:\t\t\t{int(getattr(pa, 'sm_lid', 0))}",
           f"\t\t\tport_lid:\t\t{int(getattr(pa, 'lid', 0))}",
           f"\t\t\tport_lmc:\t\t0x{int(getattr(pa, 'lmc', 0)):02x}",
           f"\t\t\tlink_layer:\t\t{_name(_LINK_LAYER, int(pa.link_layer), 'Unknown')}"]
    if verbose:
        out += _verbose_port_lines(ctx, port, pa, transport)
    out.append("")
    return out


def _verbose_port_lines(ctx: v.Context, port: int, pa: Any, transport: int) -> list[str]:
    def field(name: str) -> int | None:
        value = getattr(pa, name, None)
        return None if value is None else int(value)

    out: list[str] = []
    simple = [("max_msg_sz", "\t\t\tmax_msg_sz:\t\t0x{:x}"),
              ("port_cap_flags", "\t\t\tport_cap_flags:\t\t0x{:08x}"),
              ("port_cap_flags2", "\t\t\tport_cap_flags2:\t0x{:04x}")]
    for name, fmt in simple:
        value = field(name)
        if value is not None:
            out.append(fmt.format(value))
    vl = field("max_vl_num")
    if vl is not None:
        out.append(f"\t\t\tmax_vl_num:\t\t{_name(_VL, vl, 'invalid value')} ({vl})")
    for name, fmt in [("bad_pkey_cntr", "\t\t\tbad_pkey_cntr:\t\t0x{:x}"),
                      ("qkey_viol_cntr", "\t\t\tqkey_viol_cntr:\t\t0x{:x}"),
                      ("sm_sl", "\t\t\tsm_sl:\t\t\t{}"),
                      ("pkey_tbl_len", "\t\t\tpkey_tbl_len:\t\t{}"),
                      ("gid_tbl_len", "\t\t\tgid_tbl_len:\t\t{}"),
                      ("subnet_timeout", "\t\t\tsubnet_timeout:\t\t{}"),
                      ("init_type_reply", "\t\t\tinit_type_reply:\t{}")]:
        value = field(name)
        if value is not None:
            out.append(fmt.format(value))
    width, speed = field("active_width"), field("active_speed")
    if width is not None:
        out.append(f"\t\t\tactive_width:\t\t{_name(_WIDTH, width, 'invalid width')}X ({width})")
    if speed is not None:
        out.append(f"\t\t\tactive_speed:\t\t{_name(_SPEED, speed, 'invalid speed')} ({speed})")
    phys = field("phys_state")
    if transport == e.IBV_TRANSPORT_IB and phys is not None:
        out.append(f"\t\t\tphys_state:\t\t{_name(_PHYS, phys, 'invalid physical state')} "
                   f"({phys})")
    out += gid_lines(ctx, port, field("gid_tbl_len"))
    out += counter_lines(ctx, port)
    return out


def counter_lines(ctx: v.Context, port: int) -> list[str]:
    """The port's counters (``Context.query_port_counters``), as ``rdma statistic``
    names them; drops by reason follow the traffic counters (CA16-23)."""
    pc = ctx.query_port_counters(port)
    scope = "device, all processes" if pc.shared else "this process"
    out = [f"\t\t\tcounters ({scope}):"]
    out += [f"\t\t\t\t{name}:\t{value}" for name, value in pc.counters.items()]
    return out


def gid_lines(ctx: v.Context, port: int, tbl_len: int | None) -> list[str]:
    """``print_all_port_gids``: every non-null GID with its type."""
    count = tbl_len if tbl_len is not None else len(ctx.gids)
    out: list[str] = []
    for i in range(count):
        try:
            raw = bytes(ctx.query_gid(port, i).raw)
        except SoftRdmaError:
            continue  # an empty slot of the table
        if not any(raw[8:]):  # devinfo.c null_gid(): interface id all zero
            continue
        try:
            gtype = int(ctx.query_gid_type(port, i))
        except SoftRdmaError:
            gtype = e.IBV_GID_TYPE_ROCE_V2
        out.append(f"\t\t\tGID[{i:3d}]:\t\t{socket.inet_ntop(socket.AF_INET6, raw)}"
                   f"{_GID_TYPE.get(gtype, '')}")
    return out


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point of ``softrdma devinfo``; returns the exit status."""
    from ... import verbs as v

    out = out if out is not None else sys.stdout
    devices = v.device.all_devices()
    if args.list:
        out.write(f"{len(devices)} HCA{'s' if len(devices) != 1 else ''} found:\n")
        for info in devices:
            out.write(f"\t{info.name}\n")
        out.write("\n")
        return 0
    if args.ib_dev is not None:
        devices = [d for d in devices if d.name == args.ib_dev]
        if not devices:
            raise DeviceError(f"IB device '{args.ib_dev}' wasn't found")
    elif not devices:
        raise DeviceError("No IB devices found")
    for info in devices:
        with v.Context(info.name) as ctx:
            lines = device_lines(info, ctx, args.ib_port, args.verbose)
        out.write("\n".join(lines) + "\n")
    return 0

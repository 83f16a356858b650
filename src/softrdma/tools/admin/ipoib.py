"""``softrdma ipoib``: IP over InfiniBand (RFC 4391 datagram mode, RFC 4755 connected
mode) on a softrdma device, as a TUN network interface.

::

    softrdma ipoib up NAME --device DEV [--mode connected|datagram] [--pkey P] [--mtu M]
                      [--uc] [--no-crossing-rule] [--gid-index N] ADDR/PREFIX...
    softrdma ipoib down NAME
    softrdma ipoib show [NAME] [--json]

``up`` runs in the foreground until SIGINT/SIGTERM or ``down``; ``show`` prints the
neighbour table, the connections and the counters of running interfaces.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from typing import Any

from ...apps.ipoib_runtime import IpoibRuntime, RuntimeOptions
from ...drivers.host.ipoib_control import control_request, running
from ...errors import InvalidArgument

__all__ = ["parse", "main", "run"]

PROG = "softrdma ipoib"


def _pkey(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid P_Key {text!r}") from None
    if not 0 < value <= 0xFFFF or value & 0x7FFF == 0:
        raise argparse.ArgumentTypeError(f"invalid P_Key {text!r} (1..0xffff, not 0x8000)")
    return value | 0x8000  # full membership, as Linux's ipoib sets it


def _address(text: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    if "/" not in text:
        raise argparse.ArgumentTypeError(f"{text!r}: give ADDR/PREFIX")
    try:
        return ipaddress.ip_interface(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid address {text!r}") from None


ACTIONS = ("up", "down", "show")


def _parser(action: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} {action}")
    if action == "up":
        p.description = "Create the interface and run it until SIGINT/SIGTERM or `down`."
        p.add_argument("name", metavar="NAME", help="interface name (e.g. sr-ib0)")
        p.add_argument("addresses", metavar="ADDR/PREFIX", nargs="*", type=_address,
                       help="IPv4/IPv6 addresses of the interface")
        p.add_argument("--device", "-d", default=None,
                       help="softrdma device (default: the first)")
        p.add_argument("--mode", choices=("connected", "datagram"), default="connected",
                       help="connected (RFC 4755, default) or datagram (RFC 4391)")
        p.add_argument("--pkey", type=_pkey, default=0xFFFF, help="P_Key (default 0xffff)")
        p.add_argument("--mtu", type=int, default=None,
                       help="interface MTU (default: connected 65520 trimmed so that a "
                            "packet is one UDP GSO send, 65212 at IB MTU 4096; datagram "
                            "IB MTU - 4)")
        p.add_argument("--uc", action="store_true",
                       help="connected mode over UC connections instead of RC")
        p.add_argument("--no-crossing-rule", action="store_true",
                       help="accept every REQ, even when ours to the same peer is "
                       "outstanding (Linux's behaviour) instead of RFC 4755 §3.3")
        p.add_argument("--gid-index", type=int, default=None,
                       help="GID of the device to use (default: its first IPv6 GID)")
        p.add_argument("--idle-timeout", type=float, default=2 * 256.0,
                       help="seconds before an unused passive connection is torn down (512)")
    elif action == "down":
        p.description = "Stop a running interface."
        p.add_argument("name", metavar="NAME")
    else:
        p.description = "Print neighbours, connections and counters."
        p.add_argument("name", metavar="NAME", nargs="?", default=None)
        p.add_argument("--json", action="store_true", help="JSON output")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``softrdma ipoib ARGS`` (options and addresses may be intermixed)."""
    if not argv or argv[0] not in ACTIONS:
        top = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
        top.add_argument("action", choices=ACTIONS)
        top.parse_args(argv[:1])
    action = argv[0]
    args = _parser(action).parse_intermixed_args(argv[1:])
    args.action = action
    return args


def main(argv: list[str]) -> int:
    """``softrdma ipoib ARGS`` (the CLI passes every argument through)."""
    return run(parse(argv))


def run(args: argparse.Namespace) -> int:
    if args.action == "up":
        return _up(args)
    if args.action == "down":
        control_request(args.name, "down")
        return 0
    return _show(args)


def _up(args: argparse.Namespace) -> int:
    if args.mtu is not None and args.mtu < 68:
        raise InvalidArgument("mtu", f"must be at least 68, got {args.mtu}")
    opts = RuntimeOptions(name=args.name, device=args.device, addresses=tuple(args.addresses),
                          mode=args.mode, pkey=args.pkey, mtu=args.mtu,
                          transport="UC" if args.uc else "RC",
                          crossing_rule=not args.no_crossing_rule, gid_index=args.gid_index,
                          idle_s=args.idle_timeout)
    rt = IpoibRuntime(opts)
    try:
        snap = rt.engine.snapshot(0.0)
        print(f"{args.name}: up, {args.mode} mode, mtu {snap['mtu']}, lladdr {snap['lladdr']}, "
              f"device {rt.ctx.name}, UD QPN {rt.ud_qp.qp_num:#x}", flush=True)
        rt.run()
    finally:
        rt.close()
    return 0


def _show(args: argparse.Namespace) -> int:
    if args.name is not None:
        names = [args.name]
    else:
        names = running()
    snaps = [control_request(n, "show") for n in names]
    if args.json:
        json.dump(snaps[0] if args.name is not None else snaps, sys.stdout, indent=2)
        print()
        return 0
    for s in snaps:
        print(_format(s))
    return 0


def _format(s: dict[str, Any]) -> str:
    lines = [f"{s['name']}: device {s['device']} mode {s['mode']} mtu {s['mtu']} "
             f"(UD {s['ud_mtu']}) pkey {s['pkey']} UD QPN {s['ud_qpn']:#x}",
             f"    lladdr {s['lladdr']}",
             f"    inet {' '.join(s['addresses'])}", "neighbours:"]
    lines.append(f"    {'IP':<28} {'LLADDR':<60} {'STATE':<11} AGE")
    for n in s["neighbours"]:
        lines.append(f"    {n['ip']:<28} {n['lladdr'] or '-':<60} {n['state']:<11} "
                     f"{n['age_s']:.1f}s")
    lines.append("connections:")
    lines.append(f"    {'PEER':<28} {'MODE':<4} {'DIR':<8} {'STATE':<11} {'QPN':<17} "
                 f"{'MTU':>6} {'TX PKTS':>9} {'TX BYTES':>12} {'RX PKTS':>9} {'RX BYTES':>12}")
    for c in s["connections"]:
        peer = ",".join(c["peer"]) or c["peer_lladdr"]
        qpns = f"{c['local_qpn']:#x}/{c['remote_qpn']:#x}"
        lines.append(f"    {peer:<28} {c['mode']:<4} {c['direction']:<8} {c['state']:<11} "
                     f"{qpns:<17} {c['mtu']:>6} {c['tx_packets']:>9} {c['tx_bytes']:>12} "
                     f"{c['rx_packets']:>9} {c['rx_bytes']:>12}")
    lines.append("counters:")
    items = [f"{k} {v}" for k, v in s["counters"].items()]
    for i in range(0, len(items), 4):
        lines.append("    " + "  ".join(items[i:i + 4]))
    return "\n".join(lines)

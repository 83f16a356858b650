"""The flags of ``rc/uc/ud-pingpong`` (:func:`add_arguments`, as rdma-core's
``{rc,uc,ud}_pingpong.c`` parse them) and the :class:`Options` a run takes from them.
Re-exported by :mod:`.pingpong`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..argtypes import int_in, path_mtu, positive_seconds
from . import pingpong_ext
from .pingpong_dest import DEFAULT_TCP_PORT, DEFAULT_TIMEOUT
from .pingpong_ext import ExtOptions

KINDS = ("rc", "uc", "ud")


def add_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    """The ``ibv_{kind}_pingpong`` options (same letters, names and defaults)."""
    size = 2048 if kind == "ud" else 4096
    p.add_argument("servername", nargs="?", help="connect to the server at this host "
                   "(without it: start a server and wait for a connection)")
    p.add_argument("-p", "--port", type=int_in(0, 65535, "port"), default=None,
                   help=f"listen on/connect to TCP port PORT (default {DEFAULT_TCP_PORT}; "
                   "with --loopback an ephemeral port)")
    p.add_argument("-d", "--ib-dev", metavar="DEV", help="use device DEV "
                   "(default first device found)")
    p.add_argument("-i", "--ib-port", type=int_in(1, 255, "ib-port"), default=1,
                   metavar="PORT", help="use port PORT of the device (default 1)")
    p.add_argument("-s", "--size", type=int_in(1, 1 << 31, "size"), default=size,
                   help=f"size of message to exchange (default {size})")
    if kind != "ud":
        p.add_argument("-m", "--mtu", type=path_mtu, default=1024, help="path MTU (default 1024)")
    p.add_argument("-r", "--rx-depth", type=int_in(2, 1 << 20, "rx-depth"), default=500,
                   metavar="DEP", help="number of receives to post at a time (default 500)")
    p.add_argument("-n", "--iters", type=int_in(1, 1 << 31, "iters"), default=1000,
                   help="number of exchanges (default 1000)")
    p.add_argument("-l", "--sl", type=int_in(0, 15, "sl"), default=0,
                   help="service level value (default 0)")
    p.add_argument("-e", "--events", action="store_true",
                   help="sleep on CQ events (default poll)")
    p.add_argument("-g", "--gid-idx", type=int_in(-1, 0xFFFF, "gid-idx"), default=None,
                   metavar="IDX", help="local port GID index (default: 0 on RoCE ports, "
                   "which need a GID; -1 sends no GID, as the C tool without -g)")
    p.add_argument("-c", "--chk", action="store_true",
                   help="validate received buffers (the pattern of rc_pingpong -c: 0x7b "
                   "with a 0 at the start of each page)")
    if kind == "rc":
        pingpong_ext.add_arguments(p)
        p.add_argument("--transport", choices=("roce", "iwarp"), default="roce",
                       help="roce (default: the RoCE device and the OOB exchange) or iwarp "
                       "(an iWARP device, connected by TCP + MPA on the same port)")
    p.add_argument("--loopback", action="store_true",
                   help="run server and client in this process, on one device "
                   "(no other process needed)")
    p.add_argument("--bind", metavar="ADDR", default=None,
                   help="server: listen for the TCP exchange on ADDR only (default all)")
    p.add_argument("--timeout", type=positive_seconds("timeout"), default=DEFAULT_TIMEOUT, metavar="SEC",
                   help=f"give up after SEC seconds without progress (connecting, "
                   f"exchanging, waiting for a completion; default {DEFAULT_TIMEOUT:g})")


@dataclass(slots=True)
class Options:
    """Validated pingpong options (see :func:`add_arguments`)."""

    kind: str
    servername: str | None = None
    port: int | None = None
    ib_dev: str | None = None
    ib_port: int = 1
    size: int = 4096
    mtu: int = 1024
    rx_depth: int = 500
    iters: int = 1000
    sl: int = 0
    events: bool = False
    gid_idx: int | None = None
    chk: bool = False
    loopback: bool = False
    transport: str = "roce"
    bind: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    ext: ExtOptions = ExtOptions()

    @classmethod
    def from_args(cls, kind: str, args: argparse.Namespace) -> Options:
        """Build from the namespace :func:`add_arguments` produced."""
        return cls(kind=kind, servername=args.servername, port=args.port,
                   ib_dev=args.ib_dev, ib_port=args.ib_port, size=args.size,
                   mtu=getattr(args, "mtu", 1024), rx_depth=args.rx_depth,
                   iters=args.iters, sl=args.sl, events=args.events, gid_idx=args.gid_idx,
                   chk=args.chk, loopback=args.loopback, bind=args.bind,
                   transport=getattr(args, "transport", "roce"),
                   timeout=args.timeout, ext=ExtOptions.from_args(args))


# --------------------------------------------------------------------------------------
# One endpoint: the pingpong_context of the C tools

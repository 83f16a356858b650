"""``softrdma ladder``: the ladder (sequence) diagram of a capture, and its PSN plot.

``softrdma ladder FILE [-o out.svg] [--plot out.png]`` reads a pcap/pcapng file of RoCEv2,
RoCEv1 or iWARP traffic (softrdma's own ``--pcap`` files, tcpdump captures of Linux
rxe/siw) with :mod:`softrdma.tools.capture.ladder_events`, then draws with
:mod:`softrdma.tools.capture.ladder_draw` (matplotlib, imported only when drawing). Without
``-o``/``--plot`` the ladder is printed as text, one row per line.

Exit status: 0 done, 1 the capture cannot be read or nothing can be drawn.
"""

from __future__ import annotations

import argparse
import sys

from ...errors import DecodeError, SoftRdmaError
from ..argtypes import nonneg_int, udp_port

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``softrdma ladder``."""
    p.add_argument("file", metavar="FILE", help="pcap or pcapng capture")
    p.add_argument("-o", "--output", metavar="OUT", default=None,
                   help="write the ladder diagram to OUT (.svg, .png or .pdf)")
    p.add_argument("--plot", metavar="OUT", default=None,
                   help="write the PSN-against-time plot (one panel per connection "
                   "direction; retransmissions and NAKs marked) to OUT (.png, .svg)")
    p.add_argument("--max-rows", type=nonneg_int, default=400, metavar="N",
                   help="draw at most the first N rows (0: all; default 400)")
    p.add_argument("--title", default=None, help="a title (default: the file name)")
    p.add_argument("--udp-port", type=udp_port, action="append", default=[], metavar="N",
                   help="also read UDP port N as RoCEv2")


def run(args: argparse.Namespace) -> int:
    """Do ``softrdma ladder`` for parsed ``args``."""
    from .ladder_draw import draw_ladder, draw_psn_plot, print_ladder
    from .ladder_events import capture_events

    try:
        lad = capture_events(args.file, tuple(args.udp_port), args.max_rows)
    except DecodeError as e:
        raise SoftRdmaError(f"{args.file}: not a capture: {e}") from None
    title = args.title if args.title is not None else args.file
    if args.output is None and args.plot is None:
        print_ladder(lad, sys.stdout)
        return 0
    if args.output is not None:
        draw_ladder(lad, args.output, title)
        print(f"{args.output}: {len(lad.rows)} rows, {len(lad.lanes)} lanes")
    if args.plot is not None:
        draw_psn_plot(lad, args.plot, title)
        print(f"{args.plot}: {len(lad.psns)} connection directions")
    return 0

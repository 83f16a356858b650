"""The command-line flags of ``softrdma udaddy`` and ``softrdma ucmatose`` (librdmacm's
``udaddy.c`` and ``cmatose.c`` getopt strings, plus softrdma's ``--timeout``/``--device``).

Kept apart from the tools so that building the ``softrdma`` parser imports no verbs.
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "UDADDY_PORT", "CMATOSE_PORT", "DEFAULT_TIMEOUT"]

UDADDY_PORT = 7174  # fixed in udaddy.c
CMATOSE_PORT = 7471
DEFAULT_TIMEOUT = 60.0


def add_arguments(p: argparse.ArgumentParser, tool: str) -> None:
    """The flags of ``tool`` (``udaddy`` or ``ucmatose``)."""
    if tool == "udaddy":
        add_udaddy_arguments(p)
    else:
        add_ucmatose_arguments(p)


def add_message_arguments(p: argparse.ArgumentParser, ids: str, per: str,
                          size_note: str) -> None:
    """``-c``, ``-C``, ``-S``: how many ``ids`` (connections, or ids joining a group),
    messages ``per`` each, and their size (``size_note``: what bounds it), as the
    librdmacm examples (cmatose, udaddy, mckey) have them."""
    p.add_argument("-c", dest="connections", type=int, default=1, metavar="connections",
                   help=f"number of {ids} (1)")
    p.add_argument("-C", dest="message_count", type=int, default=10,
                   metavar="message_count", help=f"messages per {per} (10)")
    p.add_argument("-S", dest="message_size", type=int, default=100, metavar="message_size",
                   help=f"message size in bytes{size_note} (100)")


def add_softrdma_arguments(
        p: argparse.ArgumentParser,
        timeout_help: str = "give up when a peer stays silent this many seconds (default 60)",
) -> None:
    """softrdma's own ``--device`` and ``--timeout`` (its help: ``timeout_help``)."""
    p.add_argument("--device", default=None,
                   help="the softrdma device (name, or roce/iwarp) serving the addresses")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help=timeout_help)


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """The flags udaddy and cmatose share (their getopt strings), plus softrdma's own."""
    p.add_argument("-s", dest="dst_addr", default=None, metavar="server_address",
                   help="connect to this server (without -s: be the server)")
    p.add_argument("-b", dest="src_addr", default=None, metavar="bind_address",
                   help="bind to this local address")
    p.add_argument("-f", dest="addr_format", default=None, metavar="address_format",
                   help="name, ip, ipv6 (gid is not supported: no AF_IB on softrdma)")
    add_message_arguments(p, "connections", "connection", "")
    p.add_argument("-t", dest="tos", default=None, metavar="type_of_service",
                   help="type of service: the traffic class of the connection "
                   "(rdma_set_option TOS; RoCE)")
    add_softrdma_arguments(p)


def add_udaddy_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("-P", dest="port_space_name", default=None, metavar="port_space",
                   help="udp (default) or ipoib")
    p.add_argument("-p", dest="port_space", default=None, metavar="port_space",
                   help="port space number: 0x111 for UDP (default), 0x2 for IPOIB")
    p.add_argument("--port", type=int, default=UDADDY_PORT,
                   help=f"the service port (udaddy's is {UDADDY_PORT})")


def add_ucmatose_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("-p", dest="port", type=int, default=CMATOSE_PORT, metavar="port_number",
                   help=f"port ({CMATOSE_PORT})")
    p.add_argument("-P", dest="port_space_name", default=None, metavar="port_space",
                   help="tcp (default) or ib (RDMA_PS_IB; RoCE)")
    p.add_argument("-m", dest="migrate", action="store_true",
                   help="migrate the ids to a new event channel after the transfers")
    p.add_argument("-a", dest="ack_timeout", default=None, metavar="ack_timeout",
                   help="the QP's local ACK timeout, 4.096 us * 2^ack_timeout "
                   "(rdma_set_option ACK_TIMEOUT)")
    p.add_argument("--transport", choices=("roce", "iwarp"), default="roce",
                   help="which kind of softrdma device serves the address (default roce)")

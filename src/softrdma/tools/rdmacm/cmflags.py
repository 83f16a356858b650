"""The command-line flags of ``softrdma mckey``, ``softrdma rdma-server`` /
``rdma-client`` and ``softrdma rdma-xserver`` / ``rdma-xclient`` (the getopt strings of
librdmacm's ``examples/mckey.c``, ``rdma_server.c``, ``rdma_client.c``, ``rdma_xserver.c``
and ``rdma_xclient.c``, plus softrdma's ``--device``/``--timeout``).

Kept apart from the tools so that building the ``softrdma`` parser imports no verbs.
"""

from __future__ import annotations

import argparse

from .cmargs import DEFAULT_TIMEOUT, add_message_arguments, add_softrdma_arguments

__all__ = ["add_arguments", "MCKEY_SETTLE_S", "RDMA_EXAMPLE_PORT", "DEFAULT_TIMEOUT"]

MCKEY_SETTLE_S = 3.0  # mckey.c sleeps 3 s after the joins ("give SM chance...")
RDMA_EXAMPLE_PORT = "7471"  # rdma_server.c / rdma_client.c


def add_arguments(p: argparse.ArgumentParser, tool: str) -> None:
    """The flags of ``tool``: ``mckey``, ``rdma-server``, ``rdma-client``,
    ``rdma-xserver`` or ``rdma-xclient``."""
    if tool == "mckey":
        _mckey(p)
    else:
        _example(p, tool)
    add_softrdma_arguments(p, "give up when a peer stays silent this many seconds once "
                           "the exchange has begun (default 60; a server waits for its "
                           "first peer until stopped)")


def _mckey(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-m", dest="mcast_addr", default=None, metavar="multicast_address",
                   help="the multicast group (an IPv4 or IPv6 multicast address)")
    g.add_argument("-M", dest="unmapped_addr", default=None,
                   metavar="unmapped_multicast_address",
                   help="an AF_IB multicast GID (replaces -m and requires -b; softrdma has "
                   "no AF_IB and refuses it)")
    p.add_argument("-s", dest="sender", action="store_true",
                   help="be the sender (without -s: receive)")
    p.add_argument("-b", dest="src_addr", default=None, metavar="bind_address",
                   help="bind to this local address (it picks the device)")
    add_message_arguments(p, "rdma_cm ids (each joins the group)", "id",
                          ", at most the active MTU")
    p.add_argument("-p", dest="port_space", default=None, metavar="port_space",
                   help="0x111 for UDP (default), 0x2 for IPOIB (not on RoCE)")
    p.add_argument("-o", dest="send_only", action="store_true",
                   help="join as a send-only full member (the QP is not attached)")
    p.add_argument("-l", dest="no_loopback", action="store_true",
                   help="join without multicast loopback (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;"
                   " refused as rxe refuses it)")
    p.add_argument("--settle", type=float, default=MCKEY_SETTLE_S, metavar="SECONDS",
                   help="pause between the joins and the transfers, as mckey's sleep(3) "
                   f"(default {MCKEY_SETTLE_S:g})")


def _example(p: argparse.ArgumentParser, tool: str) -> None:
    default = "0.0.0.0" if tool == "rdma-server" else "127.0.0.1"
    if tool != "rdma-xserver":  # rdma_xserver.c listens on every address: no -s
        p.add_argument("-s", dest="server", default=default, metavar="server_address",
                       help=f"the server's address ({default})")
    p.add_argument("-p", dest="port", default=RDMA_EXAMPLE_PORT, metavar="port_number",
                   help=f"the server's port ({RDMA_EXAMPLE_PORT})")
    if tool in ("rdma-xserver", "rdma-xclient"):
        p.add_argument("-c", dest="comm_type", default="r", metavar="communication_type",
                       help="r: RC, reliable-connected (default); x: XRC, "
                       "extended-reliable-connected (RDMA_PS_IB ids; RoCE)")

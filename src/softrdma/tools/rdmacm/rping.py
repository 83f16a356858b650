"""``softrdma rping``: rdma-core's ``rping`` (librdmacm/examples/rping.c) on the rdma_cm API.

The ping/pong loop, as rping.c, over one RC connection set up by
:mod:`softrdma.cm.rdma_cm` (RoCE: IB CM + Annex A11; iWARP: TCP + MPA)::

    client sends source rkey/addr/len          (struct rping_rdma_info: !QII, big-endian)
    server RDMA READs the "ping" data from it
    server sends "go ahead" on the READ completion
    client sends sink rkey/addr/len
    server RDMA WRITEs the data back into the sink
    server sends "go ahead" on the WRITE completion; the client verifies (-V), prints
    (-v) ``ping data: rdma-ping-<n>: ABC...`` and starts again

``-C`` pings (0: for ever), ``-S`` bytes of ping data (rping's limits: 26 .. 65535),
port 7174 by default; the client disconnects at the end, each side reporting
``client DISCONNECT EVENT...`` / ``server DISCONNECT EVENT...`` on stderr. ``-P``: a
persistent server, serving every client in its own thread until it is stopped (rping's
``rping_run_persistent_server``). ``-q``: the QP is created with ``ibv_create_qp`` and
moved by rping itself with ``rdma_init_qp_attr``'s attributes, its number given in the
connection parameters (the client completes with ``rdma_establish``), as rping's ``-q``. Exit status: 0 on success, 1 on any failure (see
:mod:`softrdma.tools.rdmacm.rping_run`). Options beyond rping: ``--transport roce|iwarp``
(which kind of device serves the address; default roce), ``--device NAME`` and
``--timeout`` (how long a peer may stay silent). This module holds the flags and their
checks only, so that building the ``softrdma`` parser imports no verbs.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import struct

from ...errors import InvalidArgument

__all__ = ["add_arguments", "check_args", "INFO", "ping_pattern"]

INFO = struct.Struct("!QII")  # struct rping_rdma_info {__be64 buf; __be32 rkey; __be32 size}
RPING_BUFSIZE = 64 * 1024
RPING_MIN_BUFSIZE = len("2147483647") + 1 + len("rdma-ping-%d: ") + 1
RPING_SQ_DEPTH = 16
DEFAULT_PORT = 7174
MSG_FMT = "rdma-ping-%d: "

# rping.c test_state
(IDLE, CONNECT_REQUEST, ADDR_RESOLVED, ROUTE_RESOLVED, CONNECTED, RDMA_READ_ADV,
 RDMA_READ_COMPLETE, RDMA_WRITE_ADV, RDMA_WRITE_COMPLETE, DISCONNECTED, ERROR) = range(1, 12)


def ping_pattern(ping: int, start: int, size: int) -> bytes:
    """The client's ping data for ping number ``ping`` (rping_test_client): the header,
    then letters from ``start`` cycling through 65..122, the last byte NUL."""
    head = (MSG_FMT % ping).encode()[:size]
    out = bytearray(head)
    c = start
    for _ in range(len(head), size):
        out.append(c)
        c = c + 1 if c < 122 else 65
    out[size - 1] = 0
    return bytes(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    side = p.add_mutually_exclusive_group(required=True)
    side.add_argument("-s", dest="server", action="store_true", help="server side")
    side.add_argument("-c", dest="client", action="store_true", help="client side")
    p.add_argument("-a", dest="addr", default=None,
                   help="address (server: to bind, default any; client: the server's)")
    p.add_argument("-I", dest="source", default=None, help="source address for the client")
    p.add_argument("-p", dest="port", type=int, default=DEFAULT_PORT, help="port (7174)")
    p.add_argument("-C", dest="count", type=int, default=0, help="ping count (0: for ever)")
    p.add_argument("-S", dest="size", type=int, default=64, help="ping data size (64)")
    p.add_argument("-v", dest="verbose", action="count", default=0,
                   help="display ping data to stdout")
    p.add_argument("-V", dest="validate", action="count", default=0,
                   help="validate ping data")
    p.add_argument("-d", dest="debug", action="count", default=0, help="debug printfs")
    p.add_argument("-P", dest="persistent", action="store_true",
                   help="persistent server mode allowing multiple connections")
    p.add_argument("-q", dest="self_create_qp", action="store_true",
                   help="use self-created, self-modified QP (RoCE)")
    p.add_argument("--transport", choices=("roce", "iwarp"), default="roce",
                   help="which kind of softrdma device to use (default roce)")
    p.add_argument("--device", default=None, help="the softrdma device to use by name")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="give up when the peer stays silent this many seconds (default 30; "
                   "a server waits for its clients until stopped)")


def check_args(args: argparse.Namespace) -> None:
    """rping's argument checks (and softrdma's: ``--timeout``, ``-c`` needs ``-a``)."""
    if not RPING_MIN_BUFSIZE <= args.size <= RPING_BUFSIZE - 1:
        raise InvalidArgument("-S", f"Invalid size {args.size} (valid range is "
                                    f"{RPING_MIN_BUFSIZE} to {RPING_BUFSIZE - 1})")
    if args.count < 0:
        raise InvalidArgument("-C", f"Invalid count {args.count}")
    if not 0 <= args.port <= 0xFFFF:
        raise InvalidArgument("-p", f"port {args.port} not in 0..65535")
    if not args.timeout > 0:
        raise InvalidArgument("--timeout", f"must be a positive number of seconds, got "
                                           f"{args.timeout:g}")
    if args.client and args.addr is None:
        raise InvalidArgument("-a", "the client needs -a ADDR (the server's address)")
    if args.self_create_qp and args.transport == "iwarp":
        raise InvalidArgument("-q", "a self-modified QP needs the IB CM's QP attributes "
                                    "(rdma_init_qp_attr): use --transport roce")
    if args.persistent and not args.server:
        raise InvalidArgument("-P", "persistent mode is for the server (-s)")
    for name in ("addr", "source"):
        val = getattr(args, name)
        if val is not None:
            setattr(args, name, resolve_host(val, "-a" if name == "addr" else "-I"))


def resolve_host(text: str, flag: str) -> str:
    """An address or host name, as rping's ``get_addr`` takes it (``getaddrinfo``), as
    an IP address string; IPv4 first, since a server without ``-a`` listens on 0.0.0.0.
    A name that does not resolve raises :class:`InvalidArgument` naming ``flag``."""
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(text, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise InvalidArgument(flag, f"not an IP address or a known host name: {text!r} "
                                    f"({why})") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return str(infos[0][4][0])

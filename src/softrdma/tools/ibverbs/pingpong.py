"""``rc-pingpong``, ``uc-pingpong``, ``ud-pingpong``: libibverbs' ``ibv_*_pingpong``.

Same flags, defaults, output and wire behaviour as rdma-core's
``libibverbs/examples/{rc,uc,ud}_pingpong.c``, so either side can be the real tool:

* Out-of-band exchange (rdma-core ``pingpong.c`` / ``pp_*_exch_dest``), TCP port 18515:
  the client connects and sends its address as the 52-byte C string
  ``"%04x:%06x:%06x:%s\\0"`` (LID:QPN:PSN:GID, the GID as 32 hex digits in wire byte
  order, ``gid_to_wire_gid``); the server reads it, moves its QP to RTR/RTS, answers
  with its own address; the client replies ``"done\\0"`` (5 bytes) and both close.
* RC: RTR with path MTU, ``max_dest_rd_atomic`` 1, ``min_rnr_timer`` 12; RTS with
  ``timeout`` 14, ``retry_cnt`` 7, ``rnr_retry`` 7, ``max_rd_atomic`` 1 (IBA 11.2.4.2 /
  ``ibv_modify_qp``). UC: RTR path MTU/dest QPN/RQ PSN, RTS SQ PSN. UD: Q_Key
  0x11111111, receives carry the 40-byte GRH area in front of the payload (IBA 11.4.1.1)
  and the message must fit in one MTU.
* Data phase: ``rx_depth`` receives posted up front and topped up when one is left
  (and, off the round trip, right after a SEND once 16 are used); the client sends first; each side sends its next message once both its previous send and
  the peer's message have completed; ``iters`` round trips.

``rc-pingpong --transport iwarp`` runs the same data phase over an iWARP device
(:mod:`softrdma.iwarp`; by default the built-in loopback one). iWARP QPs are connected by
TCP + MPA, as siw's rdma_cm-based tools do, so the out-of-band exchange is replaced by
the MPA connection on the same TCP port (18515): the client's MPA Request and the
server's MPA Reply carry the same 52-byte address strings as private data (after the
RFC 6581 IRD/ORD block), so the address lines print as with RoCE; the QPs enter RTS
when MPA completes (no RTR/RTS attributes).

Unlike the C tools nothing here can block forever: every socket operation and the data
phase run under ``--timeout`` (a peer that vanishes gives a one-line error, exit 1).
"""

from __future__ import annotations

import argparse
import errno
import io
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from ...errors import InvalidArgument, SoftRdmaError
from ..waiting import announce_wait, connect_retry_s
from . import pingpong_ext
from .pingpong_dest import (
    DEFAULT_TCP_PORT,
    DEFAULT_TIMEOUT,
    DONE_MSG,
    MSG_LEN,
    Dest,
    OOBListener,
    PingPongError,
    client_exchange,
    decode_dest,
    encode_dest,
    gid_text,
)
from .pingpong_endpoint import (
    MTU_BYTES_TO_ENUM,
    PAGE_SIZE,
    QP_TYPES,
    Endpoint,
    check_pattern,
    local_gid,
)
from .pingpong_options import KINDS, Options, add_arguments

if TYPE_CHECKING:
    from ... import verbs as v

__all__ = [
    "DEFAULT_TCP_PORT", "DEFAULT_TIMEOUT", "DONE_MSG", "MSG_LEN", "Dest", "OOBListener",
    "PingPongError", "client_exchange", "decode_dest", "encode_dest", "gid_text",
    "MTU_BYTES_TO_ENUM", "PAGE_SIZE", "QP_TYPES", "Endpoint", "check_pattern", "local_gid",
    "KINDS", "Options", "add_arguments", "address_line", "result_lines", "run_server",
    "run_client", "iwarp_listen", "run_server_iwarp", "run_client_iwarp", "open_context",
    "open_device", "run_loopback", "run",
]


def address_line(which: str, dest: Dest, kind: str) -> str:
    """``  local address:  LID 0x0000, QPN 0x000011, PSN 0xf4747e, GID ::ffff:10.50.0.11``.

    ud_pingpong prints ``PSN 0x...: GID`` on its local line (sic); reproduced.
    """
    sep = ":" if (kind == "ud" and which == "local") else ","
    label = "  local address: " if which == "local" else "  remote address:"
    return (f"{label} LID 0x{dest.lid:04x}, QPN 0x{dest.qpn:06x}, PSN 0x{dest.psn:06x}"
            f"{sep} GID {gid_text(dest.gid)}")


def result_lines(size: int, iters: int, usec: float) -> list[str]:
    """The two summary lines of the C tools (bytes counted both ways: size*iters*2)."""
    usec = max(usec, 1e-3)
    nbytes = size * iters * 2
    return [f"{nbytes} bytes in {usec / 1e6:.2f} seconds = {nbytes * 8.0 / usec:.2f} Mbit/sec",
            f"{iters} iters in {usec / 1e6:.2f} seconds = {usec / iters:.2f} usec/iter"]


def _emit(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


def _run_and_report(ep: Endpoint, is_client: bool, out: TextIO,
                    abort: threading.Event | None) -> float:
    """The data phase, then its result lines; returns its time (microseconds)."""
    usec = ep.run(is_client, abort)
    for line in result_lines(ep.opts.size, ep.opts.iters, usec):
        _emit(out, line)
    if ep.recv_clock is not None:  # -t
        for line in ep.recv_clock.lines():
            _emit(out, line)
    return usec


def run_server(ep: Endpoint, listener: OOBListener, out: TextIO,
               abort: threading.Event | None = None) -> float:
    """Server role: print local, exchange (connect the QP before answering), run."""
    _emit(out, address_line("local", ep.local, ep.opts.kind))
    rem = listener.exchange(ep.local, ep.connect)
    _emit(out, address_line("remote", rem, ep.opts.kind))
    return _run_and_report(ep, False, out, abort)


def run_client(ep: Endpoint, host: str, port: int, out: TextIO,
               abort: threading.Event | None = None) -> float:
    """Client role: print local, exchange, connect the QP, send first, run."""
    _emit(out, address_line("local", ep.local, ep.opts.kind))
    rem = client_exchange(host, port, ep.local, ep.opts.timeout)
    _emit(out, address_line("remote", rem, ep.opts.kind))
    ep.connect(rem)
    return _run_and_report(ep, True, out, abort)


def iwarp_listen(ctx: v.Context, opts: Options, port: int) -> Any:
    """The iWARP server's listener (TCP port ``port``, all addresses unless ``--bind``)."""
    from ...drivers.cm import iwconnect

    try:
        return iwconnect.listen(ctx, port, opts.bind or "")
    except SoftRdmaError as exc:
        raise PingPongError(f"Couldn't listen to port {port}: {exc}") from exc


def run_server_iwarp(ep: Endpoint, listener: Any, out: TextIO,
                     abort: threading.Event | None = None) -> float:
    """iWARP server: the client's address comes in its MPA Request, ours goes back in
    the MPA Reply (accepting moves the QP to RTS); then the same data phase."""
    _emit(out, address_line("local", ep.local, ep.opts.kind))
    try:
        # standalone, wait until stopped (tools.waiting); in --loopback, the timeout
        req = listener.get_request(None if abort is None else ep.opts.timeout)
        rem = decode_dest(req.private_data)
        ep.remote = rem
        req.accept(ep.qp, encode_dest(ep.local), timeout=ep.opts.timeout)
    except SoftRdmaError as exc:
        raise PingPongError(f"iWARP accept failed: {exc}") from exc
    finally:
        listener.close()
    _emit(out, address_line("remote", rem, ep.opts.kind))
    return _run_and_report(ep, False, out, abort)


def run_client_iwarp(ep: Endpoint, host: str, port: int, out: TextIO,
                     abort: threading.Event | None = None) -> float:
    """iWARP client: TCP + MPA connect carrying our address (a refusal fails at once,
    :mod:`softrdma.tools.waiting`); the Reply carries the server's."""
    from ...drivers.cm import iwconnect

    _emit(out, address_line("local", ep.local, ep.opts.kind))
    deadline = time.monotonic() + ep.opts.timeout
    retry_until = min(deadline, time.monotonic() + (
        connect_retry_s() if abort is None else ep.opts.timeout))
    while True:
        try:
            conn = iwconnect.connect(ep.qp, host, port, encode_dest(ep.local),
                                     timeout=max(deadline - time.monotonic(), 0.05))
            break
        except iwconnect.ConnectError as exc:
            refused = exc.errno == errno.ECONNREFUSED
            if not refused or time.monotonic() + 0.1 >= retry_until or \
                    (abort is not None and abort.is_set()):
                raise PingPongError(f"Couldn't connect to {host}:{port}: {exc}") from exc
            time.sleep(0.1)
        except SoftRdmaError as exc:
            raise PingPongError(f"Couldn't connect to {host}:{port}: {exc}") from exc
    rem = decode_dest(conn.private_data)
    ep.remote = rem
    _emit(out, address_line("remote", rem, ep.opts.kind))
    try:
        return _run_and_report(ep, True, out, abort)
    finally:
        conn.disconnect()


def open_context(opts: Options) -> v.Context:
    """Open ``-d DEV`` (default: the first device) as the verbs layer is configured."""
    from ... import verbs as v

    if opts.transport == "iwarp":
        try:  # -d names a registry iwarp device; default: the built-in loopback one
            return v.Context(opts.ib_dev, transport="iwarp")
        except SoftRdmaError as exc:
            raise PingPongError(f"Couldn't get context for {opts.ib_dev or 'iWARP loopback'}: "
                                f"{exc}") from exc
    return open_device(opts.ib_dev)


def open_device(ib_dev: str | None) -> v.Context:
    """The context of ``-d DEV`` (default: the first device), as the C examples open it
    (``ibv_get_device_list``, then the named or the first one)."""
    from ... import verbs as v

    try:
        devices = v.get_device_list()
    except SoftRdmaError as exc:
        raise PingPongError(f"Failed to get IB devices list: {exc}") from exc
    if not devices:
        raise PingPongError("No IB devices found")
    names = [d.name for d in devices]
    if ib_dev is not None and ib_dev not in names:
        raise PingPongError(f"IB device {ib_dev} not found (have: {', '.join(names)})")
    name = ib_dev if ib_dev is not None else names[0]
    try:
        return v.Context(name)
    except SoftRdmaError as exc:
        raise PingPongError(f"Couldn't get context for {name}: {exc}") from exc


def run_loopback(opts: Options, out: TextIO) -> int:
    """Server and client in this process on one context: the server in a thread, the
    OOB exchange over TCP on the loopback; prints the server's report, then the client's.
    """
    ctx = open_context(opts)
    server_out, client_out = io.StringIO(), io.StringIO()
    abort = threading.Event()
    errors: list[BaseException] = []
    eps: list[Endpoint] = []
    try:
        srv = Endpoint(ctx, opts, "server")
        eps.append(srv)
        cli = Endpoint(ctx, opts, "client")
        eps.append(cli)
        srv.shares_gil = cli.shares_gil = True
        host = opts.bind or "127.0.0.1"
        iw = opts.transport == "iwarp"
        listener: Any = iwarp_listen(ctx, opts, opts.port or 0) if iw else \
            OOBListener(opts.port or 0, host, opts.timeout)

        def serve() -> None:
            try:
                if iw:
                    run_server_iwarp(srv, listener, server_out, abort)
                else:
                    run_server(srv, listener, server_out, abort)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                abort.set()

        thread = threading.Thread(target=serve, name="pingpong-server", daemon=True)
        thread.start()
        try:
            if iw:
                run_client_iwarp(cli, host, listener.port, client_out, abort)
            else:
                run_client(cli, host, listener.port, client_out, abort)
        except BaseException as exc:
            errors.append(exc)
            abort.set()
            listener.close()
        thread.join(opts.timeout + 5)
        if thread.is_alive():
            errors.append(PingPongError("the server thread did not finish"))
    finally:
        for ep in eps:
            ep.close()
        ctx.close()
    out.write("server:\n" + server_out.getvalue() + "client:\n" + client_out.getvalue())
    out.flush()
    if errors:
        first = next((x for x in errors if not (isinstance(x, PingPongError)
                                               and str(x).startswith("stopped:"))), errors[0])
        raise first
    return 0


def run(kind: str, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point of the ``{kind}-pingpong`` subcommand; returns the exit status."""
    out = out if out is not None else sys.stdout
    opts = Options.from_args(kind, args)
    try:
        pingpong_ext.check(opts.ext, opts.size)
    except pingpong_ext.FeatureError as exc:
        raise PingPongError(str(exc)) from None
    if opts.loopback:
        if opts.servername is not None:
            raise InvalidArgument("servername", "--loopback runs both sides; give no server")
        return run_loopback(opts, out)
    port = opts.port if opts.port is not None else DEFAULT_TCP_PORT
    if opts.transport == "iwarp":
        return _run_iwarp(opts, port, out)
    ctx = open_context(opts)  # first, as ibv_rc_pingpong: a bad -d is told before waiting
    listener = None
    try:
        if opts.servername is None:
            listener = OOBListener(port, opts.bind, opts.timeout)
            announce_wait(f"{kind}-pingpong", listener.port)
    except BaseException:
        ctx.close()
        raise
    return _session(ctx, opts, listener, port, out, run_server, run_client)


def _run_iwarp(opts: Options, port: int, out: TextIO) -> int:
    """One side of ``rc-pingpong --transport iwarp`` (server without SERVERNAME)."""
    if opts.kind != "rc":
        raise InvalidArgument("transport", "iWARP carries RC only")
    ctx = open_context(opts)
    try:
        listener = iwarp_listen(ctx, opts, port) if opts.servername is None else None
        if listener is not None:
            announce_wait(f"{opts.kind}-pingpong", port)
    except BaseException:
        ctx.close()
        raise
    return _session(ctx, opts, listener, port, out, run_server_iwarp, run_client_iwarp)


def _session(ctx: v.Context, opts: Options, listener: Any, port: int, out: TextIO,
             serve: Callable[[Endpoint, Any, TextIO], float],
             connect: Callable[[Endpoint, str, int, TextIO], float]) -> int:
    """Run the server role on ``listener`` (or, without one, the client role), then close
    the listener, the endpoint and ``ctx`` whatever happens."""
    ep: Endpoint | None = None
    try:
        ep = Endpoint(ctx, opts)
        if listener is not None:
            serve(ep, listener, out)
        else:
            assert opts.servername is not None
            connect(ep, opts.servername, port, out)
    finally:
        if listener is not None:
            listener.close()
        if ep is not None:
            ep.close()
        ctx.close()
    return 0

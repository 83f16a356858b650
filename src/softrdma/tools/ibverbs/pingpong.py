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
* Data phase: ``rx_depth`` receives posted up front and topped up when one is left; the
  client sends first; each side sends its next message once both its previous send and
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
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from ... import enums as e
from ...errors import DecodeError, InvalidArgument, SoftRdmaError
from .. import oobtcp
from ..argtypes import int_in, path_mtu, positive_seconds
from ..closers import Closers
from ..waiting import announce_wait, connect_retry_s
from . import pingpong_ext
from .pingpong_ext import ExtOptions

if TYPE_CHECKING:
    from ... import verbs as v

DEFAULT_TCP_PORT = oobtcp.DEFAULT_PORT
MSG_LEN = 52  # sizeof "0000:000000:000000:00000000000000000000000000000000"
DONE_MSG = b"done\x00"  # sizeof "done" == 5
UD_QKEY = 0x11111111
GRH_LEN = 40
RECV_WRID = 1
SEND_WRID = 2
IBV_LINK_LAYER_ETHERNET = 2
DEFAULT_TIMEOUT = 30.0
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
POISON = 0xEE  # written over a checked receive area so a short placement is detected

MTU_BYTES_TO_ENUM = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
                     2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
KINDS = ("rc", "uc", "ud")
QP_TYPES = {"rc": e.IBV_QPT_RC, "uc": e.IBV_QPT_UC, "ud": e.IBV_QPT_UD}


class PingPongError(SoftRdmaError):
    """A pingpong run failed; the message is the one line the tool prints."""


def local_gid(ctx: Any, port: int, gid_idx: int | None) -> tuple[int, bytes]:
    """``-g`` of every pingpong tool: ``(index, GID)`` this side uses and announces.

    Without ``-g`` (``None``) a RoCE port uses index 0, since every RoCE packet carries
    the GID as its address (IBA Annex A16/A17), and an InfiniBand port announces none
    (-1, the zero GID, as the C tools without ``-g``). Checked at start, before any
    peer is waited for: an index outside the GID table or an empty entry raises
    :class:`PingPongError` naming ``-g`` (the C tools would send ``::`` and the peer's
    connection would fail later)."""
    try:
        attr = ctx.query_port(port)
    except SoftRdmaError as exc:
        raise PingPongError(f"Couldn't get port info for port {port}: {exc}") from exc
    roce = int(getattr(attr, "link_layer", IBV_LINK_LAYER_ETHERNET)) == IBV_LINK_LAYER_ETHERNET
    idx = gid_idx if gid_idx is not None else (0 if roce else -1)
    if idx < 0:
        return -1, bytes(16)
    try:
        gid = bytes(ctx.query_gid(port, idx).raw)
    except SoftRdmaError as exc:
        raise PingPongError(f"-g {idx}: {exc}") from exc
    if not any(gid):
        try:
            used = [i for i, g in enumerate(ctx.gids) if any(bytes(g.raw))]
        except (SoftRdmaError, AttributeError):
            used = []
        have = f" (entries in use: {', '.join(map(str, used))})" if used else ""
        raise PingPongError(f"-g {idx}: GID index {idx} of port {port} is empty{have}")
    return idx, gid


# --------------------------------------------------------------------------------------
# The out-of-band address exchange (rdma-core libibverbs/examples/pingpong.c)
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Dest:
    """One side's address: ``struct pingpong_dest`` (LID, QPN, PSN, GID)."""

    lid: int
    qpn: int
    psn: int
    gid: bytes  # 16 bytes, network order


def gid_text(gid: bytes) -> str:
    """The GID as ``inet_ntop(AF_INET6)`` prints it (``::ffff:10.50.0.11``, ``::``)."""
    return socket.inet_ntop(socket.AF_INET6, gid)


def encode_dest(dest: Dest) -> bytes:
    """``sprintf(msg, "%04x:%06x:%06x:%s", lid, qpn, psn, wire_gid)`` plus its NUL."""
    if not 0 <= dest.lid <= 0xFFFF:
        raise InvalidArgument("dest.lid", f"{dest.lid} is not a 16-bit LID")
    if not 0 <= dest.qpn <= 0xFFFFFF:
        raise InvalidArgument("dest.qpn", f"{dest.qpn} is not a 24-bit QPN")
    if not 0 <= dest.psn <= 0xFFFFFF:
        raise InvalidArgument("dest.psn", f"{dest.psn} is not a 24-bit PSN")
    if len(dest.gid) != 16:
        raise InvalidArgument("dest.gid", f"a GID is 16 bytes, not {len(dest.gid)}")
    return f"{dest.lid:04x}:{dest.qpn:06x}:{dest.psn:06x}:{dest.gid.hex()}\x00".encode("ascii")


def decode_dest(msg: bytes) -> Dest:
    """Parse the peer's message the way ``sscanf("%x:%x:%x:%s")`` + ``wire_gid_to_gid`` do.

    Raises :class:`DecodeError` unless it is four ``:``-separated hex fields with a
    32-digit GID, NUL-terminated (or exactly filling the 52 bytes).
    """
    text_b = msg.split(b"\x00", 1)[0]
    try:
        text = text_b.decode("ascii")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"pingpong address message is not ASCII: {msg[:MSG_LEN]!r}") from exc
    parts = text.split(":")
    if len(parts) != 4:
        raise DecodeError(f"pingpong address message is not LID:QPN:PSN:GID: {text!r}")
    lid_s, qpn_s, psn_s, gid_s = parts
    try:
        lid, qpn, psn = int(lid_s, 16), int(qpn_s, 16), int(psn_s, 16)
        if len(gid_s) != 32:
            raise ValueError("GID length")
        gid = bytes.fromhex(gid_s)
    except ValueError as exc:
        raise DecodeError(f"pingpong address message has a bad field: {text!r}") from exc
    if lid > 0xFFFF or qpn > 0xFFFFFF or psn > 0xFFFFFF or min(lid, qpn, psn) < 0:
        raise DecodeError(f"pingpong address message field out of range: {text!r}")
    return Dest(lid, qpn, psn, gid)


def client_exchange(host: str, port: int, my: Dest, timeout: float = DEFAULT_TIMEOUT) -> Dest:
    """The client side of the exchange (``pp_client_exch_dest``).

    A refused connection fails at once (retried only for ``$SOFTRDMA_CONNECT_RETRY``
    seconds, :mod:`softrdma.tools.waiting`); then: send our address, read the server's, send ``done``.
    """
    deadline = time.monotonic() + timeout
    msg = encode_dest(my)
    sock = oobtcp.connect(host, port, deadline, PingPongError)
    with sock:
        oobtcp.send_all(sock, msg, deadline, "local address", PingPongError)
        reply = oobtcp.recv_exact(sock, MSG_LEN, deadline, "remote address", PingPongError)
        oobtcp.send_all(sock, DONE_MSG, deadline, "\"done\"", PingPongError)
    return decode_dest(reply)


class OOBListener:
    """The server side of the exchange (``pp_server_exch_dest``), listening from creation.

    ``bind`` None listens on every address (IPv6 dual-stack when available, like the C
    tool's ``AI_PASSIVE``); ``port`` 0 picks an ephemeral port (see :attr:`port`).
    """

    def __init__(self, port: int = DEFAULT_TCP_PORT, bind: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._sock = oobtcp.listen(port, PingPongError, bind=bind)

    @property
    def port(self) -> int:
        """The TCP port actually listened on."""
        return int(self._sock.getsockname()[1])

    def close(self) -> None:
        """Stop listening (an ``exchange`` blocked in accept fails at once)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def exchange(self, my: Dest, on_remote: Callable[[Dest], None]) -> Dest:
        """Accept one client: read its address, ``on_remote(dest)`` (connect the QP), answer
        with ``my``, wait for ``done``. Returns the client's address."""
        try:  # the client is awaited until stopped (tools.waiting)
            conn = oobtcp.accept(self._sock, PingPongError)
        finally:
            self.close()
        deadline = time.monotonic() + self.timeout
        with conn:
            rem = decode_dest(oobtcp.recv_exact(conn, MSG_LEN, deadline, "remote address",
                                                PingPongError))
            on_remote(rem)
            oobtcp.send_all(conn, encode_dest(my), deadline, "local address", PingPongError)
            done = oobtcp.recv_exact(conn, len(DONE_MSG), deadline, "\"done\"", PingPongError)
            if done != DONE_MSG:
                raise PingPongError(f"peer sent {done!r} instead of \"done\"")
        return rem


# --------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------

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
# --------------------------------------------------------------------------------------

def _mark_pages(buf: bytearray, off: int, size: int) -> None:
    """Zero the first byte of every page of ``buf[off:off+size]`` (in place)."""
    buf[off:off + size:PAGE_SIZE] = bytes(len(range(0, size, PAGE_SIZE)))


def _fill(buf: bytearray, off: int, size: int, value: int) -> None:
    """``memset(buf + off, value, size)`` without a temporary of ``size`` bytes."""
    block = bytes([value]) * min(size, 1 << 20)
    mv = memoryview(buf)
    for start in range(off, off + size, len(block) or 1):
        n = min(len(block), off + size - start)
        mv[start:start + n] = block[:n]


def check_pattern(size: int) -> bytes:
    """The ``-c`` send pattern: rc_pingpong's 0x7b buffer with ``buf[i] = 0`` at every
    page start (``i / page_size % sizeof(char)``), so a C peer run with ``-c`` matches."""
    pat = bytearray(b"\x7b" * size)
    pat[::PAGE_SIZE] = bytes(len(range(0, size, PAGE_SIZE)))
    return bytes(pat)


class Endpoint:
    """PD, MR, CQ (and channel with ``-e``), one QP in INIT with ``rx_depth`` receives.

    The MR holds a receive area (``size``, plus the 40-byte GRH area for UD) followed by
    a send area (``size``), so ``--chk`` really checks what arrived.
    """

    def __init__(self, ctx: v.Context, opts: Options, name: str = "") -> None:
        from ... import verbs as v

        self.ctx = ctx
        self.opts = opts
        self.name = name
        self.qp_type = QP_TYPES[opts.kind]
        self.ah: v.AH | None = None
        self._closers = Closers()
        try:
            self.port_attr = ctx.query_port(opts.ib_port)
        except SoftRdmaError as exc:
            raise PingPongError(f"Couldn't get port info for port {opts.ib_port}: {exc}") from exc
        self.roce = int(getattr(self.port_attr, "link_layer", IBV_LINK_LAYER_ETHERNET)) \
            == IBV_LINK_LAYER_ETHERNET
        if opts.kind == "ud":
            mtu = 1 << (int(self.port_attr.active_mtu) + 7)
            if opts.size > mtu:
                raise PingPongError(f"Requested size larger than port MTU ({mtu})")
        self.gid_idx, gid = local_gid(ctx, opts.ib_port, opts.gid_idx)
        self.grh = GRH_LEN if opts.kind == "ud" else 0
        self.rlen = opts.size + self.grh
        # One buffer and no copy of it (a 2 GiB message must not cost several times its
        # size): the send area is the --chk pattern itself, written in place.
        self.buf = bytearray(b"\x7b") * (self.rlen + opts.size)
        if opts.chk:
            _mark_pages(self.buf, self.rlen, opts.size)
        self.pattern = memoryview(self.buf)[self.rlen:] if opts.chk else memoryview(b"")
        try:
            self.pd = v.PD(ctx)
            self._closers.append(self.pd)
            self.mr = v.MR(self.pd, len(self.buf), pingpong_ext.mr_access(
                opts.ext, int(e.IBV_ACCESS_LOCAL_WRITE)), buffer=self.buf)
            self._closers.append(self.mr)
            # the buffer's real address, as ibv_reg_mr; device memory is zero-based
            self.addr = 0 if opts.ext.dm else int(self.mr.addr)
            self.channel = v.CompChannel(ctx) if opts.events else None
            if self.channel is not None:
                self._closers.append(self.channel)
            self.cq = v.CQ(ctx, opts.rx_depth + 1, None, self.channel, 0)
            self._closers.append(self.cq)
            cap = v.QPCap(max_send_wr=1, max_recv_wr=opts.rx_depth, max_send_sge=1,
                          max_recv_sge=1)
            init = v.QPInitAttr(qp_type=self.qp_type, scq=self.cq, rcq=self.cq, cap=cap)
            self.qp = v.QP(self.pd, init)
            self._closers.append(self.qp)
        except SoftRdmaError as exc:
            self.close()
            raise PingPongError(f"Couldn't create the verbs resources: {exc}") from exc
        self.send_flags = e.IBV_SEND_SIGNALED
        self._send_wr: Any = None  # post_send's WR (built at the first SEND)
        self._recv_wr: Any = None  # post_recv's WR (built at the first post)
        #: another application thread polls in this process (--loopback's server): an
        #: empty poll then hands it the GIL (time.sleep(0)); alone, the poll loop spins
        #: as the bench's does (cq.poll makes progress itself)
        self.shares_gil = False
        self._to_init()
        self.routs = self.post_recv(opts.rx_depth)
        if self.routs < opts.rx_depth:
            raise PingPongError(f"Couldn't post receive ({self.routs})")
        self.local = Dest(int(getattr(self.port_attr, "lid", 0)), self.qp.qp_num,
                          random.getrandbits(24), bytes(gid))
        self.remote: Dest | None = None

    # -- setup -------------------------------------------------------------------------
    def _to_init(self) -> None:
        from ... import verbs as v

        mask = e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
        if self.qp_type == e.IBV_QPT_UD:
            attr = v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0,
                            port_num=self.opts.ib_port, qkey=UD_QKEY)
            mask |= e.IBV_QP_QKEY
        else:
            attr = v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0,
                            port_num=self.opts.ib_port, qp_access_flags=0)
            mask |= e.IBV_QP_ACCESS_FLAGS
        try:
            self.qp.modify(attr, int(mask))
        except SoftRdmaError as exc:
            raise PingPongError(f"Failed to modify QP to INIT: {exc}") from exc

    def _ah_attr(self, rem: Dest) -> v.AHAttr:
        from ... import verbs as v

        if any(rem.gid[8:]):  # dest->gid.global.interface_id
            gr = v.GlobalRoute(dgid=v.GID(rem.gid), sgid_index=max(self.gid_idx, 0),
                               hop_limit=1)
            return v.AHAttr(port_num=self.opts.ib_port, is_global=1, gr=gr, dlid=rem.lid,
                            sl=self.opts.sl)
        if self.roce:
            raise PingPongError("the peer sent no GID, which RoCE needs: run it with "
                                "-g <gid index>")
        return v.AHAttr(port_num=self.opts.ib_port, is_global=0, dlid=rem.lid,
                        sl=self.opts.sl)

    def connect(self, rem: Dest) -> None:
        """``pp_connect_ctx``: RTR then RTS (and the AH for UD) towards ``rem``."""
        from ... import verbs as v

        self.remote = rem
        ah_attr = self._ah_attr(rem)
        if self.qp_type == e.IBV_QPT_UD:
            rtr = v.QPAttr(qp_state=e.IBV_QPS_RTR)
            rtr_mask = e.IBV_QP_STATE
            rts = v.QPAttr(qp_state=e.IBV_QPS_RTS, sq_psn=self.local.psn)
            rts_mask = e.IBV_QP_STATE | e.IBV_QP_SQ_PSN
        else:
            path_mtu = MTU_BYTES_TO_ENUM[self.opts.mtu]
            rtr = v.QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=path_mtu,
                           dest_qp_num=rem.qpn, rq_psn=rem.psn, ah_attr=ah_attr)
            rtr_mask = (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU
                        | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN)
            rts = v.QPAttr(qp_state=e.IBV_QPS_RTS, sq_psn=self.local.psn)
            rts_mask = e.IBV_QP_STATE | e.IBV_QP_SQ_PSN
            if self.qp_type == e.IBV_QPT_RC:
                rtr.max_dest_rd_atomic = 1
                rtr.min_rnr_timer = 12
                rtr_mask |= e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER
                rts.timeout = 14
                rts.retry_cnt = 7
                rts.rnr_retry = 7
                rts.max_rd_atomic = 1
                rts_mask |= (e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
                             | e.IBV_QP_MAX_QP_RD_ATOMIC)
        try:
            self.qp.modify(rtr, int(rtr_mask))
        except SoftRdmaError as exc:
            raise PingPongError(f"Failed to modify QP to RTR: {exc}") from exc
        try:
            self.qp.modify(rts, int(rts_mask))
        except SoftRdmaError as exc:
            raise PingPongError(f"Failed to modify QP to RTS: {exc}") from exc
        if self.qp_type == e.IBV_QPT_UD:
            try:
                self.ah = v.AH(self.pd, ah_attr)
            except SoftRdmaError as exc:
                raise PingPongError(f"Failed to create AH: {exc}") from exc
            self._closers.append(self.ah)

    # -- data path ---------------------------------------------------------------------
    def post_recv(self, n: int, refill: bool = False) -> int:
        """``pp_post_recv``: post up to ``n`` receives of the whole receive area; returns
        how many were posted. ``refill``: the ping-pong's refill, ``n`` being what the
        receive queue lacks: the ``n`` posts are then one call (one lock round, not ``n``;
        a refill of 499 receives one at a time cost about 3 us per iteration)."""
        from ... import verbs as v

        if n <= 0:
            return 0
        # one WR, built once and posted n times (the post copies it into a WQE), as
        # pp_post_recv posts its one struct ibv_recv_wr
        wr = self._recv_wr
        if wr is None:
            wr = self._recv_wr = v.RecvWR(wr_id=RECV_WRID, num_sge=1,
                                          sg=[v.SGE(self.addr, self.rlen, self.mr.lkey)])
        post = self.qp.post_recv
        if refill:
            try:
                post([wr] * n)
            except SoftRdmaError:
                return 0  # the queue had room for n: the QP is unusable, the caller fails
            return n
        posted = 0
        while posted < n:
            try:
                post(wr)
            except SoftRdmaError:
                break
            posted += 1
        return posted

    def post_send(self) -> None:
        """``pp_post_send``: one signaled SEND of ``size`` bytes from the send area."""
        from ... import verbs as v

        if self.opts.ext.new_send:  # -N: ibv_wr_start / wr_send / wr_set_sge / wr_complete
            batch = pingpong_ext.NewSendBatch(self.qp, v)
            batch.wr_start()
            batch.wr_id, batch.wr_flags = SEND_WRID, int(self.send_flags)
            batch.wr_send()
            batch.wr_set_sge(self.mr.lkey, self.addr + self.rlen, self.opts.size)
            try:
                batch.wr_complete()
            except SoftRdmaError as exc:
                raise PingPongError(f"Couldn't post send: {exc}") from exc
            return
        wr = self._send_wr
        if wr is None:  # built once, at the first SEND (after connect), and posted again
            sge = v.SGE(self.addr + self.rlen, self.opts.size, self.mr.lkey)
            wr = v.SendWR(wr_id=SEND_WRID, num_sge=1, sg=[sge], opcode=e.IBV_WR_SEND,
                          send_flags=self.send_flags)
            if self.ah is not None:
                assert self.remote is not None
                wr.set_wr_ud(self.ah, self.remote.qpn, UD_QKEY)
            self._send_wr = wr
        try:
            self.qp.post_send(wr)
        except SoftRdmaError as exc:
            raise PingPongError(f"Couldn't post send: {exc}") from exc

    def _check_received(self, byte_len: int) -> None:
        size = self.opts.size
        if byte_len != self.rlen:
            raise PingPongError(f"received {byte_len} bytes, expected {self.rlen}")
        got = memoryview(self.buf)[self.grh:self.rlen]
        if got != self.pattern:
            bad = next(i for i in range(size) if got[i] != self.pattern[i])
            raise PingPongError(
                f"Invalid data in page {bad // PAGE_SIZE} (byte {bad}: 0x{got[bad]:02x}, "
                f"expected 0x{self.pattern[bad]:02x})")
        _fill(self.buf, self.grh, size, POISON)

    def _activity(self) -> int:
        """Packets the device has sent and received so far (its port counters; read
        directly, this runs once per wait)."""
        c = getattr(getattr(self.ctx, "port", None), "counters", None)
        return int(getattr(c, "sent_pkts", 0)) + int(getattr(c, "rcvd_pkts", 0))

    def _next_completions(self, abort: threading.Event | None) -> list[Any]:
        """Wait (events or polling) for up to two completions; give up only after
        ``timeout`` seconds without progress: a large message keeps the device busy for
        longer than the timeout, and as long as its packets move the wait goes on."""
        if self.channel is None:  # polling: a completion already there costs one poll
            n, wcs = self.cq.poll(2)
            if n:
                return wcs
        deadline = time.monotonic() + self.opts.timeout
        seen = self._activity()
        while True:
            if time.monotonic() >= deadline:
                now = self._activity()
                if now == seen:
                    return []  # nothing moved for ``timeout`` s
                seen = now  # packets moved in the last ``timeout`` s: keep waiting
                deadline = time.monotonic() + self.opts.timeout
            if abort is not None and abort.is_set():
                raise PingPongError("stopped: the other side failed")
            if self.channel is not None:
                left = max(deadline - time.monotonic(), 0.001)
                n, wcs = self.cq.poll(2)
                if n:
                    return list(wcs)
                try:
                    self.channel.get_cq_event(timeout=min(left, 0.2))
                except TimeoutError:
                    continue
                except SoftRdmaError as exc:
                    if "time" in str(exc).lower():
                        continue
                    raise PingPongError(f"Failed to get cq_event: {exc}") from exc
                self.cq.ack_events(1)
                self.cq.req_notify()
                continue
            n, wcs = self.cq.poll(2)
            if n:
                return list(wcs)
            if self.shares_gil:
                time.sleep(0)  # let the other application thread poll

    def run(self, is_client: bool, abort: threading.Event | None = None) -> float:
        """The data phase; returns the elapsed microseconds (``gettimeofday`` delta)."""
        from ... import verbs as v

        iters = self.opts.iters
        if self.channel is not None:
            self.cq.req_notify()
        pending = RECV_WRID
        if is_client:
            self.post_send()
            pending |= SEND_WRID
        start = time.perf_counter()
        rcnt = scnt = 0
        while rcnt < iters or scnt < iters:
            wcs = self._next_completions(abort)
            if not wcs:
                raise PingPongError(
                    f"no completion for {self.opts.timeout:g} s ({scnt}/{iters} sent, "
                    f"{rcnt}/{iters} received): is the peer still running?")
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    fatal = getattr(self.ctx.runtime, "fatal", None)
                    if fatal is not None:  # the device failed (its devd died)
                        raise PingPongError(str(fatal))
                    raise PingPongError(
                        f"Failed status {v.wc_status_str(wc.status)} ({int(wc.status)}) "
                        f"for wr_id {int(wc.wr_id)}")
                if wc.wr_id == SEND_WRID:
                    scnt += 1
                elif wc.wr_id == RECV_WRID:
                    self.routs -= 1
                    if self.routs <= 1:
                        self.routs += self.post_recv(self.opts.rx_depth - self.routs, True)
                        if self.routs < self.opts.rx_depth:
                            raise PingPongError(f"Couldn't post receive ({self.routs})")
                    if self.opts.chk:
                        self._check_received(int(wc.byte_len))
                    rcnt += 1
                else:
                    raise PingPongError(f"Completion for unknown wr_id {int(wc.wr_id)}")
                pending &= ~int(wc.wr_id)
                if scnt < iters and not pending:
                    self.post_send()
                    pending = RECV_WRID | SEND_WRID
                if rcnt >= iters and scnt >= iters:
                    # done: later completions (an iWARP peer's close flushes the receives
                    # still posted) are not part of the exchange
                    break
        return (time.perf_counter() - start) * 1e6

    def close(self) -> None:
        """Destroy what this endpoint created (QP, CQ, MR, PD ...), newest first."""
        self._closers.close()


# --------------------------------------------------------------------------------------
# Reports and the two roles
# --------------------------------------------------------------------------------------

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
    from ...drivers import iwconnect

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
    from ...drivers import iwconnect

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
    listener = None
    if opts.servername is None:
        listener = OOBListener(port, opts.bind, opts.timeout)
        announce_wait(f"{kind}-pingpong", listener.port)
    try:
        ctx = open_context(opts)
    except BaseException:
        if listener is not None:
            listener.close()
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

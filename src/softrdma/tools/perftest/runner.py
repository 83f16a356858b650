"""The per-tool sequence of perftest 4.5 (write_bw.c, read_bw.c, send_bw.c, atomic_bw.c,
write_lat.c, read_lat.c, send_lat.c, atomic_lat.c), so that every message of the
exchange comes in the order a stock ``ib_*`` peer expects:

1. the exchange channel: TCP (server: the "Waiting for client to connect" banner) or,
   with ``-R``, the rdma_cm control connection;
2. versions, system data, MTU (:mod:`.oob`);
3. the QPs; with ``-R``: a handshake, the rdma_cm data connections, a handshake;
4. the test's handshakes around connecting the QPs (see :data:`PRE_RUN`), the header and
   the address lines;
5. the run and the report: one-sided tests (the client measures, the server waits in a
   handshake and prints the client's BW report after ``xchg_bw_reports``), send-bw and
   the ping-pong latency tests (both measure);
6. ``ctx_close_connection`` (none for write-lat).

``-b``: both sides run the BW loop after a handshake (send-bw: both send and receive,
``run_iter_bi``), exchange their reports and print the sum. ``--run_infinitely``: the client posts for ever and prints a
BW line (peak not measured) every ``-D`` seconds until Ctrl-C (" User stopped traffic",
exit 0); a one-sided server waits until the client leaves, a send-bw server receives
and prints its own lines. ``--output``: nothing but the one number of each result line.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from ... import verbs as v
from ...cm.rdma_cm import release_devices
from ...errors import SoftRdmaError
from ...wire.gid import is_v4_mapped
from . import cmconn, engine, loops, oob, report
from .engine import MTU_ENUM_TO_BYTES, Resources
from .oob import BwReport, Channel, Dest, TcpChannel
from .options import Options, PerftestError, from_args

BANNER = ["", "************************************", "* Waiting for client to connect... *",
          "************************************"]
PAGE_SIZE = 4096
FIRST_MESSAGE_DELAY_S = 1.0
CACHE_LINE = 64


@dataclass
class Side:
    """One side's state through the run."""

    o: Options
    out: TextIO
    ch: Channel | None = None
    res: Resources | None = None
    ctx: Any = None
    device: str = ""
    transport: str = "roce"
    mtu_enum: int = 3
    gid_index: int = 0
    gid: bytes = bytes(16)
    lid: int = 0
    out_reads: int = 1
    my: list[Dest] = field(default_factory=list)
    rem: list[Dest] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    sess: cmconn.CmSession | None = None
    data_ids: list[Any] = field(default_factory=list)

    def emit(self, lines: list[str] | str) -> None:
        if self.o.json or self.o.output:
            return
        for line in [lines] if isinstance(lines, str) else lines:
            self.out.write(line + "\n")
        self.out.flush()

    def show(self, rep: BwReport | report.LatReport) -> None:
        """One result: its table line, or with ``--output`` only its number."""
        if self.o.json:
            return
        if self.o.output:
            self.out.write(report.output_number(self.o, rep) + "\n")
            self.out.flush()
        elif isinstance(rep, BwReport):
            self.emit(report.bw_line(rep, self.o.report_gbits))
        else:
            self.emit(report.lat_line(rep))

    @property
    def chan(self) -> Channel:
        assert self.ch is not None
        return self.ch

    @property
    def r(self) -> Resources:
        assert self.res is not None
        return self.res

    def hs(self, i: int = 0) -> None:
        self.rem[i] = oob.hand_shake(self.chan, self.my[i], True)


# ---- device facts ------------------------------------------------------------------------

def open_context(o: Options) -> Any:
    """``-d`` (default: the first RoCE device), as ``ctx_open_device``."""
    try:
        devices = v.get_device_list()
    except SoftRdmaError as exc:
        raise PerftestError(f"Failed to get IB devices list: {exc}") from exc
    names = [d.name for d in devices if getattr(d, "type", "roce") != "iwarp"]
    if not names:
        raise PerftestError("No IB devices found")
    if o.ib_dev is not None and o.ib_dev not in names:
        raise PerftestError(f"IB device {o.ib_dev} not found (have: {', '.join(names)})")
    name = o.ib_dev or names[0]
    try:
        return v.Context(name)
    except SoftRdmaError as exc:
        raise PerftestError(f"Couldn't get context for {name}: {exc}") from exc


def device_facts(s: Side, ctx: Any) -> None:
    """Port MTU, GID (``-x`` or the first IPv4-mapped one, as perftest's best-GID pick
    prefers RoCEv2 IPv4), LID and out reads of ``ctx``."""
    o = s.o
    s.ctx = ctx
    s.device = str(getattr(ctx, "name", "") or o.ib_dev or "")
    try:
        pattr = ctx.query_port(o.ib_port)
    except SoftRdmaError as exc:
        raise PerftestError(f"Unable to query port {o.ib_port}: {exc}") from exc
    active = int(getattr(pattr, "active_mtu", 3)) or 3
    want = engine.MTU_BYTES_TO_ENUM[o.mtu] if o.mtu else active
    if want > active:
        raise PerftestError(f"Invalid MTU - {o.mtu} (the port's active MTU is "
                            f"{MTU_ENUM_TO_BYTES[active]})")
    s.mtu_enum = want
    s.lid = int(getattr(pattr, "lid", 0))
    gids: list[bytes] = []
    for idx in range(int(getattr(pattr, "gid_tbl_len", 0) or 0)):
        try:
            gids.append(bytes(ctx.query_gid(o.ib_port, idx).raw))
        except SoftRdmaError:
            break
    if o.gid_index is not None:
        if s.transport == "roce" and o.gid_index >= len(gids):
            raise PerftestError(f"GID index {o.gid_index} is out of the GID table "
                                f"({len(gids)} entries)")
        s.gid_index = o.gid_index
    else:
        v4 = [i for i, g in enumerate(gids) if is_v4_mapped(g)]
        s.gid_index = v4[0] if v4 else 0
    s.gid = gids[s.gid_index] if s.gid_index < len(gids) else bytes(16)
    if o.spec.verb in ("read", "atomic"):
        try:
            dev_max = int(ctx.query_device().max_qp_rd_atom) or 1
        except SoftRdmaError:
            dev_max = 1
        s.out_reads = min(o.outs, dev_max) if o.outs else dev_max
    else:
        s.out_reads = 1


def make_dests(s: Side) -> None:
    r = s.r
    s.my = [r.my_dest(i, s.lid, random.getrandbits(24), s.out_reads, s.gid, s.gid_index)
            for i in range(s.o.num_qps)]
    s.rem = [oob.ZERO_DEST] * s.o.num_qps


def print_header(s: Side) -> None:
    s.emit(report.header(s.o, s.device, s.transport, MTU_ENUM_TO_BYTES[s.mtu_enum],
                         s.gid_index, s.out_reads))


def addr_verb(o: Options) -> str:
    """The verb the address lines are printed for: with ``-R`` perftest prints them
    through the control connection's parameters, whose verb is SEND
    (``create_comm_struct``), so no OUT/RKey/VAddr (roce_write_bw_rdmacm.client.log)."""
    return "send" if o.rdma_cm else o.spec.verb


def print_addresses(s: Side, which: str) -> None:
    for d in s.my if which == "local" else s.rem:
        s.emit(report.address_lines(which, d, addr_verb(s.o)))


def prelude(s: Side) -> None:
    """Versions, system data and the MTU (every tool, in this order).

    write_bw.c sleeps 1 s between establishing the exchange channel and the first
    message; so do we, and so does every iWARP client: siw leaves an FPDU that arrives
    before its accepted QP reaches RTS unread in the socket (it reads on the next
    data_ready only), so a client that sends its first SEND at once can hang an
    ib_*_bw -R server on siw (seen: ib_write_bw -R as the server)."""
    if s.o.name == "write-bw" or (s.o.is_client and s.transport == "iwarp"):
        time.sleep(FIRST_MESSAGE_DELAY_S)
    oob.exchange_versions(s.chan)
    oob.check_sys_data(s.chan, PAGE_SIZE, CACHE_LINE)
    s.mtu_enum = oob.check_mtu(s.chan, s.mtu_enum)


# ---- the two ways to connect ------------------------------------------------------------

def setup_plain(s: Side) -> None:
    """TCP exchange; QPs connected by ``ctx_connect``."""
    o = s.o
    device_facts(s, open_context(o))
    if not o.is_client:
        s.emit(BANNER)
        lsock = TcpChannel.listen(o.port)
        s.ch = TcpChannel.accept(lsock, o.timeout)
    else:
        assert o.servername is not None
        s.ch = TcpChannel.connect(o.servername, o.port, o.timeout)
    prelude(s)
    if o.connection == "UD":
        clamp_to_mtu(s)
    s.res = Resources(s.ctx, o, max(o.sizes))
    if isinstance(s.ch, TcpChannel):
        s.res.peer_gone = s.ch.peer_closed  # a failed peer ends our waits promptly
        s.res.peer_done = s.ch.peer_waiting
    for _ in range(o.num_qps):
        s.r.add_qp()
    make_dests(s)


def clamp_to_mtu(s: Side) -> None:
    """A UD message fits one packet: sizes above the MTU are cut to it (perftest's
    ``ctx_set_mtu``; it says so with ``-a``)."""
    o = s.o
    mtu = MTU_ENUM_TO_BYTES[s.mtu_enum]
    if max(o.sizes) <= mtu:
        return
    if o.run_all:
        sys.stderr.write(f" Max msg size in UD is MTU {mtu}\n Changing to this MTU\n")
        o.sizes = tuple(x for x in o.sizes if x <= mtu)
    else:
        o.sizes = (mtu,)
    o.size = mtu


def setup_cm(s: Side) -> None:
    """``-R``: the control connection, then ``create_rdma_cm_connection``."""
    o = s.o
    sess = s.sess = cmconn.CmSession(o)
    if not o.is_client:
        ctrl = cmconn.CmChannel.accept(sess, o.port, lambda: s.emit(BANNER))
    else:
        assert o.servername is not None
        ctrl = cmconn.CmChannel.connect(sess, o.servername, o.port)
    s.ch = ctrl
    s.transport = str(ctrl.cid.transport or o.transport)
    device_facts(s, ctrl.cid.verbs)
    prelude(s)
    s.my = [oob.Dest(0, 0, 0, 0, 0, 0, bytes(16), 0, 0)] * o.num_qps
    s.rem = [oob.ZERO_DEST] * o.num_qps
    lst = None
    if o.is_client:
        s.hs(0)
    else:
        # the handshake before the data connections, with our listener up before we
        # answer: a perftest client connects as soon as it has the answer and gives up
        # after 10 refusals 100 ms apart
        s.rem[0] = oob.decode_dest_struct(s.chan.read(oob.DEST_STRUCT.size))
        lst = cmconn.listen(sess, o.port)
        s.chan.write(oob.encode_dest_struct(s.my[0]))

    def add(cid: Any) -> None:
        if cid is None:
            s.r.qps.pop()
            return
        if s.res is None:
            s.res = Resources(cid.verbs, o, max(o.sizes))
        s.r.add_qp(cid)

    if o.is_client:
        assert o.servername is not None
        s.data_ids = cmconn.client_data(sess, o.servername, o.port, add, s.out_reads)
    else:
        s.data_ids = cmconn.server_data(sess, lst, add, s.out_reads)
    s.hs(0)
    make_dests(s)


# ---- the tests ---------------------------------------------------------------------------

def connect_qps(s: Side) -> None:
    if s.o.rdma_cm:
        return
    if is_v4_mapped(s.my[0].gid) != is_v4_mapped(s.rem[0].gid):
        raise PerftestError("Found Incompatibility issue with GID types: "
                            "Please Try to use a different IP version (-x)")
    for i in range(s.o.num_qps):
        s.r.connect(i, s.my[i], s.rem[i], s.mtu_enum, s.gid_index)


def pre_run(s: Side) -> None:
    """The handshakes between the header and the run (each tool's main())."""
    o = s.o
    nq = range(o.num_qps)
    lat_rdma = o.spec.tst == "lat" and o.spec.verb != "send"
    if lat_rdma:
        s.hs(0)
    for i in nq:
        s.hs(i)
    connect_qps(s)
    if o.spec.verb == "send":
        s.hs(0)
    print_addresses(s, "local")
    for i in nq:
        s.hs(i)
        s.emit(report.address_lines("remote", s.rem[i], addr_verb(o)))
    if o.spec.verb != "send":
        s.hs(0)


def progress(s: Side, total: int, what: str) -> report.Progress:
    return report.Progress(not s.o.json and s.out.isatty(), total, what,
                           duration=s.o.duration)


BwLoop = Callable[[Resources, list[Dest], int, report.Progress],
                  tuple[list[float], list[float]]]


def measure(s: Side, size: int, loop: BwLoop, nothing: str = "no message completed"
            ) -> BwReport:
    """One size of a BW test: ``loop`` (a :mod:`.loops` BW run) gives the post and
    completion times (at least one completion, else ``nothing`` is the error), made this
    side's report."""
    o = s.o
    prog = progress(s, o.iters * o.num_qps, f"{o.name} {size} B")
    tp, tc = loop(s.r, s.rem, size, prog)
    prog.finish()
    if not tc:
        raise PerftestError(nothing)
    return report.bw_report(size, tp, tc, o.cq_mod, o.report_gbits)


def show_sum(s: Side, mine: BwReport) -> None:
    """``-b``: exchange the reports, print and keep their sum."""
    both = report.sum_reports(mine, oob.xchg_bw_reports(s.chan, mine))
    s.results.append(both)
    s.show(both)


def finish_bw(s: Side) -> None:
    """The results' closing line, then ``ctx_close_connection``."""
    s.emit(report.RESULT_LINE)
    oob.close_connection(s.chan, s.my[0], True)


def bw_start(s: Side, duplex: Callable[[Side], None]) -> bool:
    """The BW table's header, then ``--run_infinitely`` or ``-b`` (``duplex``) when asked:
    True when one of them ran the test."""
    s.emit(report.bw_table_header(s.o.report_gbits))
    if s.o.run_infinitely:
        run_infinitely(s)
        return True
    if s.o.duplex:
        duplex(s)
        return True
    return False


def run_one_sided_bw(s: Side) -> None:
    if bw_start(s, run_duplex_bw):
        return
    o = s.o
    if not o.is_client:
        with oob.waiting_for_whole_run(s.chan):  # the client runs every size first
            s.hs(0)
        rep = oob.xchg_bw_reports(s.chan, BwReport(0, 0, 0.0, 0.0, 0.0))
        s.show(rep)
        s.results.append(rep)
        oob.close_connection(s.chan, s.my[0], True)
        s.emit(report.RESULT_LINE)
        return
    mine = BwReport(0, 0, 0.0, 0.0, 0.0)
    for size in o.sizes:
        mine = measure(s, size, loops.run_bw)
        s.results.append(mine)
        s.show(mine)
    s.emit(report.RESULT_LINE)
    s.hs(0)
    oob.xchg_bw_reports(s.chan, mine)
    oob.close_connection(s.chan, s.my[0], True)


def run_duplex_bw(s: Side) -> None:
    """``-b``: per size a handshake, both sides run the loop (with ``-a`` a handshake
    after it too), exchange their reports and print the sum (write_bw.c, read_bw.c)."""
    o = s.o
    for size in o.sizes:
        s.hs(0)
        mine = measure(s, size, loops.run_bw)
        if o.run_all:
            s.hs(0)
        show_sum(s, mine)
    finish_bw(s)


def run_infinitely(s: Side) -> None:
    """``--run_infinitely`` (see the module docstring)."""
    o = s.o
    assert o.duration is not None
    size = o.sizes[0]

    def line(n: int, seconds: float) -> None:
        factor = report.GBS_FACTOR if o.report_gbits else report.MBS_FACTOR
        seconds = max(seconds, 1e-9)
        s.show(BwReport(size, n, 0.0, size * n / (seconds * factor), n / (seconds * 1e6)))

    if o.is_client or o.duplex:
        try:
            if o.spec.verb == "send":
                s.hs(0)  # the server's receives are posted
            loops.run_bw_infinitely(s.r, s.rem, size, float(o.duration), line)
        except KeyboardInterrupt:
            s.emit(["", " User stopped traffic"])
        s.emit(report.RESULT_LINE)
        return
    if o.spec.verb == "send":
        for i in range(o.num_qps):
            s.r.post_recvs(i, o.rx_depth, size)
        s.hs(0)
        with contextlib.suppress(KeyboardInterrupt):
            loops.receive_infinitely(s.r, size, float(o.duration), line)
    else:
        with contextlib.suppress(KeyboardInterrupt):  # the client runs until stopped
            if isinstance(s.ch, TcpChannel):
                while not s.ch.peer_closed():
                    time.sleep(engine.PEER_CHECK_S)
            elif isinstance(s.ch, cmconn.CmChannel) and s.sess is not None:
                cmconn.linger(s.sess, s.ch.cid, float("inf"))
    s.emit(report.RESULT_LINE)


def run_duplex_send_bw(s: Side) -> None:
    """send-bw ``-b`` (send_bw.c): per size both sides post their receives, a handshake,
    both send and receive (``run_iter_bi``), exchange their reports and print the sum
    (with ``-a`` a handshake after each size)."""
    o = s.o
    if s.r.credits:
        raise PerftestError("-b (bidirectional) send-bw needs RNR flow control: not over "
                            "iWARP")
    if o.duration is not None:
        raise PerftestError("-b (bidirectional) send-bw runs -n iterations, not -D")
    for size in o.sizes:
        for i in range(o.num_qps):
            s.r.post_recvs(i, o.rx_depth, size)
        s.hs(0)
        show_sum(s, measure(s, size, loops.run_bi))
        if o.run_all:
            s.hs(0)
    finish_bw(s)


def run_send_bw(s: Side) -> None:
    if bw_start(s, run_duplex_send_bw):
        return
    o = s.o
    for size in o.sizes:
        if not o.is_client:
            for i in range(o.num_qps):
                s.r.post_recvs(i, o.rx_depth, size)
        s.hs(0)
        if s.r.credits:
            s.r.reset_credits()
        if o.is_client:
            rep = measure(s, size, loops.run_bw)
        else:
            full = measure(s, size, loops.run_bw_server, "no message arrived")
            rep = BwReport(full.size, full.iters, 0.0, full.bw_avg, full.msg_rate)
        s.results.append(rep)
        s.show(rep)
        if o.run_all:
            s.hs(0)
    finish_bw(s)


def run_lat(s: Side) -> None:
    o = s.o
    verb = o.spec.verb
    if verb in ("read", "atomic") and not o.is_client:
        with oob.waiting_for_whole_run(s.chan):  # the client runs every size first
            oob.close_connection(s.chan, s.my[0], True)
        s.emit(report.RESULT_LINE)
        return
    s.emit(report.lat_table_header())
    rtt = 2 if verb in ("write", "send") else 1
    for size in o.sizes:
        prog = progress(s, o.iters, f"{o.name} {size} B")
        if verb == "send":
            s.r.post_recvs(0, o.rx_depth, size)
            s.hs(0)
            tp = loops.run_lat_send(s.r, size, prog, s.rem[0])
        elif verb == "write":
            tp = loops.run_lat_write(s.r, s.rem[0], size, prog)
        else:
            tp = loops.run_lat(s.r, s.rem[0], size, prog)
        prog.finish()
        rep = report.lat_report(size, tp, rtt)
        s.results.append(rep)
        s.show(rep)
    if verb == "read" or verb == "atomic":
        oob.close_connection(s.chan, s.my[0], True)
        s.emit(report.RESULT_LINE)
        return
    s.emit(report.RESULT_LINE)
    if verb == "send":
        oob.close_connection(s.chan, s.my[0], True)


def teardown(s: Side) -> None:
    if s.sess is not None and s.o.is_client and s.data_ids:
        cmconn.disconnect(s.sess, s.data_ids)
    if s.ch is not None:
        s.ch.close()
    if s.res is not None:
        s.res.close()
    if s.sess is not None:
        s.sess.close()
    if s.ctx is not None and s.sess is None:
        try:
            s.ctx.close()
        except SoftRdmaError:
            pass


def run(name: str, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point of ``softrdma <name>``; returns the exit status."""
    o = from_args(name, args)
    if o.duration is not None and o.spec.tst == "lat":
        raise PerftestError("-D (duration) is supported by the BW tests only")
    s = Side(o, out if out is not None else sys.stdout, transport=o.transport)
    try:
        _run_side(s)
    except (SoftRdmaError, OSError) as exc:
        if o.json:  # a failed run still prints its object, with the error (exit 1 stays)
            _write_json(s, str(exc) or type(exc).__name__)
        raise
    if o.json:
        _write_json(s, None)
    return 0


def _write_json(s: Side, error: str | None) -> None:
    role = "client" if s.o.is_client else "server"
    s.out.write(report.json_object(s.o, s.device, s.transport, MTU_ENUM_TO_BYTES[s.mtu_enum],
                                   s.results, role, error) + "\n")
    s.out.flush()


def _run_side(s: Side) -> None:
    """Set up, run and tear down one side (the body of :func:`run`)."""
    o = s.o
    if o.run_infinitely:
        s.emit(" WARNING: BW peak won't be measured in this run.")
    try:
        if o.rdma_cm:
            setup_cm(s)
        else:
            setup_plain(s)
        print_header(s)
        pre_run(s)
        if o.spec.tst == "lat":
            run_lat(s)
        elif o.spec.verb == "send":
            run_send_bw(s)
        else:
            run_one_sided_bw(s)
        if isinstance(s.ch, cmconn.CmChannel) and s.sess is not None:
            cmconn.linger(s.sess, s.ch.cid, cmconn.LINGER_CLIENT_S if o.is_client
                          else cmconn.LINGER_SERVER_S)
    finally:
        try:
            teardown(s)
        finally:
            if o.rdma_cm:
                release_devices()

"""perftest's command line (perftest_parameters.c ``parser``): same letters, defaults and
limits, validated into :class:`Options`; bad values are one-line errors (exit 1).

Defaults as perftest 4.5: port 18515, size 65536 (BW) / 2 (latency) / 8 (atomics, which
cannot change it), 5000 iterations for write-bw and 1000 otherwise (at least 5), TX depth
128 (BW) / 1 (latency), CQ moderation 100, 512 receives for SEND tests, QP timeout 14,
connection type RC, SL 0, no inline data, 5 s per line with ``--run_infinitely``.

perftest's flag rules, with its messages: ``-c UC`` not for READ/atomics, ``-c UD`` for
SEND only (its message size is cut to the MTU); ``-T`` (ToS) with ``-R`` only (else the
GRH Traffic Class is ``--tclass``); ``-I`` not for READ/atomics; ``--run_infinitely``
BW tests only, not with ``-e``, nor with a bidirectional SEND; ``--output`` bandwidth or
message_rate for BW tests, latency for latency tests.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ...errors import InvalidArgument, SoftRdmaError
from ..argtypes import int_in, path_mtu, positive_seconds

DEF_PORT = 18515
DEF_SIZE_BW = 65536
DEF_SIZE_LAT = 2
DEF_SIZE_ATOMIC = 8
DEF_ITERS = 1000
DEF_ITERS_WB = 5000
DEF_TX_BW = 128
DEF_TX_LAT = 1
DEF_RX_SEND = 512
DEF_RX_RDMA = 1
DEF_CQ_MOD = 100
DEF_QP_TIME = 14
DEF_TIMEOUT = 30.0
DEF_DURATION = 5  # --run_infinitely prints a line this often (s) without -D
DEF_QKEY = 0x11111111  # the UD Q_Key of perftest (perftest_parameters.h)
MAX_INLINE = 1024
CONNECTIONS = ("RC", "UC", "UD")
OUTPUTS = ("bandwidth", "message_rate", "latency")
MIN_ITER, MAX_ITER = 5, 100_000_000
MIN_TX, MAX_TX = 1, 15000
MIN_RX, MAX_RX = 1, 16384
MIN_QP_NUM, MAX_QP_NUM = 1, 16384
MIN_CQ_MOD, MAX_CQ_MOD = 1, 1024
MAX_SIZE = 8388608  # -a runs 2 .. 2^23 bytes
RUN_ALL_SIZES = tuple(1 << i for i in range(1, 24))
ATOMIC_TYPES = ("CMP_AND_SWAP", "FETCH_AND_ADD")


class PerftestError(SoftRdmaError):
    """A perftest run failed; the message is the one line the tool prints."""


@dataclass(frozen=True, slots=True)
class TestSpec:
    """Which perftest: the verb (SEND, WRITE, READ, ATOMIC) and BW or latency."""

    verb: str
    tst: str

    @property
    def title(self) -> str:
        """perftest's ``testsStr`` (the header's test name)."""
        return {"send": "Send", "write": "RDMA_Write", "read": "RDMA_Read",
                "atomic": "Atomic"}[self.verb]


SPECS = {f"{verb}-{tst}": TestSpec(verb, tst) for verb in ("write", "read", "send", "atomic")
         for tst in ("bw", "lat")}


def _connection(text: str) -> str:
    value = text.upper()
    if value in ("XRC", "DC", "SRD"):
        raise argparse.ArgumentTypeError(f"connection type {value} is not supported by "
                                         "softrdma (RC, UC, UD)")
    if value not in CONNECTIONS:
        raise argparse.ArgumentTypeError(f"connection type must be RC, UC or UD, not {text!r}")
    return value


def _output(text: str) -> str:
    if text not in OUTPUTS:
        raise argparse.ArgumentTypeError("Invalid verbosity level output flag. Please use "
                                         "bandwidth, latency, message_rate")
    return text


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """perftest's options for tool ``name`` (``write-bw`` ...)."""
    spec = SPECS[name]
    p.add_argument("servername", nargs="?", help="connect to the server at this address "
                   "(without it: be the server and wait)")
    p.add_argument("-p", "--port", type=int_in(0, 65535, "port"), default=DEF_PORT,
                   help=f"listen on/connect to port PORT (default {DEF_PORT})")
    p.add_argument("-d", "--ib-dev", "--device", dest="ib_dev", metavar="DEV",
                   help="use device DEV (default: the first device of --transport)")
    p.add_argument("-i", "--ib-port", type=int_in(1, 255, "ib-port"), default=1,
                   help="use port PORT of the device (default 1)")
    p.add_argument("-x", "--gid-index", type=int_in(0, 255, "gid-index"), default=None,
                   help="GID index (default: the first RoCEv2 IPv4 GID, else 0)")
    p.add_argument("-s", "--size", type=int_in(1, MAX_SIZE, "size"), default=None,
                   help="size of message to exchange (default "
                   f"{DEF_SIZE_ATOMIC if spec.verb == 'atomic' else DEF_SIZE_BW if spec.tst == 'bw' else DEF_SIZE_LAT})")
    p.add_argument("-a", "--all", action="store_true", help="run sizes from 2 till 2^23")
    p.add_argument("-n", "--iters", type=int_in(MIN_ITER, MAX_ITER, "iters"), default=None,
                   help="number of exchanges (at least 5, default "
                   f"{DEF_ITERS_WB if name == 'write-bw' else DEF_ITERS})")
    p.add_argument("-D", "--duration", type=int_in(1, 1 << 30, "duration"), default=None,
                   help="run the test for a customized period of seconds")
    p.add_argument("-m", "--mtu", type=path_mtu, default=None,
                   help="MTU size: 256 - 4096 (default port MTU)")
    p.add_argument("-q", "--qp", type=int_in(MIN_QP_NUM, MAX_QP_NUM, "qp"), default=1,
                   help="number of QPs running in the process (default 1)")
    p.add_argument("-R", "--rdma_cm", action="store_true",
                   help="connect QPs with rdma_cm and run test on those QPs")
    p.add_argument("-F", "--CPU-freq", dest="cpu_freq", action="store_true",
                   help="do not show a warning even if cpufreq_ondemand module is loaded")
    p.add_argument("--report_gbits", action="store_true",
                   help="report the bandwidth in Gb/sec instead of MB/sec")
    p.add_argument("-e", "--events", action="store_true",
                   help="sleep on CQ events (default poll)")
    p.add_argument("-t", "--tx-depth", type=int_in(MIN_TX, MAX_TX, "tx-depth"), default=None,
                   help=f"size of tx queue (default {DEF_TX_BW if spec.tst == 'bw' else DEF_TX_LAT})")
    p.add_argument("-r", "--rx-depth", type=int_in(MIN_RX, MAX_RX, "rx-depth"), default=None,
                   help=f"rx queue size (default {DEF_RX_SEND if spec.verb == 'send' else DEF_RX_RDMA})")
    p.add_argument("-u", "--qp-timeout", type=int_in(0, 31, "qp-timeout"), default=DEF_QP_TIME,
                   help=f"QP timeout, timeout value is 4 usec * 2 ^(timeout) (default {DEF_QP_TIME})")
    p.add_argument("-Q", "--cq-mod", type=int_in(MIN_CQ_MOD, MAX_CQ_MOD, "cq-mod"),
                   default=DEF_CQ_MOD, help=f"generate a CQE every N WRs (default {DEF_CQ_MOD})")
    p.add_argument("-o", "--outs", type=int_in(1, 65535, "outs"), default=None,
                   help="number of outstanding reads/atomics (default device max)")
    if spec.verb == "atomic":
        p.add_argument("-A", "--atomic_type", choices=ATOMIC_TYPES, default="FETCH_AND_ADD",
                       help="type of atomic operation (default FETCH_AND_ADD)")
    p.add_argument("-c", "--connection", type=_connection, default="RC", metavar="RC|UC|UD",
                   help="connection type RC/UC/UD (default RC; UC: no READ/atomics, "
                   "UD: SEND only)")
    if spec.tst == "bw":
        p.add_argument("-b", "--bidirectional", action="store_true",
                       help="measure bidirectional bandwidth (default unidirectional)")
        p.add_argument("--run_infinitely", action="store_true",
                       help="run test forever, print results every <duration> seconds "
                       f"(-D, default {DEF_DURATION}); Ctrl-C stops it")
    p.add_argument("-I", "--inline_size", type=int_in(0, MAX_INLINE, "inline_size"),
                   default=None, help="max size of message to be sent in inline")
    p.add_argument("-S", "--sl", type=int_in(0, 15, "sl"), default=0, help="SL (default 0)")
    p.add_argument("-T", "--tos", type=int_in(0, 255, "tos"), default=None,
                   help="set <tos_value> to RDMA-CM QPs. available only with -R flag. "
                   "values 0-255 (default off)")
    p.add_argument("--tclass", type=int_in(0, 255, "tclass"), default=None,
                   help="set the Traffic Class in GRH (if GRH is in use)")
    p.add_argument("--output", type=_output, default=None,
                   help="set verbosity output level: bandwidth , message_rate, latency "
                   "(print only that number)")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object (no table, no progress line)")
    p.add_argument("--transport", choices=("roce", "iwarp"), default="roce",
                   help="roce (default) or iwarp (iWARP QPs always connect with rdma_cm)")
    p.add_argument("--timeout", type=positive_seconds("timeout"), default=DEF_TIMEOUT, metavar="SEC",
                   help=f"give up after SEC seconds without progress (default {DEF_TIMEOUT:g})")


@dataclass(slots=True)
class Options:
    """The validated run parameters (perftest's ``user_param``)."""

    name: str
    spec: TestSpec
    servername: str | None
    port: int
    ib_dev: str | None
    ib_port: int
    gid_index: int | None
    size: int
    sizes: tuple[int, ...]
    run_all: bool
    iters: int
    duration: int | None
    mtu: int | None
    num_qps: int
    rdma_cm: bool
    report_gbits: bool
    events: bool
    tx_depth: int
    rx_depth: int
    qp_timeout: int
    cq_mod: int
    outs: int | None
    atomic_type: str
    json: bool
    transport: str
    timeout: float
    connection: str = "RC"
    duplex: bool = False
    run_infinitely: bool = False
    inline_size: int = 0
    sl: int = 0
    tos: int | None = None
    tclass: int = 0
    output: str | None = None

    @property
    def is_client(self) -> bool:
        return self.servername is not None


def from_args(name: str, args: argparse.Namespace) -> Options:
    """Validate ``args`` as perftest's ``parser`` + ``force_dependecies`` do."""
    spec = SPECS[name]
    if spec.verb == "atomic":
        if args.size is not None and args.size != DEF_SIZE_ATOMIC:
            raise InvalidArgument("-s", "Message size cannot be changed for Atomic tests")
        if args.all:
            raise InvalidArgument("-a", "Message size cannot be changed for Atomic tests")
    if args.duration is not None and args.all:
        raise InvalidArgument("-D", "Duration mode is not supported with -a (all sizes)")
    if args.duration is not None and args.iters is not None:
        raise InvalidArgument("-D", "use either -n (iterations) or -D (duration), not both")
    conn = getattr(args, "connection", "RC")
    if conn == "UC" and spec.verb in ("read", "atomic"):
        raise InvalidArgument("-c", "UC connection not possible in READ/ATOMIC verbs")
    if conn == "UD" and spec.verb != "send":
        raise InvalidArgument("-c", "UD connection only possible in SEND verb")
    if conn != "RC" and (args.transport == "iwarp" or getattr(args, "rdma_cm", False)):
        raise InvalidArgument("-c", f"{conn} QPs connect without rdma_cm here (iWARP and "
                                    "-R use RC QPs)")
    inline = getattr(args, "inline_size", None)
    if inline is not None and spec.verb in ("read", "atomic"):
        raise InvalidArgument("-I", "Inline feature not available on READ/Atomic verbs")
    tos = getattr(args, "tos", None)
    rdma_cm = bool(getattr(args, "rdma_cm", False)) or args.transport == "iwarp"
    if tos is not None and not rdma_cm:
        raise InvalidArgument("-T", "TOS only valid for rdma_cm based QP and RawEth QP "
                                    "(the GRH Traffic Class of other QPs: --tclass)")
    output = getattr(args, "output", None)
    if output is not None:
        if spec.tst == "bw" and output not in ("bandwidth", "message_rate"):
            raise InvalidArgument("--output", "Output verbosity level for BW can be: "
                                              "bandwidth, message_rate")
        if spec.tst == "lat" and output != "latency":
            raise InvalidArgument("--output", "Output verbosity level for LAT can be: latency")
        if args.json:
            raise InvalidArgument("--output", "use either --output or --json")
    duplex = bool(getattr(args, "bidirectional", False))
    infinite = bool(getattr(args, "run_infinitely", False))
    if infinite:
        if args.events:
            raise InvalidArgument("--run_infinitely",
                                  "run_infinitely does not support events feature yet.")
        if duplex and spec.verb == "send":
            raise InvalidArgument("--run_infinitely", "run_infinitely mode is not supported "
                                  "in SEND, SEND_IMM or WRITE_IMM Bidirectional BW test")
        if args.all:
            raise InvalidArgument("--run_infinitely", "run_infinitely runs one message size "
                                                      "(not -a)")
        if args.iters is not None:
            raise InvalidArgument("--run_infinitely", "runs until stopped: not with -n")
        if args.json:
            raise InvalidArgument("--run_infinitely", "prints a line every -D seconds: "
                                                      "not with --json")
    if args.transport == "iwarp" and spec.verb == "atomic":
        raise PerftestError("Atomic operations are not supported over iWARP (RFC 5040 "
                            "RDMAP has no atomics; siw has none either)")
    default_size = (DEF_SIZE_ATOMIC if spec.verb == "atomic" else
                    DEF_SIZE_BW if spec.tst == "bw" else DEF_SIZE_LAT)
    size = MAX_SIZE if args.all else (args.size if args.size is not None else default_size)
    sizes = RUN_ALL_SIZES if args.all else (size,)
    iters = args.iters if args.iters is not None else (
        DEF_ITERS_WB if name == "write-bw" else DEF_ITERS)
    tx_depth = args.tx_depth if args.tx_depth is not None else (
        DEF_TX_BW if spec.tst == "bw" else DEF_TX_LAT)
    rx_depth = args.rx_depth if args.rx_depth is not None else (
        DEF_RX_SEND if spec.verb == "send" else DEF_RX_RDMA)
    duration = args.duration
    if infinite and duration is None:
        duration = DEF_DURATION
    if args.duration is None and not infinite:
        tx_depth = min(tx_depth, iters)  # force_dependecies
        if spec.verb == "send":
            rx_depth = min(rx_depth, iters)
    if spec.verb == "send" and rx_depth % 2 == 1 and not args.all:
        rx_depth += 1  # perftest's "WA for a bug when rx_depth is odd in SEND"
    cq_mod = min(args.cq_mod, tx_depth)
    return Options(
        name=name, spec=spec, servername=args.servername, port=args.port,
        ib_dev=args.ib_dev, ib_port=args.ib_port, gid_index=args.gid_index, size=size,
        sizes=sizes, run_all=bool(args.all), iters=iters, duration=duration,
        mtu=args.mtu, num_qps=args.qp,
        rdma_cm=bool(args.rdma_cm) or args.transport == "iwarp",
        report_gbits=bool(args.report_gbits), events=bool(args.events), tx_depth=tx_depth,
        rx_depth=rx_depth, qp_timeout=args.qp_timeout, cq_mod=cq_mod, outs=args.outs,
        atomic_type=getattr(args, "atomic_type", "FETCH_AND_ADD"), json=bool(args.json),
        transport=args.transport, timeout=args.timeout, connection=conn, duplex=duplex,
        run_infinitely=infinite, inline_size=inline or 0, sl=getattr(args, "sl", 0),
        tos=tos, tclass=getattr(args, "tclass", None) or 0, output=output)

"""perftest's command line (perftest_parameters.c ``parser``): same letters, defaults and
limits, validated into :class:`Options`; bad values are one-line errors (exit 1).

Defaults as perftest 4.5: port 18515, size 65536 (BW) / 2 (latency) / 8 (atomics, which
cannot change it), 5000 iterations for write-bw and 1000 otherwise (at least 5), TX depth
128 (BW) / 1 (latency), CQ moderation 100, 512 receives for SEND tests, QP timeout 14.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import InvalidArgument, SoftRdmaError

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
MIN_ITER, MAX_ITER = 5, 100_000_000
MIN_TX, MAX_TX = 1, 15000
MIN_RX, MAX_RX = 1, 16384
MIN_QP_NUM, MAX_QP_NUM = 1, 16384
MIN_CQ_MOD, MAX_CQ_MOD = 1, 1024
MAX_SIZE = 8388608  # -a runs 2 .. 2^23 bytes
RUN_ALL_SIZES = tuple(1 << i for i in range(1, 24))
MTUS = (256, 512, 1024, 2048, 4096)
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


def _ranged(lo: int, hi: int, name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: invalid integer {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be {lo}..{hi}, not {value}")
        return value
    return parse


def _mtu(text: str) -> int:
    value = _ranged(256, 4096, "mtu")(text)
    if value not in MTUS:
        raise argparse.ArgumentTypeError(f"MTU must be one of {MTUS}, not {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("seconds must be > 0")
    return value


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """perftest's options for tool ``name`` (``write-bw`` ...)."""
    spec = SPECS[name]
    p.add_argument("servername", nargs="?", help="connect to the server at this address "
                   "(without it: be the server and wait)")
    p.add_argument("-p", "--port", type=_ranged(0, 65535, "port"), default=DEF_PORT,
                   help=f"listen on/connect to port PORT (default {DEF_PORT})")
    p.add_argument("-d", "--ib-dev", "--device", dest="ib_dev", metavar="DEV",
                   help="use device DEV (default: the first device of --transport)")
    p.add_argument("-i", "--ib-port", type=_ranged(1, 255, "ib-port"), default=1,
                   help="use port PORT of the device (default 1)")
    p.add_argument("-x", "--gid-index", type=_ranged(0, 255, "gid-index"), default=None,
                   help="GID index (default: the first RoCEv2 IPv4 GID, else 0)")
    p.add_argument("-s", "--size", type=_ranged(1, MAX_SIZE, "size"), default=None,
                   help="size of message to exchange (default "
                   f"{DEF_SIZE_ATOMIC if spec.verb == 'atomic' else DEF_SIZE_BW if spec.tst == 'bw' else DEF_SIZE_LAT})")
    p.add_argument("-a", "--all", action="store_true", help="run sizes from 2 till 2^23")
    p.add_argument("-n", "--iters", type=_ranged(MIN_ITER, MAX_ITER, "iters"), default=None,
                   help="number of exchanges (at least 5, default "
                   f"{DEF_ITERS_WB if name == 'write-bw' else DEF_ITERS})")
    p.add_argument("-D", "--duration", type=_ranged(1, 1 << 30, "duration"), default=None,
                   help="run the test for a customized period of seconds")
    p.add_argument("-m", "--mtu", type=_mtu, default=None,
                   help="MTU size: 256 - 4096 (default port MTU)")
    p.add_argument("-q", "--qp", type=_ranged(MIN_QP_NUM, MAX_QP_NUM, "qp"), default=1,
                   help="number of QPs running in the process (default 1)")
    p.add_argument("-R", "--rdma_cm", action="store_true",
                   help="connect QPs with rdma_cm and run test on those QPs")
    p.add_argument("-F", "--CPU-freq", dest="cpu_freq", action="store_true",
                   help="do not show a warning even if cpufreq_ondemand module is loaded")
    p.add_argument("--report_gbits", action="store_true",
                   help="report the bandwidth in Gb/sec instead of MB/sec")
    p.add_argument("-e", "--events", action="store_true",
                   help="sleep on CQ events (default poll)")
    p.add_argument("-t", "--tx-depth", type=_ranged(MIN_TX, MAX_TX, "tx-depth"), default=None,
                   help=f"size of tx queue (default {DEF_TX_BW if spec.tst == 'bw' else DEF_TX_LAT})")
    p.add_argument("-r", "--rx-depth", type=_ranged(MIN_RX, MAX_RX, "rx-depth"), default=None,
                   help=f"rx queue size (default {DEF_RX_SEND if spec.verb == 'send' else DEF_RX_RDMA})")
    p.add_argument("-u", "--qp-timeout", type=_ranged(0, 31, "qp-timeout"), default=DEF_QP_TIME,
                   help=f"QP timeout, timeout value is 4 usec * 2 ^(timeout) (default {DEF_QP_TIME})")
    p.add_argument("-Q", "--cq-mod", type=_ranged(MIN_CQ_MOD, MAX_CQ_MOD, "cq-mod"),
                   default=DEF_CQ_MOD, help=f"generate a CQE every N WRs (default {DEF_CQ_MOD})")
    p.add_argument("-o", "--outs", type=_ranged(1, 65535, "outs"), default=None,
                   help="number of outstanding reads/atomics (default device max)")
    if spec.verb == "atomic":
        p.add_argument("-A", "--atomic_type", choices=ATOMIC_TYPES, default="FETCH_AND_ADD",
                       help="type of atomic operation (default FETCH_AND_ADD)")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object (no table, no progress line)")
    p.add_argument("--transport", choices=("roce", "iwarp"), default="roce",
                   help="roce (default) or iwarp (iWARP QPs always connect with rdma_cm)")
    p.add_argument("--timeout", type=_seconds, default=DEF_TIMEOUT, metavar="SEC",
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
    if args.duration is None:
        tx_depth = min(tx_depth, iters)  # force_dependecies
        if spec.verb == "send":
            rx_depth = min(rx_depth, iters)
    if spec.verb == "send" and rx_depth % 2 == 1 and not args.all:
        rx_depth += 1  # perftest's "WA for a bug when rx_depth is odd in SEND"
    cq_mod = min(args.cq_mod, tx_depth)
    return Options(
        name=name, spec=spec, servername=args.servername, port=args.port,
        ib_dev=args.ib_dev, ib_port=args.ib_port, gid_index=args.gid_index, size=size,
        sizes=sizes, run_all=bool(args.all), iters=iters, duration=args.duration,
        mtu=args.mtu, num_qps=args.qp,
        rdma_cm=bool(args.rdma_cm) or args.transport == "iwarp",
        report_gbits=bool(args.report_gbits), events=bool(args.events), tx_depth=tx_depth,
        rx_depth=rx_depth, qp_timeout=args.qp_timeout, cq_mod=cq_mod, outs=args.outs,
        atomic_type=getattr(args, "atomic_type", "FETCH_AND_ADD"), json=bool(args.json),
        transport=args.transport, timeout=args.timeout)

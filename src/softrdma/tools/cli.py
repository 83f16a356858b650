"""The ``softrdma`` command line: one argparse dispatcher for every tool (design.md, tools).

Subcommands and where they live:

=================  =====================================================================
``devinfo``        :mod:`softrdma.tools.ibverbs.devinfo` (``ibv_devinfo``)
``devices``        :mod:`softrdma.tools.ibverbs.devices` (``ibv_devices``)
``asyncwatch``     :mod:`softrdma.tools.ibverbs.asyncwatch` (``ibv_asyncwatch``)
``srq-pingpong``   :mod:`softrdma.tools.ibverbs.srq_pingpong` (``ibv_srq_pingpong``)
``xsrq-pingpong``  :mod:`softrdma.tools.ibverbs.xsrq_pingpong` (``ibv_xsrq_pingpong``)
``rc-pingpong``    :mod:`softrdma.tools.ibverbs.pingpong` (``ibv_rc_pingpong``)
``uc-pingpong``    :mod:`softrdma.tools.ibverbs.pingpong` (``ibv_uc_pingpong``)
``ud-pingpong``    :mod:`softrdma.tools.ibverbs.pingpong` (``ibv_ud_pingpong``)
``demo``           :mod:`softrdma.tools.demo` (loopback tour of the RC operations)
``rping``          :mod:`softrdma.tools.rdmacm.rping` (flags), :mod:`~softrdma.tools.rdmacm.rping_run` (librdmacm's ``rping``, RoCE or iWARP)
``udaddy``         :mod:`softrdma.tools.rdmacm.udaddy` (librdmacm's ``udaddy``: UD over SIDR)
``ucmatose``       :mod:`softrdma.tools.rdmacm.ucmatose` (librdmacm's ``ucmatose``)
``mckey``          :mod:`softrdma.tools.rdmacm.mckey` (librdmacm's ``mckey``: rdma_cm multicast)
``rdma-server``    :mod:`softrdma.tools.rdmacm.rdma_server` (librdmacm's ``rdma_server`` example)
``rdma-client``    :mod:`softrdma.tools.rdmacm.rdma_server` (librdmacm's ``rdma_client`` example)
``rdma-xserver``   :mod:`softrdma.tools.rdmacm.rdma_xserver` (librdmacm's ``rdma_xserver``: RC or XRC)
``rdma-xclient``   :mod:`softrdma.tools.rdmacm.rdma_xserver` (librdmacm's ``rdma_xclient``)
``pcap-check``     ``softrdma.tools.capture.pcap_check.run(paths) -> int``
``ladder``         :mod:`softrdma.tools.capture.ladder` (ladder diagram and PSN plot of a capture)
``link``           ``softrdma.tools.admin.link.cmd_link(args) -> int``
``pyverbs``        :mod:`softrdma.tools.suites.pyverbs_run` (run a pyverbs program on softrdma)
``run``            :mod:`softrdma.capi.launch` (run a C libibverbs program on softrdma)
``rdma-core-tests`` :mod:`softrdma.tools.suites.rdma_core_tests` (rdma-core's pyverbs test suite)
``stats``          :mod:`softrdma.tools.admin.stats` (``rdma statistic``: port counters)
``res``            :mod:`softrdma.tools.admin.res` (``rdma resource``: QPs, CQs, MRs, PDs; QP counters)
``write-bw`` ...   :mod:`softrdma.tools.perftest` (perftest's ``ib_write_bw``, ``ib_read_bw``,
                   ``ib_send_bw``, ``ib_atomic_bw`` and the ``*_lat`` tools)
``ipoib``          :mod:`softrdma.tools.admin.ipoib` (IP over InfiniBand on a TUN interface)
``interop``        :mod:`softrdma.interop.cli` (the live suite against Linux rxe/siw)
=================  =====================================================================

Tool modules are imported inside the handlers, so a module that is missing or broken
gives a one-line error for that subcommand only. Exit status: 0 success, 1 failure (one
line on stderr: ``softrdma <cmd>: error: ...``), 2 bad arguments (argparse), 130 on
Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from .. import trace
from ..errors import SoftRdmaError
from .argtypes import nonneg_int, udp_port

PROG = "softrdma"
PERFTEST_TOOLS = ("write-bw", "read-bw", "send-bw", "atomic-bw",
                  "write-lat", "read-lat", "send-lat", "atomic-lat")


class ToolUnavailable(SoftRdmaError):
    """A subcommand's module cannot be imported."""


def version() -> str:
    """The installed distribution's version (or the source tree's, from pyproject)."""
    from importlib import metadata

    try:
        return metadata.version("softrdma")
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        with pyproject.open("rb") as fh:
            return str(tomllib.load(fh)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def _load(module: str, command: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ToolUnavailable(f"'{command}' is not available: cannot import {module} "
                              f"({exc})") from exc


def _tool(module: str, command: str, attr: str) -> Callable[..., Any]:
    fn = getattr(_load(module, command), attr, None)
    if not callable(fn):
        raise ToolUnavailable(f"'{command}' is not available: {module} has no {attr}()")
    return fn  # type: ignore[no-any-return]


# -- handlers --------------------------------------------------------------------------

def _runs(module: str, command: str, *lead: str) -> Callable[[argparse.Namespace], int]:
    """The handler of a subcommand whose module's ``run(*lead, args)`` does the work
    (``lead``: the tool's name or kind, for modules that serve several subcommands)."""
    def handler(args: argparse.Namespace) -> int:
        return int(_tool(module, command, "run")(*lead, args))
    return handler


def _passes_on(module: str, command: str, attr: str) -> Callable[[argparse.Namespace], int]:
    """The handler of a subcommand whose module parses its own arguments:
    ``module.attr(words)`` gets every word after the subcommand's name, in order."""
    def handler(args: argparse.Namespace) -> int:
        return int(_tool(module, command, attr)(list(args.rest)))
    return handler


def _cmd_pcap_check(args: argparse.Namespace) -> int:
    run = _tool("softrdma.tools.capture.pcap_check", "pcap-check", "run")
    return int(run(list(args.files), udp_ports=tuple(args.udp_port),
                   max_errors=args.max_errors, verbose=args.verbose))


# -- parser ----------------------------------------------------------------------------

def _add_tool_args(module: str, sub: argparse.ArgumentParser, *extra: Any) -> None:
    """Let the tool module declare its options (tool modules import no verbs at top).

    If the module cannot be imported the subcommand still parses (any arguments) and its
    handler reports why, instead of the whole CLI failing to start.
    """
    try:
        mod = importlib.import_module(module)
        mod.add_arguments(sub, *extra)
    except ImportError as exc:
        err = ToolUnavailable(f"'{sub.prog}' is not available: cannot import {module} ({exc})")

        def unavailable(_args: argparse.Namespace) -> int:
            raise err
        sub.set_defaults(unavailable=unavailable, passthrough=True)


class _VersionAction(argparse.Action):
    """``--version``: the version is looked up only when asked for (``importlib.metadata``
    costs more than the rest of a tool's start-up parsing)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS,
                 help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"{PROG} {version()}")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``softrdma`` parser: every subcommand with its options; with ``only`` (the
    subcommand a command line names, :func:`command_named`; "" for none) only that
    subcommand gets its options, the others their names and help lines. A tool's options
    come from its module, so a process then imports its own tool's module, not every
    tool's (:func:`main`)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="softrdma: a software RDMA stack (RoCEv2 / iWARP) in Python, "
        "wire-compatible with Linux rxe and siw.")
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--trace", metavar="KINDS", default=None,
                        help="log qp (QP state transitions), cm (CM states and events) and/or "
                        "pkt (one line per packet), comma-separated or 'all', to stderr; as "
                        "SOFTRDMA_TRACE")
    parser.add_argument("--pcap", metavar="FILE", default=None,
                        help="write what this tool's RoCE devices send and receive to FILE "
                        "(pcap; tshark and pcap-check read it); as SOFTRDMA_PCAP")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    _orig_add = subs.add_parser

    def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        sub = _orig_add(name, **kw)
        sub.set_defaults(subparser=sub)
        return sub

    def tool_args(module: str, sub: argparse.ArgumentParser, name: str, *extra: Any) -> None:
        if only is None or only == name:
            _add_tool_args(module, sub, *extra)

    def tool(name: str, module: str, *, args_module: str | None = None,
             extra: tuple[str, ...] = (), **kw: Any) -> None:
        """A subcommand whose options come from ``args_module`` (default ``module``) and
        whose work is ``module.run(args)``."""
        sub = add_parser(name, **kw)
        tool_args(args_module or module, sub, name, *extra)
        sub.set_defaults(handler=_runs(module, name))

    tool("devinfo", "softrdma.tools.ibverbs.devinfo",
         help="print device and port attributes (ibv_devinfo)",
         description="Print the attributes of softrdma devices, like "
         "ibv_devinfo.")

    for kind in ("rc", "uc", "ud"):
        p = add_parser(
            f"{kind}-pingpong", help=f"ping-pong over {'an' if kind == 'rc' else 'a'} "
            f"{kind.upper()} QP "
            f"(ibv_{kind}_pingpong)",
            description=f"ibv_{kind}_pingpong: without SERVERNAME start a server and wait; "
            f"with it, connect to that server. Interoperates with the real ibv_{kind}_pingpong.")
        tool_args("softrdma.tools.ibverbs.pingpong", p, f"{kind}-pingpong", kind)
        p.set_defaults(handler=_runs("softrdma.tools.ibverbs.pingpong", f"{kind}-pingpong",
                                     kind))

    tool("demo", "softrdma.tools.demo",
         help="show SEND/RECV, RDMA WRITE/READ and atomics on a "
         "loopback RC QP pair",
         description="Two endpoints in this process on one device, an RC "
         "connection between them, every RC operation checked.")

    tool("rping", "softrdma.tools.rdmacm.rping_run", args_module="softrdma.tools.rdmacm.rping",
         help="RDMA ping over an rdma_cm connection (librdmacm rping)",
         description="rping: -s serves, -c -a ADDR connects; the server RDMA READs "
         "the client's ping data and RDMA WRITEs it back. RoCE (IB CM + A11) by "
         "default, --transport iwarp for TCP + MPA.")

    tool("udaddy", "softrdma.tools.rdmacm.udaddy", args_module="softrdma.tools.rdmacm.cmargs", extra=("udaddy",),
         help="UD messages to a service resolved by rdma_cm "
         "(SIDR; librdmacm udaddy)",
         description="udaddy: without -s serve, with -s ADDR connect; the client's "
         "SIDR_REQ resolves the server's UD QP (RDMA_PS_UDP, Q_Key 0x01234567), "
         "then messages go both ways. Interoperates with rdma-core's udaddy.")

    tool("ucmatose", "softrdma.tools.rdmacm.ucmatose",
         args_module="softrdma.tools.rdmacm.cmargs", extra=("ucmatose",),
         help="RC connections and SENDs through rdma_cm "
         "(librdmacm ucmatose)",
         description="ucmatose: without -s serve, with -s ADDR connect; the server "
         "sends -C messages on each connection, the client answers, the server "
         "disconnects. Interoperates with rdma-core's ucmatose.")

    tool("mckey", "softrdma.tools.rdmacm.mckey", args_module="softrdma.tools.rdmacm.cmflags",
         extra=("mckey",),
         help="rdma_cm multicast over UD QPs: join, send, leave (librdmacm mckey)",
         description="mckey: -m GROUP joins the group and receives -C messages; with -s it "
         "sends them. Interoperates with rdma-core's mckey.")

    # librdmacm's examples: (module, what one run does, the rest of the description, the
    # server's and the client's command with its role)
    for module, what, detail, roles in (
            ("rdma_server", "one SEND each way (rdma_getaddrinfo, rdma_create_ep)",
             "one 16-byte SEND each way over an RC QP made by rdma_create_ep. Interoperates "
             "with rdma-core's rdma_server / rdma_client.",
             (("rdma-server", "listen on -s ADDR -p PORT, accept one connection"),
              ("rdma-client", "connect to -s ADDR -p PORT"))),
            ("rdma_xserver", "one SEND over RC or XRC (-c r|x)",
             "one 16-byte SEND from the client, over an RC QP (-c r) or XRC through rdma_cm "
             "(-c x: RDMA_PS_IB ids, the server's XRC TGT QP and XRC SRQ, whose number the "
             "accept sends). Interoperates with rdma-core's rdma_xserver / rdma_xclient.",
             (("rdma-xserver", "listen on -p PORT, accept one connection"),
              ("rdma-xclient", "connect to -s ADDR -p PORT")))):
        for name, role in roles:
            example = name.replace("-", "_")
            p = add_parser(name, help=f"librdmacm's {example} example: {role}, {what}",
                           description=f"{example}: {role}; {detail}")
            tool_args("softrdma.tools.rdmacm.cmflags", p, name, name)
            p.set_defaults(handler=_runs(f"softrdma.tools.rdmacm.{module}", name, name))

    p = add_parser("pcap-check", help="check every RoCE/iWARP packet of pcap files "
                        "(ICRC/CRC, byte-exact decoding) and follow each RC/UC connection",
                        description="Check pcap/pcapng files packet by packet, then each "
                        "RC/UC connection from its CM REQ/REP or TCP 18515 exchange (first "
                        "PSNs, PSN gaps, ACKs/NAKs, RDMA READ responses, DREQ/DREP). "
                        "Failures go to stderr, summaries to stdout.")
    p.add_argument("files", nargs="+", metavar="FILE", help="pcap or pcapng file")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print one decoded line per RoCE packet and the connections' notes")
    p.add_argument("--max-errors", type=nonneg_int, default=20, metavar="N",
                   help="print at most N failure lines per file (0: all; default 20)")
    p.add_argument("--udp-port", type=udp_port, action="append", default=[], metavar="N",
                   help="also treat UDP port N as RoCEv2 (a device configured off 4791)")
    p.set_defaults(handler=_cmd_pcap_check)

    tool("ladder", "softrdma.tools.capture.ladder",
         help="draw the ladder (sequence) diagram of a capture, and its PSN plot",
         description="One lane per endpoint (IP and QPN, or IP and TCP port for iWARP): "
         "CM and MPA messages, data (MIDDLE runs collapsed), ACK/NAK with syndrome and "
         "MSN, READ responses, retransmissions, Terminates and capture gaps. -o writes "
         "the diagram (.svg/.png/.pdf), --plot the PSN against time; without either, "
         "the rows are printed. Needs matplotlib for drawing.")

    p = add_parser("link", add_help=False, help="add, delete or show softrdma devices "
                        "(softrdma link --help)",
                        description="softrdma link [show [NAME]] | link add NAME netdev IFACE "
                        "| link delete NAME; arguments go to softrdma.tools.admin.link as they are.")
    p.set_defaults(handler=_passes_on("softrdma.tools.admin.link", "link", "cmd_link"),
                   passthrough=True)

    tool("pyverbs", "softrdma.tools.suites.pyverbs_run",
         help="run a pyverbs program on softrdma "
         "(softrdma pyverbs -- python3 program.py)",
         description="Run COMMAND with softrdma's pyverbs compatibility layer first "
         "on PYTHONPATH; a real pyverbs is not shadowed outside this command.")

    tool("run", "softrdma.capi.launch",
         help="run a C program with its libibverbs calls served by softrdma "
         "(softrdma run -- ibv_devinfo)",
         description="Run PROGRAM (dynamically linked, not setuid) with libibverbs "
         "interposed by softrdma's C interface, built on first use.")

    tool("rdma-core-tests", "softrdma.tools.suites.rdma_core_tests",
         help="run rdma-core's pyverbs test suite on a "
         "softrdma device", description="Install python3-pyverbs if needed, run "
         "rdma-core's tests through softrdma's pyverbs and print a table per file.")

    tool("devices", "softrdma.tools.ibverbs.devices",
         help="list the devices and their node GUIDs (ibv_devices)",
         description="List softrdma's devices as ibv_devices does.")

    tool("asyncwatch", "softrdma.tools.ibverbs.asyncwatch",
         help="print a device's asynchronous events "
         "(ibv_asyncwatch)", description="Open a device and print its port "
         "events (PORT_ERR, PORT_ACTIVE, GID_CHANGE) as ibv_asyncwatch does.")

    tool("srq-pingpong", "softrdma.tools.ibverbs.srq_pingpong",
         help="RC QPs sharing an SRQ ping-pong SENDs "
         "(ibv_srq_pingpong)", description="ibv_srq_pingpong: without SERVERNAME "
         "be the server and wait; with it, connect. Same flags, output and TCP "
         "exchange as the C tool.")

    tool("xsrq-pingpong", "softrdma.tools.ibverbs.xsrq_pingpong",
         help="SENDs over XRC to the peer's XRC SRQ (ibv_xsrq_pingpong)",
         description="ibv_xsrq_pingpong: without SERVERNAME be the server and wait; with "
         "it, connect. XRC INI/TGT QPs and an XRC SRQ per side; same flags, output and TCP "
         "exchange as the C tool.")

    tool("stats", "softrdma.tools.admin.stats", args_module="softrdma.tools.admin.args",
         extra=("stats",),
         help="port counters: packets, bytes, retransmissions, RNR NAKs, drops by reason "
         "(rdma statistic)",
         description="softrdma stats [show [link DEV[/PORT]]]: the counters of every "
         "device's port (RoCE and iWARP), one line each as `rdma statistic show link` "
         "prints them; a shared device's are the whole device's.")
    tool("res", "softrdma.tools.admin.res", args_module="softrdma.tools.admin.args",
         extra=("res",),
         help="objects on the devices: QPs, CQs, MRs, PDs of every process (rdma "
         "resource); per-QP counters",
         description="softrdma res [show] [qp|cq|mr|pd] | res statistic [qp]: every object "
         "open on each RoCE device, across processes, one line each as `rdma resource "
         "show` prints them; `statistic`: each QP's counters.")
    for name in PERFTEST_TOOLS:
        verb, tst = name.split("-")
        p = add_parser(name, help=f"perftest's ib_{verb}_{tst}: "
                       f"{'bandwidth' if tst == 'bw' else 'latency'} of "
                       f"{verb.upper()} over RC QPs",
                       description=f"ib_{verb}_{tst}: without SERVERNAME be the server and "
                       "wait; with it, connect to that server. Interoperates with perftest "
                       "4.5 (the TCP 18515 exchange, or rdma_cm with -R).")
        tool_args("softrdma.tools.perftest.options", p, name, name)
        p.set_defaults(handler=_runs("softrdma.tools.perftest.runner", name, name))
    p = add_parser("ipoib", add_help=False, help="IP over InfiniBand (RFC 4391/4755) on a "
                   "TUN interface "
                   "(up/down/show)", description="softrdma ipoib up NAME --device DEV "
                   "[--mode connected|datagram] [--pkey P] [--mtu M] ADDR/PREFIX... runs an "
                   "IPoIB interface until stopped; down NAME stops it; show [NAME] [--json] "
                   "prints neighbours, connections and counters.")
    p.set_defaults(handler=_passes_on("softrdma.tools.admin.ipoib", "ipoib", "main"),
                   passthrough=True)
    tool("interop", "softrdma.interop.cli",
         help="run the live interop suite against Linux rxe/siw in "
         "the lab (root)", description="Build or reuse the lab (not part of softrdma: docs/interop-lab.md), "
         "boot a guest, run every case in both directions with captures and "
         "checks, print the table.")
    return parser


def _trace_and_capture(kinds: str | None, pcap: str | None) -> None:
    """``--trace`` / ``--pcap``: set up this process (and, through the environment, the
    processes it starts) as ``SOFTRDMA_TRACE`` / ``SOFTRDMA_PCAP`` would."""
    if kinds is not None:
        trace.configure(kinds)
        os.environ[trace.ENV] = kinds
    if pcap is not None:
        try:
            with open(pcap, "ab"):
                pass
        except OSError as exc:
            raise ToolUnavailable(f"--pcap: cannot write {pcap}: {exc.strerror}") from None
        trace.capture_path = pcap


_GLOBAL_OPTIONS = ("--trace", "--pcap")


def command_named(argv: Sequence[str]) -> str:
    """The subcommand a ``softrdma`` command line names: its first word that is neither
    a global option (``--trace``/``--pcap``, with its value, or an abbreviation of one, as
    argparse accepts) nor that option's value; "" when an other option (``--help``,
    ``--version``, a mistake) or nothing comes first. Only the parsing of that subcommand
    then needs its tool's module (:func:`build_parser`)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            return word
        name, eq, _ = word.partition("=")
        if len(name) < 3 or not any(o.startswith(name) for o in _GLOBAL_OPTIONS):
            return ""
        i += 1 if eq else 2
    return ""


def _global_hint(rest: Sequence[str], tool: str) -> str:
    """A hint when ``--trace``/``--pcap`` were given after the tool's name (``tool``: its
    parser's prog, ``softrdma NAME``): they are options of ``softrdma`` itself, so they
    go before it."""
    found = [o for o in _GLOBAL_OPTIONS if any(w == o or w.startswith(f"{o}=") for w in rest)]
    if not found:
        return ""
    return (f" ({' and '.join(found)} {'are options' if len(found) > 1 else 'is an option'} "
            f"of softrdma itself: put {'them' if len(found) > 1 else 'it'} before the "
            f"tool's name, as in: {PROG} {found[0]} ... {tool.split()[-1]} ...)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``softrdma`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    words = list(argv) if argv is not None else sys.argv[1:]
    parser = build_parser(command_named(words))
    args, rest = parser.parse_known_args(words)
    # The tool's name from its parser: args.command may be a tool's own argument of
    # that name (pyverbs: the program to run).
    sub = getattr(args, "subparser", None)
    name = sub.prog if isinstance(sub, argparse.ArgumentParser) else PROG
    if getattr(args, "passthrough", False):
        args.rest = rest  # e.g. ``link``: its own parser gets every argument, in order
    elif rest:
        getattr(args, "subparser", parser).error(
            f"unrecognized arguments: {' '.join(rest)}{_global_hint(rest, name)}")
    if args.trace is not None or args.pcap is not None:
        try:
            _trace_and_capture(args.trace, args.pcap)
        except SoftRdmaError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
    handler: Callable[[argparse.Namespace], int] | None = getattr(
        args, "unavailable", None) or getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except SoftRdmaError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # before OSError, of which it is one: `softrdma ... | head`
        return 1
    except OSError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

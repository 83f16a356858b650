"""``softrdma interop`` / ``python -m softrdma.interop``: run the interop suite.

Options: ``--smoke`` (the CI subset), ``--cases PATTERN`` (comma-separated shell
patterns on case names such as ``rc_pingpong/rxe/s4096``; a bare word matches anywhere),
``--guest N`` (default 1), ``--json``, ``--keep`` (leave the guest this run booted and
the namespace in place), ``--list`` (print the case names and exit). Exit status 0 when
every run passed or was skipped, 1 when one failed or the lab could not be used, 2 bad
arguments. Needs root (network namespaces, qemu, tcpdump) and the lab's scripts, which
are not part of softrdma (``docs/interop-lab.md``): without them it says where the lab
comes from and how to point the suite at it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from ..errors import SoftRdmaError
from .cases import DIRECTIONS, all_cases, select, smoke_cases
from .lab import DEFAULT_CACHE, MAX_GUEST, Lab, LabError, locate_shared
from .report import Result, exit_status, render_table, to_json
from .runner import Options, Suite

__all__ = ["add_arguments", "run", "main"]

PROG = "softrdma interop"
#: what a user without the lab reads (docs/interop-lab.md says more)
LAB_HELP = (
    "The lab (lab/build.sh and lab/run.sh: qemu guests running Linux rdma_rxe and siw) is "
    "not part of softrdma's repository or package; it comes with the developers' shared "
    "folder, which sits beside a checkout in their workspace (../shared). Copy that "
    "folder (or at least its lab/ directory) anywhere and set SOFTRDMA_SHARED to it, e.g. "
    "SOFTRDMA_SHARED=/opt/softrdma-shared (holding lab/run.sh). Without the lab, "
    "`softrdma interop --list` still lists the cases; the rest of the test suite does not "
    "need it. See docs/interop-lab.md."
)


class Terminated(SoftRdmaError):
    """The run was stopped by a signal (after tearing down what it started)."""


def _guest(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"guest must be a number, not {text!r}") from None
    if not 1 <= n <= MAX_GUEST:
        raise argparse.ArgumentTypeError(f"guest must be 1..{MAX_GUEST} (run.sh numbers "
                                         "guests gN at 10.50.0.1N)")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smoke", action="store_true",
                   help="only the CI subset: rc_pingpong, rping over rxe, siw and siw-crc")
    p.add_argument("--cases", metavar="PATTERN", default=None,
                   help="only cases whose name matches (comma-separated shell patterns)")
    p.add_argument("--guest", type=_guest, default=1, metavar="N",
                   help="use guest gN (10.50.0.1N), booting it if it is not running "
                   "(default 1)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--keep", action="store_true",
                   help="leave the guest (if this run booted it) and the namespace up")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--out-dir", type=Path, default=None, metavar="DIR",
                   help="where captures and logs go (default "
                   "$LAB_CACHE/interop/<time>-g<N>)")


def run(args: argparse.Namespace) -> int:
    cases = select(smoke_cases() if args.smoke else all_cases(), args.cases)
    if not cases:
        raise SoftRdmaError(f"no case matches {args.cases!r} (see --list)")
    if args.list:
        for c in cases:
            print(c.name)
        return 0
    try:
        shared = locate_shared()
    except LabError as exc:
        raise LabError(f"{exc}.\n{LAB_HELP}") from None
    if os.geteuid() != 0:
        raise SoftRdmaError("the lab needs root (network namespaces, qemu, tcpdump)")
    lab = Lab(shared, Path(os.environ.get("LAB_CACHE", str(DEFAULT_CACHE))))

    def progress(msg: str) -> None:
        print(f"[interop] {msg}", file=sys.stderr, flush=True)

    def on_result(r: Result) -> None:
        if not args.json:
            print(f"{r.case:28} {r.direction:16} {r.result}"
                  + (f"  ({r.reasons[0]})" if r.reasons else ""), flush=True)

    def terminated(signum: int, _frame: object) -> None:
        raise Terminated(f"stopped by signal {signal.Signals(signum).name}")

    # SIGTERM/SIGHUP end the run through its teardown, like Ctrl-C
    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, terminated)
    suite = Suite(lab, Options(guest=args.guest, keep=args.keep, out_dir=args.out_dir),
                  progress)
    progress(f"{len(cases)} cases x {len(DIRECTIONS)} directions on g{args.guest}; "
             f"captures in {suite.out_dir}")
    results = suite.run(cases, on_result)
    print(to_json(results) if args.json else "\n" + render_table(results))
    return exit_status(results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m softrdma.interop",
                                description="softrdma against Linux rxe/siw in the lab")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (SoftRdmaError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130

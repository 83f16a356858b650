"""``python -m softrdma.interop.devstats NAME``: print a running devd's counters as JSON.

Run inside the suite's namespace with the suite's ``SOFTRDMA_STATE_DIR``: it connects
to the device's devd without starting one (``spawn=False``) and prints
``{"rx": N, ...}`` (:data:`softrdma.drivers.devd.daemon.STAT_NAMES`); exit status 1 with one
line on stderr when no devd answers."""

from __future__ import annotations

import json
import sys

from ..drivers.devd.client import DevdLink
from ..drivers.host.registry import Registry
from ..errors import SoftRdmaError


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m softrdma.interop.devstats NAME", file=sys.stderr)
        return 2
    try:
        record = Registry().get(args[0])
        with DevdLink(record, spawn=False, direct=False) as link:
            print(json.dumps(link.stats()))
    except (SoftRdmaError, OSError) as exc:
        print(f"softrdma interop devstats: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

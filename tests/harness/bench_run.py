"""``bench/run.py --json --quick`` as the bench tests run it: one place for the command
line and the check that it succeeded (the figures themselves are not asserted:
benchmarks print, tests check behaviour)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH_RUN = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def quick_run(runs: int, *figures: str, timeout: float) -> dict[str, Any]:
    """The JSON object of a quick ``bench/run.py`` run of ``runs`` runs of ``figures``
    (each an ``--only``); fails with the run's stderr if it exited non-zero."""
    only = [arg for f in figures for arg in ("--only", f)]
    out = subprocess.run(
        [sys.executable, str(BENCH_RUN), "--json", "--quick", "--runs", str(runs), *only],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc

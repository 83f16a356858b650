"""``bench/run.py`` gains the lossy-link goodput figures (issue 25): each run gives the
goodput at 1 % / 5 % loss beside the same link's goodput without loss, seeded per run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def test_lossy_goodput_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--json", "--quick", "--runs", "2",
         "--only", "lossy_goodput_1", "--only", "lossy_goodput_5"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    figs = json.loads(out.stdout)["figures"]
    assert list(figs) == ["lossy_goodput_1", "lossy_goodput_5"]
    for name, goal in (("lossy_goodput_1", ">= 0.6"), ("lossy_goodput_5", ">= 0.3")):
        f = figs[name]
        assert f["error"] is None and f["goal"] == goal
        assert len(f["softrdma"]) == len(f["baseline_values"]) == 2
        # a lossy link never beats the clean one, and the clean one carries data
        assert all(0 < o <= b for o, b in zip(f["softrdma"], f["baseline_values"], strict=True))

"""``bench/run.py`` gains the lossy-link goodput figures (issue 25): each run gives the
goodput at 1 % / 5 % loss beside the same link's goodput without loss, seeded per run."""

from __future__ import annotations

from harness.bench_run import quick_run


def test_lossy_goodput_figures() -> None:
    figs = quick_run(2, "lossy_goodput_1", "lossy_goodput_5", timeout=120)["figures"]
    assert list(figs) == ["lossy_goodput_1", "lossy_goodput_5"]
    for name, goal in (("lossy_goodput_1", ">= 0.6"), ("lossy_goodput_5", ">= 0.3")):
        f = figs[name]
        assert f["error"] is None and f["goal"] == goal
        assert len(f["softrdma"]) == len(f["baseline_values"]) == 2
        # a lossy link never beats the clean one, and the clean one carries data
        assert all(0 < o <= b for o, b in zip(f["softrdma"], f["baseline_values"], strict=True))

"""``bench/capi_bench.py``'s pairs (issue 22's two figures in ``bench/run.py``): each side
is measured twice, in the order C, Python, Python, C, and each figure is the mean of its
side's two; ``bench/run.py --only capi_*`` runs them to the end (the figures themselves
are not asserted: benchmarks print, tests check behaviour)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from harness.bench_run import quick_run

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def capi_bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("capi_bench")
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop("capi_bench", None)


def test_alternated_runs_both_orders_and_averages_each_side(capi_bench: ModuleType) -> None:
    calls: list[bool] = []
    values = iter([10.0, 100.0, 300.0, 30.0])  # C, Python, Python, C

    def one(c: bool) -> float:
        calls.append(c)
        return next(values)

    c, py = capi_bench.alternated(one)
    assert calls == [True, False, False, True]
    assert (c, py) == (20.0, 200.0)


def test_alternated_passes_a_failure_on(capi_bench: ModuleType) -> None:
    """A pair that fails stops the run with its error (``bench/run.py`` reports it as the
    figure's error), not with a figure made of the pairs that ran."""
    def one(c: bool) -> float:
        if not c:
            raise capi_bench.BenchError("rc-pingpong failed")
        return 1.0

    with pytest.raises(capi_bench.BenchError, match="rc-pingpong failed"):
        capi_bench.alternated(one)


def test_run_capi_figures_quick() -> None:
    from softrdma.capi import build
    missing = build.missing_packages()
    if missing:
        pytest.skip("the C interface cannot be built here: install " + ", ".join(missing))
    figs = quick_run(1, "capi_rc_lat", "capi_write_bw", timeout=600)["figures"]
    assert list(figs) == ["capi_write_bw", "capi_rc_lat"]
    for fig in figs.values():
        assert fig["error"] is None, fig["error"]
        assert len(fig["softrdma"]) == len(fig["baseline_values"]) == 1
        assert fig["softrdma"][0] > 0 and fig["baseline_values"][0] > 0

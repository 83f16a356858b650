"""Example budgets of the property tests.

A normal run (and CI's derandomized run) uses each test's own budget. The slow job
(``.ci/slow``, ``HYPOTHESIS_PROFILE=slow``) multiplies every budget by
``SOFTRDMA_PROPERTY_SCALE`` (default 10) and draws new random examples each run, so that
the derandomized run is not the only exploration the engines get."""

from __future__ import annotations

import os

SLOW = os.environ.get("HYPOTHESIS_PROFILE") == "slow"
SCALE = int(os.environ.get("SOFTRDMA_PROPERTY_SCALE", "10")) if SLOW else 1


def examples(n: int) -> int:
    """The example budget for a test whose normal budget is ``n``."""
    return n * SCALE

"""The fuzz targets (``tests/harness/fuzz_targets.py``, driven by ``tools/dev/fuzz.py``
with atheris) on seeded random inputs: each keeps running (its harness is not broken by a
change elsewhere) and lets no exception out. A cheap fuzz run of its own too: the inputs
are random bytes, new with each seed (``SOFTRDMA_FUZZ_SEED``, default fixed); the slow
job (``.ci/slow``) runs 20,000 per target (``SOFTRDMA_FUZZ_INPUTS``) with a new seed each
run."""

from __future__ import annotations

import os
import random

import pytest
from harness.fuzz_targets import TARGETS, Provider, close_devd

INPUTS = int(os.environ.get("SOFTRDMA_FUZZ_INPUTS", "300"))
SEED = int(os.environ.get("SOFTRDMA_FUZZ_SEED", "2026"))


def test_provider_takes_values_from_the_front_then_the_smallest() -> None:
    p = Provider(bytes([7, 0x01, 0x02, 200]))
    assert p.number(0, 9) == 7            # one byte, mod 10
    assert p.number(0, 0xFFFF) == 0x0102  # two bytes
    assert p.flag() is False           # 200 % 2
    assert (p.number(5, 9), p.flag(), p.raw(3)) == (5, False, b"")
    assert Provider(bytes([1, 2, 3])).mutate(b"abcdef", 0) == b"abcdef"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_target_runs_on_random_inputs(name: str) -> None:
    rng = random.Random(f"{SEED}:{name}")
    target = TARGETS[name]
    n = max(1, INPUTS // 4) if name in ("ibcm", "pcap") else INPUTS  # the slow ones
    try:
        for _ in range(n):
            target(rng.randbytes(rng.randrange(0, 400)))
    finally:
        close_devd()  # the devd target's, if it started one

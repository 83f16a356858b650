"""``softrdma rdma-core-tests --hugepages N``: the 2 MiB huge-page pool is raised for the
run and given back after (softrdma.tools.suites.hugepages), so rdma-core's huge-page MR tests
(test_odp, test_parent_domain) run instead of skipping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from softrdma.tools.suites import hugepages


def test_pool_raised_inside_and_restored_after(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("reserving huge pages needs root")
    pool = tmp_path / "nr_hugepages"
    pool.write_text("0\n")
    with hugepages.reserved(8, pool) as note:
        assert note is None and pool.read_text().strip() == "8"
    assert pool.read_text().strip() == "0"
    pool.write_text("32\n")  # enough already: left alone
    with hugepages.reserved(8, pool) as note:
        assert note is None and pool.read_text().strip() == "32"
    assert pool.read_text().strip() == "32"


def test_someone_elses_change_is_not_undone(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("reserving huge pages needs root")
    pool = tmp_path / "nr_hugepages"
    pool.write_text("0\n")
    with hugepages.reserved(4, pool):
        pool.write_text("64\n")  # another program changed the pool meanwhile
    assert pool.read_text().strip() == "64"


def test_no_pool_or_zero_is_a_note_not_an_error(tmp_path: Path) -> None:
    with hugepages.reserved(4, tmp_path / "missing") as note:
        assert note is not None and "missing" in note
    pool = tmp_path / "nr_hugepages"
    pool.write_text("0\n")
    with hugepages.reserved(0, pool) as note:
        assert note is None
    assert pool.read_text().strip() == "0"


def test_the_real_pool_is_given_back() -> None:
    if os.geteuid() != 0 or hugepages._read(hugepages.NR_HUGEPAGES_2M) is None:
        pytest.skip("needs root and a 2 MiB huge page pool")
    before = hugepages._read(hugepages.NR_HUGEPAGES_2M)
    assert before is not None
    with hugepages.reserved(before + 2) as note:
        if note is None:
            assert (hugepages._read(hugepages.NR_HUGEPAGES_2M) or 0) >= before + 2
    assert hugepages._read(hugepages.NR_HUGEPAGES_2M) == before

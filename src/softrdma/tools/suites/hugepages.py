"""Huge pages for the length of a run (``softrdma rdma-core-tests --hugepages N``).

rdma-core's tests that register memory backed by 2 MiB huge pages (``test_odp``'s
``*_huge_*`` and ``test_parent_domain``'s ``test_huge_page_traffic``;
rdma-core's ``tests/utils.py`` ``requires_huge_pages``) skip unless the kernel has some
reserved (``/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages``). softrdma registers any
memory, huge pages included, so as root the suite reserves a few for the run and gives
them back afterwards (Linux ``Documentation/admin-guide/mm/hugetlbpage.rst``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["NR_HUGEPAGES_2M", "reserved"]

#: the 2 MiB pool the tests look at
NR_HUGEPAGES_2M = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")


def _read(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@contextmanager
def reserved(count: int, path: Path = NR_HUGEPAGES_2M) -> Iterator[str | None]:
    """Make at least ``count`` 2 MiB huge pages reserved inside the block, restoring the
    previous number after it (unless someone else changed it meanwhile). Yields a note
    for the report when the pool could not be raised (not root, no hugetlb, no memory),
    None otherwise."""
    before = _read(path)
    if count <= 0 or (before is not None and before >= count):
        yield None
        return
    if before is None:
        yield f"no 2 MiB huge page pool ({path} is missing)"
        return
    if os.geteuid() != 0:
        yield f"reserving huge pages needs root ({path} is {before})"
        return
    try:
        path.write_text(f"{count}\n")
    except OSError as exc:
        yield f"could not reserve {count} huge pages: {exc.strerror}"
        return
    got = _read(path)
    try:
        yield None if got is not None and got >= count else (
            f"the kernel reserved {got} of {count} huge pages")
    finally:
        if _read(path) == got:
            try:
                path.write_text(f"{before}\n")
            except OSError:
                pass

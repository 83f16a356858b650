"""An implicit ODP MR's bounds check (softrdma.verbs.procmem.mapped): is a range mapped
with the permissions asked? Answered by the kernel's PROCMAP_QUERY (Linux 6.11), or by
reading /proc/self/maps where the kernel lacks it: both must agree on every kind of
range (inside one mapping, across adjacent ones, over a hole, into a read-only mapping
for a write, at address 0 and above the address space), and a forked child must ask
about its own memory, not its parent's."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator

import pytest

from softrdma.verbs import procmem

PAGE = mmap.PAGESIZE
PROT_READ, PROT_WRITE = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


@pytest.fixture()
def layout() -> Iterator[int]:
    """Six pages from ``base``: read-write, read-write, read-only, a hole, read-write, no
    access; and below ``base`` a page of no access. The two no-access pages fence the
    layout: a mapping the kernel placed right beside it (mmap goes top-down, into the
    highest gap that fits) would otherwise make the bytes past either end readable."""
    start = _libc.mmap(None, 7 * PAGE, PROT_READ | PROT_WRITE, 0x22, -1, 0)  # PRIVATE|ANON
    assert start not in (None, ctypes.c_void_p(-1).value)
    base = start + PAGE
    assert _libc.mprotect(start, PAGE, 0) == 0
    assert _libc.mprotect(base + 2 * PAGE, PAGE, PROT_READ) == 0
    assert _libc.munmap(base + 3 * PAGE, PAGE) == 0
    assert _libc.mprotect(base + 5 * PAGE, PAGE, 0) == 0
    yield base
    _libc.munmap(start, 4 * PAGE)
    _libc.munmap(base + 4 * PAGE, 2 * PAGE)


def _cases(base: int) -> list[tuple[int, int, bool, bool]]:
    """(address, length, write, expected)."""
    return [
        (base, 1, True, True), (base, 2 * PAGE, True, True),
        (base + PAGE - 8, 16, True, True),
        (base, 3 * PAGE, False, True), (base, 3 * PAGE, True, False),  # into read-only
        (base + 2 * PAGE, PAGE, False, True), (base + 2 * PAGE, 1, True, False),
        (base + 2 * PAGE, PAGE + 1, False, False),  # into the hole
        (base + 3 * PAGE, 1, False, False), (base, 5 * PAGE, False, False),
        (base + 4 * PAGE, PAGE, True, True), (base + 4 * PAGE, PAGE + 1, False, False),
        (base + 5 * PAGE, 1, False, False),
        (base - 1, 2, False, False), (0, 8, False, False), (1 << 47, 8, False, False),
        ((1 << 64) - 16, 8, False, False), (base, 0, True, True),
    ]


def test_the_query_and_the_maps_file_agree(layout: int) -> None:
    fd = procmem._query_maps_fd()
    for addr, n, write, want in _cases(layout):
        assert procmem.mapped(addr, n, write) is want, (hex(addr), n, write)
        if n:
            assert procmem._mapped_by_maps(addr, addr + n, write) is want, (hex(addr), n)
            if fd is not None:
                assert procmem._mapped_by_query(fd, addr, addr + n, write) is want


def test_the_query_reads_no_maps_file(layout: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel answers PROCMAP_QUERY, the whole file is never read (440 us a
    check in a softrdma run process: ibv_rc_pingpong -O took 2 ms an iteration)."""
    if procmem._query_maps_fd() is None:
        pytest.skip(f"this kernel ({os.uname().release}) has no PROCMAP_QUERY (Linux 6.11)")

    def no_read() -> list[tuple[int, int, str]]:
        raise AssertionError("/proc/self/maps read")

    monkeypatch.setattr(procmem, "_maps", no_read)
    assert procmem.mapped(layout, 2 * PAGE, True) and not procmem.mapped(layout, 3 * PAGE, True)


def test_a_forked_child_asks_about_its_own_memory(layout: int) -> None:
    """The child unmaps a page the parent keeps: its answer changes, the parent's not;
    the child closes the descriptor it inherited for the one it opens."""
    assert procmem.mapped(layout, PAGE, True)  # the descriptor is open before the fork
    inherited = procmem._query_fd
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            _libc.munmap(layout, PAGE)
            ok = not procmem.mapped(layout, PAGE, False) and procmem.mapped(
                layout + PAGE, PAGE, True)
            if inherited is not None and inherited[1] is not None:
                mine = procmem._query_fd
                assert mine is not None and mine[0] == os.getpid()
                ok = ok and os.readlink(f"/proc/self/fd/{mine[1]}").endswith("/maps")
                if mine[1] != inherited[1]:  # the inherited one is closed
                    try:
                        os.fstat(inherited[1])
                        ok = False
                    except OSError:
                        pass
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert procmem.mapped(layout, PAGE, True)

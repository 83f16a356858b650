"""The rdma_cm device list's driver side (:mod:`softrdma.drivers.cm.cm_devices`): the kept
list is read once and again after a change, and a forked child reads it on its own,
even when the parent forked while another thread held the list's lock (the child has
no such thread to release it)."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import weakref

import pytest
from harness.collect import Cyclic, collect_while_holding, collector_paused, finishes

from softrdma.cm import rdma_devices as rd
from softrdma.drivers.cm.cm_devices import KeptList, OpenTable
from softrdma.verbs.device import IWARP_LOOPBACK

DEADLINE = 60.0  # generous: the machine is shared


def test_kept_list_reads_once_until_forgotten() -> None:
    reads: list[int] = []

    def read() -> list[int]:
        reads.append(1)
        return [len(reads)]

    kept = KeptList(read)
    first = kept.get()
    assert kept.get() == first  # kept (or, without rtnetlink, read each time)
    kept.forget()
    assert kept.get() == [len(reads)]


def test_open_table_opens_each_name_once_under_concurrency() -> None:
    table: OpenTable[object] = OpenTable()
    opened: list[object] = []
    start = threading.Barrier(8)

    def make() -> object:
        obj = object()
        opened.append(obj)
        return obj

    got: list[object] = []

    def worker() -> None:
        start.wait(DEADLINE)
        got.append(table.get_or_open("dev", make))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert len(opened) == 1 and got == opened * 8
    assert table.values() == opened
    assert table.pop("other") == [] and table.pop() == opened and table.values() == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_while_the_list_is_locked_reads_its_own() -> None:
    rd.candidates()
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with rd._candidates._lock:
            held.set()
            release.wait(DEADLINE)

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert held.wait(DEADLINE)
    try:
        pid = os.fork()
        if pid == 0:  # the child: the holder thread is not here
            signal.alarm(int(DEADLINE))  # a hang ends the child with SIGALRM
            try:
                ok = any(d.name == IWARP_LOOPBACK for d in rd.candidates())
            except BaseException:  # noqa: BLE001 - reported by the exit status
                ok = False
            os._exit(0 if ok else 3)
    finally:
        release.set()
        t.join(DEADLINE)
    deadline = time.monotonic() + DEADLINE + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung reading the device list")
        time.sleep(0.01)  # polling the child's exit: a condition with a deadline
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_open_table_survives_a_finalizer_in_the_thread_that_holds_it() -> None:
    """A garbage collection may run in the middle of any table method, in the thread
    holding the table's lock, and run finalizers that read the table: a context's
    finalizer does (the last report of a shared device lists its rdma_cm ids). With a
    plain lock the thread waited for itself (rdma-core's suite hung so under load); the
    finalizer now reads and changes the table, and the method it interrupted ends."""
    table: OpenTable[str] = OpenTable()
    table.get_or_open("a", lambda: "A")
    table.get_or_open("b", lambda: "B")
    seen: list[list[str]] = []

    def finalizer() -> None:
        seen.append(table.values())
        seen.append(table.pop("b"))
        table.each(lambda v: seen.append([v]))

    def opener() -> str:
        obj = Cyclic()
        weakref.finalize(obj, finalizer)
        del obj
        gc.collect()  # as an allocation inside the method may start one
        return "C"

    def drop(v: str) -> None:
        table.pop(v.lower())

    with collector_paused():
        assert finishes(lambda: seen.append([table.get_or_open("c", opener)]))
        assert finishes(lambda: table.each(drop))  # a walk over a copy: fn may pop
    assert seen == [["A", "B"], ["B"], ["A"], ["C"]]
    assert table.values() == []


def test_a_context_freed_by_a_collection_in_a_thread_holding_the_file_table() -> None:
    """A context whose last reference went with a cycle is released by the collection
    that frees it, in whichever thread ran it, and its release takes the table of open
    command files: a collection started while that thread held the table (opening
    another context) waited for itself."""
    from softrdma import verbs as v
    from softrdma.verbs import context_file

    with collector_paused():
        ctx = v.Context(IWARP_LOOPBACK)
        holder = Cyclic()
        holder.ctx = ctx  # type: ignore[attr-defined]
        runtime = ctx.runtime
        del ctx, holder
        assert collect_while_holding(context_file._files_lock)
        assert runtime.closed


def test_an_imported_context_freed_by_a_collection_inside_its_file() -> None:
    """An imported context shares its command file with the one it came from; freed by
    a collection that started while its thread held that file (numbering an object,
    ``new_handle``), its release takes the file's lock again in the same thread."""
    from softrdma import verbs as v

    ctx = v.Context(IWARP_LOOPBACK)
    try:
        file = ctx._file
        with collector_paused():
            imported = v.Context.import_device(os.dup(ctx.async_fileno()))
            holder = Cyclic()
            holder.ctx = imported  # type: ignore[attr-defined]
            del imported, holder
            assert collect_while_holding(file._lock)
        assert file.users == 1 and not file.closed
    finally:
        ctx.close()

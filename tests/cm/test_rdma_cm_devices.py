"""The rdma_cm device list's driver side (:mod:`softrdma.drivers.cm.cm_devices`): the kept
list is read once and again after a change, and a forked child reads it on its own,
even when the parent forked while another thread held the list's lock (the child has
no such thread to release it)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

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

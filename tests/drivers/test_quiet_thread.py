"""softrdma's own threads block the asynchronous signals from birth, and starting one
leaves the starting thread's mask as it was (drivers/runtime/threads.py)."""

from __future__ import annotations

import signal

from softrdma.drivers.runtime.threads import ASYNC_SIGNALS, QuietThread


def _mask_in_thread(cls: type) -> set[int]:
    seen: list[set[int]] = []
    t = cls(target=lambda: seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, []))))
    t.start()
    t.join(30)
    assert seen, "the thread did not run"
    return seen[0]


def test_a_quiet_thread_blocks_every_asynchronous_signal_and_no_fault() -> None:
    mask = _mask_in_thread(QuietThread)
    assert ASYNC_SIGNALS <= mask
    for fault in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL):
        assert fault not in mask
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM} <= ASYNC_SIGNALS


def test_starting_one_leaves_the_starting_threads_mask() -> None:
    before = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    _mask_in_thread(QuietThread)
    assert set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) == before
    assert signal.SIGUSR1 not in before  # (a plain thread would have it unblocked)

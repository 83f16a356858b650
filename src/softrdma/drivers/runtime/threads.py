"""softrdma's own threads (progress, workers, CM deadlines and delivery, port watch) leave
the process's signals to the application's threads.

A signal sent to a process goes to one of its threads that does not block it. A C program
under ``softrdma run`` that blocks a signal in its threads and takes it with
``sigwait(3)`` in one of them (a server's usual pattern) would otherwise have it delivered
to a softrdma thread instead, whose default action ends the process (SIGUSR1, SIGTERM);
a handler would run on a thread the program does not know. libibverbs starts no thread, so
with it every signal reached the program's own. A Python application loses nothing: its
handlers run on its main thread anyway, and a signal now interrupts that thread's system
calls rather than a softrdma thread's.

So :class:`QuietThread` starts its thread with every asynchronous signal blocked, from
birth: :meth:`QuietThread.start` blocks them in the starting thread for the moment of the
start (a new thread inherits its creator's mask), then restores that thread's mask. The
signals a thread raises itself by a fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
SIGSYS) stay unblocked: the kernel delivers them to the faulting thread in any case.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["QuietThread", "ASYNC_SIGNALS"]

_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP,
           signal.SIGSYS}
_UNBLOCKABLE = {signal.SIGKILL, signal.SIGSTOP}
#: the signals a softrdma thread blocks: every one but the faults a thread raises itself
#: (and SIGKILL and SIGSTOP, which no thread can block)
ASYNC_SIGNALS = frozenset(s for s in signal.valid_signals()
                          if s not in _FAULTS and s not in _UNBLOCKABLE)


class QuietThread(threading.Thread):
    """A :class:`threading.Thread` of softrdma's own that blocks :data:`ASYNC_SIGNALS`."""

    def start(self) -> None:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, ASYNC_SIGNALS)
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

"""Waiting in tests without fixed sleeps (issue 25: the suite must pass on a busy machine).

A test waits for a *condition* with a generous deadline, never for a fixed time: on an idle
machine the condition comes at once and the test stays fast; on a loaded one the deadline
leaves room. :func:`wait_until` polls a predicate; :class:`StreamLines` reads a child
process's stream in a thread so that a test can wait for a line (a server's ``waiting for
a client`` or ``listening``) instead of sleeping until it has probably been printed.

A test that must see something *not* happen (a server still waiting past its
``--timeout``) first waits for the condition that starts the observation (the server's
line), then observes for a bounded window: that window is the one sleep allowed, and it
is not a guess at how long something takes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

__all__ = ["DEFAULT_TIMEOUT", "PAST_TIMEOUT", "load_factor", "wait_until", "StreamLines",
           "waits_until_stopped", "Capture"]

T = TypeVar("T")

DEFAULT_TIMEOUT = 120.0  # seconds: far beyond what anything takes even at load 10


def load_factor() -> float:
    """How much slower than idle this machine is now: the 1-minute load average per core,
    at least 1 (scales deadlines of things whose duration grows with load)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def wait_until(cond: Callable[[], T | None], timeout: float = DEFAULT_TIMEOUT,
               what: str = "the condition", interval: float = 0.05) -> T:
    """Poll ``cond`` until it returns something true and return it; AssertionError naming
    ``what`` if ``timeout`` seconds pass first (the last value is in the message)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not true within {timeout:g} s (last: {got!r})")
        time.sleep(interval)


class StreamLines:
    """Every line a child process writes on one stream, collected by a thread.

    ``wait_for(pattern)`` waits until a line matches (AssertionError if the stream ends or
    the deadline passes); ``text()`` is everything read so far, ``join()`` waits for the
    end of the stream (after the process exited) and returns all of it."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._done = threading.Event()

        def pump() -> None:
            try:
                for line in stream:
                    self.lines.append(line)
            finally:
                self._done.set()

        self._thread = threading.Thread(target=pump, daemon=True)
        self._thread.start()

    def wait_for(self, pattern: str, timeout: float = DEFAULT_TIMEOUT) -> re.Match[str]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            ended = self._done.is_set()  # read before the lines: none is missed
            for line in self.lines[seen:]:
                seen += 1
                if (m := rx.search(line)) is not None:
                    return m
            if ended:
                raise AssertionError(f"stream ended without a line matching {pattern!r}: "
                                     f"{self.text()!r}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"no line matching {pattern!r} within {timeout:g} s: "
                                     f"{self.text()!r}")
            self._done.wait(0.02)

    def text(self) -> str:
        return "".join(self.lines)

    def join(self, timeout: float = DEFAULT_TIMEOUT) -> str:
        self._thread.join(timeout)
        return self.text()


PAST_TIMEOUT = 3.0  # the observation window after a server's ready line: 3 x its --timeout 1


def waits_until_stopped(cmd: list[str], env: dict[str, str], ready: str,
                        on: str = "stderr", stop: bool = True) -> tuple[int, str, str]:
    """Start the server ``cmd``; once it printed a line matching ``ready`` (on ``on``:
    "stdout" or "stderr"), watch it for :data:`PAST_TIMEOUT` s: it must still run (a
    server that waits for its first client with no limit). Then Ctrl-C it (``stop``;
    else kill it) and return (returncode, stdout, stderr)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stderr is not None
    out, err = StreamLines(p.stdout), StreamLines(p.stderr)
    try:
        (out if on == "stdout" else err).wait_for(ready)
        time.sleep(PAST_TIMEOUT)  # not a wait for something: nothing may happen meanwhile
        assert p.poll() is None, (p.returncode, out.text(), err.text())
        if stop:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=DEFAULT_TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, out.join(), err.join()


class Capture:
    """A capture (tshark, dumpcap or tcpdump writing a file) that a test starts before its
    traffic and stops after it, without guessing how long either takes.

    It is started once the tool captures. tcpdump says so (``listening on``, printed once
    its socket is open). tshark and dumpcap print ``Capturing on`` *before* they open the
    interface (tshark even before it starts dumpcap), so frames sent right after that line
    can be missed on a busy machine; with ``-w FILE`` dumpcap opens the interface, installs
    the filter, then writes and flushes the file's header, so the capture is started once
    FILE holds a header. :meth:`stop` first
    waits until ``until()`` (a check of the file the test makes anyway: the last frames
    are there) is true, at most ``timeout`` seconds (then the test checks what the file
    holds), and then stops the tool with SIGINT (it writes what it has)."""

    def __init__(self, argv: list[str], ready: str = r"Capturing on|listening on",
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stderr is not None
        self.err = StreamLines(self.proc.stderr)
        try:
            self.err.wait_for(ready, timeout)
            if "-w" in argv and Path(argv[0]).name in ("tshark", "dumpcap"):
                out = Path(argv[argv.index("-w") + 1])
                wait_until(lambda: out.exists() and out.stat().st_size > 0, timeout=timeout,
                           what=f"the capture header in {out}", interval=0.02)
        except BaseException:
            self.stop()
            raise

    def stop(self, until: Callable[[], object] | None = None, timeout: float = 60.0) -> None:
        if until is not None and self.proc.poll() is None:
            try:
                wait_until(until, timeout=timeout, what="the traffic in the capture",
                           interval=0.5)
            except AssertionError:
                pass  # the test's own checks of the file say what is missing
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=DEFAULT_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.join(10)

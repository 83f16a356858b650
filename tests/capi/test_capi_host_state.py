"""``softrdma run``: what softrdma's embedded Python must leave as a C program had it
(tests/capi/signal_wait.c, tests/capi/locale_kept.c). Signals: a signal while the program
blocks in a verb that waits for an event (issue 22's errors "the libibverbs way":
libibverbs waits in read(2) of the channel, so a handler without SA_RESTART ends the wait
with EINTR, as qperf stops its test loop, and one with SA_RESTART lets it go on), SIGINT,
SIGPIPE and SIGXFSZ, signals a program takes with sigwait(3) in a thread of its own
(softrdma's threads block them), and exit() from a signal handler
(tests/capi/exit_in_handler.c). The locale: the program's, not the environment's."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import compile_c, need_build, run
from harness.device import private_device


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    need_build()
    yield private_device("capisig", tmp_path, monkeypatch)


def test_a_handler_without_sa_restart_ends_the_wait_with_eintr(device: str,
                                                                tmp_path: Path) -> None:
    """ibv_get_cq_event and ibv_get_async_event return -1 with EINTR once a SIGALRM
    handler installed without SA_RESTART ran (before: the wait went on until an event)."""
    p = run(str(compile_c(tmp_path, "signal_wait", "-libverbs")), device, "norestart")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "cq_event EINTR" in p.stdout and "async_event EINTR" in p.stdout, p.stdout
    assert "Traceback" not in p.stderr


def test_a_handler_with_sa_restart_leaves_the_wait_to_its_event(device: str,
                                                                 tmp_path: Path) -> None:
    """With SA_RESTART the wait goes on through the signal and returns the event of the
    loopback SEND another thread posts later: the CQ, the received bytes and both
    completions checked."""
    p = run(str(compile_c(tmp_path, "signal_wait", "-libverbs", "-lpthread")), device,
            "restart")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "cq_event through SA_RESTART" in p.stdout and p.stdout.rstrip().endswith("ok"), \
        p.stdout
    assert "Traceback" not in p.stderr


def test_sigint_stays_the_programs(device: str, tmp_path: Path) -> None:
    """A C program starts with SIGPIPE and SIGXFSZ at the default (the Python of `softrdma
    run` ignores them, and exec kept them ignored), and once softrdma's Python is up in
    it SIGINT is still the default (Python's ``signal`` module, first imported, had set its
    KeyboardInterrupt handler, and Ctrl-C no longer ended the program): a SIGINT ends the
    program as usual; a handler the program installed before its first verb stays."""
    exe = str(compile_c(tmp_path, "signal_wait", "-libverbs", "-lpthread"))
    p = run(exe, device, "sigint")
    assert p.returncode == -signal.SIGINT, (p.returncode, p.stdout, p.stderr)
    assert "sigint default" in p.stdout, p.stdout
    p = run(exe, device, "sigint-own")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "sigint own" in p.stdout, p.stdout


def test_the_programs_locale_stays(device: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that never called setlocale runs in the "C" locale before and after its
    first verbs, with a UTF-8 locale in the environment (Python's start-up had given it
    that one)."""
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.delenv("LC_ALL", raising=False)
    monkeypatch.delenv("LC_CTYPE", raising=False)
    p = run(str(compile_c(tmp_path, "locale_kept", "-libverbs")), device)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.count(": C -> C\n") == 6 and p.stdout.rstrip().endswith("ok"), p.stdout


def test_signals_reach_the_programs_threads_not_softrdmas(device: str,
                                                         tmp_path: Path) -> None:
    """A program that blocks SIGUSR1 and SIGTERM and takes them with sigwait(3) in its own
    thread gets them there, with softrdma's threads running (before, the kernel gave them
    to a softrdma thread, which had them unblocked, and SIGUSR1 ended the process)."""
    p = run(str(compile_c(tmp_path, "signal_wait", "-libverbs", "-lpthread")), device,
            "sigwait")
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert "the last SIGTERM" in p.stdout and p.stdout.rstrip().endswith("ok"), p.stdout


def test_exit_from_a_signal_handler_ends_the_program(device: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A program whose signal handler calls exit() while its main thread is inside a verb
    ends with the handler's status. qperf's server does this when its client fails: the
    SIGURG handler calls die(), which calls exit(). softrdma's Python must not load
    OpenSSL's libcrypto. ``secrets`` loaded it (through ``hmac`` and ``hashlib``), and
    its exit handler frees memory. With the signal inside malloc, that handler waited
    forever for the malloc lock the interrupted call held, and qperf hung
    (tests/capi/exit_in_handler.c)."""
    monkeypatch.setenv("SOFTRDMA_CAPI_DEVICE", device)  # the rdma_cm id's device
    exe = str(compile_c(tmp_path, "exit_in_handler", "-libverbs", "-lrdmacm"))
    for _ in range(3):
        p = run(exe, device, timeout=120.0)
        assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
        assert p.stdout.splitlines() == ["libcrypto not mapped"], p.stdout
        assert "Traceback" not in p.stderr

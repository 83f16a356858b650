"""QPNs a devd client leases and releases without an exchange per QP (issue 26):
:meth:`DevdLink.lease_qpn` takes QPN_LEASE numbers in one exchange, :meth:`release_qpn`
gives numbers back QPN_LEASE at a time without waiting; devd still hands out and owns
every number, and plain requests on the channel still get their own answers."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from harness.devd import Running, running, state  # noqa: F401  (fixtures)

from softrdma.drivers.devd.client import DevdLink
from softrdma.drivers.devd.proto import QPN_FIRST
from softrdma.drivers.devd.requests import QPN_LEASE


def until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:g} s: {what}")
        time.sleep(0.005)


def test_qpns_are_leased_and_given_back_in_batches(running: Running) -> None:  # noqa: F811
    with running.client() as a:
        a.stats()  # an answered request: devd numbers its answers
        first = a.lease_qpn()
        assert first == QPN_FIRST
        # one exchange took a whole lease (the first answer is enough to go on): devd
        # owns QPN_LEASE numbers for us
        until(lambda: len(running.devd._owners) == QPN_LEASE, "a whole lease at devd")
        got = [first] + [a.lease_qpn() for _ in range(QPN_LEASE // 2 - 1)]
        assert len(running.devd._owners) == QPN_LEASE  # no exchange for these
        got.append(a.lease_qpn())  # half of the lease used: the next one is asked for
        until(lambda: len(running.devd._owners) == 2 * QPN_LEASE, "the second lease")
        got += [a.lease_qpn() for _ in range(QPN_LEASE - len(got))]
        assert got == list(range(QPN_FIRST, QPN_FIRST + QPN_LEASE))
        nxt = a.lease_qpn()  # from the second lease, already there
        assert nxt == QPN_FIRST + QPN_LEASE
        assert len(running.devd._owners) == 2 * QPN_LEASE
        for q in got[:-1]:
            a.release_qpn(q)
        assert len(running.devd._owners) == 2 * QPN_LEASE  # kept until a batch is full
        a.release_qpn(got[-1])  # the batch goes, unanswered
        until(lambda: set(running.devd._owners).isdisjoint(got), "the batch freed at devd")
        # answers of the pipelined records are taken, not mistaken for this one's
        assert a.stats()["clients"] == 1
        assert a.stale_replies == 0 and a.qpn_free_errors == 0


def test_a_refused_release_is_counted(running: Running) -> None:  # noqa: F811
    with running.client() as a, running.client() as b:
        a.stats()
        b.stats()
        theirs = b.lease_qpn()
        for _ in range(QPN_LEASE):
            a.release_qpn(theirs)  # not a's: every FREE is refused
        until(lambda: (a.stats(), a.qpn_free_errors)[1] == QPN_LEASE, "refusals counted")
        assert theirs in running.devd._owners
        assert a.stale_replies == 0


def test_an_old_daemon_without_numbered_answers_gets_plain_requests(
        running: Running, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Pipelining needs answers matched by sequence number; until one is seen the link
    asks one QPN at a time."""
    with running.client() as a:
        monkeypatch.setattr(DevdLink, "_numbered", False)
        a._numbered = False
        calls: list[int] = []
        orig = a.alloc_qpn

        def alloc(want: int = 0) -> int:
            calls.append(want)
            return orig(want)
        monkeypatch.setattr(a, "alloc_qpn", alloc)
        q = a.lease_qpn()
        assert calls == [0] and running.devd._owners.keys() == {q}

"""A server and a client run together under ``softrdma run``, their outputs.

(Moved from tests/capi/test_capi_rdmacm.py, which other test files imported.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

from harness.capi import TIMEOUT, run_pair
from harness.device import reap


def _ended_well(cli: subprocess.CompletedProcess[str]) -> bool:
    return cli.returncode == 0


def _client_until_it_connects(srv: subprocess.Popen[str], client: list[str],
                              done: Callable[[subprocess.CompletedProcess[str]], bool]
                              = _ended_well) -> subprocess.CompletedProcess[str]:
    """Run ``client`` until ``done`` with its run (by default: it ended with 0), again
    while the server ``srv`` is not listening yet; a server that ended, or the deadline,
    fails with both outputs (a server still waiting for a client is stopped first)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        cli = subprocess.run(client, capture_output=True, text=True, timeout=TIMEOUT,
                             check=False)
        if done(cli):
            return cli
        if srv.poll() is not None or time.monotonic() > deadline:
            if srv.poll() is None:  # still waiting for a client: stop it, keep its output
                srv.kill()
            out, err = srv.communicate(timeout=TIMEOUT)
            raise AssertionError(f"client failed: rc={cli.returncode} {cli.stdout} "
                                 f"{cli.stderr}; server rc={srv.returncode} {out} {err}")
        time.sleep(0.2)


def pair(server: list[str], client: list[str]) -> tuple[tuple[str, str], tuple[str, str]]:
    """Start ``server``, run ``client`` until it connects (again while the server is not
    listening yet), both to their end with exit status 0: (stdout, stderr) of each."""
    srv = subprocess.Popen(server, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        cli = _client_until_it_connects(srv, client)
        out, err = srv.communicate(timeout=TIMEOUT)
        assert srv.returncode == 0, (out, err)
    finally:
        reap(srv)
    return (out, err), (cli.stdout, cli.stderr)


def against_daemon(server: list[str], client: list[str],
                   done: Callable[[subprocess.CompletedProcess[str]], bool] = _ended_well
                   ) -> subprocess.CompletedProcess[str]:
    """Start ``server``, one that serves until it is stopped (rcopy, cmtime), run
    ``client`` until ``done`` with its run (by default: it ended with 0; again while the
    server is not listening yet, and the server must still run), then stop the server:
    the client's run."""
    srv = subprocess.Popen(server, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        return _client_until_it_connects(srv, client, done)
    finally:
        reap(srv)


#: perftest's clock calibration (``get_cpu_mhz``: the cycle counter against
#: ``gettimeofday`` over short sleeps) fails when its process is descheduled meanwhile:
#: "Correlation coefficient r^2: ... < 0.9", then this line, and exit 1 after the transfer.
#: A busy machine's doing, not the transfer's: the pair is run again.
PERFTEST_CLOCK_FAILED = "Can't produce a report"


def perftest_run_pair(server: list[str], client: list[str], port: int
                      ) -> tuple[list[subprocess.Popen[str]], list[tuple[str, str]]]:
    """:func:`harness.capi.run_pair` for stock perftest: again (generous deadline) while a
    side's clock calibration failed (:data:`PERFTEST_CLOCK_FAILED`)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        procs, outs = run_pair(server, client, port)
        if not any(PERFTEST_CLOCK_FAILED in out + err for out, err in outs):
            return procs, outs
        assert time.monotonic() < deadline, outs


ATTEMPT_S = 60.0  # one -R client: a pair that works takes seconds


#: what perftest's client prints when its first rdma_cm connection (the exchange
#: channel, ``rdma_client_connect``) failed: its server saw nothing and still waits
FIRST_CONNECTION_FAILED = "Unable to perform rdma_client function"


def perftest_pair(server: list[str], client: list[str]
                  ) -> tuple[tuple[str, str], tuple[str, str]]:
    """A perftest ``-R`` pair to its end: (stdout, stderr) of each. The client connects
    twice (perftest's own exchange channel, then the test's QPs), and its server listens
    anew after answering the handshake before the second. A client that came before the
    first listen (a REJECTED event, nothing reached the server: perftest's
    ``establish_connection`` says :data:`FIRST_CONNECTION_FAILED`) is started again
    against the same server, which still waits for its first client. Its next line,
    "Unable to init the socket connection", is no sign of the second connection (taking
    it for one restarted the server on every attempt wherever the client starts faster
    than the server listens: the CI clone, whose installed package is byte-compiled).
    Any other failure is fatal to the pair: a REJECTED second connection (the server
    listens anew late) cannot be retried by perftest 4.5-0.17, whose
    ``rdma_cm_client_connection`` retries with the ids of the nodes its
    ``rdma_cm_destroy_cma`` freed (the library refuses them, EINVAL: the client exits
    instead of dying with SIGBUS), and its server waits for a connection that will not
    come, so both are started again on the same port (generous deadline)."""
    deadline = time.monotonic() + TIMEOUT
    last = "the client hung"
    while True:  # again on the same port: a killed server's listen goes with it (devd)
        srv = subprocess.Popen(server, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        try:
            while True:
                try:
                    cli = subprocess.run(client, capture_output=True, text=True,
                                         timeout=ATTEMPT_S, check=False)
                except subprocess.TimeoutExpired:
                    last = "the client hung"
                    break
                last = f"rc={cli.returncode} {cli.stdout} {cli.stderr}"
                if cli.returncode == 0:
                    out, err = srv.communicate(timeout=TIMEOUT)
                    if srv.returncode and PERFTEST_CLOCK_FAILED in out + err:
                        last = f"server rc={srv.returncode} {out} {err}"
                        break  # its clock, not the transfer: both again
                    assert srv.returncode == 0, (out, err)
                    return (out, err), (cli.stdout, cli.stderr)
                if FIRST_CONNECTION_FAILED not in cli.stdout + cli.stderr:
                    break  # the second connection (or a crash): this server waits for ever
                if srv.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            reap(srv)
        if time.monotonic() > deadline:
            raise AssertionError(f"client failed: {last}")

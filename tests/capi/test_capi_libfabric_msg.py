"""libfabric's verbs provider over connected endpoints, under ``softrdma run``:
``fi_pingpong -p verbs -e msg`` (FI_EP_MSG: an RC QP per connection, set up through
rdma_cm) and ``fi_pingpong -p "verbs;ofi_rxm" -e rdm`` (RxM: reliable datagrams over
those MSG endpoints), data checked (``-c``), between two hosts (network namespaces,
``tests/harness/netns.py``).

libfabric 1.17 lists a device for FI_EP_MSG by the addresses of its interface and skips
the one named ``lo`` (``vrb_getifaddrs``), so the device here sits on each host's
``eth0``, named with ``softrdma run -d``. What made these run: a passive ``fi_getinfo``
with neither node nor service binds ``localhost``, which must bind no device where that
device owns no loopback address (the kernel's ``cma_any_addr``), the
client's ``rdma_getaddrinfo`` carries the server's address in the hints alone, and the
provider's retry count above 7 is taken as 7 (``softrdma.cm.rdma_transport``). RxM
sizes its completion queues by ``FI_UNIVERSE_SIZE`` (default 256): 262144 entries, more
than softrdma's (and rxe's) 32767; ``FI_UNIVERSE_SIZE=16`` makes them fit, on rxe as here. Root only (namespaces); CI runs as root.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import pytest
from harness.capi import need_build, need_tool
from harness.netns import DEVICE, Host, Network, skip_reason

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

PORT = 47592  # fi_pingpong's control port (each host has its own network namespace)
TIMEOUT = 180.0


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    need_tool("fi_pingpong", "libfabric-bin")
    need_build()
    with Network(2, tmp_path_factory.mktemp("fimsg")) as n:
        yield n


def _fi_pingpong(provider: str, ep: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", "run", "-d", DEVICE, "--", "fi_pingpong",
            "-p", provider, "-e", ep, "-c", "-I", "20", "-S", "4096", *extra]


def _pair(server: Host, client: Host, provider: str, ep: str,
          extra_env: dict[str, str] | None = None, logs: list[str] | None = None) -> list[str]:
    env = {"FI_UNIVERSE_SIZE": "16", **(extra_env or {})}
    srv = server.popen(_fi_pingpong(provider, ep, "-B", str(PORT)), env=env)
    try:
        server.wait_tcp_listen(PORT, srv, timeout=TIMEOUT)
        cli = client.run(_fi_pingpong(provider, ep, "-P", str(PORT), server.ipv4),
                         timeout=TIMEOUT, check=False, env=env)
        out, err = srv.communicate(timeout=TIMEOUT)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    assert (srv.returncode, cli.returncode) == (0, 0), (
        f"server rc={srv.returncode}: {out[-1500:]}{err[-1500:]}\n"
        f"client rc={cli.returncode}: {cli.stdout[-1500:]}{cli.stderr[-1500:]}")
    if logs is not None:
        logs += [err, cli.stderr]
    return [out, cli.stdout]


#: fi_pingpong's result row: bytes, #sent, #ack (20 of 20 answered), total, time, ...
ROW = re.compile(r"^4k\s+20\s+=20\s+160k\s+[\d.]+s\s+[\d.]+\s+[\d.]+", re.MULTILINE)


@pytest.mark.parametrize(("provider", "ep"), [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")],
                         ids=["msg", "rxm"])
def test_fi_pingpong_over_connected_endpoints(net: Network, provider: str, ep: str) -> None:
    a, b = net.hosts
    for server, client in ((a, b), (b, a)):
        for out in _pair(server, client, provider, ep):
            assert ROW.search(out), out


def test_fi_pingpong_rxm_over_xrc(net: Network) -> None:
    """RxM over the verbs provider's XRC endpoints (``FI_VERBS_PREFER_XRC=1`` with RxM's
    shared receive context, ``FI_OFI_RXM_USE_SRX=1``): each connection is an XRC INI QP to
    the peer's XRC TGT QP and a reciprocal one back, set up through rdma_cm on
    ``RDMA_PS_TCP`` ids (connected as RC, as Linux does: the kernel's id is RC whatever the
    QP), the SENDs naming the peer's XRC SRQ. libfabric then clears the ids' ``qp`` and
    tears the CM connections down while it goes on using the QPs (librdmacm moves only
    ``id->qp``): the QPs must outlive them. The passive side's ESTABLISHED carries no
    private data (libfabric tells the sides apart by it) and the active side's the REP's
    QPN, as on Linux. Data checked (``-c``), both directions."""
    a, b = net.hosts
    env = {"FI_VERBS_PREFER_XRC": "1", "FI_OFI_RXM_USE_SRX": "1", "FI_LOG_LEVEL": "info",
           "FI_LOG_PROV": "verbs"}
    for server, client in ((a, b), (b, a)):
        logs: list[str] = []
        for out in _pair(server, client, "verbs;ofi_rxm", "rdm", env, logs):
            assert ROW.search(out), out
        for log in logs:  # the provider's own account: XRC connections both ways
            assert "INI Connection Done" in log and "TGT Connection Done" in log, log[-3000:]
            assert "protocol mismatch" not in log and "Failed to create" not in log

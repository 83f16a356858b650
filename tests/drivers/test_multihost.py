"""Three hosts in network namespaces (tests/harness/netns.py): RC, UC and UD (the
pingpong tools) and rdma_cm (``rping``) between every pair of hosts, over RoCEv2 on IPv4
and on IPv6, and over RoCEv1 (issue 11, "Many hosts"). Every endpoint is a separate
process in its host, talking to its own host's devd; traffic crosses veths and a bridge.
RoCEv1 runs on a second device of each host (``rxe1``, ``roce_ver 1``) from its
link-local GID (modified EUI-64 of the MAC, A16.5.1) for the pingpong tools and from the
IPv4 address for rping.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.netns import (
    DEVICE,
    DEVICE_V1,
    GID_IDX_IPV4,
    GID_IDX_IPV6,
    GID_IDX_V1_LINK_LOCAL,
    Host,
    Network,
    skip_reason,
)

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

ITERS = "20"
OOB_PORT = 18515  # ibv_*_pingpong's default out-of-band TCP port
RPING_COUNT = "3"


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with Network(3, tmp_path_factory.mktemp("hosts"), v1_device=True) as n:
        yield n


V1 = 1  # the "family" of the RoCEv1 cases
FAMILIES = pytest.mark.parametrize(
    "family", [4, 6, V1],
    ids=["roce-v2-ipv4", "roce-v2-ipv6", "roce-v1"])


def _addr(h: Host, family: int) -> str:
    return h.ipv6 if family == 6 else h.ipv4  # RoCEv1: the OOB/rdma_cm address is IPv4


def _device_gid(family: int) -> tuple[str, int]:
    if family == V1:
        return DEVICE_V1, GID_IDX_V1_LINK_LOCAL
    return DEVICE, GID_IDX_IPV4 if family == 4 else GID_IDX_IPV6


def _finish(srv: subprocess.Popen[str], cli: subprocess.CompletedProcess[str], what: str) -> str:
    try:
        out, err = srv.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        srv.kill()
        out, err = srv.communicate()
    assert cli.returncode == 0, f"{what} client: {cli.stderr}"
    assert srv.returncode == 0, f"{what} server: {err}"
    return out


# each tool over one family and each family under one tool by default; the other six
# combinations in the slow job (.ci/slow)
@pytest.mark.parametrize(("tool", "extra", "family"), [
    pytest.param(tool, extra, family, id=f"{tid}-{fid}",
                 marks=() if (tid, fid) in {("rc", "roce-v2-ipv4"), ("uc", "roce-v2-ipv6"),
                                            ("ud", "roce-v1")} else pytest.mark.slow)
    for family, fid in ((4, "roce-v2-ipv4"), (6, "roce-v2-ipv6"), (V1, "roce-v1"))
    for tool, extra, tid in (("rc-pingpong", [], "rc"), ("uc-pingpong", [], "uc"),
                             ("ud-pingpong", ["-s", "512"], "ud"))])
def test_pingpong_every_pair(net: Network, tool: str, extra: list[str], family: int) -> None:
    device, gid_idx = _device_gid(family)
    common = ["-d", device, "-g", str(gid_idx), "-n", ITERS, "-c", "--timeout", "30", *extra]
    for a, b in net.pairs():
        srv = a.popen([sys.executable, "-m", "softrdma", tool, *common])
        a.wait_tcp_listen(OOB_PORT, srv)
        cli = b.softrdma(tool, *common, _addr(a, family), check=False, timeout=90)
        out = _finish(srv, cli, f"{tool} {a.name}<-{b.name}")
        # each side names its peer's GID: the traffic really went between the two hosts
        if family != V1:
            assert f"GID {b.gid(family)}" in out
            assert f"GID {a.gid(family)}" in cli.stdout
        else:
            assert f"GID {b.link_local_gid()}" in out
            assert f"GID {a.link_local_gid()}" in cli.stdout
        assert f"{ITERS} iters in" in out and f"{ITERS} iters in" in cli.stdout


@FAMILIES
def test_rdma_cm_rping_every_pair(net: Network, family: int) -> None:
    device = _device_gid(family)[0]
    for a, b in net.pairs():
        addr = _addr(a, family)
        srv = a.popen([sys.executable, "-m", "softrdma", "rping", "-s", "--device", device,
                       "-a", addr, "-C", RPING_COUNT, "-v", "--timeout", "30"])
        # the listener is an rdma_cm id (no TCP port to watch): retry while the server
        # is still starting (its devd answers REJ "invalid service ID" until it listens)
        for _ in range(20):
            cli = b.softrdma("rping", "-c", "--device", device, "-a", addr, "-C", RPING_COUNT,
                             "-v", "--timeout", "30", check=False, timeout=90)
            if cli.returncode == 0 or srv.poll() is not None:
                break
            time.sleep(0.5)
        out = _finish(srv, cli, f"rping {a.name}<-{b.name}")
        pings = [ln for ln in cli.stdout.splitlines() if ln.startswith("ping data: rdma-ping-")]
        assert len(pings) == int(RPING_COUNT)
        assert out.count("server ping data: rdma-ping-") == int(RPING_COUNT)


def test_teardown_removes_everything(tmp_path: Path) -> None:
    """The harness leaves no namespace and no process behind, even when the body fails."""
    names: list[str] = []
    procs: list[subprocess.Popen[str]] = []
    with pytest.raises(RuntimeError, match="boom"):
        with Network(2, tmp_path, device=False) as n:
            names = [h.ns for h in n.hosts] + [n.switch]
            procs = [h.popen(["sleep", "600"]) for h in n.hosts]
            raise RuntimeError("boom")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert names and not any(name in listed for name in names)
    assert all(p.poll() is not None for p in procs)

"""``softrdma run --sysfs``: middleware that looks at /sys/class/infiniband and
/dev/infiniband itself (UCX, libfabric), on softrdma devices.

The program runs in a private mount namespace (``softrdma.tools.suites.sysfs_ns``) where
each softrdma device has its sysfs entry (netdev, RoCE v2 GIDs with their type and
interface) and a ``/dev/infiniband/uverbsN`` character device (``/dev/null`` bound in
place: UCX lists only devices whose node it may open); the host sees none of it. Root
makes the namespace itself; another user makes it inside a user namespace of its own
(``unshare --user --map-root-user``), which root gets too with
``SOFTRDMA_SYSFS_USERNS=1``: the tests marked ``mode`` run both ways.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import need_build, need_tool, run_cmd, run_pair, tcp_port
from harness.device import private_device

from softrdma.capi import launch
from softrdma.drivers.host import registry
from softrdma.drivers.host.registry import BUILTIN_DEVICE

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not ROOT or launch.sysfs_unavailable(launch.sysfs_user_namespace()) is not None,
    reason="the private /sys and /dev view is tested as root (a mount namespace, and a "
    "user namespace as the other users make it; CI runs as root)")


@pytest.fixture(params=["mount", "user"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The namespace root makes (``mount``), or the one a user other than root makes
    (``user``: a user namespace around it, forced by SOFTRDMA_SYSFS_USERNS=1)."""
    if request.param == "user":
        why = launch.sysfs_unavailable(True)
        if why is not None:
            pytest.skip(why)
        monkeypatch.setenv(launch.USERNS_ENV, "1")
    else:
        monkeypatch.delenv(launch.USERNS_ENV, raising=False)
    return str(request.param)


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test's own device, and no other: UCX and libfabric open every device they
    list, and the built-in softrdma_lo would take UDP port 4791 from the tests that use
    it (in parallel, with SOFTRDMA_SHARED=0: "Address already in use")."""
    need_build()
    name = private_device("mwtest", tmp_path, monkeypatch)
    registry.delete(BUILTIN_DEVICE.name)
    yield name


def sysfs_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "softrdma", "run", "--sysfs", *run_cmd(*args)[5:]]


@needs_root
def test_namespace_has_uverbs_nodes_and_gid_attrs(device: str, mode: str) -> None:
    script = ("stat -c %F /dev/infiniband/uverbs0; "
              f"cat /sys/class/infiniband/{device}/ports/1/gid_attrs/types/0 "
              f"/sys/class/infiniband/{device}/ports/1/gid_attrs/ndevs/0 "
              f"/sys/class/infiniband/{device}/ports/1/gids/0; "
              "echo ok > /dev/null && ls /dev/infiniband")
    p = subprocess.run(sysfs_run("sh", "-c", script), capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "character special file"
    assert lines[1] == "RoCE v2" and lines[2] == "lo"
    assert lines[3] == "0000:0000:0000:0000:0000:ffff:7f00:0001"
    assert "rdma_cm" in lines[4:] and "uverbs0" in lines[4:]
    assert not Path("/dev/infiniband").exists() or Path("/dev/infiniband").is_dir()


def test_sysfs_without_root_takes_a_user_namespace(device: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A user other than root makes the view inside a user namespace where it is root,
    and its program keeps the user's state directory (uid 0's default is root's)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("SOFTRDMA_STATE_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert launch.sysfs_user_namespace()
    cmd = launch.sysfs_command(["true"], tmp_path, True)
    assert cmd[:6] == ["unshare", "--user", "--map-root-user", "--mount", "--propagation",
                       "private"]
    env: dict[str, str] = {}
    launch.sysfs_env(env, True)
    assert env[launch.STATE_ENV] == str(tmp_path / "softrdma")
    assert env["UCX_UD_VERBS_ETH_DGID_CHECK"] == "n"
    env = {}
    launch.sysfs_env(env, False)  # root's own namespace: its own default
    assert launch.STATE_ENV not in env


def test_sysfs_refused_without_user_namespaces(device: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A user other than root on a system that refuses it user namespaces: a clear error
    that says which sysctls decide, and the program does not run."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(launch, "_unshare_works",
                        lambda *flags: "unshare failed: Operation not permitted")
    args = argparse.Namespace(command=["--", "true"], dev=None, print_env=False, sysfs=True)
    assert launch.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("softrdma run: error: --sysfs: the private /sys/class/infiniband "
                          "and /dev/infiniband view needs, for a user other than root here, "
                          "a user namespace, which this system refuses (unshare --user: "
                          "unshare failed: Operation not permitted;"), err
    assert "user.max_user_namespaces" in err and err.count("\n") == 1


@needs_root
def test_ucx_info_lists_softrdma_devices(device: str, mode: str) -> None:
    need_tool("ucx_info", "ucx-utils")
    p = subprocess.run(sysfs_run("ucx_info", "-d"), capture_output=True, text=True,
                       timeout=180, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    ours = p.stdout.split(f"# Memory domain: {device}\n", 1)
    assert len(ours) == 2, p.stdout[-3000:]
    section = ours[1].split("# Memory domain:", 1)[0]
    transports = re.findall(r"#\s+Transport: (\w+)\n#\s+Device: (\S+)", section)
    assert ("rc_verbs", f"{device}:1") in transports
    assert ("ud_verbs", f"{device}:1") in transports


@needs_root
def test_ucx_perftest_rc_verbs(device: str, mode: str) -> None:
    """UCT active-message latency over rc_verbs between two processes (before: UCX's
    ibv_ah_attr with dlid (its UDP source-port hint) and flow_label ~0 failed RTR)."""
    need_tool("ucx_perftest", "ucx-utils")
    port = tcp_port()
    common = ["-d", f"{device}:1", "-x", "rc_verbs", "-t", "am_lat", "-n", "100",
              "-p", str(port)]
    procs, outs = run_pair(sysfs_run("ucx_perftest", *common),
                           sysfs_run("ucx_perftest", "127.0.0.1", *common), port)
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    m = re.search(r"^Final:\s+(\d+)\s+([\d.]+)", outs[1][0], re.MULTILINE)
    assert m is not None, outs[1][0]
    assert int(m.group(1)) == 100 and float(m.group(2)) > 0


@needs_root
def test_ucx_perftest_ud_verbs(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """UCT active-message latency over ud_verbs between two processes. UCX before 1.19
    takes a RoCE UD receive's IP version from wc.sl (Mellanox's convention; softrdma and
    rxe report 0) and dropped every IPv4 packet in its destination GID check: both sides
    timed out ("UD endpoint ... unhandled timeout error"); --sysfs turns that check off."""
    need_tool("ucx_perftest", "ucx-utils")
    for key in launch.UCX_ENV:
        monkeypatch.delenv(key, raising=False)
    port = tcp_port()
    common = ["-d", f"{device}:1", "-x", "ud_verbs", "-t", "am_lat", "-n", "100",
              "-p", str(port)]
    procs, outs = run_pair(sysfs_run("ucx_perftest", *common),
                           sysfs_run("ucx_perftest", "127.0.0.1", *common), port)
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    m = re.search(r"^Final:\s+(\d+)\s+([\d.]+)", outs[1][0], re.MULTILINE)
    assert m is not None, outs[1][0]
    assert int(m.group(1)) == 100 and float(m.group(2)) > 0


def test_fi_info_lists_the_verbs_provider(device: str) -> None:
    """libfabric's verbs provider starts from rdma_get_devices (it was ENOSYS: no verbs
    provider at all); its datagram domain ``<dev>-dgram`` needs no root."""
    need_tool("fi_info", "libfabric-bin")
    p = subprocess.run(run_cmd("fi_info", "-p", "verbs"), capture_output=True, text=True,
                       timeout=180, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    domains = re.findall(r"provider: (\S+)\n\s+fabric: .*\n\s+domain: (\S+)", p.stdout)
    assert ("verbs;ofi_rxd", f"{device}-dgram") in domains, p.stdout


def test_fi_pingpong_rdm_over_verbs_ud(device: str) -> None:
    """fi_pingpong, reliable datagrams (ofi_rxd) over softrdma's UD QPs, data verified."""
    need_tool("fi_pingpong", "libfabric-bin")
    port = tcp_port()
    common = ["-p", "verbs;ofi_rxd", "-e", "rdm", "-d", f"{device}-dgram", "-I", "50",
              "-S", "256", "-v"]
    procs, outs = run_pair(run_cmd("fi_pingpong", *common, "-B", str(port)),
                           run_cmd("fi_pingpong", *common, "-P", str(port), "127.0.0.1"),
                           port)
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    for out, _ in outs:
        m = re.search(r"^256\s+50\s+=50\s+\S+\s+[\d.]+s", out, re.MULTILINE)
        assert m is not None, out

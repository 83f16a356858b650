"""``softrdma link`` device handling (issue 14): ``rename OLD NEW`` (the built-in device
too, so a program can find the name it expects), refused while the device's devd serves
processes; ``add`` refuses a second device of a type on the same netdev and port; the
built-in iWARP device ``softrdma_iw_lo`` is listed by ``link``, ``devinfo`` and
``devices`` like any other."""

from __future__ import annotations

import errno
import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from softrdma.drivers.devd.proto import socket_path
from softrdma.drivers.host.registry import BUILTIN_DEVICE, DeviceRecord, Registry
from softrdma.errors import DeviceError
from softrdma.tools.admin.link import cmd_link

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(d))
    return d


def run_link(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cmd_link(list(args), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_rename_builtin_and_registered() -> None:
    assert run_link("rename", "softrdma_lo", "mlx5_0") == (0, "", "")
    assert Registry().list() == [DeviceRecord("mlx5_0", "lo", "roce", 4791)]
    assert run_link("add", "r1", "netdev", "lo", "port", "4800") == (0, "", "")
    assert run_link("rename", "r1", "rxe0") == (0, "", "")
    assert [r.name for r in Registry().list()] == ["mlx5_0", "rxe0"]
    # the old name is free again: the built-in device comes back under its own name
    assert run_link("rename", "mlx5_0", "softrdma_lo") == (0, "", "")
    assert Registry().list()[0] == BUILTIN_DEVICE


def test_rename_errors() -> None:
    rc, _, err = run_link("rename", "nope", "x")
    assert rc == 1 and err.strip() == "softrdma link: error: device 'nope': no such device"
    Registry().add("r1", "lo", "roce", 4800)
    rc, _, err = run_link("rename", "r1", "softrdma_lo")
    assert rc == 1 and "already exists" in err
    rc, _, err = run_link("rename", "r1", "bad/name")
    assert rc == 1 and "may only hold" in err
    rc, _, err = run_link("rename", "r1")
    assert rc == 2 and "OLD and NEW" in err


def test_rename_refused_while_devd_serves(state: Path) -> None:
    Registry().add("busy0", "lo", "roce", 4801)
    path = socket_path("busy0", state)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    try:
        rc, _, err = run_link("rename", "busy0", "x")
        assert rc == 1 and "is in use" in err
    finally:
        srv.close()
    rc, _, err = run_link("rename", "busy0", "x")  # a stale socket file does not block
    assert rc == 0, err


def test_second_device_on_the_same_netdev_and_port() -> None:
    rc, _, err = run_link("add", "rxe0", "netdev", "lo")
    assert rc == 1
    assert err.strip() == ("softrdma link: error: device 'softrdma_lo' already uses netdev lo "
                           "port 4791 (roce); pick another port (port N) or rename it "
                           "(softrdma link rename softrdma_lo rxe0)")
    with pytest.raises(DeviceError) as ei:
        Registry().add("rxe0", "lo", "roce", 4791)
    assert ei.value.errno == errno.EEXIST
    # another port, or another transport, is a different endpoint
    assert run_link("add", "rxe0", "netdev", "lo", "port", "4802")[0] == 0
    assert run_link("add", "siw0", "netdev", "lo", "type", "siw", "port", "4791")[0] == 0
    # once the built-in device is gone its endpoint is free
    assert run_link("delete", "softrdma_lo")[0] == 0
    assert run_link("add", "rxe1", "netdev", "lo")[0] == 0


def test_iwarp_loopback_listed_everywhere() -> None:
    rc, out, _ = run_link()
    assert rc == 0
    assert "link softrdma_iw_lo/1 state ACTIVE physical_state LINK_UP netdev lo" in out.splitlines()
    rc, out, _ = run_link("show", "softrdma_iw_lo")
    assert out == "link softrdma_iw_lo/1 state ACTIVE physical_state LINK_UP netdev lo\n"
    env = dict(os.environ, PYTHONPATH=SRC)
    dev = subprocess.run([sys.executable, "-m", "softrdma", "devinfo", "-d", "softrdma_iw_lo"],
                         text=True, capture_output=True, timeout=60, check=False, env=env)
    assert dev.returncode == 0, dev.stderr
    assert dev.stdout.splitlines()[:2] == ["hca_id:\tsoftrdma_iw_lo", "\ttransport:\t\t\tiWARP (1)"]
    lst = subprocess.run([sys.executable, "-m", "softrdma", "devinfo", "-l"], text=True,
                         capture_output=True, timeout=60, check=False, env=env)
    assert lst.stdout == "2 HCAs found:\n\tsoftrdma_lo\n\tsoftrdma_iw_lo\n\n"
    devs = subprocess.run([sys.executable, "-m", "softrdma", "devices"], text=True,
                          capture_output=True, timeout=60, check=False, env=env)
    assert [ln.split()[0] for ln in devs.stdout.splitlines()[2:]] == ["softrdma_lo",
                                                                      "softrdma_iw_lo"]

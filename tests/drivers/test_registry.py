"""Device registry, netdev queries and ``softrdma link`` (design.md "Devices shared by
processes")."""

from __future__ import annotations

import errno
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from softrdma.drivers.host import netdev, registry
from softrdma.drivers.host.registry import BUILTIN_DEVICE, DeviceRecord, Registry, ib_mtu_for
from softrdma.errors import DeviceError, InvalidArgument
from softrdma.tools.admin.link import cmd_link

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(d))
    return d


# -- netdev -----------------------------------------------------------------------------


def test_netdev_lo() -> None:
    lo = netdev.get("lo")
    assert lo.name == "lo"
    assert lo.index == int(Path("/sys/class/net/lo/ifindex").read_text())
    assert lo.mtu == int(Path("/sys/class/net/lo/mtu").read_text())
    assert lo.mac == bytes(6)
    assert socket.inet_aton("127.0.0.1") in lo.ipv4
    assert lo.up
    assert "lo" in netdev.list_names()
    assert netdev.exists("lo")
    if Path("/proc/net/if_inet6").exists() and "lo" in Path("/proc/net/if_inet6").read_text():
        loop6 = socket.inet_pton(socket.AF_INET6, "::1")
        assert any(a.address == loop6 and a.prefixlen == 128 for a in lo.ipv6)
        assert loop6 in lo.ips


def test_netdev_ipv4_matches_ioctl_primary() -> None:
    for name in netdev.list_names():
        primary = netdev._ipv4_primary(name)
        addrs = netdev.ipv4_addresses(name)
        assert primary == addrs[:1]


@pytest.mark.parametrize("name", ["nosuchif0", "", "../lo", "a" * 16, "."])
def test_netdev_unknown(name: str) -> None:
    assert not netdev.exists(name)
    with pytest.raises(DeviceError):
        netdev.get(name)
    with pytest.raises(DeviceError):
        netdev.ipv4_addresses(name)


# -- MTU --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eth", "ib"),
    [
        (1500, 1024),  # Ethernet (captures README: active MTU 1024)
        (65536, 4096),  # lo
        (9000, 4096),
        (4176, 4096),
        (4175, 2048),
        (2128, 2048),
        (2127, 1024),
        (1104, 1024),
        (1103, 512),
        (336, 256),
        (335, 0),
    ],
)
def test_ib_mtu_for(eth: int, ib: int) -> None:
    assert ib_mtu_for(eth) == ib


def test_active_mtu_follows_netdev() -> None:
    assert BUILTIN_DEVICE.active_mtu() == ib_mtu_for(netdev.get("lo").mtu)


# -- state directory ----------------------------------------------------------------------


def test_state_dir_rules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert registry.state_dir() == tmp_path / "state"
    monkeypatch.delenv("SOFTRDMA_STATE_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert registry.state_dir() == Path("/run/softrdma")
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    monkeypatch.setattr(os, "getuid", lambda: 1234)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    assert registry.state_dir() == Path("/run/user/1234/softrdma")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert registry.state_dir() == Path("/tmp/softrdma-1234")


# -- add / list / get / delete ------------------------------------------------------------


def test_builtin_listed_first(state: Path) -> None:
    assert registry.list_devices() == [BUILTIN_DEVICE]
    assert BUILTIN_DEVICE == DeviceRecord("softrdma_lo", "lo", "roce", 4791)
    assert not state.exists()  # reading creates nothing
    rec = registry.add("rxe0", "lo", "roce", 4792)
    assert rec == DeviceRecord("rxe0", "lo", "roce", 4792)
    assert registry.list_devices() == [BUILTIN_DEVICE, rec]
    assert registry.get("rxe0") == rec
    assert registry.get("softrdma_lo") == BUILTIN_DEVICE


def test_add_list_delete_roundtrip(state: Path) -> None:
    reg = Registry()
    a = reg.add("a", "lo", "roce", 4792)
    b = reg.add("b.x-1_", "lo", "iwarp", 5000)
    assert reg.list() == [BUILTIN_DEVICE, a, b]
    data = json.loads((state / "devices.json").read_text())
    assert data["devices"][1] == {"name": "b.x-1_", "netdev": "lo", "type": "iwarp", "udp_port": 5000}
    assert reg.delete("a") == a
    assert reg.list() == [BUILTIN_DEVICE, b]
    with pytest.raises(DeviceError, match="no such device") as ei:
        reg.delete("a")
    assert ei.value.errno == errno.ENODEV
    with pytest.raises(DeviceError, match="no such device"):
        reg.get("a")
    # a fresh Registry object on the same directory sees the same records
    assert Registry(state).list() == [BUILTIN_DEVICE, b]
    assert not [p for p in state.iterdir() if p.name.endswith(".tmp")]


def test_builtin_can_be_deleted_and_readded() -> None:
    reg = Registry()
    reg.add("x", "lo", "roce", 4792)
    assert reg.delete("softrdma_lo") == BUILTIN_DEVICE
    assert [r.name for r in reg.list()] == ["x"]
    with pytest.raises(DeviceError):
        reg.get("softrdma_lo")
    with pytest.raises(DeviceError):
        reg.delete("softrdma_lo")
    again = reg.add("softrdma_lo", "lo", "roce", 4800)
    assert reg.list() == [BUILTIN_DEVICE.__class__("x", "lo", "roce", 4792), again]
    assert reg.get("softrdma_lo").udp_port == 4800


def test_duplicate_name() -> None:
    reg = Registry()
    reg.add("dup", "lo", "roce", 4792)
    with pytest.raises(DeviceError, match="already exists") as ei:
        reg.add("dup", "lo", "iwarp")
    assert ei.value.errno == errno.EEXIST
    with pytest.raises(DeviceError, match="already exists"):
        reg.add("softrdma_lo", "lo")
    assert [r.name for r in reg.list()] == ["softrdma_lo", "dup"]


@pytest.mark.parametrize("name", ["", "a" * 65, "a/b", "a b", "näme", "x;y", ".", "..", "a\n"])
def test_bad_names(name: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        Registry().add(name, "lo")
    assert ei.value.argument == "name"
    assert Registry().list() == [BUILTIN_DEVICE]


def test_longest_name_ok() -> None:
    assert Registry().add("n" * 64, "lo", "roce", 4792).name == "n" * 64


def test_unknown_netdev() -> None:
    with pytest.raises(DeviceError, match="no such network interface"):
        Registry().add("x", "nosuchif0")
    assert Registry().list() == [BUILTIN_DEVICE]


@pytest.mark.parametrize(
    ("kw", "arg"),
    [({"type": "rxe2"}, "type"), ({"udp_port": 0}, "udp_port"), ({"udp_port": 70000}, "udp_port")],
)
def test_bad_type_or_port(kw: dict[str, object], arg: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        Registry().add("x", "lo", **kw)  # type: ignore[arg-type]
    assert ei.value.argument == arg


def test_corrupt_registry(state: Path) -> None:
    state.mkdir(parents=True)
    (state / "devices.json").write_text("{not json")
    with pytest.raises(DeviceError, match="corrupt"):
        Registry().list()
    (state / "devices.json").write_text(json.dumps({"devices": [{"name": "x"}]}))
    with pytest.raises(DeviceError, match="malformed record"):
        Registry().list()
    (state / "devices.json").write_text(
        json.dumps({"devices": [{"name": "x", "netdev": "lo", "type": "ib", "udp_port": 1}]})
    )
    with pytest.raises(DeviceError, match="malformed record"):
        Registry().list()


_ADDER = """
import sys, time
sys.path.insert(0, {src!r})
from softrdma.drivers.host.registry import Registry
prefix, n, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
while time.time() < start:
    time.sleep(0.001)
reg = Registry()
for i in range(n):
    reg.add(f"{{prefix}}{{i}}", "lo", "roce", (10000 if prefix == "p" else 20000) + i)
"""


def test_concurrent_adds_from_two_processes(state: Path) -> None:
    import time

    code = _ADDER.format(src=SRC)
    start = time.time() + 0.5  # both processes begin adding at the same moment
    n = 30
    procs = [
        subprocess.Popen([sys.executable, "-c", code, prefix, str(n), repr(start)])
        for prefix in ("p", "q")
    ]
    for p in procs:
        assert p.wait(timeout=20) == 0
    names = {r.name for r in Registry().list()}
    expected = {f"{p}{i}" for p in "pq" for i in range(n)} | {"softrdma_lo"}
    assert names == expected
    json.loads((state / "devices.json").read_text())  # a whole file, not a torn one


# -- softrdma link ------------------------------------------------------------------------


def run_link(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cmd_link(list(args), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_link_list_default() -> None:
    rc, out, err = run_link()
    assert rc == 0 and err == ""
    assert out == ("link softrdma_lo/1 state ACTIVE physical_state LINK_UP netdev lo\n"
                   "link softrdma_iw_lo/1 state ACTIVE physical_state LINK_UP netdev lo\n")
    assert run_link("show") == (0, out, "")


def test_link_add_show_delete() -> None:
    assert run_link("add", "r1", "netdev", "lo", "port", "4792") == (0, "", "")
    assert run_link("add", "s1", "netdev", "lo", "type", "siw", "port", "5001") == (0, "", "")
    rc, out, _ = run_link("-d")
    assert rc == 0
    mtu = ib_mtu_for(netdev.get("lo").mtu)
    assert out.splitlines() == [
        f"link softrdma_lo/1 state ACTIVE physical_state LINK_UP netdev lo type roce mtu {mtu} udp_port 4791 roce_ver 2",
        f"link r1/1 state ACTIVE physical_state LINK_UP netdev lo type roce mtu {mtu} udp_port 4792 roce_ver 2",
        f"link s1/1 state ACTIVE physical_state LINK_UP netdev lo type iwarp mtu {mtu} udp_port 5001 mpa_crc off",
        f"link softrdma_iw_lo/1 state ACTIVE physical_state LINK_UP netdev lo type iwarp mtu {mtu} udp_port 0 mpa_crc off",
    ]
    rc, out, _ = run_link("show", "s1")
    assert out == "link s1/1 state ACTIVE physical_state LINK_UP netdev lo\n"
    assert run_link("delete", "r1") == (0, "", "")
    assert [r.name for r in Registry().list()] == ["softrdma_lo", "s1"]


def test_link_down_netdev_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Registry().add("gone", "lo", "roce", 4792)
    # the netdev disappears after the record was made
    monkeypatch.setattr(netdev, "SYS_CLASS_NET", tmp_path / "nothing")
    rc, out, _ = run_link("show", "gone")
    assert out == "link gone/1 state DOWN physical_state DISABLED netdev lo\n"


@pytest.mark.parametrize(
    ("args", "rc", "msg"),
    [
        (("add", "dup", "netdev", "lo"), 1, "already exists"),
        (("add", "x", "netdev", "nosuchif0"), 1, "no such network interface"),
        (("add", "bad/name", "netdev", "lo"), 1, "may only hold"),
        (("add", "x", "netdev"), 2, "missing value"),
        (("add", "x"), 2, "needs 'netdev IFACE'"),
        (("add", "x", "netdev", "lo", "type", "ib"), 2, "unknown type"),
        (("add", "x", "netdev", "lo", "port", "abc"), 2, "not a number"),
        (("add", "x", "netdev", "lo", "port", "0"), 1, "not in 1..65535"),
        (("add", "x", "netdev", "lo", "mtu", "9000"), 2, "unknown keyword"),
        (("delete",), 2, "exactly one"),
        (("delete", "nope"), 1, "no such device"),
        (("show", "nope"), 1, "no such device"),
        (("frob",), 2, "unknown command"),
    ],
)
def test_link_errors(args: tuple[str, ...], rc: int, msg: str) -> None:
    Registry().add("dup", "lo", "roce", 4792)
    before = Registry().list()
    code, out, err = run_link(*args)
    assert code == rc
    assert out == ""
    assert err.count("\n") == 1 and msg in err and err.startswith("softrdma link: error: ")
    assert Registry().list() == before


def test_link_module_entry_point(state: Path) -> None:
    env = dict(os.environ, PYTHONPATH=SRC, SOFTRDMA_STATE_DIR=str(state))
    p = subprocess.run(
        [sys.executable, "-m", "softrdma.tools.admin.link", "add", "m0", "netdev", "nosuchif0"],
        capture_output=True, text=True, env=env, timeout=20,
    )  # fmt: skip
    assert p.returncode == 1
    assert p.stderr == "softrdma link: error: netdev 'nosuchif0': no such network interface\n"


@pytest.mark.parametrize(
    ("args", "rc", "msg"),
    [
        (("type", "foo"), 2, "unknown type 'foo'"),
        (("port", "70000"), 1, "UDP port 70000 not in 1..65535"),
        (("--udp-port", "70000"), 2, "unknown keyword '--udp-port'"),
    ],
)
def test_link_add_bad_type_or_port_exits_nonzero(state: Path, args: tuple[str, ...], rc: int,
                                                 msg: str) -> None:
    """Issue 13 item 12: through the ``softrdma`` command, one line, no record made."""
    env = dict(os.environ, PYTHONPATH=SRC, SOFTRDMA_STATE_DIR=str(state))
    p = subprocess.run([sys.executable, "-m", "softrdma", "link", "add", "x1", "netdev", "lo",
                        *args], capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == rc and p.stdout == ""
    assert p.stderr.startswith("softrdma link: error: ") and p.stderr.count("\n") == 1
    assert msg in p.stderr
    assert [r.name for r in Registry(state).list()] == ["softrdma_lo"]


def test_link_add_roce_ver_and_vlan(state: Path) -> None:
    """``roce_ver 1|2|both`` and ``vlan VID`` (Annex A16 RoCEv1) are recorded and shown;
    bad values are one-line usage errors; older records (no roce_ver) read as v2."""
    assert run_link("add", "v1", "netdev", "lo", "roce_ver", "1", "vlan", "7") == (0, "", "")
    # "both" also runs RoCEv2 on UDP: a port softrdma_lo (lo, 4791) does not use
    assert run_link("add", "vb", "netdev", "lo", "roce_ver", "both", "port", "4793") == (0, "", "")
    rc, out, _ = run_link("-d")
    lines = out.splitlines()
    assert lines[1].endswith("roce_ver 1 vlan 7") and lines[2].endswith("roce_ver both")
    data = json.loads((state / "devices.json").read_text())
    assert data["devices"][0]["roce_ver"] == "1" and data["devices"][0]["vlan"] == 7
    rec = Registry(state).get("v1")
    assert rec.roce_v1 and not rec.roce_v2 and Registry(state).get("vb").roce_v2
    rc, out, err = run_link("add", "x", "netdev", "lo", "roce_ver", "3")
    assert rc == 2 and out == "" and "roce_ver '3' is not 1, 2 or both" in err
    rc, _, err = run_link("add", "x", "netdev", "lo", "roce_ver", "1", "vlan", "4095")
    assert rc == 1 and "VLAN ID must be 1..4094" in err and "\n" == err[-1] and err.count("\n") == 1
    rc, _, err = run_link("add", "x", "netdev", "lo", "vlan", "5")
    assert rc == 1 and "applies to RoCEv1" in err
    rc, _, err = run_link("add", "x", "netdev", "lo", "roce_ver", "both", "port", "4794")  # vb has lo
    assert rc == 1 and "already carries RoCEv1 for device 'vb'" in err
    assert run_link("add", "x", "netdev", "lo", "roce_ver", "1", "vlan", "8") == (0, "", "")
    data["devices"][0].pop("roce_ver")
    data["devices"][0].pop("vlan")
    (state / "devices.json").write_text(json.dumps(data))
    assert Registry(state).get("v1").roce_ver == "2"

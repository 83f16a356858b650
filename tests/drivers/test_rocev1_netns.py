"""RoCEv1 (IBA Annex A16) between two hosts: two network namespaces joined by a veth pair,
each with a softrdma device ``roce_ver 1`` on its end (root only; the namespaces, names
unique per run, are created and removed by a fixture, even on failure).

* RC (SEND, RDMA WRITE/READ, atomics) and UD from ``rocev1_peer.py``; ``rc-pingpong``,
  ``uc-pingpong``, ``ud-pingpong``, ``rping`` (IB CM + Annex A11), ``udaddy`` (SIDR) and
  the perftest tools as over RoCEv2; through devd (shared device) and in-process;
  UD multicast (the MGID's Ethernet multicast MAC) with a detach;
* ``roce_ver both``: the source GID's type picks the encapsulation;
* with and without an 802.1Q VLAN, the SL in the priority bits (A16.8.1), checked on a
  capture that tshark decodes without malformed or expert-error marks and that
  ``softrdma pcap-check`` verifies (ICRC and byte-exact re-encoding);
* address resolution (A16.5.1): the kernel's own ARP and ND, triggered on demand;
* ``devinfo -v`` and the pyverbs ``query_gid_type`` report "RoCE v1" GIDs.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness.wait import StreamLines, wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="RoCEv1 between network namespaces needs root (netns, veth, AF_PACKET) and iproute2")

HERE = Path(__file__).resolve().parents[1]
TSHARK = shutil.which("tshark")
_COUNTER = itertools.count()


@dataclass
class Host:
    ns: str
    ifname: str
    ip4: str
    ip6: str
    state: Path
    mac: str = ""
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def env(self, shared: bool = True) -> dict[str, str]:
        env = dict(os.environ, SOFTRDMA_STATE_DIR=str(self.state))
        env["SOFTRDMA_SHARED"] = "1" if shared else "0"
        return env

    def cmd(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *args]

    def run(self, *args: str, shared: bool = True, timeout: float = 180) -> str:
        r = subprocess.run(self.cmd(sys.executable, *args), env=self.env(shared),
                           capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"{args}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
        return r.stdout

    def start(self, *args: str, shared: bool = True) -> subprocess.Popen[str]:
        p = subprocess.Popen(self.cmd(sys.executable, *args), env=self.env(shared),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs.append(p)
        return p

    def serve(self, *args: str, shared: bool = True, tcp: int | None = None) -> Server:
        """Start a server tool and wait until a client can come: its ``waiting for a
        client`` line, or (``tcp``: perftest says nothing) a listener on that TCP port."""
        p = self.start(*args, shared=shared)
        assert p.stdout is not None
        srv = Server(p, StreamLines(p.stdout))
        if tcp is None:
            srv.out.wait_for("waiting for a client")
        else:
            wait_until(lambda: p.poll() is not None or tcp in self.listening_tcp(),
                       what=f"a listener on TCP {tcp}")
            assert p.poll() is None, srv.out.join()
        return srv

    def listening_tcp(self) -> set[int]:
        """The TCP ports something listens on in the namespace (/proc/net/tcp{,6})."""
        text = subprocess.run(self.cmd("cat", "/proc/net/tcp", "/proc/net/tcp6"),
                              capture_output=True, text=True, timeout=60).stdout
        return {int(f[1].rsplit(":", 1)[1], 16) for f in map(str.split, text.splitlines())
                if len(f) > 3 and f[3] == "0A" and ":" in f[1]}

    def softrdma(self, *args: str, shared: bool = True, timeout: float = 180) -> str:
        return self.run("-m", "softrdma", *args, shared=shared, timeout=timeout)


@dataclass
class Server:
    """A server started by :meth:`Host.serve`, its output read as it comes."""

    proc: subprocess.Popen[str]
    out: StreamLines


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


#: The VLAN pair (``vlan7``) of a test in the slow job only (.ci/slow): the tests whose VLAN
#: case repeats the untagged one. The tag itself stays in the default suite: the capture,
#: address resolution and RC/UD/atomics tests run on both pairs.
UNTAGGED_BY_DEFAULT = pytest.mark.parametrize(
    "hosts", [None, pytest.param(7, marks=pytest.mark.slow)], ids=["untagged", "vlan7"],
    indirect=True)


@pytest.fixture(params=[None, 7], ids=["untagged", "vlan7"])
def hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Host, Host]]:
    """Two namespaces joined by a veth pair, IPv4 + IPv6 (no DAD), device ``r1`` with
    ``roce_ver 1`` (``vlan 7``: softrdma tags its frames with VLAN 7) on each end."""
    vlan: int | None = request.param
    n = next(_COUNTER)
    tag = f"{os.getpid() % 100000}x{n}"
    subnet = 100 + (os.getpid() + n) % 150
    a = Host(f"srv1a{tag}", f"v1a{tag}"[:15], f"10.231.{subnet}.1", f"fd31:{subnet:x}::1",
             tmp_path / "a")
    b = Host(f"srv1b{tag}", f"v1b{tag}"[:15], f"10.231.{subnet}.2", f"fd31:{subnet:x}::2",
             tmp_path / "b")
    made: list[str] = []
    try:
        for h in (a, b):
            _sh("ip", "netns", "add", h.ns)
            made.append(h.ns)
        _sh("ip", "link", "add", a.ifname, "netns", a.ns, "type", "veth", "peer", "name",
            b.ifname, "netns", b.ns)
        for h in (a, b):
            _sh("ip", "-n", h.ns, "link", "set", "lo", "up")
            _sh("ip", "-n", h.ns, "addr", "add", f"{h.ip4}/24", "dev", h.ifname)
            _sh("ip", "-n", h.ns, "addr", "add", f"{h.ip6}/64", "dev", h.ifname, "nodad")
            _sh("ip", "-n", h.ns, "link", "set", h.ifname, "up")
            h.mac = _mac_in(h)
            extra = ["vlan", str(vlan)] if vlan is not None else []
            h.softrdma("link", "add", "r1", "netdev", h.ifname, "roce_ver", "1", *extra)
        yield a, b
    finally:
        for h in (a, b):
            for p in h.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(5)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait(5)
        for ns in made:  # removes the veth pair and any devd left inside
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _mac_in(h: Host) -> str:
    out = subprocess.run(h.cmd("cat", f"/sys/class/net/{h.ifname}/address"),
                         capture_output=True, text=True, check=True).stdout
    return out.strip()


def _finish(p: subprocess.Popen[str] | Server, timeout: float = 180) -> str:
    if isinstance(p, Server):
        try:
            p.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()
            raise AssertionError(f"timed out: {p.out.join()}") from None
        out = p.out.join()
        assert p.proc.returncode == 0, out[-3000:]
        return out
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        raise AssertionError(f"timed out: {out}") from None
    assert p.returncode == 0, out[-3000:]
    return out


def _capture(h: Host, pcap: Path) -> subprocess.Popen[str]:
    """tshark writing ``pcap`` from ``h``'s interface, returned once it captures."""
    assert TSHARK is not None
    cap = subprocess.Popen(h.cmd(TSHARK, "-i", h.ifname, "-w", str(pcap), "-q"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    h.procs.append(cap)
    assert cap.stderr is not None
    StreamLines(cap.stderr).wait_for("Capturing on")  # printed before dumpcap starts:
    # dumpcap writes the file's header once the interface is open and filtered
    wait_until(lambda: pcap.exists() and pcap.stat().st_size > 0, timeout=120, interval=0.02,
               what=f"the capture header in {pcap}")
    return cap


def _stop_capture(cap: subprocess.Popen[str], pcap: Path, display: str, frames: int) -> None:
    """Until ``pcap`` holds ``frames`` frames matching ``display`` (at most 60 s: then the
    test checks what it holds), then stop the capture."""
    assert TSHARK is not None

    def count() -> int:
        return len(subprocess.run([TSHARK, "-r", str(pcap), "-Y", display, "-T", "fields",
                                   "-e", "frame.number"], capture_output=True, text=True,
                                  timeout=120).stdout.split())

    try:
        wait_until(lambda: count() >= frames, timeout=60, interval=0.5,
                   what=f"{frames} frames in the capture")
    except AssertionError:
        pass
    finally:
        cap.send_signal(signal.SIGINT)
        cap.wait(60)


# ---------------------------------------------------------------------------- verbs
@pytest.mark.parametrize(("hosts", "gid_index"), [  # the VLAN pair's link-local GID: slow
    pytest.param(None, 0, id="untagged-gid-link-local"),
    pytest.param(None, 1, id="untagged-gid-ipv4"),
    pytest.param(7, 0, id="vlan7-gid-link-local", marks=pytest.mark.slow),
    pytest.param(7, 1, id="vlan7-gid-ipv4")], indirect=["hosts"])
def test_rc_ud_atomics_over_rocev1(hosts: tuple[Host, Host], gid_index: int) -> None:
    """CA16-15: RC SEND/WRITE/READ, CMP_AND_SWP, FETCH_AND_ADD and UD over RoCEv1, with
    the EUI-64 link-local GID (MAC read from the GID) and the IPv4 GID (kernel ARP)."""
    a, b = hosts
    port = "18600"
    srv = b.start(str(HERE / "harness/rocev1_peer.py"), "server", "r1", str(gid_index), port)
    cli = a.start(str(HERE / "harness/rocev1_peer.py"), "client", "r1", str(gid_index), port, b.ip4)
    assert "OK client" in _finish(cli)
    assert "OK server 112" in _finish(srv)


@pytest.mark.parametrize("tool,shared", [("rc-pingpong", True), ("uc-pingpong", False),
                                         ("ud-pingpong", True)])
@UNTAGGED_BY_DEFAULT
def test_pingpong_tools_over_rocev1(hosts: tuple[Host, Host], tool: str, shared: bool) -> None:
    """The ibv_*_pingpong tools between the hosts, GID index 1 (IPv4, RoCE v1)."""
    a, b = hosts
    args = ("-m", "softrdma", tool, "-d", "r1", "-g", "1", "-n", "50", "-l", "3", "-c", "-s", "1000")
    srv = b.serve(*args, shared=shared)
    out = a.softrdma(*args[2:], b.ip4, shared=shared)
    assert "50 iters" in out and f"GID ::ffff:{b.ip4}" in out
    assert "50 iters" in _finish(srv)


@UNTAGGED_BY_DEFAULT
def test_rping_over_rocev1(hosts: tuple[Host, Host]) -> None:
    """rdma_cm (IB CM + Annex A11 IP CM) over RoCEv1, through devd on both sides."""
    a, b = hosts
    srv = b.serve("-m", "softrdma", "rping", "-s", "-a", b.ip4, "-C", "3", "-v")
    out = a.softrdma("rping", "-c", "-a", b.ip4, "-I", a.ip4, "-C", "3", "-v")
    assert out.count("ping data: rdma-ping-") == 3
    assert _finish(srv).count("server ping data") == 3


# ---------------------------------------------------------------------------- the wire
@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
def test_capture_tags_decodes_and_checks(hosts: tuple[Host, Host], tmp_path: Path) -> None:
    """The frames on the wire: EtherType 0x8915 with a GRH (A16.3.1); with a VLAN, an
    802.1Q tag with VID 7 and the SL (3) as priority (A16.8.1). tshark marks nothing
    malformed and ``softrdma pcap-check`` verifies every frame."""
    a, b = hosts
    assert TSHARK is not None
    vlan = "vlan 7" in a.softrdma("link", "-d")
    pcap = tmp_path / "v1.pcap"
    v1 = "eth.type == 0x8915 || vlan.etype == 0x8915"
    cap = _capture(b, pcap)
    try:
        args = ("-m", "softrdma", "rc-pingpong", "-d", "r1", "-g", "1", "-n", "20", "-l", "3")
        srv = b.serve(*args)
        a.softrdma(*args[2:], b.ip4)
        _finish(srv)
    finally:
        _stop_capture(cap, pcap, v1, 40)
    fields = subprocess.run(
        [TSHARK, "-r", str(pcap), "-Y", v1, "-T", "fields", "-e", "vlan.id", "-e", "vlan.priority", "-e", "ipv6.nxt",
         "-e", "infiniband.bth.opcode"],
        capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert len(fields) >= 40, fields[:5]
    for line in fields:
        vid, prio, *_ = (line.split("\t") + ["", ""])[:2]
        assert (vid, prio) == (("7", "3") if vlan else ("", "")), line
    problems = subprocess.run(
        [TSHARK, "-r", str(pcap), "-Y", "_ws.malformed || _ws.expert.severity >= 8388608",
         "-T", "fields", "-e", "frame.number"], capture_output=True, text=True, timeout=60,
        check=True).stdout.split()
    assert problems == []
    out = subprocess.run([sys.executable, "-m", "softrdma", "pcap-check", str(pcap)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and " 0 failed" in out.stdout, out.stdout + out.stderr


def test_address_resolution_triggers_kernel_arp_and_nd(hosts: tuple[Host, Host]) -> None:
    """A16.5.1: a GID resolves through the kernel's neighbour table; a miss makes the
    kernel ARP (IPv4 GID) or send a Neighbor Solicitation (IPv6 GID); a dead address
    gives no MAC (and is not retried at once)."""
    a, b = hosts
    _sh("ip", "-n", a.ns, "neigh", "flush", "dev", a.ifname)
    code = f"""
import ipaddress, socket
from softrdma.drivers.host.neigh import NeighbourResolver
r = NeighbourResolver({a.ifname!r}, socket.if_nametoindex({a.ifname!r}), wait=2.0)
g4 = bytes(10) + b"\\xff\\xff" + ipaddress.ip_address({b.ip4!r}).packed
g6 = ipaddress.ip_address({b.ip6!r}).packed
dead = bytes(10) + b"\\xff\\xff" + ipaddress.ip_address({b.ip4!r}).packed[:3] + b"\\x63"
print(r.resolve(g4).hex(":"), r.resolve(g6).hex(":"), r.triggers)
print(r.resolve(dead), r.triggers, r.resolve(dead), r.triggers)
"""
    out = a.run("-c", code).split()
    assert out[:3] == [b.mac, b.mac, "2"], out
    assert out[3:] == ["None", "3", "None", "3"], out
    neigh = subprocess.run(["ip", "-n", a.ns, "neigh", "show", "dev", a.ifname],
                           capture_output=True, text=True, check=True).stdout
    assert f"{b.ip4} lladdr {b.mac}" in neigh and f"{b.ip6} lladdr {b.mac}" in neigh


@UNTAGGED_BY_DEFAULT
def test_devinfo_and_pyverbs_show_rocev1_gids(hosts: tuple[Host, Host]) -> None:
    a, _ = hosts
    out = a.softrdma("devinfo", "-v", "-d", "r1", shared=False)
    ll = _eui64_gid(a.mac)
    assert f"GID[  0]:\t\t{ll}, RoCE v1" in out
    assert f"GID[  1]:\t\t::ffff:{a.ip4}, RoCE v1" in out
    assert f"GID[  2]:\t\t{a.ip6}, RoCE v1" in out
    code = ("from softrdma.compat.pyverbs import device as d, libibverbs_enums as e\n"
            "c = d.Context(name='r1')\n"
            "print(c.query_gid_type(1, 0) == e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1,"
            " c.query_gid_ex(1, 1).gid_type, str(c.query_gid(1, 0)))\n"
            "c.close()\n")
    same, gid_type, gid0 = a.run("-c", code, shared=False).split()
    assert (same, gid_type, str(ipaddress.IPv6Address(gid0))) == ("True", "1", ll)


def _eui64_gid(mac: str) -> str:
    m = bytes.fromhex(mac.replace(":", ""))
    raw = b"\xfe\x80" + bytes(6) + bytes([m[0] ^ 2]) + m[1:3] + b"\xff\xfe" + m[3:]
    return str(ipaddress.IPv6Address(raw))


@UNTAGGED_BY_DEFAULT
def test_device_on_a_vlan_netdev(hosts: tuple[Host, Host]) -> None:
    """A device on an 802.1Q VLAN netdev (``ip link add ... type vlan id 9``): receives on
    it, sends on the lower device with its own tag (priority = SL, A16.8.1)."""
    a, b = hosts
    if "vlan" in a.softrdma("link", "-d").split("r1/1", 1)[1]:
        pytest.skip("runs once, on the untagged pair")
    for h in (a, b):
        r = subprocess.run(["ip", "-n", h.ns, "link", "add", "link", h.ifname, "name",
                            f"{h.ifname[:10]}.9", "type", "vlan", "id", "9"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"802.1Q VLAN netdevs are not available here (8021q): {r.stderr.strip()}")
        vdev = f"{h.ifname[:10]}.9"
        last = h.ip4.rsplit(".", 1)[1]
        _sh("ip", "-n", h.ns, "addr", "add", f"10.232.9.{last}/24", "dev", vdev)
        _sh("ip", "-n", h.ns, "link", "set", vdev, "up")
        h.softrdma("link", "add", "rv", "netdev", vdev, "roce_ver", "1")
    args = ("-m", "softrdma", "rc-pingpong", "-d", "rv", "-g", "1", "-n", "20", "-l", "6")
    srv = b.serve(*args)
    assert "20 iters" in a.softrdma(*args[2:], "10.232.9.2")
    assert "20 iters" in _finish(srv)


_MCAST_RECV = """
import sys, time
from softrdma import enums as e, verbs as v
ctx = v.Context("r1")
pd = v.PD(ctx); cq = v.CQ(ctx, 16); mr = v.MR(pd, 8192, 1)
qp = v.QP(pd, v.QPInitAttr(qp_type=int(e.IBV_QPT_UD), scq=cq, rcq=cq, cap=v.QPCap(8, 8)))
qp.to_rts(v.QPAttr(qkey=0x1234))
mgid = v.GID("ff0e::a16:1")
def wait(t):
    end = time.monotonic() + t
    while time.monotonic() < end:
        n, wcs = cq.poll(1)
        if n:
            return wcs[0]
        time.sleep(0.001)
    return None
qp.post_recv(v.RecvWR(1, 1, [v.SGE(mr.addr, 2048, mr.lkey)]))
qp.attach_mcast(mgid)
print("ready", flush=True)
wc = wait(60)
assert wc is not None and wc.status == 0 and wc.byte_len == 40 + 5, wc
assert bytes(mr.read(5, 40)) == b"mcast" and bytes(mr.read(16, 24)) == mgid.raw
qp.detach_mcast(mgid)
qp.post_recv(v.RecvWR(2, 1, [v.SGE(mr.addr, 2048, mr.lkey)]))
print("detached", flush=True)
assert wait(3) is None, "delivered after detach"
print("OK", flush=True)
"""

_MCAST_SEND = """
from softrdma import enums as e, verbs as v
import time
ctx = v.Context("r1")
pd = v.PD(ctx); cq = v.CQ(ctx, 16); mr = v.MR(pd, 64, 1)
mr.write(b"mcast", 5)
qp = v.QP(pd, v.QPInitAttr(qp_type=int(e.IBV_QPT_UD), scq=cq, rcq=cq, cap=v.QPCap(8, 8)))
qp.to_rts(v.QPAttr(qkey=0x1234))
ah = v.AH(pd, v.AHAttr(gr=v.GlobalRoute(dgid=v.GID("ff0e::a16:1"), sgid_index=0, hop_limit=1)))
w = v.SendWR(1, sg=[v.SGE(mr.addr, 5, mr.lkey)], send_flags=int(e.IBV_SEND_SIGNALED))
w.set_wr_ud(ah, 0xFFFFFF, 0x1234)
qp.post_send(w)
while not cq.poll(1)[0]:
    time.sleep(0.001)
time.sleep(0.5)
"""


@UNTAGGED_BY_DEFAULT
@pytest.mark.iba("10.5")
def test_ud_multicast_over_rocev1(hosts: tuple[Host, Host]) -> None:
    """UD multicast on RoCEv1 (IBA 10.5, ../shared/specs/roce.md §4): the MGID's frames go to 33:33 + its
    last 4 bytes; the receiver's devd joins that MAC; a detach stops delivery."""
    a, b = hosts
    rx = b.start("-c", _MCAST_RECV)
    assert rx.stdout is not None
    assert rx.stdout.readline().strip() == "ready"
    a.run("-c", _MCAST_SEND)
    assert rx.stdout.readline().strip() == "detached"
    a.run("-c", _MCAST_SEND)
    assert "OK" in _finish(rx)


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
@UNTAGGED_BY_DEFAULT
def test_dual_device_chooses_encapsulation_per_gid(hosts: tuple[Host, Host],
                                                   tmp_path: Path) -> None:
    """``roce_ver both``: the same IPv4 address is GID n ("RoCE v1") and GID n+1 ("RoCE
    v2"); rc-pingpong with -g n goes out as EtherType 0x8915, with -g n+1 as UDP 4791
    (in-process devices)."""
    a, b = hosts
    if "vlan" in a.softrdma("link", "-d").split("r1/1", 1)[1]:
        pytest.skip("runs once, on the untagged pair")
    assert TSHARK is not None
    for h in (a, b):
        h.softrdma("link", "delete", "r1")
        h.softrdma("link", "add", "rb", "netdev", h.ifname, "roce_ver", "both")
    def dad_done(h: Host) -> bool:
        return not subprocess.run(h.cmd("ip", "-6", "addr", "show", "dev", h.ifname,
                                        "tentative"),
                                  capture_output=True, text=True, timeout=30).stdout.strip()

    for h in (a, b):  # the GID indices move when IPv6 DAD ends: wait for it first
        wait_until(functools.partial(dad_done, h), 60, "IPv6 duplicate address detection to end")
    out = a.softrdma("devinfo", "-v", "-d", "rb", shared=False)
    # every address once per type, v1 first, as Linux lists them: the IPv4 address follows
    # the link-local GID's pair when the in-process device serves that address too
    index = {kind: re.search(rf"GID\[ *(\d+)\]:\t\t::ffff:{re.escape(a.ip4)}, RoCE {kind}\n",
                             out) for kind in ("v1", "v2")}
    assert index["v1"] and index["v2"], out
    v1, v2 = index["v1"].group(1), index["v2"].group(1)
    assert int(v2) == int(v1) + 1
    counts = {}
    for gid in (v1, v2):
        pcap = tmp_path / f"g{gid}.pcap"
        cap = _capture(b, pcap)
        try:
            args = ("-m", "softrdma", "rc-pingpong", "-d", "rb", "-g", gid, "-n", "10")
            srv = b.serve(*args, shared=False)
            a.softrdma(*args[2:], b.ip4, shared=False)
            _finish(srv)
        finally:
            _stop_capture(cap, pcap, "infiniband", 20)
        kinds = subprocess.run([TSHARK, "-r", str(pcap), "-Y", "infiniband", "-T", "fields",
                                "-e", "eth.type"], capture_output=True, text=True,
                               timeout=60, check=True).stdout.split()
        counts[gid] = (kinds.count("0x8915"), kinds.count("0x0800"))
    assert counts[v1][0] >= 20 and counts[v1][1] == 0, counts
    assert counts[v2][0] == 0 and counts[v2][1] >= 20, counts


@pytest.mark.parametrize("tool,gid", [("write-bw", "1"), ("atomic-bw", "0"), ("read-lat", "1")])
@UNTAGGED_BY_DEFAULT
def test_perftest_tools_over_rocev1(hosts: tuple[Host, Host], tool: str, gid: str) -> None:
    """perftest's ib_write_bw / ib_atomic_bw / ib_read_lat shapes over RoCEv1."""
    a, b = hosts
    args = ("-m", "softrdma", tool, "-d", "r1", "-x", gid, "-n", "100")
    srv = b.serve(*args, tcp=18515)  # perftest's default port
    out = a.softrdma(*args[2:], b.ip4)
    assert " 100 " in out and "#bytes" in out, out
    _finish(srv)


@UNTAGGED_BY_DEFAULT
def test_udaddy_over_rocev1(hosts: tuple[Host, Host]) -> None:
    """rdma_cm UD (SIDR_REQ/SIDR_REP resolve the server's UD QP) over RoCEv1."""
    a, b = hosts
    srv = b.serve("-m", "softrdma", "udaddy", "-b", b.ip4)
    out = a.softrdma("udaddy", "-s", b.ip4, "-b", a.ip4)
    assert "return status 0" in out
    assert "return status 0" in _finish(srv)

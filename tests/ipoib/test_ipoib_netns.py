"""``softrdma ipoib`` between network namespaces (root): two hosts joined by a veth pair
and three hosts on a bridge, each running ``softrdma ipoib up`` on its own device and
devd (issue 12 checks; RFC 4391 / RFC 4755)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.ipoib_netns import IFACE, ipoib_up, started, veth_pair
from harness.netns import IFNAME, Host, Network, skip_reason
from harness.wait import wait_until

from softrdma.apps.ipoib_runtime import TUN_BATCH, UD_SIGNAL_EVERY, default_cm_mtu

pytestmark = [
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
    pytest.mark.skipif(shutil.which("ping") is None, reason="the IPoIB tests need ping "
                       "(iputils-ping; .ci/run installs it)"),
]

TCP = str(Path(__file__).resolve().parents[1] / "harness/ipoib_tcp.py")
PEER = str(Path(__file__).resolve().parents[1] / "harness/ipoib_peer.py")


def v4(i: int) -> str:
    return f"10.88.0.{i}"


def v6(i: int) -> str:
    return f"fd88::{i}"


def show(h: Host) -> dict[str, object]:
    got: dict[str, object] = json.loads(h.softrdma("ipoib", "show", IFACE, "--json").stdout)
    return got


def ipoib_down(h: Host, p: subprocess.Popen[str]) -> None:
    h.softrdma("ipoib", "down", IFACE, check=False)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("ipoib down did not stop the process") from None
    assert p.returncode == 0, started(p).describe()


def ping(h: Host, addr: str, *extra: str) -> None:
    """Two pings (-W: each reply may take long on a loaded machine; ping ends at the
    second reply, so the wait costs nothing when the replies come)."""
    h.run(["ping", "-c", "2", "-i", "0.2", "-W", "30", *extra, addr], timeout=120)


class Pair:
    """Two hosts joined directly by a veth pair (MTU 9000: IB MTU 4096)."""

    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pair, list[subprocess.Popen[str]]]]:
    with veth_pair(tmp_path_factory.mktemp("ipoib2")) as hosts:
        procs = [ipoib_up(h) for h in hosts]
        yield Pair(hosts), procs


def conns(h: Host) -> list[dict[str, object]]:
    c = show(h)["connections"]
    assert isinstance(c, list)
    return c


def test_ping_both_ways_ipv4_ipv6(pair: tuple[Pair, list[subprocess.Popen[str]]]) -> None:
    net, _ = pair
    a, b = net.hosts
    ping(a, v4(2))
    ping(b, v4(1))
    ping(a, v6(2))
    ping(b, v6(1))
    s = show(a)
    neigh = {n["ip"]: n for n in s["neighbours"]}  # type: ignore[attr-defined]
    assert neigh[v4(2)]["lladdr"].startswith("80:")  # RC flag (RFC 4755 §3.1)
    assert len(neigh[v4(2)]["lladdr"].split(":")) == 20
    assert s["counters"]["arp_requests"] >= 1  # type: ignore[index]
    text = a.softrdma("ipoib", "show").stdout  # every interface of this namespace
    # connected mode's default MTU: 65520 trimmed so that a packet is one GSO send
    mtu = default_cm_mtu(s["ud_mtu"] + 4, True)  # type: ignore[operator]
    assert s["mtu"] == mtu and 65520 * 0.98 <= mtu <= 65520
    assert text.startswith(f"{IFACE}: device rxe0 mode connected mtu {mtu}")
    assert "neighbours:" in text and v4(2) in text and "counters:" in text


def test_tcp_bulk_64mib_over_rc(pair: tuple[Pair, list[subprocess.Popen[str]]]) -> None:
    net, _ = pair
    a, b = net.hosts
    srv = b.spawn([sys.executable, TCP, "serve", "5301"])
    assert srv.json()["listening"] == 5301
    sent = json.loads(a.run([sys.executable, TCP, "send", v4(2), "5301", "64"],
                            timeout=300).stdout)
    got = srv.json(timeout=120)
    assert got == sent and got["bytes"] == 64 << 20
    c = [x for x in conns(a) if x["state"] == "ESTABLISHED"]
    assert c and c[0]["mode"] == "RC" and c[0]["mtu"] == 65520
    assert sum(int(x["tx_bytes"]) for x in c) > 60 << 20  # type: ignore[call-overload]
    assert show(a)["counters"]["tx_conn"] > 900  # type: ignore[index]


def test_tshark_decodes_ipoib(pair: tuple[Pair, list[subprocess.Popen[str]]],
                              tmp_path: Path) -> None:
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed")
    net, _ = pair
    a, b = net.hosts
    cap = tmp_path / "ipoib.pcap"
    tcpdump = a.popen(["tshark", "-q", "-i", IFNAME, "-w", str(cap), "-f", "udp port 4791"])
    # tshark writes the file header once it captures
    wait_until(lambda: cap.exists() and cap.stat().st_size > 0, what="tshark capturing")
    ping(a, v4(2))
    # a broadcast ping: UD SEND_ONLY to the broadcast group (b need not answer)
    a.run(["ping", "-b", "-c", "1", "-W", "1", "10.88.0.255"], timeout=120, check=False)
    ping(a, v4(2), "-s", "20000")
    ping(a, v6(2))

    def fields(check: bool) -> str:
        return subprocess.run(["tshark", "-r", str(cap), "-T", "fields", "-E", "separator=|",
                               "-e", "infiniband.bth.opcode", "-e", "frame.protocols",
                               "-e", "_ws.expert", "-e", "_ws.malformed"], capture_output=True,
                              text=True, timeout=120, check=check).stdout

    # until the file holds the last ping's ICMPv6 (then the earlier ones too), or at most
    # 60 s (then what it holds is checked below)
    with contextlib.suppress(AssertionError):
        wait_until(lambda: "ipv6:icmpv6" in fields(False), timeout=60, interval=0.5,
                   what="the pings in the capture")
    tcpdump.send_signal(signal.SIGINT)
    tcpdump.wait(timeout=60)
    out = fields(True)
    rows = [x.split("|") for x in out.splitlines() if x.strip()]
    whole = [r for r in rows if r[0] in ("4", "100")]   # RC / UD SEND_ONLY: a whole packet
    assert any(r[0] == "100" and "infiniband:ethertype:ip:icmp" in r[1] for r in whole), rows[:5]
    # once the connection is up, small packets take it too: RC SEND_ONLY, decoded
    assert any(r[0] == "4" and ("ethertype:ip:icmp" in r[1] or "ethertype:ipv6:icmpv6" in r[1])
               for r in whole), rows[:5]
    assert any("infiniband:ethertype:ipv6:icmpv6" in r[1] for r in whole), rows[:5]
    assert any(r[0] == "0" for r in rows)  # RC SEND_FIRST: the 20000-byte ping went over RC
    assert not [r for r in whole if r[2] or r[3]], [r for r in whole if r[2] or r[3]][:5]
    # a message split over several RC packets is not reassembled by Wireshark: only the
    # whole-packet messages above can be checked for expert marks; none is malformed
    assert not [r for r in rows if r[3]]


def test_simultaneous_connects_leave_one_connection(
        pair: tuple[Pair, list[subprocess.Popen[str]]]) -> None:
    net, procs = pair
    a, b = net.hosts
    for h, p in zip(net.hosts, procs, strict=True):  # fresh interfaces: no connection yet
        ipoib_down(h, p)
    procs[:] = [ipoib_up(h) for h in net.hosts]
    ping(a, v4(2))  # both know each other (ARP), nothing big yet: no connection
    assert conns(a) == [] and conns(b) == []
    # -W: a reply may take long on a loaded machine (ping ends at the second reply)
    pa = a.popen(["ping", "-c", "2", "-s", "30000", "-W", "30", v4(2)])
    pb = b.popen(["ping", "-c", "2", "-s", "30000", "-W", "30", v4(1)])
    assert pa.wait(timeout=120) == 0 and pb.wait(timeout=120) == 0
    ca, cb = conns(a), conns(b)
    assert len(ca) == 1 and len(cb) == 1, (ca, cb)
    assert ca[0]["state"] == cb[0]["state"] == "ESTABLISHED"


def test_restart_mid_transfer_recovers(pair: tuple[Pair, list[subprocess.Popen[str]]]) -> None:
    net, procs = pair
    a, b = net.hosts
    srv = b.spawn([sys.executable, TCP, "serve", "5302"])
    assert srv.json()["listening"] == 5302
    sent_before = sum(int(str(x["tx_bytes"])) for x in conns(a))
    sender = a.popen([sys.executable, TCP, "send", v4(2), "5302", "4096"])
    wait_until(lambda: sum(int(str(x["tx_bytes"])) for x in conns(a)) > sent_before + (4 << 20),
               what="the transfer under way", interval=0.2)
    procs[1].send_signal(signal.SIGTERM)  # b's interface goes away mid-transfer
    assert procs[1].wait(timeout=60) == 0
    wait_until(lambda: b.softrdma("ipoib", "show", IFACE, "--json", check=False).returncode,
               what="b's interface gone")
    procs[1] = ipoib_up(b)
    # the other side does not hang: it answers at once, and traffic flows again
    assert show(a)["name"] == IFACE
    ping(a, v4(2), "-s", "20000")
    ping(b, v6(1))
    sender.kill()
    sender.wait(timeout=10)
    srv.proc.kill()
    srv2 = b.spawn([sys.executable, TCP, "serve", "5303"])
    assert srv2.json()["listening"] == 5303
    sent = json.loads(a.run([sys.executable, TCP, "send", v4(2), "5303", "8"],
                            timeout=120).stdout)
    assert srv2.json(timeout=60) == sent
    procs[1].kill()  # no clean teardown at all this time (no DREQ, stale control socket)
    procs[1].wait(timeout=10)
    procs[1] = ipoib_up(b)
    ping(a, v4(2), "-s", "20000")
    ping(b, v6(1), "-s", "20000")


def test_three_hosts_on_a_bridge(tmp_path: Path) -> None:
    with Network(3, tmp_path) as net:
        procs = [ipoib_up(h) for h in net.hosts]
        for x, y in net.pairs():
            ping(x, v4(y.index))
            ping(y, v6(x.index))
            ping(x, v4(y.index), "-s", "8000")  # over RC
        a = net.hosts[0]
        assert len([c for c in conns(a) if c["state"] == "ESTABLISHED"]) == 2
        for h, p in zip(net.hosts, procs, strict=True):
            ipoib_down(h, p)


def test_datagram_mode(tmp_path: Path) -> None:
    with veth_pair(tmp_path) as hosts:
        a, b = hosts
        procs = [ipoib_up(h, "--mode", "datagram") for h in hosts]
        ping(a, v4(2))
        ping(b, v6(1))
        ping(a, v4(2), "-s", "6000")  # fragmented by the kernel to the UD MTU
        s = show(a)
        assert s["mtu"] == s["ud_mtu"] == 4092 and s["connections"] == []
        assert s["lladdr"].startswith("00:")  # type: ignore[attr-defined]
        # bulk TCP over UD, IPv4 and IPv6: b coalesces the segments it receives (issue 26)
        # and the data arrives whole (sha256), the kernel checking every merged checksum
        for port, dest in ((5311, v4(2)), (5312, v6(2))):
            srv = b.spawn([sys.executable, TCP, "serve", str(port)])
            assert srv.json()["listening"] == port
            sent = json.loads(a.run([sys.executable, TCP, "send", dest, str(port), "8"],
                                    timeout=300).stdout)
            assert srv.json(timeout=120) == sent and sent["bytes"] == 8 << 20
        c = show(b)["counters"]
        assert c["rx_gro_segments"] > c["rx_gro_packets"] > 0, c  # type: ignore[index]
        # a's UD sends are signaled one in 16: their slots all come back but for the
        # unsignaled sends since the last signaled one (fewer than 16, plus a TUN batch
        # that a stray packet may have begun), none lost
        sent_ud = show(a)["counters"]["tx_ud"]  # type: ignore[index]
        slots = show(a)["send_slots"]
        assert sent_ud > 4000 and 0 <= slots["ud_unreaped"] < UD_SIGNAL_EVERY + TUN_BATCH, slots  # type: ignore[index]
        assert slots["free"] + slots["ud_unreaped"] == slots["total"], slots  # type: ignore[index]
        for h, p in zip(hosts, procs, strict=True):
            ipoib_down(h, p)


def test_cli_errors(tmp_path: Path) -> None:
    with Network(1, tmp_path) as net:
        h = net.hosts[0]
        for args, text in ((["show", "nope"], "no IPoIB interface 'nope'"),
                           (["down", "nope"], "no IPoIB interface 'nope'"),
                           (["up", "x", "--device", "nodev", "10.1.1.1/24"], "no softrdma device")):
            r = h.softrdma("ipoib", *args, check=False)
            assert r.returncode == 1 and r.stderr.startswith("softrdma ipoib: error:"), r.stderr
            assert text in r.stderr and "Traceback" not in r.stderr
        r = h.softrdma("ipoib", "up", "x", "10.1.1.1", check=False)
        assert r.returncode == 2 and "ADDR/PREFIX" in r.stderr


def state(*hosts: Host) -> str:
    """The interfaces' connections, neighbours and counters, for failure messages."""
    return "\n".join(json.dumps({k: show(h)[k] for k in ("connections", "neighbours",
                                                            "counters")}) for h in hosts)


def test_bad_input_and_linux_style_peer(pair: tuple[Pair, list[subprocess.Popen[str]]]) -> None:
    """A REQ with missing/malformed private data gets a Consumer Reject carrying our UD
    QPN (RFC 4755 §3.2, §6); a peer opening its own connection alongside ours (Linux) is
    accepted; malformed encapsulation headers and ARP packets are counted and dropped;
    none of it disturbs the connection in use.

    "In use": a ping runs over the connection all along. An idle one goes with its
    neighbour entry (RFC 4755 §3.4: STALE 30 s after its last confirmation, removed after
    60 s more unused, as Linux reaps an IPoIB neighbour), and on a busy machine the steps
    below take longer than that (the hand-made peer is a fresh Python process each time);
    the ping's RC ACKs keep the neighbour confirmed (RFC 4861 §7.3.1)."""
    net, _ = pair
    a, b = net.hosts
    ping(a, v4(2), "-s", "20000")
    pinger = a.popen(["ping", "-q", "-i", "0.5", "-s", "20000", v4(2)])
    sa, sb = show(a), show(b)
    before = [c for c in conns(a) if c["state"] == "ESTABLISHED"]
    assert before
    peer = [sys.executable, PEER, "rxe0", str(sa["gid"]), str(sa["ud_qpn"])]

    def run_peer(*args: str) -> dict[str, object]:
        got: dict[str, object] = json.loads(b.run([*peer, *args], timeout=120).stdout)
        return got

    for pd in ("", "000000", "0000004200000000"):
        got = run_peer("req-pd", pd)
        assert got == {"event": "REJECTED", "reason": 28, "rej_ud_qpn": sa["ud_qpn"]}, got
    linux = b.spawn([*peer, "linux-conn", str(sb["ud_qpn"])])
    assert linux.json(timeout=120) == {"event": "ESTABLISHED", "rep": 65524}
    # the peer has our REP; our side counts the connection once its RTU is processed (the
    # peer keeps it up until told)
    try:
        wait_until(lambda: len([c for c in conns(a) if c["state"] == "ESTABLISHED"])
                   == len(before) + 1, what=f"{len(before) + 1} connections established",
                   interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{state(a, b)}") from None
    ping(a, v4(2), "-s", "20000")
    linux.send("close")
    assert linux.proc.wait(timeout=120) == 0
    assert run_peer("ud-garbage") == {"sent": 4}

    def counted() -> dict[str, int] | None:
        c = show(a)["counters"]
        assert isinstance(c, dict)
        return c if c["conn_bad_req"] >= 3 and c["rx_bad_encap"] >= 2 and \
            c["rx_bad_arp"] >= 2 else None

    wait_until(counted, what="the malformed requests and messages counted", interval=0.2)
    ping(a, v4(2), "-s", "20000")
    ping(b, v6(1), "-s", "20000")
    after = [x for x in conns(a) if x["state"] == "ESTABLISHED"]
    assert [x["id"] for x in after] == [x["id"] for x in before], state(a, b)
    pinger.send_signal(signal.SIGINT)
    out = pinger.communicate(timeout=60)[0]
    assert " 0 received" not in out and "received" in out, out


def test_uc_connections_and_pkey(tmp_path: Path) -> None:
    """``--uc``: connected mode over UC (RFC 4755 applies to both connected modes);
    ``--pkey``: the partition's groups and the BTH P_Key."""
    with veth_pair(tmp_path) as hosts:
        a, b = hosts
        procs = [ipoib_up(h, "--uc", "--pkey", "0x8001") for h in hosts]
        ping(a, v4(2), "-s", "30000")
        ping(b, v6(1), "-s", "30000")
        s = show(a)
        assert s["pkey"] == "0x8001" and str(s["lladdr"]).startswith("40:")  # UC flag
        c = conns(a)
        assert [(x["mode"], x["state"], x["mtu"]) for x in c] == [("UC", "ESTABLISHED", 65520)]
        assert int(c[0]["tx_packets"]) >= 2  # type: ignore[call-overload]
        for h, p in zip(hosts, procs, strict=True):
            ipoib_down(h, p)


def test_mixed_modes_per_destination_mtu(tmp_path: Path) -> None:
    """A connected-mode host (MTU 65520) and a datagram-mode peer (no CM flag, UD MTU
    4092): a packet too big for the path gets ICMP "fragmentation needed" back through
    the TUN device (RFC 4755 §7.2); the kernel learns the path MTU and traffic flows."""
    with veth_pair(tmp_path) as hosts:
        a, b = hosts
        procs = [ipoib_up(a), ipoib_up(b, "--mode", "datagram")]
        ping(a, v4(2))
        r = a.run(["ping", "-c", "4", "-i", "0.3", "-W", "30", "-s", "8000", v4(2)], check=False,
                  timeout=120)
        assert " 0 received" not in r.stdout, r.stdout
        s = show(a)
        assert s["counters"]["tx_icmp_too_big"] >= 1 and s["connections"] == []  # type: ignore[index]
        assert "mtu 4092" in a.run(["ip", "route", "get", v4(2)]).stdout
        srv = b.spawn([sys.executable, TCP, "serve", "5304"])
        assert srv.json()["listening"] == 5304
        sent = json.loads(a.run([sys.executable, TCP, "send", v4(2), "5304", "4"],
                                timeout=120).stdout)
        assert srv.json(timeout=60) == sent
        for h, p in zip(hosts, procs, strict=True):
            ipoib_down(h, p)


def test_req_crossing_on_the_wire(pair: tuple[Pair, list[subprocess.Popen[str]]]) -> None:
    """RFC 4755 §3.3 made certain: a hand-made peer holds our REQ and sends its own; the
    interface accepts it only if its own address (flags zeroed, MSB first) is the smaller,
    else rejects it with Consumer Reject, and one connection is left either way."""
    net, _ = pair
    a, b = net.hosts
    sa = show(a)
    before = {c["id"] for c in conns(a)}
    peer = b.spawn([sys.executable, PEER, "rxe0", str(sa["gid"]), str(sa["ud_qpn"]), "cross",
                    "10.88.0.9", v4(1)])
    ready = peer.json(timeout=120)
    pinger = a.popen(["ping", "-c", "3", "-i", "0.5", "-s", "20000", "-W", "2", "10.88.0.9"])
    got = peer.json(timeout=120)
    pinger.wait(timeout=120)
    key_a = int(str(sa["ud_qpn"])).to_bytes(4, "big") + ipaddress.IPv6Address(str(sa["gid"])).packed
    key_p = int(str(ready["ud_qpn"])).to_bytes(4, "big") + ipaddress.IPv6Address(
        str(ready["gid"])).packed
    if key_a < key_p:   # we accept the peer's REQ; the peer rejects ours
        assert got == {"own": "ESTABLISHED", "answered": "reject"}, got
    else:               # we reject the peer's REQ (Consumer Reject); the peer accepts ours
        assert got == {"own": "REJECTED", "own_reason": 28, "answered": "accept"}, got
    # the peer keeps its connection up until told: our side settles on it
    def settled() -> dict[str, object] | None:
        s = show(a)
        new = [c for c in s["connections"] if c["id"] not in before]  # type: ignore[attr-defined]
        return s if len(new) == 1 and new[0]["state"] == "ESTABLISHED" else None

    s = wait_until(settled, what="one new connection established", interval=0.2)
    new = [c for c in s["connections"] if c["id"] not in before]  # type: ignore[attr-defined]
    assert new[0]["direction"] == ("passive" if key_a < key_p else "active")
    assert s["counters"]["conn_crossing_rejects"] == sa["counters"][  # type: ignore[index]
        "conn_crossing_rejects"] + (0 if key_a < key_p else 1)
    peer.send("done")
    assert peer.proc.wait(timeout=120) == 0


def test_wrong_flags_tolerated(pair: tuple[Pair, list[subprocess.Popen[str]]]) -> None:
    """RFC 4755 §8: a neighbour whose flags claim RC (and reserved bits) but which takes no
    connection costs one refused REQ and ICMP errors for the big packets; the reserved bits
    are ignored, and the other neighbours' traffic is not disturbed."""
    net, _ = pair
    a, b = net.hosts
    sa = show(a)
    peer = b.spawn([sys.executable, PEER, "rxe0", str(sa["gid"]), str(sa["ud_qpn"]),
                    "announce", "10.88.0.8", v4(1)])
    assert peer.json(timeout=120) == {"announced": "10.88.0.8"}
    a.run(["ping", "-c", "2", "-i", "0.5", "-W", "2", "-s", "20000", "10.88.0.8"], check=False,
          timeout=120)
    c0 = sa["counters"]
    assert isinstance(c0, dict)

    def refused() -> dict[str, object] | None:  # the REQ to the neighbour was refused
        s = show(a)
        c = s["counters"]
        assert isinstance(c, dict)
        return s if c["conn_refused"] > c0["conn_refused"] and \
            c["tx_icmp_too_big"] > c0["tx_icmp_too_big"] else None

    s = wait_until(refused, what="the neighbour's REQ refused, ICMP sent", interval=0.2)
    neigh = {n["ip"]: n for n in s["neighbours"]}  # type: ignore[attr-defined]
    assert neigh["10.88.0.8"]["lladdr"].startswith("c0:")  # RC|UC kept, reserved ignored
    c = s["counters"]
    assert c["conn_refused"] == c0["conn_refused"] + 1  # type: ignore[index]
    ping(a, v4(2), "-s", "20000")
    peer.send("done")
    assert peer.proc.wait(timeout=120) == 0

"""``softrdma run``: librdmacm programs (rping, rdma_server/rdma_client, ucmatose) on softrdma.

Each pair runs unmodified on a private RoCE device on lo (``SOFTRDMA_CAPI_DEVICE``, what
``softrdma run -d`` sets, makes the programs' ids resolve to it), or on the built-in iWARP
loopback device. A RoCE server listens through the IB CM, not on a TCP port: the client is
started again (with a generous deadline) while the server is not listening yet, which it
reports as a REJECTED connection (reason 8) and a non-zero exit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import (
    TIMEOUT,
    cm_device,
    compile_c,
    need_tool,
    preloaded,
    run_pair,
    tcp_port,
)
from harness.capi_pairs import pair, perftest_pair
from harness.device import reap
from harness.wait import StreamLines

from softrdma.capi import build
from softrdma.drivers.host import registry
from softrdma.verbs.device import IWARP_LOOPBACK


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield cm_device("capicm", "rping", tmp_path, monkeypatch)


def _pings(out: str, prefix: str, count: int) -> None:
    """rping -v's lines: ``<prefix>ping data: rdma-ping-N: <64 bytes of the pattern>``."""
    lines = [ln for ln in out.splitlines() if ln.startswith(prefix + "ping data:")]
    assert len(lines) == count, out
    for i, line in enumerate(lines):
        head = f"rdma-ping-{i}: "
        # rping's pattern: 'A'..'z' from 'A' + i, up to the buffer's last byte (a NUL)
        data = "".join(chr(65 + (i + k) % 58) for k in range(64 - 1 - len(head)))
        assert line == f"{prefix}ping data: {head}{data}", line


def rping(*args: str) -> list[str]:
    return preloaded("rping", "-a", "127.0.0.1", "-C", "3", "-v", "-V", *args)


def test_rping_roce_two_c_processes(device: str) -> None:
    """Stock rping on both sides (RoCE: IB CM + A11, RDMA READ/WRITE of the ping data);
    the server's CM thread blocks in rdma_get_cm_event and its CQ thread in
    ibv_get_cq_event while the main thread waits."""
    port = str(tcp_port())
    (sout, serr), (cout, _) = pair(rping("-s", "-p", port), rping("-c", "-p", port))
    _pings(cout, "", 3)
    _pings(sout, "server ", 3)
    assert "server DISCONNECT EVENT..." in serr


@pytest.mark.parametrize("c_side", ["-c", "-s"])
def test_rping_against_python_rping(device: str, c_side: str) -> None:
    """The stock rping against softrdma's Python rping on one device (through devd), the C
    program as the client and as the server."""
    port = str(tcp_port())
    python = [sys.executable, "-m", "softrdma", "rping", "-a", "127.0.0.1", "-p", port,
              "-C", "3", "-v", "--device", device]
    c = rping(c_side, "-p", port)
    if c_side == "-c":
        (sout, _), (cout, _) = pair([*python, "-s"], c)
    else:
        (sout, _), (cout, _) = pair(c, [*python, "-c"])
    _pings(cout, "", 3)
    _pings(sout, "server ", 3)


def test_rping_iwarp(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """rping over iWARP (TCP + MPA) on the built-in loopback device (softrdma run -d)."""
    monkeypatch.setenv("SOFTRDMA_CAPI_DEVICE", IWARP_LOOPBACK)
    port = str(tcp_port())
    (sout, _), (cout, _) = pair(rping("-s", "-p", port), rping("-c", "-p", port))
    _pings(cout, "", 3)
    _pings(sout, "server ", 3)


@pytest.mark.parametrize("server,mode", [("rdma_server", []), ("rdma_xserver", []),
                                         ("rdma_xserver", ["-c", "x"])],
                         ids=["rdma_server", "rdma_xserver", "rdma_xserver-xrc"])
def test_rdma_server_client(device: str, server: str, mode: list[str]) -> None:
    """rdma_server/rdma_client: rdma_getaddrinfo, synchronous ids (rdma_create_ep,
    rdma_get_request, blocking connect/accept/disconnect), librdmacm's CQs with their
    completion channels (rdma_get_send_comp/rdma_get_recv_comp). rdma_xserver/
    rdma_xclient in RC mode: the client's QP asks for no inline data and one SGE, then
    sends its 16 bytes inline (lkey 0), as Linux rxe allows: the QP's inline room is at
    least its SGEs' bytes. Their XRC mode (-c x): RDMA_PS_IB ids of types
    IBV_QPT_XRC_RECV / _SEND, the server's XRC TGT QP and XRC SRQ on the device's XRC
    domain (rdma_create_srq after rdma_get_request), its SRQ number in the REP's private
    data, and the client's inline SEND naming that SRQ (Linux rxe has no XRC at all)."""
    need_tool(server, "rdmacm-utils")
    client = server.replace("server", "client")
    port = str(tcp_port())
    (sout, serr), (cout, cerr) = pair(preloaded(server, "-p", port, *mode),
                                      preloaded(client, "-s", "127.0.0.1", "-p", port, *mode))
    assert f"{server}: end 0" in sout, (sout, serr)
    assert f"{client}: end 0" in cout, (cout, cerr)


_XRC_PY = """
import sys, time
from softrdma import enums as e, verbs as v
from softrdma.cm import rdma_cm as rc

T = rc.RdmaCmEventType
dev, port, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ch = rc.EventChannel()


def event(want):
    ev = ch.get_cm_event(60)
    ch.ack(ev)
    if ev.event != want:
        print("got", rc.event_str(ev.event), "status", ev.status, flush=True)
        sys.exit(3)
    return ev


def poll(cq):
    end = time.monotonic() + 60
    while time.monotonic() < end:
        n, wcs = cq.poll(1)
        if n:
            return wcs[0]
        time.sleep(0.001)
    sys.exit(4)


if role == "server":  # rdma_xserver -c x's part
    lst = rc.CmId(ch, rc.RDMA_PS_IB, qp_type=int(e.IBV_QPT_XRC_RECV))
    lst.bind_addr(("127.0.0.1", port), device=dev)
    lst.listen(1)
    cid = event(T.CONNECT_REQUEST).id
    xrcd, pd, cq = v.XRCD(cid.verbs), v.PD(cid.verbs), v.CQ(cid.verbs, 4)
    srq = v.XrcSRQ(pd, xrcd, cq, v.SrqInitAttr(v.SrqAttr(4, 1)))
    tgt = cid.create_qp(None, v.QPInitAttr(qp_type=int(e.IBV_QPT_XRC_RECV)), xrcd=xrcd)
    mr = v.MR(pd, 64, int(e.IBV_ACCESS_LOCAL_WRITE))
    mr.write(bytes([0xEE]) * 64, 64)
    srq.post_recv(v.RecvWR(9, 1, [v.SGE(mr.addr, 64, mr.lkey)]))
    cid.accept(rc.ConnParam(private_data=srq.srq_num.to_bytes(4, "big")))
    event(T.ESTABLISHED)
    wc = poll(cq)
    print("received", wc.wr_id, wc.status, wc.byte_len, wc.qp_num == tgt.qp_num,
          mr.read(16, 0) == bytes(16), flush=True)
    event(T.DISCONNECTED)
else:  # rdma_xclient -c x's part
    cid = rc.CmId(ch, rc.RDMA_PS_IB, qp_type=int(e.IBV_QPT_XRC_SEND))
    cid.resolve_addr(None, ("127.0.0.1", port), 2000, device=dev)
    event(T.ADDR_RESOLVED)
    cid.resolve_route(2000)
    event(T.ROUTE_RESOLVED)
    pd, cq = v.PD(cid.verbs), v.CQ(cid.verbs, 4)
    cid.create_qp(pd, v.QPInitAttr(qp_type=int(e.IBV_QPT_XRC_SEND), scq=cq, rcq=cq,
                                   cap=v.QPCap(1, 0, 1, 0, 16)))
    cid.connect()
    est = event(T.ESTABLISHED)
    wr = v.SendWR(5, None, 1, [v.SGE(0, 16, 0)], e.IBV_WR_SEND,
                  e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE)
    wr.set_inline_data(b"python over XRC!")
    wr.set_qp_type_xrc(int.from_bytes(est.private_data[:4], "big"))
    cid.qp.post_send(wr)
    wc = poll(cq)
    print("sent", wc.wr_id, wc.status, flush=True)
    event(T.DISCONNECTED)
"""


@pytest.mark.parametrize("c_side", ["client", "server"])
def test_xrc_between_c_and_python(device: str, c_side: str) -> None:
    """XRC through rdma_cm between the stock rdma_xclient/rdma_xserver (-c x) and a Python
    program on softrdma's rdma_cm API, on one device: the C client's inline SEND reaches
    the Python server's XRC SRQ (16 bytes, the TGT QP's number in the completion), and the
    Python client's SEND, naming the SRQ from the REP's private data, completes the C
    server's rdma_get_recv_comp."""
    need_tool("rdma_xserver", "rdmacm-utils")
    port = str(tcp_port())
    py = [sys.executable, "-c", _XRC_PY, device, port]
    if c_side == "client":
        (sout, serr), (cout, cerr) = pair([*py, "server"],
                                          preloaded("rdma_xclient", "-c", "x", "-s",
                                                    "127.0.0.1", "-p", port))
        assert "rdma_xclient: end 0" in cout, (cout, cerr)
        assert sout.splitlines() == ["received 9 0 16 True True"], (sout, serr)
    else:
        (sout, serr), (cout, cerr) = pair(preloaded("rdma_xserver", "-c", "x", "-p", port),
                                          [*py, "client"])
        assert "rdma_xserver: end 0" in sout, (sout, serr)
        assert cout.splitlines() == ["sent 5 0"], (cout, cerr)


@pytest.mark.parametrize("c_side", ["client", "server"])
@pytest.mark.parametrize("mode", ["r", "x"])
def test_x_examples_against_their_python_twins(device: str, c_side: str, mode: str) -> None:
    """Stock rdma_xserver/rdma_xclient against ``softrdma rdma-xserver``/``rdma-xclient``
    on one device, RC and XRC, the C program as either side."""
    need_tool("rdma_xserver", "rdmacm-utils")
    port = str(tcp_port())
    py = [sys.executable, "-m", "softrdma"]
    tail = ["-p", port, "-c", mode]
    if c_side == "client":
        server = [*py, "rdma-xserver", *tail, "--device", device, "--timeout", "60"]
        client = preloaded("rdma_xclient", "-s", "127.0.0.1", *tail)
    else:
        server = preloaded("rdma_xserver", *tail)
        client = [*py, "rdma-xclient", "-s", "127.0.0.1", *tail, "--device", device,
                  "--timeout", "60"]
    (sout, serr), (cout, cerr) = pair(server, client)
    assert "rdma_xserver: end 0" in sout, (sout, serr)
    assert "rdma_xclient: end 0" in cout, (cout, cerr)


def test_xrc_connection_captured_under_softrdma_run(device: str, tmp_path: Path) -> None:
    """``softrdma --pcap FILE run -- PROGRAM``: the program's device captures to FILE.
    rdma_xserver -c x's capture holds the XRC connection as Linux's cm.c encodes it (the
    REQ's Transport Service Type 3 with Extended Transport Type 1, the TGT QP in the REP's
    Local EE Context Number), the client's XRC SEND ONLY and its XRC ACK; pcap-check
    follows the connection from the REQ/REP (PSNs, the DREQ naming the TGT QP) and tshark
    decodes the same fields, when it is installed."""
    need_tool("rdma_xserver", "rdmacm-utils")
    port = str(tcp_port())
    cap = tmp_path / "xrc.pcap"
    server = [sys.executable, "-m", "softrdma", "--pcap", str(cap), "run", "--",
              "rdma_xserver", "-c", "x", "-p", port]
    (sout, serr), (cout, cerr) = pair(server, preloaded("rdma_xclient", "-c", "x", "-s",
                                                        "127.0.0.1", "-p", port))
    assert "rdma_xserver: end 0" in sout and "rdma_xclient: end 0" in cout, (serr, cerr)
    udp = str(registry.get(device).udp_port)  # the private device's RoCE port, not 4791
    chk = subprocess.run([sys.executable, "-m", "softrdma", "pcap-check", "-v",
                          "--udp-port", udp, str(cap)],
                         capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert chk.returncode == 0, (chk.stdout, chk.stderr)
    assert "1 connection followed, 0 inconsistent" in chk.stdout, chk.stdout
    lines = chk.stdout.splitlines()
    (req,) = [ln for ln in lines if " CM REQ " in ln]
    (rep,) = [ln for ln in lines if " CM REP " in ln]
    assert req.endswith(" XRC") and " EECN 0x" in rep, (req, rep)
    sends = [ln for ln in lines if "XRC_SEND_ONLY" in ln]
    assert len(sends) == 1 and sends[0].endswith("len 16"), sends
    assert any("XRC_ACKNOWLEDGE" in ln for ln in lines)
    assert any("closed (DREP)" in ln for ln in lines)
    if shutil.which("tshark"):
        out = subprocess.run(["tshark", "-r", str(cap), "-V", "-d", f"udp.port=={udp},infiniband"],
                             capture_output=True, text=True, timeout=TIMEOUT, check=False).stdout
        assert "Transport Service Type: 0x3" in out and "Extended Transport: 0x1" in out
        assert "Extended Reliable Connection (XRC) - SEND Only" in out


def test_cmtime_connection_steps(device: str) -> None:
    """rdma-core's cmtime (issue 26: the connection rate applications wait on): 20
    connections set up and torn down by an event-driven client against its server
    (threads for requests and disconnects; it serves until stopped), each step timed.

    The client starts once the server's IB CM listens (its ``SOFTRDMA_TRACE=cm`` line),
    and runs once: cmtime 44's server creates every QP from one static
    ``ibv_qp_init_attr``, into which librdmacm's ``rdma_create_qp`` writes the first
    id's CQs, so once that id is gone its later QPs name destroyed CQs (EINVAL here,
    freed memory on Linux) and it refuses every connection of a second client run."""
    need_tool("cmtime", "rdmacm-utils")
    port = str(tcp_port())
    srv = subprocess.Popen(preloaded("cmtime", "-b", "127.0.0.1", "-p", port, "-c", "20"),
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env={**os.environ, "SOFTRDMA_TRACE": "cm"})
    try:
        assert srv.stderr is not None
        StreamLines(srv.stderr).wait_for(r"-> LISTEN", timeout=TIMEOUT)
        cli = subprocess.run(preloaded("cmtime", "-s", "127.0.0.1", "-p", port, "-c", "20"),
                             capture_output=True, text=True, timeout=TIMEOUT, check=False)
    finally:
        reap(srv)
    assert cli.returncode == 0, (cli.stdout, cli.stderr)
    rows = dict(re.findall(r"^(\w[\w ]*?)\s*:\s+([\d.]+)", cli.stdout, re.M))
    for step in ("create id", "resolve addr", "resolve route", "create qp", "connect",
                 "disconnect", "destroy"):
        assert step in rows, cli.stdout
    assert float(rows["connect"]) > 0, cli.stdout
    assert "REJECTED" not in cli.stdout and "error" not in cli.stdout.lower(), cli.stdout


@pytest.mark.parametrize("space", [[], ["-P", "ib"]], ids=["tcp", "ib"])
def test_ucmatose_messages_options_and_migrate(device: str, space: list[str]) -> None:
    """ucmatose: 5 messages each way, TOS and ACK timeout options, then rdma_migrate_id
    to a new event channel before disconnecting; in the TCP port space and (-P ib) in
    RDMA_PS_IB with IP addresses, as Linux serves it. One connection: a client started
    again while the server is not listening yet could leave it a request of a client that
    has gone (with -c 2, one REQ rejected, the other not)."""
    need_tool("ucmatose", "rdmacm-utils")
    port = str(tcp_port())
    common = ["-p", port, "-c", "1", "-C", "5", "-m", *space]
    (sout, serr), (cout, cerr) = pair(
        preloaded("ucmatose", *common),
        preloaded("ucmatose", "-s", "127.0.0.1", *common, "-t", "32", "-a", "14"))
    for out in (sout, cout):
        assert "data transfers complete" in out and "migrating to new event channel" in out
        assert "return status 0" in out
    assert "disconnected" in sout


def test_ucmatose_connections_iwarp(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ucmatose with 3 connections over iWARP: its server listens on TCP, so the client
    starts once the port listens (no second start)."""
    need_tool("ucmatose", "rdmacm-utils")
    monkeypatch.setenv("SOFTRDMA_CAPI_DEVICE", IWARP_LOOPBACK)
    port = tcp_port()
    common = ["-p", str(port), "-c", "3", "-C", "5"]
    procs, outs = run_pair(preloaded("ucmatose", *common),
                           preloaded("ucmatose", "-s", "127.0.0.1", *common), port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert "data transfers complete" in out and "return status 0" in out, out


@pytest.mark.iba("12.11")
def test_udaddy(device: str) -> None:
    """udaddy: UD ids (RDMA_PS_UDP) resolved through SIDR, ESTABLISHED with the remote
    QPN/Q_Key/AH, the server's replies on AHs made with ibv_create_ah_from_wc. Its -p is
    the port space: the default port 7174 is a service on the private device only."""
    need_tool("udaddy", "rdmacm-utils")
    (sout, serr), (cout, cerr) = pair(preloaded("udaddy", "-C", "5"),
                                      preloaded("udaddy", "-s", "127.0.0.1", "-C", "5"))
    for out in (sout, cout):
        assert "data transfers complete" in out and "return status 0" in out, out
    assert "sending replies" in sout


@pytest.mark.parametrize("srq", [(), ("--use-srq",)], ids=["qp", "srq"])
def test_perftest_over_rdma_cm(device: str, srq: tuple[str, ...]) -> None:
    """perftest's -R: the connection through rdma_cm (both sides' ids on the device);
    with --use-srq the receives go through an SRQ its rdma_cm QPs are made on."""
    need_tool("ib_send_bw", "perftest")
    port = str(tcp_port())
    common = ["ib_send_bw", "-R", *srq, "-d", device, "-n", "50", "-s", "4096", "-p", port]
    (sout, _), (cout, _) = perftest_pair(preloaded(*common), preloaded(*common, "127.0.0.1"))
    for out in (sout, cout):
        row = re.search(r"^\s*4096\s+50\s+([\d.]+)\s+([\d.]+)", out, re.M)
        assert row and float(row.group(2)) > 0, out


@pytest.mark.parametrize("tool,args,message", [
    ("rping", ("-c", "-a", "127.0.0.1"), "RDMA_CM_EVENT_REJECTED, error 8"),
    ("rdma_client", ("-s", "127.0.0.1"), "rdma_connect: Connection refused"),
    ("ucmatose", ("-s", "127.0.0.1"), "RDMA_CM_EVENT_REJECTED, error: 8"),
])
def test_nobody_listening_is_a_clear_rejection(device: str, tool: str, args: tuple[str, ...],
                                               message: str) -> None:
    """A connection to a port nobody listens on fails at once, the librdmacm way (a
    REJECTED event, or ECONNREFUSED from a synchronous id), no hang, no traceback."""
    need_tool(tool, "rdmacm-utils")
    p = subprocess.run(preloaded(tool, *args, "-p", str(tcp_port())), capture_output=True,
                       text=True, timeout=TIMEOUT, check=False)
    assert p.returncode != 0
    assert message in p.stdout + p.stderr, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr


def test_build_names_librdmacm_dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rdmacm.c needs <rdma/rdma_cma.h>: its package is named when it is missing."""
    monkeypatch.setenv("SOFTRDMA_CAPI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "RDMA_CMA_H", tmp_path / "no-rdma_cma.h")
    assert "librdmacm-dev" in build.missing_packages()
    with pytest.raises(build.BuildError, match="librdmacm-dev"):
        build.build()


def test_channel_fd_errors_and_unserved_calls(device: str, tmp_path: Path) -> None:
    """tests/capi/cm_check.c: an empty non-blocking channel is EAGAIN, its fd polls
    readable with an event pending; after ADDR_RESOLVED the id's verbs is a context of
    the device and its addresses are set; bad arguments are EINVAL (rdma_notify with no
    connection too), an option not served ENOSYS, XRC through rdma_cm EOPNOTSUPP;
    rdma_getaddrinfo."""
    exe = compile_c(tmp_path, "cm_check", "-lrdmacm", "-libverbs")
    p = subprocess.run(preloaded(str(exe)), capture_output=True, text=True, timeout=TIMEOUT,
                       check=False)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.splitlines() == [f"device {device}", "ok"], p.stdout


def test_destroy_id_waits_for_events_held_elsewhere(device: str, tmp_path: Path) -> None:
    """tests/capi/cm_destroy_wait.c: rdma_destroy_id returns only once another thread has
    acknowledged the event it holds about the id, whose context it still reads (rping's
    CM thread at DISCONNECTED while its main thread destroys the id); an event held by the
    destroying thread itself does not block it (its ack ends the id); an event not taken
    yet is dropped."""
    exe = compile_c(tmp_path, "cm_destroy_wait", "-lrdmacm", "-lpthread")
    p = subprocess.run(preloaded(str(exe)), capture_output=True, text=True, timeout=TIMEOUT,
                       check=False)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.splitlines() == ["ok"], p.stdout


def _mckey_pair(group: str, receiver: list[str], sender: list[str]
                ) -> tuple[subprocess.CompletedProcess[str], tuple[str, str]]:
    """A receiver joined to ``group`` and a sender to it: the sender (which waits 3 s
    after joining) is run again until the receiver has its messages, since UD multicast
    is unreliable and the receiver may join late on a busy machine."""
    rcv = subprocess.Popen(receiver, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            snd = subprocess.run(sender, capture_output=True, text=True, timeout=TIMEOUT,
                                 check=False)
            assert snd.returncode == 0, (snd.stdout, snd.stderr)
            try:
                out, err = rcv.communicate(timeout=2)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the receiver got nothing: {snd.stdout}") from None
    finally:
        reap(rcv)
    return snd, (out, err)


@pytest.mark.iba("10.5.2.1")
def test_mckey_two_c_processes(device: str) -> None:
    """mckey: RDMA_PS_UDP ids resolve the group address, rdma_join_multicast_ex (the
    MGID is the group's IP as a GID), MULTICAST_JOIN's ud param gives the AH, QPN
    0xFFFFFF and Q_Key; 5 SENDs from one process to the other's joined QP, then
    rdma_leave_multicast."""
    need_tool("mckey", "rdmacm-utils")
    group = "230.7.7.9"
    common = ["mckey", "-m", group, "-b", "127.0.0.1", "-C", "5", "-S", "64"]
    snd, (out, err) = _mckey_pair(group, preloaded(*common), preloaded(*common, "-s"))
    for text in (snd.stdout, out):
        assert f"joined dgid: ::ffff:{group}" in text, text
        assert "data transfers complete" in text and "return status 0" in text, text
    assert "initiating data transfers" in snd.stdout
    assert "receiving data transfers" in out, (out, err)
    assert "Traceback" not in err + snd.stderr


def test_mckey_c_sender_python_receiver(device: str) -> None:
    """The stock mckey sends to softrdma's Python mckey on one device (through devd)."""
    need_tool("mckey", "rdmacm-utils")
    group = "230.7.7.10"
    common = ["-m", group, "-b", "127.0.0.1", "-C", "5", "-S", "64"]
    snd, (out, err) = _mckey_pair(
        group, [sys.executable, "-m", "softrdma", "mckey", *common, "--device", device],
        preloaded("mckey", *common, "-s"))
    assert "data transfers complete" in out and "return status 0" in out, (out, err)

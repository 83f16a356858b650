"""softrdma's perftest tools: option parsing and errors, output layout against perftest
4.5's logs, --json, and softrdma-to-softrdma runs of every tool as two processes
(RoCE on lo through devd; -R over RoCE and over the built-in iWARP device; -q 2)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import _listening
from harness.perftest import (
    CAPTURES,
    device_state,
    env_for,
    run_pair,
    spawn,
)
from harness.ports import free_port
from harness.wait import wait_until, waits_until_stopped

from softrdma.errors import InvalidArgument
from softrdma.tools.cli import main
from softrdma.tools.perftest import TOOLS, options, report
from softrdma.tools.perftest.oob import BwReport, Dest

BW_ROW = re.compile(r"^ (\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")
LAT_ROW = re.compile(r"^ (\d+)\s+(\d+)" + r"\s+([\d.]+)" * 7 + r"\s*$")
GID_11 = bytes(10) + b"\xff\xff" + bytes([10, 50, 0, 11])


def _opts(name: str, *argv: str) -> options.Options:
    ap = argparse.ArgumentParser()
    options.add_arguments(ap, name)
    return options.from_args(name, ap.parse_args(list(argv)))


# -- options ------------------------------------------------------------------------------

def test_defaults_are_perftests() -> None:
    wb = _opts("write-bw")
    assert (wb.size, wb.iters, wb.tx_depth, wb.cq_mod, wb.port) == (65536, 5000, 128, 100,
                                                                    18515)
    lat = _opts("send-lat", "10.0.0.1")
    assert (lat.size, lat.iters, lat.tx_depth, lat.rx_depth) == (2, 1000, 1, 512)
    assert lat.is_client and lat.servername == "10.0.0.1"
    at = _opts("atomic-bw")
    assert at.size == 8 and at.atomic_type == "FETCH_AND_ADD"
    # force_dependecies: TX depth and CQ moderation never exceed the iterations
    small = _opts("read-bw", "-n", "50")
    assert (small.tx_depth, small.cq_mod) == (50, 50)
    allsz = _opts("write-bw", "-a")
    assert allsz.sizes == tuple(1 << i for i in range(1, 24))
    assert _opts("write-bw", "--transport", "iwarp").rdma_cm  # iWARP connects by rdma_cm
    assert _opts("write-bw", "-q", "2", "-R", "-x", "1").num_qps == 2


@pytest.mark.parametrize("argv,message", [
    (["atomic-bw", "-s", "64"], "Message size cannot be changed for Atomic tests"),
    (["atomic-lat", "--transport", "iwarp"], "Atomic operations are not supported over "
                                             "iWARP"),
    (["write-bw", "-D", "2", "-a"], "Duration mode is not supported with -a"),
    (["write-lat", "-D", "2"], "-D (duration) is supported by the BW tests only"),
])
def test_bad_combinations_are_one_line_errors(argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"softrdma {argv[0]}: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv", [["write-bw", "-n", "4"], ["send-bw", "-q", "0"],
                                  ["read-bw", "-m", "3000"], ["write-lat", "-s", "zz"],
                                  ["send-lat", "-t", "0"], ["atomic-bw", "-A", "XOR"]])
def test_out_of_range_values_are_usage_errors(argv: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_every_tool_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    for name in TOOLS:
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        assert "--report_gbits" in capsys.readouterr().out
    with pytest.raises(InvalidArgument):
        options.from_args("atomic-bw", argparse.Namespace(
            size=16, all=False, duration=None, iters=None, transport="roce"))


# -- output layout ------------------------------------------------------------------------

def test_header_and_addresses_match_perftest_log() -> None:
    """roce_read_bw.client.log (ib_read_bw -n 50 -s 4096 -x 1 --report_gbits)."""
    log = (CAPTURES / "roce_read_bw.client.log").read_text().splitlines()
    o = _opts("read-bw", "-n", "50", "-s", "4096", "-x", "1", "--report_gbits", "10.50.0.11")
    hdr = report.header(o, "rxe0", "roce", 1024, 1, 128)
    start = log.index(hdr[0], 2)
    assert log[start:start + len(hdr)] == hdr
    d = Dest(0, 0x80, 0x14, 0xBE0D36, 0x50A, 0x5585EAE09000, bytes(10) + b"\xff\xff"
             + bytes([10, 50, 0, 12]))
    lines = report.address_lines("local", d, "read")
    assert log[start + len(hdr):start + len(hdr) + 2] == lines
    assert report.bw_table_header(True)[1] in log
    assert report.bw_line(BwReport(4096, 50, 0.1386, 0.1199, 0.003569), True) in log
    # send_bw has no RKey/VAddr; the server prints RX depth, not TX depth
    srv = _opts("send-bw", "-n", "50", "-s", "4096", "-x", "1", "--report_gbits")
    slog = (CAPTURES / "roce_send_bw.server.log").read_text().splitlines()
    shdr = report.header(srv, "rxe0", "roce", 1024, 1, 1)
    assert all(line in slog for line in shdr), [x for x in shdr if x not in slog]
    assert report.address_lines("remote", Dest(0, 1, 0x15, 0x860E4E, 0, 0, GID_11), "send")[0] \
        == " remote address: LID 0000 QPN 0x0015 PSN 0x860e4e"


def test_depth_lines_follow_the_role() -> None:
    """ctx_print_test_info: TX depth on the client only (no tool here is duplex), RX
    depth on a SEND test's server only (bench_rxe.log's send_lat client has none)."""
    for name in ("send-lat", "send-bw", "write-lat", "read-bw"):
        cli = report.header(_opts(name, "10.0.0.1"), "d", "roce", 1024, 1, 1)
        srv = report.header(_opts(name), "d", "roce", 1024, 1, 1)
        assert any(x.startswith(" TX depth") for x in cli)
        assert not any(x.startswith(" TX depth") for x in srv)
        assert not any(x.startswith(" RX depth") for x in cli)
        assert any(x.startswith(" RX depth") for x in srv) == name.startswith("send")
    log = (CAPTURES / "bench_rxe.log").read_text().splitlines()
    start = log.index("                    Send Latency Test")
    o = _opts("send-lat", "-s", "64", "-n", "2000", "-x", "1", "10.50.0.11")
    assert report.header(o, "rxe0", "roce", 1024, 1, 1)[1:] == log[start:start + 14]


def test_small_gbits_use_the_extended_format() -> None:
    """roce_write_bw_rdmacm.client.log: below 0.1 Gb/sec perftest prints 6 decimals."""
    log = (CAPTURES / "roce_write_bw_rdmacm.client.log").read_text().splitlines()
    assert report.bw_line(BwReport(4096, 50, 0.094504, 0.085008, 0.002594), True) in log
    o = _opts("write-bw", "-n", "50", "-s", "4096", "-x", "1", "-R", "10.50.0.11")
    hdr = report.header(o, "rxe0", "roce", 1024, 1, 1)
    assert hdr[-3:] == [" rdma_cm QPs\t : ON", " Data ex. method : rdma_cm", report.RESULT_LINE]
    assert all(line in log for line in hdr)


def test_latency_table_matches_perftest_log() -> None:
    log = (CAPTURES / "bench_rxe.log").read_text().splitlines()
    assert report.RESULT_FMT_LAT in log
    r = report.LatReport(64, 2000, 218.13, 3980.19, 273.05, 428.85, 446.70, 2477.60, 3744.30)
    assert report.lat_line(r) in log


def test_latency_statistics_are_perftests() -> None:
    # posts 10 us apart except one 100 us gap and one 50 us gap: both are the dropped tail
    t = [0.0]
    for gap in [10e-6] * 7 + [100e-6, 50e-6] + [10e-6] * 3:
        t.append(t[-1] + gap)
    r = report.lat_report(2, t, 2)
    assert r.iters == 13
    assert r.t_min == pytest.approx(5.0) and r.t_typical == pytest.approx(5.0)
    assert r.t_max == pytest.approx(25.0)  # the first value past the kept ones
    assert r.t_avg == pytest.approx(5.0) and r.t_stdev == 0.0


def test_bw_statistics_are_perftests() -> None:
    # 4 WRs of 1 MiB posted at 0, completing at 1, 2, 3, 4 s; one CQE per WR
    r = report.bw_report(1 << 20, [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0], 1, False)
    assert (r.iters, r.bw_avg, r.msg_rate) == (4, 1.0, 4 / 4e6)
    assert r.bw_peak == pytest.approx(1.0)
    g = report.bw_report(125_000_000 // 8, [0.0], [1.0], 1, True)
    assert g.bw_avg == pytest.approx(0.125)


def test_c_hex_is_printf_alternate_form() -> None:
    assert report.c_hex(0, 4) == "0000" and report.c_hex(0x80, 4) == "0x80"
    assert report.c_hex(0x4218E, 6) == "0x4218e" and report.c_hex(0x50A, 8) == "0x00050a"


def test_progress_line_only_on_terminals() -> None:
    buf = io.StringIO()
    p = report.Progress(False, 10, "x", buf)
    p.start -= 10
    p.update(5)
    assert buf.getvalue() == ""
    p = report.Progress(True, 10, "write-bw 4096 B", buf)
    p.start -= 10
    p.update(5)
    assert "write-bw 4096 B: 5/10" in buf.getvalue()
    p.finish()
    assert buf.getvalue().endswith("\r")


# -- softrdma to softrdma -----------------------------------------------------------------

@pytest.fixture()
def state(tmp_path: Path) -> Iterator[Path]:
    yield from device_state(tmp_path)


def _rows(out: str, pattern: re.Pattern[str]) -> list[tuple[str, ...]]:
    return [m.groups() for m in map(pattern.match, out.splitlines()) if m]


# slow (the slow job): the tools that test_rdma_cm_mode and test_perftest_flags also run
@pytest.mark.parametrize("tool,extra", [
    ("write-bw", ["-s", "4096", "-n", "40"]),
    pytest.param("read-bw", ["-s", "4096", "-n", "40"], marks=pytest.mark.slow),
    ("send-bw", ["-s", "3000", "-n", "40", "-m", "1024"]),
    ("atomic-bw", ["-n", "40", "-A", "CMP_AND_SWAP"]),
    pytest.param("write-lat", ["-s", "64", "-n", "30"], marks=pytest.mark.slow),
    ("read-lat", ["-s", "64", "-n", "30"]),
    pytest.param("send-lat", ["-s", "64", "-n", "30", "-e"], marks=pytest.mark.slow),
    ("atomic-lat", ["-n", "30"]),
])
def test_two_processes_every_tool(state: Path, tool: str, extra: list[str]) -> None:
    srv, cli = run_pair(tool, state, ["-d", "pttest", *extra])
    assert srv.returncode == 0, srv.stderr
    assert cli.returncode == 0, cli.stderr
    assert "* Waiting for client to connect... *" in srv.stdout
    size = extra[extra.index("-s") + 1] if "-s" in extra else "8"
    iters = extra[extra.index("-n") + 1]
    if tool.endswith("-bw"):
        crow = _rows(cli.stdout, BW_ROW)
        srow = _rows(srv.stdout, BW_ROW)
        assert crow and crow[0][:2] == (size, iters)
        assert srow and srow[0][:2] == (size, iters)
        # the message rate (6 decimals): the 2-decimal MB/s of 40 8-byte atomics is 0.00
        # once a busy machine stretches them past about 60 ms (perftest's format)
        assert float(crow[0][4]) > 0
        if tool != "send-bw":  # the server prints the client's report
            assert srow == crow
    else:
        crow = _rows(cli.stdout, LAT_ROW)
        assert crow and crow[0][:2] == (size, iters)
        if tool in ("write-lat", "send-lat"):  # both sides measure
            assert _rows(srv.stdout, LAT_ROW)[0][:2] == (size, iters)
    # each side's remote address is the other's local one
    loc = [ln for ln in cli.stdout.splitlines() if ln.startswith(" local address")]
    rem = [ln for ln in srv.stdout.splitlines() if ln.startswith(" remote address")]
    assert [x.split("address:")[1] for x in loc] == [x.split("address:")[1] for x in rem]


@pytest.mark.parametrize("tool,transport,extra", [
    ("write-bw", "roce", ["-d", "pttest", "-q", "2"]),
    ("send-lat", "roce", ["-d", "pttest"]),
    ("read-bw", "iwarp", ["-q", "2"]),
    ("send-bw", "iwarp", []),
    ("write-lat", "iwarp", []),
])
def test_rdma_cm_mode(state: Path, tool: str, transport: str, extra: list[str]) -> None:
    srv, cli = run_pair(tool, state, ["-R", "--transport", transport, "-s", "2048", "-n",
                                      "30", *extra])
    assert srv.returncode == 0, srv.stderr
    assert cli.returncode == 0, cli.stderr
    assert " Data ex. method : rdma_cm" in cli.stdout
    # with -R perftest prints no OUT/RKey/VAddr (roce_write_bw_rdmacm.client.log)
    assert re.search(r"^ local address: LID 0000 QPN 0x[0-9a-f]{4,6} PSN 0x[0-9a-f]+$",
                     cli.stdout, re.M), cli.stdout
    assert f"\t\tTransport type : {'IW' if transport == 'iwarp' else 'IB'}" in cli.stdout
    assert " Waiting for client rdma_cm QP to connect" in srv.stdout
    nq = 2 if "-q" in extra else 1
    assert cli.stdout.count(" local address:") == nq == srv.stdout.count(" remote address:")
    row = _rows(cli.stdout, BW_ROW if tool.endswith("-bw") else LAT_ROW)
    assert row and row[0][0] == "2048"
    if tool.endswith("-bw"):
        assert row[0][1] == str(30 * nq)


def test_two_qps_plain(state: Path) -> None:
    srv, cli = run_pair("send-bw", state, ["-d", "pttest", "-q", "2", "-s", "1024",
                                           "-n", "25"])
    assert srv.returncode == 0 and cli.returncode == 0, (srv.stderr, cli.stderr)
    assert _rows(cli.stdout, BW_ROW)[0][:2] == ("1024", "50")
    assert _rows(srv.stdout, BW_ROW)[0][:2] == ("1024", "50")
    assert cli.stdout.count(" local address:") == 2


def test_json_output(state: Path) -> None:
    srv, cli = run_pair("write-bw", state, ["-d", "pttest", "-s", "1024", "-n", "20",
                                            "--json", "--report_gbits"])
    assert srv.returncode == 0 and cli.returncode == 0, (srv.stderr, cli.stderr)
    for proc, role in ((cli, "client"), (srv, "server")):
        obj = json.loads(proc.stdout)  # one JSON object, nothing else
        assert obj["test"] == "write-bw" and obj["role"] == role
        assert obj["bw_unit"] == "Gb/sec" and obj["num_of_qps"] == 1
        row = obj["results"][0]
        assert (row["MsgSize"], row["n_iterations"]) == (1024, 20)
        assert row["BW_average"] > 0
    assert json.loads(srv.stdout)["results"] == json.loads(cli.stdout)["results"]


def test_all_sizes(state: Path) -> None:
    # -u 20: a 4 s ACK timeout, so 8 MiB messages on a loaded 2-core machine do not
    # exhaust the retries
    srv, cli = run_pair("send-lat", state, ["-d", "pttest", "-a", "-n", "5", "-u", "20"],
                        timeout=240)
    assert srv.returncode == 0 and cli.returncode == 0, (srv.stderr, cli.stderr)
    sizes = [int(r[0]) for r in _rows(cli.stdout, LAT_ROW)]
    assert sizes == [1 << i for i in range(1, 24)]


def test_duration_mode(state: Path) -> None:
    srv, cli = run_pair("write-bw", state, ["-d", "pttest", "-s", "1024", "-D", "2"])
    assert srv.returncode == 0 and cli.returncode == 0, (srv.stderr, cli.stderr)
    row = _rows(cli.stdout, BW_ROW)[0]
    assert row[0] == "1024" and int(row[1]) > 0


# -- failures -----------------------------------------------------------------------------

def test_client_without_server_fails(state: Path) -> None:
    port = free_port()
    t0 = time.monotonic()
    p = spawn(["write-bw", "-d", "pttest", "-p", str(port), "--timeout", "1", "127.0.0.1"],
              env_for(state))
    _out, err = p.communicate(timeout=30)
    assert p.returncode == 1 and time.monotonic() - t0 < 20
    assert err.startswith("softrdma write-bw: error: Couldn't connect to 127.0.0.1:")


def test_server_without_client_waits_until_stopped(state: Path) -> None:
    # past --timeout: the first client is awaited until stopped
    rc, out, err = waits_until_stopped(
        [sys.executable, "-m", "softrdma", "read-lat", "-d", "pttest", "-p",
         str(free_port()), "--timeout", "1"], env_for(state),
        "Waiting for client to connect", on="stdout")
    assert rc == 130 and "Traceback" not in err
    assert "Waiting for client to connect" in out


def test_peer_that_stops_answering_fails(state: Path) -> None:
    """A client whose server vanishes after the exchange (it never ACKs the WRITEs):
    error completions or no completion, a non-zero exit and one line, no hang."""
    port = free_port()
    env = env_for(state)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", port))
    lsock.listen(1)
    cli = spawn(["write-bw", "-d", "pttest", "-p", str(port), "-n", "20", "-s", "1024",
                 "-u", "8", "--timeout", "8", "127.0.0.1"], env)
    try:
        conn, _ = lsock.accept()
        from softrdma.tools.perftest import oob

        with conn:
            conn.settimeout(20)
            ver = conn.recv(16)
            conn.sendall(ver)
            for n in (4, 4, 2):
                conn.sendall(conn.recv(n))
            key = b""
            while len(key) < oob.KEY_MSG_SIZE_GID:
                key += conn.recv(oob.KEY_MSG_SIZE_GID - len(key))
            d = oob.decode_key(key, True)
            fake = oob.encode_key(oob.Dest(0, 1, 0xABCDE, 1, 0x1234, 0x10000, d.gid), True)
            for _ in range(3):  # answer the 3 handshakes with a QP that does not exist
                conn.sendall(fake)
                if _ < 2:
                    conn.recv(oob.KEY_MSG_SIZE_GID)
            _out, err = cli.communicate(timeout=60)
    finally:
        lsock.close()
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == 1
    assert err.startswith("softrdma write-bw: error: ") and err.count("\n") == 1, err
    assert "Completion with error" in err or "no completion" in err or "peer" in err



def test_data_mismatch_fails_both_sides(state: Path) -> None:
    """A send-bw server expecting 4096-byte messages gets 2048-byte ones: it reports the
    mismatch and exits 1; the client then loses its peer and exits 1 too."""
    env = env_for(state)
    port = str(free_port())
    common = ["send-bw", "-d", "pttest", "-p", port, "-n", "20", "--timeout", "10"]
    srv = spawn([*common, "-s", "4096"], env)
    try:
        wait_until(lambda: _listening(int(port)), what=f"the server listening on {port}")
        cli = spawn([*common, "-s", "2048", "127.0.0.1"], env)
        _o, cerr = cli.communicate(timeout=60)
        _o, serr = srv.communicate(timeout=60)
    finally:
        for p in (srv,):
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert srv.returncode == 1 and "data mismatch: received 2048 bytes, expected 4096" in serr
    assert cli.returncode == 1 and cerr.startswith("softrdma send-bw: error: "), cerr


# -- divergences found against siw (regression tests) ---------------------------------------

def test_iwarp_send_bw_grants_credits(state: Path) -> None:
    """ib_send_bw over iWARP (no RNR NAK) only sends while the receiver grants credits:
    an RDMA WRITE of its receive count into the sender's credit slot every rx_depth/3
    messages. With 6 receives and 60 messages the sender stalls at 5 without them
    (against siw: 99/100 received, then both sides hung)."""
    srv, cli = run_pair("send-bw", state, ["--transport", "iwarp", "-s", "512", "-n", "60",
                                           "-r", "6", "-t", "16", "--timeout", "15"])
    assert srv.returncode == 0, srv.stderr
    assert cli.returncode == 0, cli.stderr
    assert _rows(cli.stdout, BW_ROW)[0][:2] == ("512", "60")
    assert _rows(srv.stdout, BW_ROW)[0][:2] == ("512", "60")


def test_credit_slot_is_the_advertised_address(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Over iWARP a send-bw QP advertises its credit slot (ctx_alloc_credit), and a
    credit is a host-order uint32 there."""
    from softrdma import verbs as v
    from softrdma.tools.perftest import engine

    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    ctx = v.Context(None, transport="iwarp")
    try:
        for transport, credits in (("iwarp", True), ("roce", False)):
            o = _opts("send-bw", "-q", "2", "-n", "30", "--transport", transport)
            res = engine.Resources(ctx, o, 4096)
            try:
                res.add_qp()
                res.add_qp()
                assert res.credits is credits
                d = res.my_dest(1, 0, 1, 1, bytes(16), 0)
                if credits:
                    off = d.vaddr - (int(res.mr.addr))
                    res.buf[off:off + 4] = (77).to_bytes(4, "little")
                    assert res.credit(1) == 77 and res.credit(0) == 0
                    res.reset_credits()
                    assert res.credit(1) == 0
                else:
                    assert d.vaddr == res.target(1)
            finally:
                res.close()
    finally:
        ctx.close()


def test_rdma_cm_server_lets_the_client_close_first(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """After the closing handshake a -R server keeps the control connection until the
    client closes it (up to 3 s): siw completes the client's last SEND with an error when
    the server tears down at once (ib_read_bw -R against softrdma: Bad wc status 2)."""
    from softrdma.cm import rdma_cm as rc
    from softrdma.tools.perftest import cmconn, runner

    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    port = free_port()
    srv = spawn(["read-lat", "-R", "--transport", "iwarp", "-p", str(port), "-n", "10",
                 "--timeout", "20"], env_for(tmp_path))
    try:
        wait_until(lambda: _listening(port), what=f"the server listening on {port}")
        o = _opts("read-lat", "-R", "--transport", "iwarp", "-p", str(port), "-n", "10",
                  "--timeout", "20", "127.0.0.1")
        s = runner.Side(o, io.StringIO(), transport="iwarp")
        try:
            runner.setup_cm(s)
            runner.pre_run(s)
            runner.run_lat(s)  # ends with the closing handshake
            closed_at = time.monotonic()
            assert s.sess is not None and isinstance(s.ch, cmconn.CmChannel)
            ev = s.sess.wait(cmconn.for_id(s.ch.cid, rc.RdmaCmEventType.DISCONNECTED),
                             time.monotonic() + 10, "waiting for the server")
            assert ev is not None
            assert time.monotonic() - closed_at >= cmconn.LINGER_SERVER_S - 0.5
        finally:
            runner.teardown(s)
            rc.release_devices()
        _out, err = srv.communicate(timeout=30)
        assert srv.returncode == 0, err
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()


def test_rdma_cm_server_listens_before_answering(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """perftest's client connects its rdma_cm QPs as soon as it has the server's answer
    to the handshake before them, giving up after 10 refusals 100 ms apart (seen once
    against siw: "Connection refused"): the -R server listens before it answers."""
    from softrdma.cm import rdma_cm as rc
    from softrdma.tools.perftest import cmconn, oob, runner

    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    port = free_port()
    srv = spawn(["read-lat", "-R", "--transport", "iwarp", "-p", str(port), "-n", "10",
                 "--timeout", "20"], env_for(tmp_path))
    try:
        wait_until(lambda: _listening(port), what=f"the server listening on {port}")
        o = _opts("read-lat", "-R", "--transport", "iwarp", "-p", str(port), "-n", "10",
                  "--timeout", "20", "127.0.0.1")
        s = runner.Side(o, io.StringIO(), transport="iwarp")
        try:
            sess = s.sess = cmconn.CmSession(o)
            s.ch = cmconn.CmChannel.connect(sess, "127.0.0.1", port)
            runner.device_facts(s, s.ch.cid.verbs)
            runner.prelude(s)
            s.ch.write(oob.encode_dest_struct(oob.ZERO_DEST))
            s.ch.read(oob.DEST_STRUCT.size)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # not refused: the data listener is already up
        finally:
            runner.teardown(s)
            rc.release_devices()
        # checked: the server listened; stopped now, not left to wait out its --timeout
        # for a data connection that never comes
        srv.send_signal(signal.SIGINT)
        srv.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()



def test_rdma_cm_server_banner_once_listening(tmp_path: Path) -> None:
    """The -R server prints "Waiting for client to connect" once its port listens: a
    stock perftest client started on the banner is not refused (it does not retry a
    REJECTED first connection). The server is stopped on the banner and its port looked
    up (iWARP: a TCP listener; read from /proc, a probe would be taken as the client)."""
    port = free_port()
    srv = spawn(["write-bw", "-R", "--transport", "iwarp", "-p", str(port),
                 "--timeout", "20"], env_for(tmp_path))
    try:
        assert srv.stdout is not None
        lines: list[str] = []
        while "* Waiting for client to connect... *\n" not in lines:
            line = srv.stdout.readline()  # the server exits (EOF) on failure
            assert line, (lines, srv.communicate(timeout=30))
            lines.append(line)
        os.kill(srv.pid, signal.SIGSTOP)
        try:
            assert _listening(port), lines
        finally:
            os.kill(srv.pid, signal.SIGCONT)
    finally:
        srv.kill()
        srv.communicate()

def test_iwarp_client_pauses_before_its_first_message(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """siw leaves an FPDU that arrives before its accepted QP is in RTS unread: a -R
    client on iWARP waits 1 s after ESTABLISHED before its first SEND, as write_bw.c
    does (without it, ib_write_bw -R as the server on siw hung)."""
    from softrdma.cm import rdma_cm as rc
    from softrdma.tools.perftest import cmconn, oob

    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    port = free_port()
    o = _opts("read-bw", "-R", "--transport", "iwarp", "-p", str(port), "--timeout", "20")
    sess = cmconn.CmSession(o)
    cli = spawn(["read-bw", "-R", "--transport", "iwarp", "-p", str(port), "--timeout", "5",
                 "127.0.0.1"], env_for(tmp_path))
    try:
        ch = cmconn.CmChannel.accept(sess, port)
        sess.wait(cmconn.for_id(ch.cid, rc.RdmaCmEventType.ESTABLISHED),
                  time.monotonic() + 10, "establishing")
        t0 = time.monotonic()
        assert ch.read(oob.MAX_VERSION) == oob.encode_version()
        assert time.monotonic() - t0 >= 0.8
        ch.close()
    finally:
        sess.close()
        rc.release_devices()
        if cli.poll() is None:
            cli.kill()
        cli.communicate()

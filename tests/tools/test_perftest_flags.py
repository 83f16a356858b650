"""perftest flags of issue 24 §4: ``-b`` (bidirectional), ``-c RC|UC|UD``,
``--run_infinitely``, ``-I`` (inline), ``-T`` (ToS, rdma_cm) / ``--tclass`` (GRH),
``-S`` (SL) and ``--output``: perftest's rules and messages, its header and output, and
softrdma-to-softrdma runs as two processes (RoCE on lo through devd)."""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.perftest import device_state, env_for, run_pair, spawn
from harness.ports import free_port

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.host.registry import Registry
from softrdma.tools.cli import main
from softrdma.tools.perftest import engine, options, report
from softrdma.tools.perftest.oob import BwReport
from softrdma.wire import roce
from softrdma.wire.pcap import read_pcap


def _opts(name: str, *argv: str) -> options.Options:
    ap = argparse.ArgumentParser()
    options.add_arguments(ap, name)
    return options.from_args(name, ap.parse_args(list(argv)))


@pytest.fixture()
def state(tmp_path: Path) -> Iterator[Path]:
    yield from device_state(tmp_path)


# -- rules and messages (perftest_parameters.c) ---------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (["write-bw", "-c", "UD"], "UD connection only possible in SEND verb"),
    (["read-bw", "-c", "UC"], "UC connection not possible in READ/ATOMIC verbs"),
    (["atomic-lat", "-c", "UC"], "UC connection not possible in READ/ATOMIC verbs"),
    (["send-bw", "-c", "UD", "-R"], "UD QPs connect without rdma_cm"),
    (["read-bw", "-I", "64"], "Inline feature not available on READ/Atomic verbs"),
    (["write-bw", "-T", "32"], "TOS only valid for rdma_cm based QP and RawEth QP"),
    (["write-bw", "--output", "latency"], "Output verbosity level for BW can be: "
                                          "bandwidth, message_rate"),
    (["send-lat", "--output", "bandwidth"], "Output verbosity level for LAT can be: latency"),
    (["write-bw", "--run_infinitely", "-e"], "run_infinitely does not support events"),
    (["send-bw", "--run_infinitely", "-b"], "run_infinitely mode is not supported in SEND"),
    (["write-bw", "--run_infinitely", "-n", "100"], "not with -n"),
])
def test_perftest_rules_are_one_line_errors(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"softrdma {argv[0]}: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv,message", [
    (["write-bw", "--output", "foo"], "Invalid verbosity level output flag"),
    (["write-bw", "-c", "XRC"], "XRC is not supported"),
    (["write-bw", "-I", "2000"], "inline_size must be 0..1024"),
    (["write-lat", "--run_infinitely"], "unrecognized arguments"),  # BW tests only
    (["write-lat", "-b"], "unrecognized arguments"),
])
def test_bad_values_are_usage_errors(argv: list[str], message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_flags_parse_as_perftest() -> None:
    # `-c UC 127.0.0.1` once took UC as the server
    o = _opts("write-bw", "-c", "UC", "127.0.0.1")
    assert o.connection == "UC" and o.servername == "127.0.0.1"
    o = _opts("send-bw", "-c", "ud", "-b", "-I", "64", "-S", "3", "--tclass", "96",
              "--output", "message_rate")
    assert (o.connection, o.duplex, o.inline_size, o.sl, o.tclass, o.output) == (
        "UD", True, 64, 3, 96, "message_rate")
    assert _opts("write-bw", "-R", "-T", "32").tos == 32
    inf = _opts("write-bw", "--run_infinitely")
    assert inf.run_infinitely and inf.duration == options.DEF_DURATION
    assert _opts("write-bw", "--run_infinitely", "-D", "2").duration == 2


def test_header_shows_the_flags() -> None:
    """ctx_print_test_info: "Bidirectional" in the title, the connection type, the max
    inline data, and a duplex server's TX depth (and RX depth for SEND)."""
    hdr = report.header(_opts("write-bw", "-b", "-c", "UC", "-I", "128"), "d", "roce",
                        1024, 1, 1)
    assert hdr[1] == " " * 20 + "RDMA_Write Bidirectional BW Test"
    assert " Connection type : UC\t\tUsing SRQ      : OFF" in hdr
    assert " Max inline data : 128[B]" in hdr
    assert " TX depth        : 128" in hdr  # the server of a duplex test sends too
    cli = report.header(_opts("send-bw", "-b", "10.0.0.1"), "d", "roce", 1024, 1, 1)
    assert " RX depth        : 512" in cli and " TX depth        : 128" in cli


def test_output_number_is_printf_lf() -> None:
    o = _opts("write-bw", "--output", "bandwidth")
    r = BwReport(4096, 200, 30.0, 22.813645123, 0.0069)
    assert report.output_number(o, r) == "22.813645"
    o = _opts("write-bw", "--output", "message_rate")
    assert report.output_number(o, r) == "0.006900"
    both = report.sum_reports(r, BwReport(4096, 200, 1.0, 2.0, 0.001))
    assert (both.bw_peak, both.bw_avg, both.msg_rate) == (31.0, r.bw_avg + 2.0, 0.0079)


@pytest.mark.parametrize("conn", ["RC", "UC", "UD"])
def test_qp_attributes_follow_the_flags(state: Path, monkeypatch: pytest.MonkeyPatch,
                                        conn: str) -> None:
    """The QPs the engine makes: the type of ``-c``, ``max_inline_data`` of ``-I``, the
    SL of ``-S`` and the GRH Traffic Class of ``--tclass`` in the address vector (UD:
    in the address handle, with perftest's Q_Key), no RC-only attributes on UC."""
    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(state))
    o = _opts("send-bw", "-c", conn, "-I", "64", "-S", "3", "--tclass", "96")
    with v.Context("pttest") as ctx:
        res = engine.Resources(ctx, o, 1024)
        try:
            qp = res.add_qp()
            gid = bytes(ctx.query_gid(1, 0).raw)
            me = res.my_dest(0, 0, 0x123, 1, gid, 0)
            res.connect(0, me, me, 3, 0)
            attr, init = qp.query()
            assert init.qp_type == engine.QP_TYPES[conn]
            assert attr.qp_state == e.IBV_QPS_RTS and attr.cap.max_inline_data == 64
            if conn == "UD":
                assert attr.qkey == options.DEF_QKEY
                av = res.ahs[0].av
                assert (av.sl, av.traffic_class) == (3, 96)
            else:
                assert (attr.ah_attr.sl, attr.ah_attr.gr.traffic_class) == (3, 96)
                assert attr.dest_qp_num == qp.qp_num
                # UC has no remote READ/atomics to allow
                assert attr.qp_access_flags == (engine.ACCESS if conn == "RC"
                                                else engine.UC_ACCESS)
            wr = res.send_wr(0, me, 64)
            res.post(0, wr, True)
            assert wr.send_flags & e.IBV_SEND_INLINE  # 64 bytes: inline
            big = res.send_wr(0, me, 65)
            res.post(0, big, True)
            assert not big.send_flags & e.IBV_SEND_INLINE
        finally:
            res.close()


# -- two processes --------------------------------------------------------------------------

def _rows(out: str, size: int) -> list[str]:
    """The result rows (BW or latency table) of message size ``size``."""
    return [x for x in out.splitlines() if x.startswith(f" {size:<7d} ")
            and x.split()[1].isdigit() and len(x.split()) >= 5]


@pytest.mark.parametrize("tool,title", [("write-bw", "RDMA_Write"), ("send-bw", "Send")])
def test_bidirectional_both_sides_print_the_sum(state: Path, tool: str, title: str) -> None:
    srv, cli = run_pair(tool, state, ["-b", "-n", "100", "-s", "4096"])
    assert srv.returncode == 0 and cli.returncode == 0, (srv.stderr, cli.stderr)
    for r in (srv, cli):
        assert f"{title} Bidirectional BW Test" in r.stdout
        assert len(_rows(r.stdout, 4096)) == 1, r.stdout
    # both print my + remote: the same sums
    assert _rows(srv.stdout, 4096) == _rows(cli.stdout, 4096)


@pytest.mark.parametrize("tool,extra,size", [
    ("write-bw", ["-c", "UC", "-n", "100", "-s", "4096", "-I", "64"], 4096),
    ("send-bw", ["-c", "UD", "-n", "100", "-s", "65536", "-I", "64", "-S", "2"], 1024),
    ("send-lat", ["-c", "UD", "-n", "50", "-s", "64", "-I", "64"], 64),
    ("write-lat", ["-c", "UC", "-n", "50", "-I", "32"], 2),
])
def test_uc_ud_and_inline_runs(state: Path, tool: str, extra: list[str], size: int) -> None:
    """UC and UD QPs move the data (a UD message is cut to the MTU, here the device's
    1024 with -m); the header says so."""
    srv, cli = run_pair(tool, state, ["-m", "1024", *extra])
    assert srv.returncode == 0 and cli.returncode == 0, (srv.stderr, cli.stderr)
    conn = extra[extra.index("-c") + 1]
    for r in (srv, cli):
        assert f" Connection type : {conn}\t" in r.stdout
        assert f" Max inline data : {extra[extra.index('-I') + 1]}[B]" in r.stdout
        assert len(_rows(r.stdout, size)) == 1, r.stdout


def test_output_prints_only_the_number(state: Path) -> None:
    srv, cli = run_pair("write-bw", state, ["-n", "100", "-s", "4096", "--output",
                                            "bandwidth"])
    assert srv.returncode == 0 and cli.returncode == 0, (srv.stderr, cli.stderr)
    for r in (srv, cli):
        lines = r.stdout.splitlines()
        assert len(lines) == 1 and float(lines[0]) > 0, r.stdout
        assert len(lines[0].split(".")[1]) == 6  # "%lf"
    assert srv.stdout == cli.stdout  # the server prints the client's report
    srv, cli = run_pair("send-lat", state, ["-n", "50", "--output", "latency"])
    assert srv.returncode == 0 and cli.returncode == 0, (srv.stderr, cli.stderr)
    assert all(len(r.stdout.splitlines()) == 1 and float(r.stdout) > 0 for r in (srv, cli))


def test_run_infinitely_prints_lines_until_ctrl_c(state: Path) -> None:
    """A BW line every -D seconds (peak not measured) until SIGINT: " User stopped
    traffic", the result line, exit 0; the server then ends too."""
    env = env_for(state)
    port = free_port()
    common = ["write-bw", "-p", str(port), "--timeout", "60", "--run_infinitely", "-D", "1",
              "-s", "4096"]
    srv = spawn(common, env)
    cli = spawn([*common, "127.0.0.1"], env)
    try:
        assert cli.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 120
        def enough(rows: list[str]) -> bool:
            # an interval in which nothing completed (a loaded host) prints 0.00 as
            # perftest does: wait for two rows, at least one with traffic in it
            return len(rows) >= 2 and any(float(x.split()[3]) > 0 for x in rows)
        while not enough(_rows("".join(seen), 4096)) and time.monotonic() < deadline:
            line = cli.stdout.readline()
            if not line:
                break
            seen.append(line)
        rows = _rows("".join(seen), 4096)
        assert enough(rows), "".join(seen)
        assert all(float(x.split()[2]) == 0.0 and float(x.split()[3]) >= 0 for x in rows)
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=60)
        assert cli.returncode == 0, err
        assert " User stopped traffic" in out and "Traceback" not in err
        assert out.rstrip().endswith("-" * 87)
        sout, serr = srv.communicate(timeout=60)
        assert srv.returncode == 0, serr
        assert " WARNING: BW peak won't be measured in this run." in sout
    finally:
        for p in (srv, cli):
            if p.poll() is None:
                p.kill()
                p.communicate()


def _data_tos(path: Path, udp_port: int) -> set[int]:
    """The IPv4 TOS bytes of the RDMA WRITE packets in a capture."""
    tos = set()
    for rec in read_pcap(path):
        f = roce.parse_frame(rec.data, rec.linktype, frozenset((udp_port,)))
        if f is not None and f.ip_version == 4 and 0x06 <= f.packet.opcode <= 0x0B:
            tos.add(f.ip[1])
    return tos


@pytest.mark.parametrize("flags,tos", [(["--tclass", "96"], 96), (["-R", "-T", "32"], 32)])
def test_tos_and_tclass_reach_the_wire(state: Path, tmp_path: Path, flags: list[str],
                                       tos: int) -> None:
    """``--tclass`` (the GRH Traffic Class) and ``-T`` with ``-R`` (rdma_set_option TOS)
    are the IPv4 TOS of the RoCEv2 packets (Annex A17), as a capture shows."""
    pcap = tmp_path / "client.pcap"
    env = env_for(state)
    port = free_port()
    common = ["write-bw", "-p", str(port), "--timeout", "40", "-n", "20", "-s", "1024",
              *flags]
    srv = spawn(common, env)
    cli = spawn([*common, "127.0.0.1"], {**env, "SOFTRDMA_PCAP": str(pcap)})
    try:
        for p in (srv, cli):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    finally:
        for p in (srv, cli):
            if p.poll() is None:
                p.kill()
                p.communicate()
    port = Registry(state).get("pttest").udp_port
    assert _data_tos(pcap, port) == {tos}

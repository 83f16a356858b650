"""The interop suite's pure parts, without the lab: output parsing, counter checks, the
case matrix and command lines, the table, locating the lab, the CLI's argument errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from softrdma.errors import InvalidArgument
from softrdma.interop import cases as C
from softrdma.interop import checks, parse
from softrdma.interop import lab as labmod
from softrdma.interop.lab import Lab, LabError, guest_ip, host_ip, locate_shared
from softrdma.interop.report import Result, exit_status, render_table, to_json
from softrdma.interop.runner import softrdma_tools

CAPTURES = Path("/work/shared/captures")
ROOT = Path(__file__).resolve().parents[2]

# perftest 4.5 as the guests print it (from ../shared/captures/bench_rxe.log)
BW_TABLE = """\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 4096       100              12.34              10.50   		   0.002688
---------------------------------------------------------------------------------------
"""
LAT_TABLE = """\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 64      2000          200.65         4647.01      268.59   	       451.23      	546.64 \
		2907.88 		4539.57
---------------------------------------------------------------------------------------
"""
STAT = ("link rxe0/1 sent_pkts 41 rcvd_pkts 40 duplicate_request 0 out_of_seq_request 0 "
        "rcvd_rnr_err 0 send_rnr_err 0 rcvd_seq_err 0 ack_deferred 0 retry_exceeded_err 0 "
        "retry_rnr_exceeded_err 0 completer_retry_err 2 send_err 0 link_downed 0 "
        "rdma_sends 17 rdma_recvs 17 \n")


# -- parsing -------------------------------------------------------------------------------

def test_perftest_bw_table() -> None:
    f = parse.parse_perftest(BW_TABLE)
    assert f == {"bytes": 4096, "iterations": 100, "bw_peak": 12.34, "bw_avg": 10.5,
                 "msg_rate": 0.002688, "unit": 1.0}


def test_perftest_lat_table() -> None:
    f = parse.parse_perftest(LAT_TABLE)
    assert f["t_typical"] == 268.59 and f["p999"] == 4539.57 and f["iterations"] == 2000


def test_perftest_without_result_row_is_empty() -> None:
    head = BW_TABLE.splitlines()[1]
    assert parse.parse_perftest(head + "\n" + "-" * 20 + "\n") == {}
    assert parse.parse_perftest("no table here\n") == {}


@pytest.mark.skipif(not (CAPTURES / "roce_read_bw.client.log").exists(),
                    reason="the shared captures are not here")
def test_perftest_real_gbits_output() -> None:
    f = parse.parse_perftest((CAPTURES / "roce_read_bw.client.log").read_text())
    assert f["bytes"] == 4096 and f["iterations"] == 50 and f["unit"] == 0.0
    assert f["bw_avg"] == pytest.approx(0.12)


@pytest.mark.skipif(not (CAPTURES / "roce_rc_pingpong.client.log").exists(),
                    reason="the shared captures are not here")
def test_pingpong_real_output() -> None:
    f = parse.parse_pingpong((CAPTURES / "roce_rc_pingpong.client.log").read_text())
    assert f == {"bytes": 81920, "mbit": 23.86, "iterations": 10, "usec_iter": 2746.40}


def test_rdma_statistic_and_hw_counters() -> None:
    s = parse.parse_rdma_statistic("garbage\n" + STAT)
    assert s["sent_pkts"] == 41 and s["completer_retry_err"] == 2 and len(s) == 15
    hw = parse.parse_hw_counters("/sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts:7\n"
                                 "/sys/x/send_err:0\nbad line\n")
    assert hw == {"sent_pkts": 7, "send_err": 0}


def test_user_qps_ignores_gsi_and_kernel_qps() -> None:
    text = ("link rxe0/1 lqpn 1 type GSI state RTS sq-psn 5 comm [ib_core]\n"
            "link rxe0/1 lqpn 17 type RC state RTS sq-psn 9 comm [rdma_cm]\n"
            "link rxe0/1 lqpn 18 type RC state ERR sq-psn 3 pid 211 comm ibv_rc_pingpong\n")
    assert parse.user_qps(text) == ["link rxe0/1 lqpn 18 type RC state ERR sq-psn 3 "
                                    "pid 211 comm ibv_rc_pingpong"]


def test_counter_delta_and_error_lines() -> None:
    assert parse.counter_delta({"a": 1, "b": 5}, {"a": 4, "b": 5, "c": 2}) == {"a": 3, "c": 2}
    text = ("ping data: rdma-ping-0: ABC\ncq completion failed status 12\n"
            "Failed status transport retry counter exceeded (12) for wr_id 2\nreturn status 0\n")
    assert parse.error_lines(text) == ["cq completion failed status 12",
                                       "Failed status transport retry counter exceeded (12) "
                                       "for wr_id 2"]


@pytest.mark.skipif(not (CAPTURES / "roce_ucmatose.server.log").exists(),
                    reason="the shared captures are not here")
def test_successful_real_outputs_have_no_error_lines() -> None:
    for name in ("roce_ucmatose.server.log", "roce_ucmatose.client.log", "iwarp_rping.client.log",
                 "roce_read_bw.client.log", "iwarp_write_bw.server.log"):
        assert parse.error_lines((CAPTURES / name).read_text()) == [], name


def test_pcap_check_output() -> None:
    out = ("/x/a.pcap: frame 12: RC 0x11: first request PSN 0x0 is not the announced 0x5\n"
           "/x/a.pcap: 40 packets, 39 ok, 1 failed\n")
    summary, first = parse.pcap_check_lines(out)
    assert summary == "/x/a.pcap: 40 packets, 39 ok, 1 failed"
    assert first.startswith("/x/a.pcap: frame 12:")
    assert parse.pcap_check_packets(summary) == 40
    assert parse.pcap_check_packets("x") == -1
    assert parse.pcap_check_lines("") == ("", "")
    ok = ("/x/b.pcap: 65 packets, 65 ok, 0 failed\n"
          "/x/b.pcap: 1 connection followed, 0 inconsistent\n")
    assert parse.pcap_check_lines(ok) == (
        "/x/b.pcap: 65 packets, 65 ok, 0 failed; 1 connection followed, 0 inconsistent", "")


# -- checks --------------------------------------------------------------------------------

def test_clean_counters_give_no_finding() -> None:
    assert checks.guest_findings({"sent_pkts": 200, "rcvd_pkts": 200,
                                  "completer_retry_err": 1}, []) == []
    assert checks.softrdma_findings({"rx": 100, "forwarded": 100}) == []


def test_error_completion_storm_and_stuck_qp() -> None:
    f = checks.guest_findings({"rcvd_pkts": 50, "retry_exceeded_err": 1,
                               "duplicate_request": 40}, ["link rxe0/1 lqpn 18 ...", "x"])
    assert f[0].startswith("error completion in the guest: retry_exceeded_err +1")
    assert f[1].startswith("retransmission storm in the guest (40 of 50 packets")
    assert f[2] == "stuck QP in the guest after the case: link rxe0/1 lqpn 18 ... (+1 more)"
    assert checks.softrdma_findings({"unknown_qpn": 20})[0].startswith("softrdma's devd dropped")


def test_a_few_retries_among_many_packets_are_not_a_storm() -> None:
    assert checks.guest_findings({"rcvd_pkts": 10000, "completer_retry_err": 20}, []) == []
    assert checks.guest_findings({"rcvd_pkts": 201, "completer_retry_err": 13}, []) == []
    assert checks.guest_findings({"rcvd_pkts": 100, "completer_retry_err": 30}, []) != []


# -- the case matrix -------------------------------------------------------------------------

def test_matrix_covers_the_issue() -> None:
    names = {c.name for c in C.all_cases()}
    for tool in ("rc_pingpong", "uc_pingpong", "ud_pingpong"):
        assert {f"{tool}/rxe/s{s}" for s in C.PINGPONG_SIZES[tool[:2]]} <= names
    assert {"rping/rxe/s64", "rping/siw/s64", "rping/siw-crc/s64", "ucmatose/rxe",
            "udaddy/rxe"} <= names
    for t in ("write_bw", "read_bw", "send_bw", "atomic_bw", "write_lat", "send_lat"):
        assert any(n.startswith(f"{t}/rxe") for n in names)
        assert any(n.startswith(f"{t}-R/rxe") for n in names)
        if t != "atomic_bw":
            assert any(n.startswith(f"{t}-R/siw") for n in names)
    assert max(C.PINGPONG_SIZES["rc"]) > C.MTU  # multi-packet messages
    assert len(names) == len(C.all_cases())  # names are unique
    # cases needing the same guest link are adjacent, so each link is set up once
    fabrics = [c.fabric for c in C.all_cases()]
    assert fabrics == sorted(fabrics, key=fabrics.index)


def test_smoke_subset_and_patterns() -> None:
    smoke = C.smoke_cases()
    assert {c.name for c in smoke} == {"rc_pingpong/rxe/s4096", "rping/rxe/s64",
                                        "rping/siw/s64", "rping/siw-crc/s64"}
    assert all(c in C.all_cases() for c in smoke)
    assert [c.name for c in C.select(C.all_cases(), "rping/siw*")] == [
        "rping/siw/s64", "rping/siw/s3000", "rping/siw-crc/s64", "rping/siw-crc/s3000"]
    assert {c.name for c in C.select(C.all_cases(), "ucmatose,udaddy")} == {
        "ucmatose/rxe", "udaddy/rxe", "c/ucmatose/rxe", "c/udaddy/rxe"}
    assert C.select(C.all_cases(), "nothing-like-this") == []
    # a case's whole name selects that case alone (the lab test's smoke run), not its C twin
    assert [c.name for c in C.select(C.all_cases(), "rc_pingpong/rxe/s4096")] == [
        "rc_pingpong/rxe/s4096"]
    assert [c.name for c in C.select(C.all_cases(), "c/rc_pingpong/rxe/s4096")] == [
        "c/rc_pingpong/rxe/s4096"]


EP = C.Endpoint("10.50.0.14", "10.50.0.24", guest_gid=1, softrdma="python3 -m softrdma")


def test_pingpong_commands_both_directions() -> None:
    case = C.Case("ibv_rc_pingpong", "rc-pingpong", "rxe", "pingpong", 8000, port=18515)
    srv = C.commands(case, "softrdma-server", EP)
    assert not srv.server_on_guest
    assert srv.server == ("python3 -m softrdma rc-pingpong -d ilab -g 0 -n 20 -s 8000 -c "
                          "--timeout 60 -m 1024")
    assert srv.client == "ibv_rc_pingpong -d rxe0 -g 1 -n 20 -s 8000 -c -m 1024 10.50.0.24"
    cli = C.commands(case, "softrdma-client", EP)
    assert cli.server_on_guest
    assert cli.server == "ibv_rc_pingpong -d rxe0 -g 1 -n 20 -s 8000 -c -m 1024"
    assert cli.client.endswith("-m 1024 10.50.0.14")
    ud = C.Case("ibv_ud_pingpong", "ud-pingpong", "rxe", "pingpong", 512, port=18515)
    assert "-m" not in C.commands(ud, "softrdma-server", EP).client.split()


def test_rping_and_perftest_commands() -> None:
    rp = C.Case("rping", "rping", "siw-crc", "rping", 64, port=7174)
    c = C.commands(rp, "softrdma-client", EP)
    assert c.server == "rping -s -a 10.50.0.14 -v -V -C 5 -S 64"
    assert "--transport iwarp --device iwlab" in c.client and "-c -a 10.50.0.14" in c.client
    bw = C.Case("ib_write_bw", "write-bw", "rxe", "bw", 4096, True, 18515)
    c = C.commands(bw, "softrdma-server", EP)
    assert c.server == ("python3 -m softrdma write-bw -d ilab -x 0 -R -F -n 100 -s 4096 "
                        "--timeout 60")
    assert c.client == "ib_write_bw -d rxe0 -x 1 -R -F -n 100 -s 4096 10.50.0.24"
    siw = C.Case("ib_send_lat", "send-lat", "siw", "lat", 64, True, 18515)
    c = C.commands(siw, "softrdma-client", EP)
    assert c.server == "ib_send_lat -d siw0 -R -F -n 100 -s 64"
    assert c.client.endswith("--transport iwarp --timeout 60 10.50.0.14")
    cm = C.Case("ucmatose", "ucmatose", "rxe", "cm", port=7471)
    c = C.commands(cm, "softrdma-server", EP)
    assert c.server == "python3 -m softrdma ucmatose -b 10.50.0.24 -C 5 --device ilab --timeout 60"
    assert c.client == "ucmatose -s 10.50.0.24 -C 5"
    at = C.Case("ib_atomic_bw", "atomic-bw", "rxe", "bw", 0, False, 18515)
    assert "-s" not in C.commands(at, "softrdma-client", EP).client.split()
    with pytest.raises(InvalidArgument, match="direction"):
        C.commands(bw, "sideways", EP)


def test_rdma_examples_and_mckey_commands() -> None:
    """librdmacm's rdma_server/rdma_client and mckey against softrdma's twins (issue 14)."""
    names = {c.name for c in C.all_cases()}
    assert {"rdma_server/rxe", "mckey/rxe"} <= names
    ex = next(c for c in C.all_cases() if c.name == "rdma_server/rxe")
    c = C.commands(ex, "softrdma-server", EP)
    assert c.server == ("python3 -m softrdma rdma-server -s 10.50.0.24 -p 7471 --device ilab "
                        "--timeout 60")
    assert c.client == "rdma_client -s 10.50.0.24 -p 7471"
    c = C.commands(ex, "softrdma-client", EP)
    assert c.server == "rdma_server -s 10.50.0.14 -p 7471"
    assert c.client.startswith("python3 -m softrdma rdma-client -s 10.50.0.14 -p 7471")
    mk = next(c for c in C.all_cases() if c.name == "mckey/rxe")
    c = C.commands(mk, "softrdma-server", EP)  # softrdma receives, Linux sends
    assert c.server == ("python3 -m softrdma mckey -m 239.1.2.3 -b 10.50.0.24 -C 5 "
                        "--device ilab --timeout 60")
    assert c.client == "mckey -m 239.1.2.3 -b 10.50.0.14 -C 5 -s"
    c = C.commands(mk, "softrdma-client", EP)
    assert c.server == "mckey -m 239.1.2.3 -b 10.50.0.14 -C 5"
    assert " -s --device ilab" in c.client


def test_addresses_follow_run_sh() -> None:
    assert guest_ip(4) == "10.50.0.14" and host_ip(4) == "10.50.0.24"


# -- report ----------------------------------------------------------------------------------

def test_table_and_json() -> None:
    ok = Result("write_bw/rxe/s4096", "softrdma-client",
                softrdma={"bw_avg": 3.5, "unit": 1.0}, linux={"bw_avg": 3.25, "unit": 1.0})
    bad = Result("rping/rxe/s64", "softrdma-server", pcap="/x/rping.pcap",
                 pcap_check="/x/rping.pcap: frame 7: bad ICRC")
    bad.fail("softrdma side exited 1")
    skip = Result("udaddy/rxe", "softrdma-server", result="skipped: softrdma lacks udaddy")
    table = render_table([ok, bad, skip])
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["case", "direction", "result"]
    assert "softrdma 3.50 MB/s / linux 3.25 MB/s" in table
    assert "    softrdma side exited 1" in lines
    assert "    capture: /x/rping.pcap" in lines
    assert "    pcap-check: /x/rping.pcap: frame 7: bad ICRC" in lines
    assert lines[-1] == "3 runs: 1 passed, 1 failed, 1 skipped"
    data = json.loads(to_json([ok, bad, skip]))
    assert data["results"][1]["result"] == "fail" and data["results"][2]["result"].startswith(
        "skipped")
    assert exit_status([ok, skip]) == 0 and exit_status([ok, bad]) == 1 and exit_status([]) == 1


# -- lab location, tools, CLI --------------------------------------------------------------

def test_locate_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text("")
    (tmp_path / "shared" / "lab").mkdir(parents=True)
    (tmp_path / "shared" / "lab" / "run.sh").write_text("")
    assert locate_shared(repo) == (tmp_path / "shared").resolve()
    other = tmp_path / "elsewhere"
    (other / "lab").mkdir(parents=True)
    (other / "lab" / "run.sh").write_text("")
    (tmp_path / "shared" / "lab" / "run.sh").unlink()
    monkeypatch.setenv("SOFTRDMA_SHARED", str(other))
    assert locate_shared(repo) == other.resolve()
    monkeypatch.setenv("SOFTRDMA_SHARED", str(tmp_path / "none"))
    if not Path("/work/shared/lab/run.sh").is_file():
        with pytest.raises(LabError, match="cannot find the lab"):
            locate_shared(repo)


def test_softrdma_tools_lists_subcommands() -> None:
    tools = softrdma_tools()
    assert {"rc-pingpong", "uc-pingpong", "ud-pingpong", "rping", "interop"} <= tools


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-m", "softrdma", "interop", *args],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_cli_list_and_errors() -> None:
    cp = _cli("--smoke", "--list")
    assert cp.returncode == 0 and cp.stdout.split() == [c.name for c in C.smoke_cases()]
    cp = _cli("--cases", "no-such-case")
    assert cp.returncode == 1
    assert cp.stderr.strip() == ("softrdma interop: error: no case matches 'no-such-case' "
                                 "(see --list)")
    cp = _cli("--guest", "12")
    assert cp.returncode == 2 and "guest must be 1..9" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_cli_without_the_lab_says_where_it_comes_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's clone has no ../shared/lab: the suite says what the lab is, that softrdma
    does not ship it, and how to point the suite at a copy."""
    from softrdma.interop import cli

    repo = tmp_path / "clone"
    repo.mkdir()
    (repo / "pyproject.toml").write_text("")
    monkeypatch.setenv("SOFTRDMA_SHARED", str(tmp_path / "none"))
    monkeypatch.setattr(cli, "locate_shared", lambda: locate_shared(repo))
    monkeypatch.setattr(labmod, "Path", _NoWorkShared)  # as on a machine without /work/shared
    assert cli.main(["--smoke"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("softrdma interop: error: cannot find the lab: no lab/run.sh in "
                          f"{tmp_path / 'shared'}"), err
    assert "not part of softrdma's repository or package" in err
    assert "set SOFTRDMA_SHARED" in err and "docs/interop-lab.md" in err
    assert (ROOT / "docs" / "interop-lab.md").is_file()
    assert "Traceback" not in err


class _NoWorkShared(type(Path())):  # type: ignore[misc]
    """``Path`` for which ``/work/shared`` holds nothing."""

    def is_file(self) -> bool:
        return not str(self).startswith("/work/shared") and super().is_file()


def test_one_suite_per_guest(tmp_path: Path) -> None:
    a, b = Lab(tmp_path, tmp_path), Lab(tmp_path, tmp_path)
    a.lock_guest(4)
    try:
        with pytest.raises(LabError, match=rf"g4 is in use by another interop run \(pid "
                                           rf"{os.getpid()}\)"):
            b.lock_guest(4)
        b.lock_guest(5)  # another guest is free
        b.unlock_guest(5)
    finally:
        a.unlock_guest(4)
    b.lock_guest(4)  # free again once released
    b.unlock_guest(4)
    assert not b.locked(4)


def test_lab_net_rescue_over_the_serial_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labmod, "SERIAL_BYTE_DELAY", 0.0)
    # a short private directory: a Unix socket path is limited to 108 bytes
    with tempfile.TemporaryDirectory(prefix="sri-") as d:
        _rescue(Path(d))


def _rescue(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = run / "g4.console.log"
    lab = Lab(tmp_path, tmp_path)
    # the shape of a starved boot: the serial getty takes the console before
    # lab-net.service fails, so systemd never says so there
    log.write_bytes(b"[  OK  ] Started \x1b[0;1;39mserial-getty@ttyS0.service\x1b[0m\n"
                    b"rdmalab login: root (automatic login)\n")
    assert not lab._rescue_network(4, log)  # no prompt yet: nothing is typed
    log.write_bytes(log.read_bytes() + b"\x1b[?2004hroot@rdmalab:~#          Starting "
                    b"\x1b[0;1;39mlab-net.service\x1b[0m - RDMA lab network setup...\r\n")
    got = bytearray()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(run / "g4.serial"))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while chunk := conn.recv(64):
                got.extend(chunk)

    t = threading.Thread(target=serve)
    t.start()
    try:
        assert lab._rescue_network(4, log)
    finally:
        t.join(10)
        srv.close()
    # the guest runs the script only where the service failed
    assert bytes(got) == b"\nsystemctl is-failed -q lab-net.service && /usr/local/sbin/lab-net\n"


def _fake_run_sh(shared: Path, boot: str) -> None:
    """A stand-in for the lab's run.sh whose ``boot N`` runs the shell code ``boot``
    (``$LOG``: the guest's console log)."""
    (shared / "lab").mkdir(parents=True)
    (shared / "lab" / "run.sh").write_text(
        'LOG="$LAB_CACHE/run/g$2.console.log"\n'
        f'case $1 in boot) {boot};; *) exit 0;; esac\n')


def test_boot_waits_while_the_console_shows_progress(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow guest (here 3 s) that keeps printing on its console is waited for, however
    long past the silence limit its boot takes."""
    monkeypatch.setattr(labmod, "BOOT_STALL", 1.5)
    monkeypatch.setattr(labmod, "load_factor", lambda: 1.0)
    _fake_run_sh(tmp_path / "shared", 'mkdir -p "${LOG%/*}"; for i in $(seq 15); do '
                 'echo "[  $i] booting" >> "$LOG"; sleep 0.2; done')
    lab = Lab(tmp_path / "shared", tmp_path / "cache")
    assert lab.boot(4) and lab.booted == [4]
    assert (tmp_path / "cache" / "run" / "g4.console.log").read_text().count("booting") == 15


def test_boot_fails_once_the_console_is_silent(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A guest whose console stops (a hung boot) fails after the silence limit, scaled by
    the host's load, with an error that says so (not after the whole boot budget)."""
    monkeypatch.setattr(labmod, "BOOT_STALL", 1.0)
    monkeypatch.setattr(labmod, "load_factor", lambda: 2.0)
    _fake_run_sh(tmp_path / "shared", 'mkdir -p "${LOG%/*}"; echo "[  0] booting" >> "$LOG"; '
                 'sleep 600')
    lab = Lab(tmp_path / "shared", tmp_path / "cache")
    with pytest.raises(LabError, match=r"g4 did not boot: its console was silent for \d+s "
                                       r"after \d+s \(host load 2\.0 per core"):
        lab.boot(4)
    assert lab.booted == [4]  # ours to stop
    assert labmod.BOOT_TIMEOUT > 600  # the overall cap leaves a loaded host its time


def test_capi_cases_run_the_stock_binary_on_both_sides() -> None:
    """Issue 22: a C case runs the same binary in the guest and, under ``softrdma run``
    on softrdma's device with the host's GID index and addresses, on the host."""
    names = [c.name for c in C.capi_cases()]
    for n in ("c/rc_pingpong/rxe/s4096", "c/uc_pingpong/rxe/s4096", "c/ud_pingpong/rxe/s512",
              "c/srq_pingpong/rxe/s4096", "c/rping/rxe/s64", "c/rping/siw/s64",
              "c/ucmatose/rxe", "c/udaddy/rxe", "c/write_bw-R/siw/s4096"):
        assert n in names
    for t in ("write_bw", "read_bw", "send_bw"):
        assert f"c/{t}/rxe/s4096" in names and f"c/{t}-R/rxe/s4096" in names
    assert set(names) <= {c.name for c in C.all_cases()}
    assert all(c.softrdma_tool == "run" for c in C.capi_cases())
    assert [c.name for c in C.select(C.all_cases(), "c/*")] == names
    pp = next(c for c in C.capi_cases() if c.tool == "ibv_srq_pingpong")
    srv = C.commands(pp, "softrdma-server", EP)
    assert srv.server == ("python3 -m softrdma run -d ilab -- ibv_srq_pingpong -d ilab -g 0 "
                          "-n 20 -s 4096 -c -m 1024")
    assert srv.client == "ibv_srq_pingpong -d rxe0 -g 1 -n 20 -s 4096 -c -m 1024 10.50.0.24"
    cli = C.commands(pp, "softrdma-client", EP)
    assert cli.client.endswith("-- ibv_srq_pingpong -d ilab -g 0 -n 20 -s 4096 -c -m 1024 "
                               "10.50.0.14")
    rp = next(c for c in C.capi_cases() if c.name == "c/rping/siw/s64")
    c = C.commands(rp, "softrdma-server", EP)
    assert c.server == ("python3 -m softrdma run -d iwlab -- rping -s -a 10.50.0.24 -v -V "
                        "-C 5 -S 64")
    assert c.client == "rping -c -a 10.50.0.24 -v -V -C 5 -S 64"
    bw = next(c for c in C.capi_cases() if c.name == "c/read_bw-R/rxe/s4096")
    c = C.commands(bw, "softrdma-client", EP)
    assert c.server == "ib_read_bw -d rxe0 -x 1 -R -F -n 100 -s 4096"
    assert c.client == ("env SOFTRDMA_CM_RETRY_NO_LISTENER=10 "  # cm.rdma_retry
                        "python3 -m softrdma run -d ilab -- ib_read_bw -d ilab -x 0 -R -F "
                        "-n 100 -s 4096 10.50.0.14")
    cm = next(c for c in C.capi_cases() if c.name == "c/udaddy/rxe")
    assert C.commands(cm, "softrdma-server", EP).server.endswith(
        "-- udaddy -b 10.50.0.24 -C 5")


# -- the C perftest -R client's retry (issue 22) ----------------------------------------------
REFUSED = (" Unable to perform rdma_client function\n Unable to init the socket connection\n")
# the guest's perftest 4.5-0.17 client (Linux) whose second connection got a REJ 8 from
# softrdma's server (from a lab run: its retry crashed before more lines)
LINUX_REJECTED = """\
Device not recognized to implement inline feature. Disabling it
RDMA CM event error:
Event: RDMA_CM_EVENT_REJECTED; error: 8.

ERRNO: Operation not supported.
Failed to handle RDMA CM event.
ERRNO: Operation not supported.
Failed to connect RDMA CM events.
ERRNO: Operation not supported.
"""
# perftest 4.5-0.17's client whose second connection got a REJ (from a lab run)
REJECTED = """\
RDMA CM event error:
Event: RDMA_CM_EVENT_REJECTED; error: 8.

ERRNO: Connection timed out.
Failed to handle RDMA CM event.
ERRNO: Connection timed out.
Failed to connect RDMA CM events.
ERRNO: Connection timed out.
Failed to resolve RDMA CM address.
ERRNO: Invalid argument.
Failed to destroy RDMA CM ID number 0.
ERRNO: Invalid argument.
Failed to destroy RDMA CM contexts.
ERRNO: Invalid argument.
Failed to create RDMA CM connection.
ERRNO: Invalid argument.
Failed to create RDMA CM connection with resources.
"""


class _Proc:
    def __init__(self) -> None:
        self.rc: int | None = None

    def poll(self) -> int | None:
        return self.rc


class _FakeProcess:
    """A guest or host process that has run when waited for: ``rc`` and ``text``."""

    def __init__(self, rc: int, text: str) -> None:
        self.proc = _Proc()
        self.rc, self.text, self.output = rc, text, ""

    def wait(self, timeout: float) -> int:
        self.proc.rc, self.output = self.rc, self.text
        return self.rc

    def kill(self) -> None:
        pass


class _Exchange:
    """One C perftest ``-R`` case with softrdma as the client, on a fake lab: the guest's
    server runs until waited for, the host's clients print ``clients`` in turn, the guest's
    rdma_cm listener shows or not as ``listening`` says, probe by probe (then it shows)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 clients: list[tuple[int, str]], listening: tuple[bool, ...] = (),
                 case: str = "c/write_bw-R/rxe/s4096",
                 server: tuple[int, str] = (0, BW_TABLE)) -> None:
        from softrdma.interop import runner
        monkeypatch.setattr(runner, "POLL_INTERVAL", 0.0)
        self.case = next(c for c in C.all_cases() if c.name == case)
        self.suite = runner.Suite(Lab(tmp_path, tmp_path), runner.Options(5, out_dir=tmp_path))
        self.clients = list(clients)
        self.spawned: list[str] = []
        self.probes: list[str] = []
        self.listening = list(listening)
        self.servers: list[_FakeProcess] = []
        self.server = server
        monkeypatch.setattr(self.suite.lab, "spawn_guest", self._spawn_guest)
        monkeypatch.setattr(self.suite.lab, "ssh", self._ssh)
        monkeypatch.setattr(self.suite.host, "spawn", self._spawn)

    def _spawn_guest(self, n: int, tag: str, command: str) -> _FakeProcess:
        self.servers.append(_FakeProcess(*self.server))
        return self.servers[-1]

    def _ssh(self, n: int, command: str, timeout: float = 0.0
             ) -> subprocess.CompletedProcess[str]:
        self.probes.append(command)
        up = self.listening.pop(0) if self.listening else True
        return subprocess.CompletedProcess(command, 0, "LISTEN :18515 \n" if up else "")

    def _spawn(self, argv: list[str]) -> _FakeProcess:
        self.spawned.append(" ".join(argv))
        rc, text = self.clients.pop(0)
        return _FakeProcess(rc, text)

    def run(self) -> tuple[Result, str, str]:
        cmds = C.commands(self.case, "softrdma-client", EP)
        r = Result(self.case.name, "softrdma-client")
        srv, cli = self.suite._exchange(self.case, cmds, "t", r)
        return r, srv, cli


PINGS = "".join(f"ping data: rdma-ping-{i}: ABC\n" for i in range(5))
# a lab run's guest rping server (rdma-core v44), exit 255: its CM event thread read the
# event channel that its main thread had destroyed after the DISCONNECT (rdma-core f3ae6534)
RPING_RACE = ("server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n"
              "rdma_get_cm_event: Bad file descriptor\n" + PINGS.replace("ping", "server ping"))


def test_rping_teardown_race_is_recognised_only_after_a_clean_disconnect() -> None:
    assert parse.rping_teardown_race(RPING_RACE)
    assert parse.rping_teardown_race("client DISCONNECT EVENT...\n"
                                     "rdma_get_cm_event: Bad file descriptor\n" + PINGS)
    # exit 255 without the race's line, or before any DISCONNECT: a real failure
    assert not parse.rping_teardown_race(RPING_RACE.replace("Bad file descriptor", "x"))
    assert not parse.rping_teardown_race("rdma_get_cm_event: Bad file descriptor\n" + PINGS)
    # any other line beside it still counts: a completion error, a wait in the wrong state
    for other in ("cq completion failed status 5", "wait for RDMA_READ_COMPLETE state 10",
                  "wait for RDMA_READ_ADV state 11"):
        assert not parse.rping_teardown_race(RPING_RACE + other + "\n"), other


@pytest.mark.parametrize("text, passed", [(RPING_RACE, True),
                                          (RPING_RACE + "cq completion failed status 5\n",
                                           False)])
def test_linux_rping_teardown_race_is_a_note_not_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, passed: bool) -> None:
    """The guest's rping server saw every ping and the DISCONNECT, then exited 255 from its
    own teardown race: the case passes with a note saying so. With any other error line
    the exit still fails it."""
    ex = _Exchange(tmp_path, monkeypatch, [(0, "client DISCONNECT EVENT...\n" + PINGS)],
                   case="rping/siw/s64", server=(255, text))
    r, srv, _ = ex.run()
    assert srv == text
    assert r.passed is passed, r.reasons
    if passed:
        assert len(r.notes) == 1 and "teardown race" in r.notes[0], r.notes
    else:
        assert "linux server exited 255" in r.reasons


def test_client_retry_only_for_a_refused_first_connection() -> None:
    from softrdma.interop.runner import client_retry
    by_name = {c.name: c for c in C.all_cases()}
    r_case = by_name["c/read_bw-R/rxe/s4096"]
    assert [c.name for c in C.all_cases() if c.retries_client] == [
        "c/write_bw-R/rxe/s4096", "c/read_bw-R/rxe/s4096", "c/send_bw-R/rxe/s4096",
        "c/write_bw-R/siw/s4096"]
    assert client_retry(r_case, True, 1, "header\n" + REFUSED) == "client"
    assert client_retry(r_case, True, 1, REJECTED) == "pair"
    assert not client_retry(r_case, False, 1, REFUSED)  # the guest's client: not ours
    # the guest's Linux client lost the race against softrdma's server: a new pair; its
    # 4.5-0.17 retry crashed on the ids it freed (exit 255 over ssh, from a lab run)
    assert client_retry(r_case, False, 255, LINUX_REJECTED) == "pair"
    assert client_retry(r_case, True, 1, LINUX_REJECTED) == "pair"
    assert not client_retry(r_case, True, 0, REFUSED)  # it passed
    assert not client_retry(r_case, True, None, REFUSED)  # killed: it hung, no retry
    # the second connection, a crash, or the text only quoted in another line
    assert not client_retry(r_case, True, 1, "Failed to create RDMA CM connection with "
                                             "resources.\n")
    assert not client_retry(r_case, True, 1, "x Unable to perform rdma_client function y\n")
    assert not client_retry(r_case, True, 1, "Event: RDMA_CM_EVENT_REJECTED; error: 8.\n")
    for name in ("write_bw-R/rxe/s4096", "c/write_bw/rxe/s4096", "c/rping/rxe/s64"):
        assert not client_retry(by_name[name], True, 1, REFUSED)
        assert not client_retry(by_name[name], True, 1, REJECTED)


def test_refused_client_is_started_again_once_the_guest_listens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slow guest's perftest server did not listen yet when softrdma's client made its
    first connection: the runner waits until the guest's rdma_cm listener shows (here at
    the 4th probe after the refusal), starts the client again, and the case passes with a note."""
    # listening at the first probe; after the refusal, it shows again at the 4th
    ex = _Exchange(tmp_path, monkeypatch, [(1, REFUSED), (0, BW_TABLE)],
                   listening=(True, False, False, False, True))
    r, srv, cli = ex.run()
    assert r.passed, r.reasons
    assert len(ex.spawned) == 2 and ex.spawned[0] == ex.spawned[1]
    assert len(ex.servers) == 1  # the same server, still waiting for its first client
    assert len(ex.probes) == 5 and all("LISTEN" in p and ":18515 " in p for p in ex.probes)
    assert cli == BW_TABLE and srv == BW_TABLE  # the checks see the attempt that ran
    assert (tmp_path / "t.client.1.log").read_text() == REFUSED
    assert r.notes == ["client started again (1 of 3): Unable to perform rdma_client "
                       "function (its first rdma_cm connection was refused)"]
    assert "client started again (1 of 3)" in render_table([r])


def test_refused_client_gives_up_after_its_retries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from softrdma.interop.runner import CLIENT_RETRIES
    ex = _Exchange(tmp_path, monkeypatch, [(1, REFUSED)] * (CLIENT_RETRIES + 2))
    r, _, cli = ex.run()
    assert len(ex.spawned) == CLIENT_RETRIES + 1
    assert not r.passed and "softrdma client exited 1" in r.reasons
    assert cli == REFUSED and len(r.notes) == CLIENT_RETRIES


@pytest.mark.parametrize("case,text", [
    ("c/write_bw-R/rxe/s4096", "Failed to create RDMA CM connection with resources.\n"),
    ("c/write_bw/rxe/s4096", REFUSED),
])
def test_other_client_failures_are_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               case: str, text: str) -> None:
    ex = _Exchange(tmp_path, monkeypatch, [(1, text), (0, BW_TABLE)], case=case)
    r, _, _ = ex.run()
    assert len(ex.spawned) == 1 and not r.passed and not r.notes


def test_rejected_second_connection_restarts_the_pair(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """perftest's second connection was rejected (its server did not listen again yet):
    perftest 4.5-0.17's server then waits for ever, so a new server is started (and waited
    for: the new listener shows at the 2nd probe) before the client comes again."""
    ex = _Exchange(tmp_path, monkeypatch, [(1, REJECTED), (0, BW_TABLE)],
                   listening=(True, False, True))
    r, srv, cli = ex.run()
    assert r.passed, r.reasons
    assert len(ex.servers) == 2 and ex.servers[0].proc.rc == 0  # the first one was ended
    assert len(ex.spawned) == 2 and len(ex.probes) == 3
    assert cli == BW_TABLE and (tmp_path / "t.client.1.log").read_text() == REJECTED
    assert r.notes == ["client started again (1 of 3, with a new server): its second "
                       "rdma_cm connection was rejected (the server did not listen again yet)"]


def test_capi_cases_for_the_issues_other_programs() -> None:
    """Issue 22's must-run programs beyond the first C cases: librdmacm's rdma_server /
    rdma_client and mckey, perftest's latency tools and atomics, over rxe."""
    by_name = {c.name: c for c in C.capi_cases()}
    ex = C.commands(by_name["c/rdma_server/rxe"], "softrdma-client", EP)
    assert ex.server == "rdma_server -s 10.50.0.14 -p 7471"
    assert ex.client == ("python3 -m softrdma run -d ilab -- rdma_client -s 10.50.0.14 "
                         "-p 7471")
    xs = C.commands(by_name["c/rdma_xserver/rxe"], "softrdma-server", EP)
    assert xs.server == "python3 -m softrdma run -d ilab -- rdma_xserver -p 7471"
    assert xs.client == "rdma_xclient -s 10.50.0.24 -p 7471"
    xc = C.commands(by_name["c/rdma_xserver/rxe"], "softrdma-client", EP)
    assert xc.server == "rdma_xserver -p 7471"
    assert xc.client == "python3 -m softrdma run -d ilab -- rdma_xclient -s 10.50.0.14 -p 7471"
    mk = C.commands(by_name["c/mckey/rxe"], "softrdma-server", EP)
    assert mk.server == "python3 -m softrdma run -d ilab -- mckey -m 239.1.2.3 -b 10.50.0.24 -C 5"
    assert mk.client == "mckey -m 239.1.2.3 -b 10.50.0.14 -C 5 -s"
    lat = C.commands(by_name["c/write_lat/rxe/s64"], "softrdma-client", EP)
    assert lat.server == "ib_write_lat -d rxe0 -x 1 -F -n 100 -s 64"
    assert lat.client.endswith("-- ib_write_lat -d ilab -x 0 -F -n 100 -s 64 10.50.0.14")
    # atomics are 8 bytes: no -s (perftest's own size)
    at = C.commands(by_name["c/atomic_lat/rxe"], "softrdma-server", EP)
    assert at.client == "ib_atomic_lat -d rxe0 -x 1 -F -n 100 10.50.0.24"
    assert C.commands(by_name["c/atomic_bw/rxe"], "softrdma-server", EP).client == (
        "ib_atomic_bw -d rxe0 -x 1 -F -n 100 10.50.0.24")


def test_capi_rstream_cases() -> None:
    """rsockets (librdmacm's rstream, data checked with -T v) over rxe and siw: the same
    binary on both sides, the host's under ``softrdma run``; a side passes once it printed
    its result row."""
    by_name = {c.name: c for c in C.capi_cases()}
    rx = C.commands(by_name["c/rstream/rxe/s65536"], "softrdma-server", EP)
    assert rx.server == ("python3 -m softrdma run -d ilab -- rstream -b 10.50.0.24 -p 7471 "
                         "-T v -S 65536 -C 10")
    assert rx.client == "rstream -s 10.50.0.24 -p 7471 -T v -S 65536 -C 10"
    iw = C.commands(by_name["c/rstream/siw/s8192"], "softrdma-client", EP)
    assert iw.server == "rstream -b 10.50.0.14 -p 7471 -T v -S 8192 -C 10"
    assert iw.client.startswith("python3 -m softrdma run -d iwlab -- rstream -s 10.50.0.14 ")
    row = "custom    64k     10      1       1.2m        0.50s      0.02    50000.00"
    assert parse.rstream_done("name      bytes   xfers\n" + row + "\n")
    assert not parse.rstream_done("name      bytes   xfers\ndata verification failed byte 7\n")
    assert parse.error_lines("data verification failed byte 7") != []

"""The ``softrdma`` command line: dispatch, help, argument errors, --version, and the
devinfo and demo tools on real devices."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ports

from softrdma import enums as e
from softrdma.tools import cli, demo
from softrdma.tools.cli import main

SRC = str(Path(__file__).resolve().parents[2] / "src")
SUBCOMMANDS = ["devinfo", "rc-pingpong", "uc-pingpong", "ud-pingpong", "demo", "pcap-check",
               "rping", "udaddy", "ucmatose"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        rc = int(exc.code or 0)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# -- help, version, dispatch ------------------------------------------------------------

def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["--version"], capsys)
    assert rc == 0 and re.fullmatch(r"softrdma \d+\.\d+\S*\n", out), out


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["--help"], capsys)
    assert rc == 0
    for name in [*SUBCOMMANDS, "link"]:
        assert name in out


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run([], capsys)
    assert rc == 2 and "usage: softrdma" in err


@pytest.mark.parametrize("cmd,expect", [
    ("devinfo", ["--ib-dev", "--ib-port", "--list", "--verbose"]),
    ("rc-pingpong", ["--port", "--ib-dev", "--ib-port", "--size", "--mtu", "--rx-depth",
                     "--iters", "--sl", "--events", "--gid-idx", "--chk", "--odp",
                     "--loopback", "default 4096", "default 18515", "default 500",
                     "default 1000", "default 1024"]),
    ("uc-pingpong", ["--mtu", "--chk", "--loopback", "default 4096"]),
    ("ud-pingpong", ["--gid-idx", "--loopback", "default 2048"]),
    ("demo", ["--size", "--mtu", "--transport", "--port", "4791"]),
    ("pcap-check", ["FILE"]),
    ("rping", ["-s", "-c", "-a", "-I", "-p", "-C", "-S", "-v", "-V", "-d", "-P", "--timeout",
               "persistent server mode"]),
    ("udaddy", ["-s server_address", "-b bind_address", "-f address_format",
                "-P port_space", "-c connections", "-C message_count", "-S message_size",
                "-t type_of_service", "-p port_space", "0x111 for UDP", "--timeout"]),
    ("ucmatose", ["-s server_address", "-b bind_address", "-f address_format",
                  "-P port_space", "-c connections", "-C message_count", "-S message_size",
                  "-t type_of_service", "-p port_number", "-m", "-a ack_timeout", "(7471)",
                  "--transport"]),
])
def test_subcommand_help(cmd: str, expect: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run([cmd, "--help"], capsys)
    assert rc == 0
    flat = " ".join(out.split())
    for word in expect:
        assert word in flat, (word, out)


def test_ud_pingpong_has_no_mtu_option(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["ud-pingpong", "-m", "1024"], capsys)
    assert rc == 2 and "unrecognized arguments" in err


@pytest.mark.parametrize("argv,msg", [
    (["rc-pingpong", "-m", "1000"], "MTU must be 256, 512, 1024, 2048 or 4096"),
    (["rc-pingpong", "-p", "70000"], "port must be 0..65535"),
    (["rc-pingpong", "-n", "zero"], "invalid integer"),
    (["rc-pingpong", "-n", "0"], "iters must be"),
    (["uc-pingpong", "--timeout", "-1"], "timeout must be > 0"),
    (["rc-pingpong", "host1", "host2"], "unrecognized arguments: host2"),
    (["devinfo", "-i", "0"], "port must be >= 1"),
    (["devinfo", "--bogus"], "unrecognized arguments: --bogus"),
    (["demo", "--mtu", "9000"], "MTU must be"),
    (["demo", "--port", "0"], "UDP port must be 1..65535"),
    (["demo", "--transport", "ib"], "invalid choice"),
    (["pcap-check"], "the following arguments are required: FILE"),
    (["no-such-command"], "invalid choice"),
])
def test_argument_errors(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and msg in err and out == ""
    assert f"usage: softrdma {argv[0]}" in err or "usage: softrdma [" in err


def test_hex_and_octal_numbers_like_strtol(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["rc-pingpong", "-p", "0x4853", "-n", "010", "-s", "64"])
    assert (args.port, args.iters, args.size) == (18515, 8, 64)


def test_pcap_check_dispatch(monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []
    fake = types.ModuleType("softrdma.tools.capture.pcap_check")

    kwargs: list[dict[str, object]] = []

    def fake_run(paths: list[str], **kw: object) -> int:
        calls.append(paths)
        kwargs.append(kw)
        return 3

    fake.run = fake_run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "softrdma.tools.capture.pcap_check", fake)
    rc, _, _ = _run(["pcap-check", "a.pcap", "b.pcapng"], capsys)
    assert rc == 3 and calls == [["a.pcap", "b.pcapng"]]
    assert kwargs[-1] == {"udp_ports": (), "max_errors": 20, "verbose": False}
    rc, _, _ = _run(["pcap-check", "-v", "--max-errors", "0", "--udp-port", "4792", "c.pcap"],
                    capsys)
    assert rc == 3 and kwargs[-1] == {"udp_ports": (4792,), "max_errors": 0, "verbose": True}
    for bad in (["--max-errors", "-1"], ["--udp-port", "70000"], ["--max-errors", "x"]):
        with pytest.raises(SystemExit) as exc:
            main(["pcap-check", *bad, "c.pcap"])
        assert exc.value.code == 2
    assert len(calls) == 2


def test_link_dispatch_passes_arguments_in_order(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []
    fake = types.ModuleType("softrdma.tools.admin.link")

    def cmd_link(args: list[str]) -> int:
        calls.append(args)
        return 0

    fake.cmd_link = cmd_link  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "softrdma.tools.admin.link", fake)
    for argv in (["link"], ["link", "add", "x", "netdev", "lo", "port", "5000"],
                 ["link", "-d"], ["link", "--help"], ["link", "show", "x", "-d"]):
        rc, _, _ = _run(argv, capsys)
        assert rc == 0
    assert calls == [[], ["add", "x", "netdev", "lo", "port", "5000"], ["-d"], ["--help"],
                     ["show", "x", "-d"]]


@pytest.mark.parametrize("argv,module", [
    (["pcap-check", "x.pcap"], "softrdma.tools.capture.pcap_check"),
    (["link", "show"], "softrdma.tools.admin.link"),
])
def test_missing_tool_module_is_one_line_error(argv: list[str], module: str,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    rc, _, err = _run(argv, capsys)
    assert rc == 1
    assert err.count("\n") == 1 and "is not available" in err and module in err


def test_missing_own_module_keeps_cli_alive(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "softrdma.tools.demo", None)
    rc, _, err = _run(["demo", "--size", "64"], capsys)
    assert rc == 1 and "softrdma.tools.demo" in err
    rc, out, _ = _run(["--version"], capsys)  # the rest of the CLI still works
    assert rc == 0 and out.startswith("softrdma ")


def test_unsupported_pingpong_features_are_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["rc-pingpong", "-o", "-j"], capsys)
    assert rc == 1 and "DM memory region can't be on demand" in err and err.count("\n") == 1
    rc, _, err = _run(["rc-pingpong", "-P"], capsys)
    assert rc == 1 and "prefetch is valid only with on-demand memory region" in err
    rc, _, err = _run(["demo", "--transport", "iwarp"], capsys)
    assert rc == 1 and "iWARP demo is not available" in err


def test_loopback_with_servername_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["rc-pingpong", "--loopback", "somehost"], capsys)
    assert rc == 1 and "--loopback" in err


def test_python_dash_m(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=SRC, SOFTRDMA_STATE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "softrdma", "--version"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.startswith("softrdma ")
    p = subprocess.run([sys.executable, "-m", "softrdma", "rc-pingpong", "-m", "3"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "MTU must be" in p.stderr


@pytest.mark.parametrize("argv,named", [
    (["rc-pingpong", "-n", "5"], "rc-pingpong"),
    (["--trace", "qp", "write-bw", "host"], "write-bw"),
    (["--trace=qp,cm", "--pcap", "x.pcap", "rping", "-s"], "rping"),
    (["--tra", "pkt", "link", "show"], "link"),  # argparse's abbreviation of --trace
    (["--pcap=x.pcap", "ud-pingpong"], "ud-pingpong"),
    (["--help", "rc-pingpong"], ""),
    (["--version"], ""),
    (["-x", "demo"], ""),
    (["--trace"], ""),
    ([], ""),
])
def test_command_named(argv: list[str], named: str) -> None:
    assert cli.command_named(argv) == named


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_a_parser_for_one_command_parses_it_as_the_full_parser() -> None:
    """build_parser(NAME) gives NAME the options the full parser gives it (the same help
    text, so the same flags, defaults and choices) and lists every other command."""
    full = _subparsers(cli.build_parser())
    assert len(full) > 30
    for name, sub in full.items():
        one = _subparsers(cli.build_parser(name))
        assert one.keys() == full.keys()
        assert one[name].format_help() == sub.format_help(), name
    bare = _subparsers(cli.build_parser(""))
    assert "-s SIZE" in full["rc-pingpong"].format_help()
    assert "-s SIZE" not in bare["rc-pingpong"].format_help()


def test_a_tool_imports_its_own_module_only(state: Path) -> None:
    """A tool's process loads its own tool module, not every tool's (the parser of one
    command), nor the version lookup, and a RoCE device's process no iWARP stack,
    CRC-32C or asyncio (each imported where it is used). The device is ``state``'s
    'clitest', on a free port: the built-in device's port 4791 may be a running devd's
    on this host."""
    probe = (
        "import sys\n"
        "from softrdma.tools import cli\n"
        "cli.build_parser(cli.command_named(['rc-pingpong', '-n', '5']))\n"
        "import softrdma.verbs as v\n"
        "ctx = v.Context('clitest')\n"
        "assert ctx.transport == 'roce', ctx.transport\n"
        "ctx.close()\n"
        "print(' '.join(sorted(sys.modules)))\n")
    env = dict(os.environ, PYTHONPATH=SRC)  # the fixture's private registry, not shared
    p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    loaded = set(p.stdout.split())
    assert "softrdma.tools.ibverbs.pingpong_options" in loaded
    for absent in ("softrdma.tools.perftest.options", "softrdma.tools.rdmacm.rping",
                   "softrdma.tools.capture.ladder", "importlib.metadata", "crc32c",
                   "softrdma.wire.mpa", "softrdma.iwarp.engine", "softrdma.drivers.runtime.tcp",
                   "asyncio"):
        assert absent not in loaded, absent


# -- devinfo and demo on real devices -------------------------------------------------

@pytest.fixture()
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private registry with the built-in device plus 'clitest' (lo, ephemeral port)."""
    from softrdma.drivers.host.registry import Registry

    monkeypatch.setenv("SOFTRDMA_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("SOFTRDMA_SHARED", "0")
    Registry(tmp_path).add("clitest", "lo", "roce", ports.free_port())
    yield tmp_path


def test_devinfo_list(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["devinfo", "-l"], capsys)
    assert rc == 0
    assert out == "3 HCAs found:\n\tsoftrdma_lo\n\tclitest\n\tsoftrdma_iw_lo\n\n"


def test_devinfo_device(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["devinfo", "-d", "clitest"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "hca_id:\tclitest"
    assert lines[1] == "\ttransport:\t\t\tInfiniBand (0)"
    assert re.search(r"^\tnode_guid:\t\t\t[0-9a-f]{4}(:[0-9a-f]{4}){3}$", out, re.M)
    assert re.search(r"^\tvendor_id:\t\t\t0x[0-9a-f]{4,}$", out, re.M)
    assert "\tphys_port_cnt:\t\t\t1" in lines
    assert "\t\tport:\t1" in lines
    assert "\t\t\tstate:\t\t\tPORT_ACTIVE (4)" in lines
    assert "\t\t\tmax_mtu:\t\t4096 (5)" in lines
    assert "\t\t\tlink_layer:\t\tEthernet" in lines
    assert "\t\t\tsm_lid:\t\t\t0" in lines and "\t\t\tport_lmc:\t\t0x00" in lines
    assert "GID[" not in out and "max_qp:" not in out  # only with -v
    assert out.endswith("\n\n")


def test_devinfo_verbose(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["devinfo", "-v", "-d", "clitest", "-i", "1"], capsys)
    assert rc == 0, err
    assert re.search(r"^\tmax_qp:\t\t\t\t\d+$", out, re.M)
    assert re.search(r"^\tatomic_cap:\t\t\tATOMIC_(HCA|NONE|GLOB) \(\d\)$", out, re.M)
    assert "\t\t\tGID[  0]:\t\t::ffff:127.0.0.1, RoCE v2" in out.splitlines()


def test_devinfo_errors(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["devinfo", "-d", "nope"], capsys)
    assert rc == 1 and "IB device 'nope' wasn't found" in err
    rc, _, err = _run(["devinfo", "-d", "clitest", "-i", "2"], capsys)
    assert rc == 1 and "Invalid port" in err


def test_demo_succeeds(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = ports.free_port()
    rc, out, err = _run(["demo", "--port", str(port), "--size", "5000", "--mtu", "1024"],
                        capsys)
    assert rc == 0, out + err
    for op in ("SEND/RECV", "RDMA WRITE", "RDMA READ", "ATOMIC CMP_AND_SWP",
               "ATOMIC FETCH_AND_ADD"):
        line = next(x for x in out.splitlines() if x.strip().startswith(op))
        assert "IBV_WC_SUCCESS" in line and "verify OK" in line, line
    assert f"127.0.0.1:{port}" in out
    m = re.search(r"packets: (\d+) sent, (\d+) received", out)
    assert m and int(m.group(1)) >= 12 and int(m.group(1)) == int(m.group(2))
    assert out.rstrip().endswith("OK: all 5 checks passed")


def test_demo_port_in_use(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        rc, _, err = _run(["demo", "--port", str(port)], capsys)
    assert rc == 1 and err.count("\n") == 1
    assert f"UDP port {port}" in err and "already in use" in err and "--port" in err


def test_demo_error_completions_fail(state: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """QPs and memory without remote access: the RDMA WRITE is NAKed (invalid request, as
    rxe's check_op_valid), the QP goes to the error state and the demo exits 1."""
    monkeypatch.setattr(demo, "ACCESS", e.IBV_ACCESS_LOCAL_WRITE)
    rc, out, err = _run(["demo", "--port", str(ports.free_port()), "--timeout", "5"], capsys)
    assert rc == 1, out + err
    line = next(x for x in out.splitlines() if x.strip().startswith("RDMA WRITE"))
    assert "remote invalid request error (9) verify FAILED" in line, line
    assert "FAILED" in out or "no completion" in err

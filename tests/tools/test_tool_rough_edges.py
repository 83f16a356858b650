"""Rough edges of the tools (issue 24 §4): host names for rping, a hint for --trace and
--pcap given after the tool's name, rdma-core's DEV/PORT form and -j for ``link`` and
``stats``, the tool's name (not its arguments) when ``softrdma pyverbs`` is interrupted."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.device import private_device
from harness.rping import _run_pair

from softrdma.errors import InvalidArgument
from softrdma.tools import cli
from softrdma.tools.admin import link
from softrdma.tools.rdmacm import rping

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _rping_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    rping.add_arguments(p)
    args = p.parse_args(list(argv))
    rping.check_args(args)
    return args


def test_rping_takes_host_names() -> None:
    assert _rping_args("-c", "-a", "localhost").addr == "127.0.0.1"  # IPv4 first
    assert _rping_args("-c", "-a", "::1", "-I", "localhost").source == "127.0.0.1"
    with pytest.raises(InvalidArgument, match="-a: not an IP address or a known host name"):
        _rping_args("-c", "-a", "no-such-host.invalid")


def test_rping_client_to_localhost(tmp_path: Path) -> None:
    client, sout, serr, src = _run_pair(tmp_path, "roce", "localhost", 2, 64)
    assert client.returncode == 0, client.stderr
    assert src == 0, serr
    assert len(client.stdout.splitlines()) == 2


@pytest.mark.parametrize("argv", [["rc-pingpong", "--pcap", "x.pcap"],
                                  ["devinfo", "--trace=pkt"],
                                  ["srq-pingpong", "--trace", "pkt", "--pcap", "y"]])
def test_global_options_after_the_tool_get_a_hint(argv: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        cli.main(argv)
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert "of softrdma itself: put" in err and "softrdma --" in err, err
    assert f"before the tool's name, as in: softrdma {argv[1].split('=')[0]} ... {argv[0]}" in err


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return private_device("edge0", tmp_path, monkeypatch, subprocesses=False)


def _link(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = link.cmd_link(list(argv), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_link_dev_port_and_json(device: str) -> None:
    rc, out, err = _link("show", f"{device}/1")
    assert rc == 0, err
    assert out.startswith(f"link {device}/1 state ") and out.count("\n") == 1
    assert _link("show", device)[1] == out
    rc, out, err = _link("show", "softrdma_iw_lo/1", "-d")
    assert rc == 0 and " type iwarp " in out, err
    rc, _, err = _link("show", f"{device}/2")
    assert rc == 1 and "has no port 2 (only port 1)" in err
    for argv in (["-j", "show", f"{device}/1"], ["show", f"{device}/1", "-j"],
                 ["show", f"{device}/1", "-j", "-p"]):
        rc, out, err = _link(*argv)
        assert rc == 0, err
        (obj,) = json.loads(out)
        assert obj["ifname"] == device and obj["port"] == 1 and obj["netdev"] == "lo"
        assert obj["state"] in ("ACTIVE", "DOWN")
    assert "\n  " in _link("-p", "show")[1]  # pretty
    rc, out, _ = _link("-j")
    assert {device, "softrdma_iw_lo"} <= {o["ifname"] for o in json.loads(out)}


def test_stats_dev_port(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stats", "show", "link", "softrdma_iw_lo/1"]) == 0
    assert capsys.readouterr().out.startswith("link softrdma_iw_lo/1 sent_pkts ")
    assert cli.main(["stats", "-d", f"{device}/1"]) == 0
    assert capsys.readouterr().out.startswith(f"link {device}/1 sent_pkts 0 ")
    assert cli.main(["stats", "-j", "show", "link", f"{device}/1"]) == 0
    (obj,) = json.loads(capsys.readouterr().out)
    assert obj["ifname"] == device and obj["sent_pkts"] == 0
    assert cli.main(["stats", "show", "link", "softrdma_iw_lo/2"]) == 1
    assert "has no port 2" in capsys.readouterr().err


def test_interrupted_pyverbs_names_the_tool(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to softrdma) while the pyverbs program runs."""
    prog = "import time; print('ready', flush=True); time.sleep(60)"
    env = dict(os.environ, PYTHONPATH=SRC, SOFTRDMA_STATE_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "softrdma", "pyverbs", "--",
                             sys.executable, "-c", prog], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 60
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "softrdma pyverbs: interrupted", err


@pytest.mark.parametrize("tool", ["rc-pingpong", "ud-pingpong", "srq-pingpong"])
def test_pingpong_server_refuses_unknown_device_before_waiting(tool: str) -> None:
    """A server given ``-d`` naming no device says so and exits 1 before it announces
    that it waits for a client (``ibv_rc_pingpong`` opens its device first): before, it
    printed ``waiting for a client`` and then the error."""
    p = subprocess.run([sys.executable, "-m", "softrdma", tool, "-d", "no_such_dev",
                        "-p", "0"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": SRC}, check=False)
    assert p.returncode == 1, p.stderr
    assert "waiting for a client" not in p.stderr
    assert p.stderr.startswith(f"softrdma {tool}: error: IB device no_such_dev not found"), p.stderr

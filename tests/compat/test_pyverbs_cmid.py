"""``pyverbs.cmid`` on softrdma (issue 14): an unmodified pyverbs rdma_cm program (server
and client in two processes under ``softrdma pyverbs``) connects, exchanges a message each
way and disconnects, on RoCE (the IB CM) and on iWARP (TCP + MPA); the synchronous API
(``rdma_create_ep``/``get_request``) and the parameter objects in one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness.device import private_device
from harness.ports import free_port

from softrdma.tools.suites.pyverbs_run import shim_env

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROG = str(Path(__file__).resolve().parents[1] / "data" / "pyverbs_cm_pingpong.py")


@pytest.fixture()
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return private_device("cmt0", tmp_path, monkeypatch)


def _pair(device: str) -> tuple[str, str]:
    port = str(free_port())
    env = shim_env(device)
    cmd = [sys.executable, "-m", "softrdma", "pyverbs", "--", sys.executable, PROG]
    server = subprocess.Popen([*cmd, "server", "127.0.0.1", port], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "listening"
        client = subprocess.run([*cmd, "client", "127.0.0.1", port], env=env, text=True,
                                capture_output=True, timeout=120, check=False)
        out, _ = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert client.returncode == 0, client.stdout + client.stderr
    assert server.returncode == 0, out
    return client.stdout.strip(), out.strip()


def test_pyverbs_rdma_cm_program_on_roce(state: str) -> None:
    client, server = _pair(state)
    assert client == f"client got pong on {state}"
    assert server == f"server got ping on {state}"


def test_pyverbs_rdma_cm_program_on_iwarp(state: str) -> None:
    client, server = _pair("softrdma_iw_lo")
    assert client == "client got pong on softrdma_iw_lo"
    assert server == "server got ping on softrdma_iw_lo"


SYNC = """
import threading
import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.cmid import CMID, AddrInfo, CMEventChannel, ConnParam
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QPCap, QPInitAttr

port = "{port}"
init = QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(max_send_wr=2, max_recv_wr=2))
srv = CMID(creator=AddrInfo(src="127.0.0.1", src_service=port, flags=ce.RAI_PASSIVE),
           qp_init_attr=init)
srv.listen()
got = {{}}

def serve():
    child = srv.get_request()
    mr = child.reg_msgs(16)
    child.post_recv(mr)
    child.accept()
    wc = child.get_recv_comp()
    got["msg"] = mr.read(5, 0)
    got["len"] = wc.byte_len

t = threading.Thread(target=serve)
t.start()
cli = CMID(creator=AddrInfo(src="127.0.0.1", dst="127.0.0.1", dst_service=port),
           qp_init_attr=QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(2, 2)))
cli.set_option(ce.RDMA_OPTION_ID, ce.RDMA_OPTION_ID_ACK_TIMEOUT, 17, 1)
cli.connect(ConnParam())
attr, _ = cli.query_qp(e.IBV_QP_TIMEOUT)
mr = cli.reg_msgs(16)
mr.write(b"hello", 5)
cli.post_send(mr)
cli.get_send_comp()
t.join(30)
print(got["msg"].decode(), got["len"], attr.timeout, cli.qpn > 0)
CMID(creator=CMEventChannel(), port_space=ce.RDMA_PS_IB).close()
try:
    CMID(creator=CMEventChannel(), port_space=ce.RDMA_PS_IPOIB)
except PyverbsRDMAError as exc:
    print("ps_ipoib", exc.error_code)
try:
    cli.set_option(ce.RDMA_OPTION_ID, 99, 1, 1)
except PyverbsRDMAError as exc:
    print("option", exc.error_code)
cli.disconnect()
cli.close()
srv.close()
"""


def test_pyverbs_sync_cmid_and_options(state: str) -> None:
    code = SYNC.format(port=free_port())
    proc = subprocess.run([sys.executable, "-c", code], env=shim_env(state), text=True,
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.split("\n")
    # 16 bytes sent (the whole registered buffer, as rdma_post_send); the option's Local
    # ACK Timeout is the QP's; unsupported port spaces and options are refused
    assert lines[0] == "hello 16 17 True"
    assert lines[1] == "ps_ipoib 93"  # EPROTONOSUPPORT (RDMA_PS_IB ids are served)
    assert lines[2] == "option 38"  # ENOSYS


WAITING = """
import threading
import pyverbs.cm_enums as ce
import pyverbs.enums as e
import pyverbs.cmid as impl
from pyverbs.cmid import CMID, AddrInfo, ConnParam
from pyverbs.qp import QPCap, QPInitAttr

impl._SYNC_WAIT_S = 0.2  # the old limit of get_request, made short
port = "{port}"
init = QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(max_send_wr=2, max_recv_wr=2))
srv = CMID(creator=AddrInfo(src="127.0.0.1", src_service=port, flags=ce.RAI_PASSIVE),
           qp_init_attr=init)
srv.listen()
got = {{}}

def serve():
    try:
        child = srv.get_request()
        child.accept()
        got["qpn"] = child.qpn
    except Exception as exc:
        got["error"] = repr(exc)

t = threading.Thread(target=serve)
t.start()
t.join(1.5)  # well past the old limit: the server is still waiting for its client
print("waiting", t.is_alive(), got.get("error"))
cli = CMID(creator=AddrInfo(src="127.0.0.1", dst="127.0.0.1", dst_service=port),
           qp_init_attr=QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(2, 2)))
cli.connect(ConnParam())
t.join(60)
print("served", not t.is_alive(), got.get("qpn", 0) > 0, got.get("error"))
cli.disconnect()
cli.close()
srv.close()
"""


def test_pyverbs_get_request_waits_for_a_late_client(state: str) -> None:
    """rdma_get_request blocks until a client comes (librdmacm); it used to give up after
    a fixed time with a traceback."""
    code = WAITING.format(port=free_port())
    proc = subprocess.run([sys.executable, "-c", code], env=shim_env(state), text=True,
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "waiting True None", proc.stdout + proc.stderr
    assert lines[1] == "served True True None", proc.stdout + proc.stderr

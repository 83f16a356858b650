"""``softrdma run`` with a Python program: Debian's real pyverbs (Cython over libibverbs).

The preloaded C interface attaches to the program's own interpreter (no second Python in
the process); a verb that blocks lets the GIL go (``get_cq_event``); another Python version
is refused with a clear message; ``softrdma rdma-core-tests --real-pyverbs`` runs rdma-core's
suite this way and prints the same per-file table.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import need_build, run
from harness.capi_pyverbs import need_real_pyverbs
from harness.device import private_device

from softrdma.capi import launch
from softrdma.tools.suites import rdma_core_tests as rct
from softrdma.verbs import get_device_list


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    need_build()
    yield private_device("pvreal", tmp_path, monkeypatch)


# the program: the real pyverbs lists softrdma's devices, opens one, and traffic's
# blocking wait (get_cq_event) returns; it prints what the test checks
PROGRAM = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import pyverbs
import pyverbs.device as d
from pyverbs.cq import CompChannel, CQ
from pyverbs.pd import PD
from pyverbs.mr import MR
from pyverbs.qp import QPCap, QPInitAttr, QPAttr, QP
from pyverbs.wr import SGE, SendWR, RecvWR
import pyverbs.enums as e
print("pyverbs", pyverbs.__file__)
names = [x.name.decode() for x in d.get_device_list()]
print("devices", " ".join(names))
ctx = d.Context(name=sys.argv[2])
print("guid", ctx.query_device().node_guid)
# softrdma runs in this interpreter: its bridge is one of this program's modules
print("same-interpreter", "softrdma.capi.bridge" in sys.modules)
pd = PD(ctx)
ch = CompChannel(ctx)
cq = CQ(ctx, 4, None, ch, 0)
cq.req_notify()
mr = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
cap = QPCap(max_send_wr=2, max_recv_wr=2, max_send_sge=1, max_recv_sge=1)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap))
attr = QPAttr(port_num=1)
attr.qkey = 0x11
qp.to_rts(attr)
qp.post_recv(RecvWR(1, 1, [SGE(mr.buf, 64, mr.lkey)]))
from pyverbs.addr import AHAttr, GlobalRoute, AH
gid = ctx.query_gid(1, 0)
ah = AH(pd, attr=AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1, port_num=1))
smr = MR(pd, 24, e.IBV_ACCESS_LOCAL_WRITE)
smr.write(b"real pyverbs over UD!!!!", 24)
wr = SendWR(2, num_sge=1, sg=[SGE(smr.buf, 24, smr.lkey)])
wr.set_wr_ud(ah, qp.qp_num, 0x11)
import threading, time
waiting = threading.Event()
def poster():
    waiting.wait()
    time.sleep(0.3)  # only makes it likely that the main thread is inside get_cq_event
    qp.post_send(wr)
threading.Thread(target=poster).start()
got = []
while len(got) < 2:
    waiting.set()
    ev_cq = ch.get_cq_event(cq)  # blocks in C: must let the GIL go to the poster
    cq.ack_events(1)
    cq.req_notify()
    n, wcs = cq.poll(4)
    got += [(w.wr_id, w.status, w.byte_len) for w in wcs[:n]]
print("completions", sorted(got))
print("data", mr.read(24, 40).decode())
"""


def test_real_pyverbs_runs_in_the_programs_interpreter(device: str, tmp_path: Path) -> None:
    link = need_real_pyverbs(tmp_path)
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    p = run(sys.executable, str(script), str(link), device)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in p.stdout.splitlines() if " " in line)
    assert out["pyverbs"].endswith(".py") and str(link) in out["pyverbs"]
    assert device in out["devices"].split()
    info = next(d for d in get_device_list() if d.name == device)
    # pyverbs gives node_guid as libibverbs stores it: big-endian (__be64) read as an int
    raw = int(out["guid"])
    assert int.from_bytes(raw.to_bytes(8, "little"), "big") == info.node_guid
    assert out["same-interpreter"] == "True"
    # the send (wr_id 2) and the receive of 24 bytes plus the 40-byte GRH (wr_id 1)
    assert out["completions"] == "[(1, 0, 64), (2, 0, 24)]"
    assert out["data"] == "real pyverbs over UD!!!!"


def test_python_host_detection(tmp_path: Path) -> None:
    script = tmp_path / "tool"
    script.write_text("#!/usr/bin/env -S python3 -u\nprint(1)\n")
    assert launch.python_host(str(script)) == shutil.which("python3")
    script.write_text("#!/bin/sh\necho 1\n")
    assert launch.python_host(str(script)) is None
    assert launch.python_host("/usr/bin/python3.11") == "/usr/bin/python3.11"
    assert launch.python_host(shutil.which("ibv_devices") or "/bin/true") is None
    # a Python program gets softrdma's directories, never this Python's standard library,
    # and neither gets them through PYTHONPATH, which every Python they start reads
    env = launch.preload_env(Path("/x/lib.so"), base={}, python_host=True)
    std = os.path.dirname(os.__file__)
    assert std not in env["SOFTRDMA_CAPI_PATH"].split(os.pathsep)
    c_host = launch.preload_env(Path("/x/lib.so"), base={"PYTHONPATH": "/mine"})
    assert std in c_host["SOFTRDMA_CAPI_PATH"].split(os.pathsep)
    assert "PYTHONPATH" not in env and c_host["PYTHONPATH"] == "/mine"


def test_another_python_version_is_refused(device: str, tmp_path: Path) -> None:
    fake = tmp_path / "python9.9"  # answers the version probe as another Python would
    fake.write_text("#!/bin/sh\necho 9.9\n")
    fake.chmod(0o755)
    p = run(str(fake), "-c", "pass")
    assert p.returncode == 1
    assert "it runs Python 9.9" in p.stderr
    assert f"built for the Python that runs softrdma ({sys.version_info[0]}." in p.stderr


def _other_python() -> str | None:
    """A working Python 3 of another minor version than this one, or None."""
    cands = [str(p) for p in sorted(Path("/root/.pyenv/versions").glob("3.*/bin/python3"))]
    cands += [w for m in range(8, 20) if (w := shutil.which(f"python3.{m}"))]
    for cand in cands:
        try:
            got = subprocess.run([cand, "-S", "-c", "import sys; print(sys.version_info[1])"],
                                 capture_output=True, text=True, timeout=60, check=False)
        except OSError:
            continue
        if got.returncode == 0 and got.stdout.strip() not in ("", str(sys.version_info[1])):
            return cand
    return None


def test_library_refuses_another_python_without_the_wrapper(device: str) -> None:
    """Preloaded by hand into another Python, the first verb fails with ELIBBAD and a
    message (before, it hung: the library's Py_* calls bound to the other interpreter)."""
    other = _other_python()
    if other is None:
        pytest.skip("no Python of another minor version is installed here")
    env = launch.preload_env(need_build(), base=dict(os.environ), python_host=True)
    env.pop("PYTHONPATH", None)
    code = ("import ctypes, os; lib = ctypes.CDLL(None, use_errno=True); "
            "f = lib.ibv_get_device_list; f.restype = ctypes.c_void_p; "
            "print(f(None), os.strerror(ctypes.get_errno()))")
    p = subprocess.run([other, "-S", "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"None {os.strerror(80)}"  # ELIBBAD
    assert "softrdma: this program runs Python 3." in p.stderr
    assert f"built for Python {sys.version_info[0]}.{sys.version_info[1]}" in p.stderr


def test_the_pythons_a_program_starts_keep_their_own_path(device: str,
                                                         tmp_path: Path) -> None:
    """softrdma's directories reach the program's interpreter in ``SOFTRDMA_CAPI_PATH``,
    not ``PYTHONPATH``: what the program starts sees the ``PYTHONPATH`` it was given, and
    a Python of another version among them (a test runner's helper, a build tool)
    imports its own standard library and the modules of that path, while the C program
    beside it still has its verbs. Before, ``PYTHONPATH`` carried this Python's standard
    library, and another version failed at its first ``import re`` ("SRE module
    mismatch")."""
    tool = shutil.which("ibv_devices")
    if tool is None:
        pytest.skip("ibv_devices is not installed (Debian package ibverbs-utils)")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "mymod.py").write_text("X = 42\n")
    path = os.pathsep.join(p for p in (str(mine), os.environ.get("PYTHONPATH")) if p)
    script = f'printf "%s\\n" "$PYTHONPATH" && {tool}'
    other = _other_python()  # (none on a machine with one Python 3)
    if other is not None:
        script += f" && {other} -c 'import json, re, mymod; print(mymod.X)'"
    p = run("sh", "-c", script, env=dict(os.environ, PYTHONPATH=path))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == path
    assert device in p.stdout
    if other is not None:
        assert lines[-1] == "42"


def _python_without_softrdma() -> str | None:
    """A Python of this major.minor that cannot import softrdma in isolated mode (a
    system Python beside softrdma's venv), or None."""
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for cand in dict.fromkeys(c for c in ("/usr/bin/python3", shutil.which("python3")) if c):
        try:
            got = subprocess.run([cand, "-I", "-c", "import sys; print('%d.%d' % "
                                  "sys.version_info[:2]); import softrdma"],
                                 capture_output=True, text=True, timeout=60, check=False)
        except OSError:
            continue
        if got.stdout.strip() == want and "ModuleNotFoundError" in got.stderr:
            return cand
    return None


def test_an_isolated_python_program_finds_softrdma(device: str, tmp_path: Path) -> None:
    """``python3 -I`` (isolated mode, which ignores ``PYTHONPATH``: some launchers start
    Python so) under ``softrdma run``: its first verb puts softrdma's directories on its
    ``sys.path``, and the real pyverbs lists the device. Before, they came in
    ``PYTHONPATH``, and a Python without softrdma installed saw no device (cffi's
    "initialization code failed")."""
    link = need_real_pyverbs(tmp_path)
    host = _python_without_softrdma()
    if host is None:
        pytest.skip("no Python of this version without softrdma is installed here")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import pyverbs.device as d; "
            "print(' '.join(x.name.decode() for x in d.get_device_list()))")
    p = run(host, "-I", "-c", code, str(link))
    assert p.returncode == 0, p.stderr[-3000:]
    assert device in p.stdout.split(), p.stdout + p.stderr[-3000:]


def test_rdma_core_suite_through_the_real_pyverbs(device: str, tmp_path: Path) -> None:
    need_real_pyverbs(tmp_path)
    if not (rct.TESTS_DIR / "run_tests.py").is_file():
        pytest.skip("rdma-core's tests are not installed (Debian package python3-pyverbs)")
    subset = ["tests.test_pd", "tests.test_cq_events", "tests.test_fork",
              "tests.test_shared_pd", "tests.test_addr"]
    p = subprocess.run([sys.executable, "-m", "softrdma", "rdma-core-tests", "--real-pyverbs",
                        "--no-install", "--hugepages", "0", "--dev", device, *subset],
                       capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "through the real pyverbs under softrdma run" in p.stdout
    rows = {m.group(1): tuple(map(int, m.groups()[1:])) for m in re.finditer(
        r"^(test_\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", p.stdout, re.MULTILINE)}
    assert rows["test_pd"] == (4, 0, 0, 0), p.stdout
    assert rows["test_cq_events"] == (2, 0, 0, 0), p.stdout  # a blocking get_cq_event
    assert rows["test_fork"] == (1, 0, 0, 0), p.stdout
    assert rows["test_addr"] == (3, 0, 0, 0), p.stdout
    assert rows["test_shared_pd"] == (0, 0, 0, 1), p.stdout
    assert "skipped x1: Importing a device is not supported" in p.stdout


def test_real_pyverbs_refused_when_missing_or_foreign(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no pyverbs package"):
        rct.real_pyverbs_env("d", tmp_path, tmp_path)
    pkg = tmp_path / "site" / "pyverbs"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "device.cpython-399-x86_64-linux-gnu.so").write_text("")
    with pytest.raises(ValueError, match="built for another Python"):
        rct.real_pyverbs_env("d", tmp_path / "site", tmp_path)


def test_addrinfo_of_a_source_alone(device: str, tmp_path: Path) -> None:
    """pyverbs' ``AddrInfo(src=GROUP)`` (rdma-core's multicast tests) ends in
    ``rdma_getaddrinfo(NULL, NULL, hints)`` with the source in the hints: the result
    carries that source (librdmacm); it was EINVAL."""
    link = need_real_pyverbs(tmp_path)
    script = tmp_path / "ai.py"
    script.write_text(
        "import sys, socket\n"
        f"sys.path.insert(0, {str(link)!r})\n"
        "from pyverbs.cmid import AddrInfo\n"
        "import pyverbs.cm_enums as ce\n"
        "ai = AddrInfo(src='230.0.0.7')\n"
        "AddrInfo(src='127.0.0.1', dst='230.0.0.7', port_space=ce.RDMA_PS_UDP)\n"
        "print('ok')\n")
    p = run(sys.executable, str(script))
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert p.stdout.strip() == "ok"


def test_device_memory_copies_are_word_aligned(device: str, tmp_path: Path) -> None:
    """``ibv_memcpy_to_dm`` / ``ibv_memcpy_from_dm`` take 4-byte-aligned offsets and
    lengths inside the allocation (rdma-core's test_dm_bad_access and
    test_dm_write_bad_flow); an unaligned copy was accepted."""
    link = need_real_pyverbs(tmp_path)
    script = tmp_path / "dm.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(link)!r})\n"
        "import pyverbs.device as d\n"
        "from pyverbs.pyverbs_error import PyverbsRDMAError\n"
        "ctx = d.Context(name=sys.argv[1])\n"
        "dm = d.DM(ctx, d.AllocDmAttr(length=100))\n"
        "for off, n in [(3, 4), (4, 3), (104, 4), (0, 104), (0, 4), (96, 4)]:\n"
        "    res = []\n"
        "    for op in ('to', 'from'):\n"
        "        try:\n"
        "            dm.copy_to_dm(off, b'a' * n, n) if op == 'to' else dm.copy_from_dm(off, n)\n"
        "            res.append('ok')\n"
        "        except PyverbsRDMAError:\n"
        "            res.append('refused')\n"
        "    print(off, n, *res)\n")
    p = run(sys.executable, str(script), device)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert p.stdout.splitlines() == [
        "3 4 refused refused", "4 3 refused refused", "104 4 refused refused",
        "0 104 refused refused", "0 4 ok ok", "96 4 ok ok"], p.stdout


def test_rereg_mr_keeps_the_keys(device: str, tmp_path: Path) -> None:
    """``ibv_rereg_mr`` changes the region in place: its lkey and rkey stay (as rxe);
    rdma-core's test_mr_rereg_* send with the keys read before the rereg. A new
    registration with new keys replaced it, so those sends failed."""
    link = need_real_pyverbs(tmp_path)
    script = tmp_path / "rereg.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(link)!r})\n"
        "import pyverbs.device as d\n"
        "import pyverbs.enums as e\n"
        "from pyverbs.pd import PD\n"
        "from pyverbs.mr import MR\n"
        "from pyverbs.mem_alloc import posix_memalign, free\n"
        "ctx = d.Context(name=sys.argv[1])\n"
        "pd, pd2 = PD(ctx), PD(ctx)\n"
        "mr = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)\n"
        "keys = (mr.lkey, mr.rkey)\n"
        "mr.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, None, 0, 0,\n"
        "         e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)\n"
        "print('access', (mr.lkey, mr.rkey) == keys)\n"
        "mr.rereg(e.IBV_REREG_MR_CHANGE_PD, pd2, 0, 0, 0)\n"
        "print('pd', (mr.lkey, mr.rkey) == keys)\n"
        "addr = posix_memalign(64)\n"
        "mr.rereg(e.IBV_REREG_MR_CHANGE_TRANSLATION, None, addr, 64, 0)\n"
        "print('translation', (mr.lkey, mr.rkey) == keys, mr.buf == addr)\n"
        "mr.rereg(e.IBV_REREG_MR_CHANGE_PD, pd, 0, 0, 0)\n"
        "mr.close()\n"
        "free(addr)\n")
    p = run(sys.executable, str(script), device)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert p.stdout.splitlines() == ["access True", "pd True", "translation True True"], \
        p.stdout


def test_reset_drops_the_qps_completions(device: str, tmp_path: Path) -> None:
    """A QP moved to RESET leaves none of its completions in its CQ (as the mlx4/mlx5
    providers clean them): rdma-core's test_mr_rereg_pd/addr restate a QP from ERR and
    then poll; the receives flushed by the ERR were left behind and failed them."""
    link = need_real_pyverbs(tmp_path)
    script = tmp_path / "reset.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(link)!r})\n"
        "import pyverbs.device as d\n"
        "import pyverbs.enums as e\n"
        "from pyverbs.pd import PD\n"
        "from pyverbs.mr import MR\n"
        "from pyverbs.cq import CQ, CompChannel\n"
        "from pyverbs.qp import QP, QPCap, QPInitAttr, QPAttr\n"
        "from pyverbs.wr import RecvWR, SGE\n"
        "ctx = d.Context(name=sys.argv[1])\n"
        "pd = PD(ctx)\n"
        "ch = CompChannel(ctx)\n"
        "cq = CQ(ctx, 8, None, ch, 0)\n"
        "mr = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)\n"
        "cap = QPCap(max_send_wr=2, max_recv_wr=2, max_send_sge=1, max_recv_sge=1)\n"
        "qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap))\n"
        "attr = QPAttr(port_num=1)\n"
        "attr.qkey = 0x11\n"
        "qp.to_rts(attr)\n"
        "for i in range(2):\n"
        "    qp.post_recv(RecvWR(i, 1, [SGE(mr.buf, 64, mr.lkey)]))\n"
        "cq.req_notify()\n"
        "qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)\n"
        "ch.get_cq_event(cq)  # a flushed receive is in the CQ\n"
        "cq.ack_events(1)\n"
        "qp.modify(QPAttr(qp_state=e.IBV_QPS_RESET), e.IBV_QP_STATE)\n"
        "n, _ = cq.poll(8)\n"
        "print('left', n)\n")
    p = run(sys.executable, str(script), device)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert p.stdout.splitlines() == ["left 0"], p.stdout

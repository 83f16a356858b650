"""``softrdma run``: rdma-core's real-pyverbs errors, fixed in the C interface.

- an rdma_cm id carries its device's PD in ``id->pd`` once it has a device, as librdmacm
  gives it (pyverbs' ``PD(cmid)`` takes it after ``rdma_resolve_route``: it was NULL and
  ``ibv_create_ah`` on it crashed rdma-core's test_rdmacm_async_udp_traffic);
- a connection whose QP the application creates and moves itself (``conn_param.qp_num``,
  ``rdma_init_qp_attr``, CONNECT_RESPONSE, ``rdma_establish``: test_rdmacm_async_traffic_
  external_qp; ``rdma_init_qp_attr`` was ENOSYS);
- ``ibv_reg_dm_mr`` of zero length (test_create_dm_mr: EINVAL before; the kernel accepts it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from harness.capi import cm_device, compile_c, preloaded, run, tcp_port
from harness.capi_pairs import pair
from harness.capi_pyverbs import need_real_pyverbs


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return cm_device("capixq", None, tmp_path, monkeypatch)


def test_connection_of_the_applications_own_qp(device: str, tmp_path: Path) -> None:
    """tests/capi/cm_extqp.c: the QP on ``id->pd`` (non-NULL after bind, resolve and on
    the request's id), moved with rdma_init_qp_attr's attributes, its number in
    conn_param; CONNECT_RESPONSE then rdma_establish on the client, ESTABLISHED on the
    server; one SEND whose data and completion fields both sides check."""
    exe = compile_c(tmp_path, "cm_extqp", "-lrdmacm", "-libverbs")
    port = str(tcp_port())
    (sout, serr), (cout, cerr) = pair(preloaded(str(exe), "server", port),
                                      preloaded(str(exe), "client", port))
    assert sout.splitlines() == ["recv 15 external qp 42", "ok"], (sout, serr)
    assert cout.splitlines() == ["sent 15", "ok"], (cout, cerr)


def test_zero_length_device_memory_mr(device: str, tmp_path: Path) -> None:
    """The real pyverbs registers a zero-length DM MR (rdma-core's test_create_dm_mr: 10%
    of a 4-byte DM, rounded down to the 4-byte alignment); one past the DM is still
    EINVAL, and an ordinary MR of zero length too."""
    link = need_real_pyverbs(tmp_path)
    script = tmp_path / "dmmr.py"
    script.write_text(
        "import sys, mmap\n"
        f"sys.path.insert(0, {str(link)!r})\n"
        "import pyverbs.device as d\n"
        "import pyverbs.enums as e\n"
        "from pyverbs.pd import PD\n"
        "from pyverbs.mr import DMMR, MR\n"
        "from pyverbs.pyverbs_error import PyverbsRDMAError\n"
        "ctx = d.Context(name=sys.argv[1])\n"
        "pd = PD(ctx)\n"
        "dm = d.DM(ctx, d.AllocDmAttr(length=4))\n"
        "acc = e.IBV_ACCESS_ZERO_BASED | e.IBV_ACCESS_LOCAL_WRITE\n"
        "mr = DMMR(pd, 0, acc, dm, 0)\n"
        "print('zero', mr.length, mr.lkey != 0)\n"
        "mr.close()\n"
        "for n, off in [(4, 4), (8, 0)]:\n"
        "    try:\n"
        "        DMMR(pd, n, acc, dm, off).close()\n"
        "        print('outside ok')\n"
        "    except PyverbsRDMAError as ex:\n"
        "        print('outside', ex.error_code)\n"
        "try:\n"
        "    MR(pd, 0, e.IBV_ACCESS_LOCAL_WRITE)\n"
        "    print('plain ok')\n"
        "except PyverbsRDMAError as ex:\n"
        "    print('plain', ex.error_code)\n"
        "dm.close()\n")
    p = run(sys.executable, str(script), device)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert p.stdout.splitlines() == ["zero 0 True", "outside 22", "outside 22", "plain 22"], \
        p.stdout + p.stderr[-2000:]


def test_create_qp_ex_with_zero_create_flags(device: str, tmp_path: Path) -> None:
    """``ibv_create_qp_ex`` with IBV_QP_INIT_ATTR_CREATE_FLAGS and no flag set creates
    the QP, as rxe does (rdma-core's test_qp picks that mask at random: half its runs
    skipped as EOPNOTSUPP); a flag set is still EOPNOTSUPP."""
    link = need_real_pyverbs(tmp_path)
    script = tmp_path / "qpex.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(link)!r})\n"
        "import pyverbs.device as d\n"
        "import pyverbs.enums as e\n"
        "from pyverbs.pd import PD\n"
        "from pyverbs.cq import CQ\n"
        "from pyverbs.qp import QP, QPCap, QPInitAttrEx\n"
        "from pyverbs.pyverbs_error import PyverbsRDMAError\n"
        "ctx = d.Context(name=sys.argv[1])\n"
        "pd, cq = PD(ctx), CQ(ctx, 8, None, None, 0)\n"
        "mask = e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_CREATE_FLAGS\n"
        "for qpt, flags in [(e.IBV_QPT_RC, 0), (e.IBV_QPT_UD, 0), (e.IBV_QPT_UD, 2)]:\n"
        "    a = QPInitAttrEx(qp_type=qpt, scq=cq, rcq=cq, pd=pd, comp_mask=mask,\n"
        "                     create_flags=flags, cap=QPCap(4, 4, 1, 1))\n"
        "    try:\n"
        "        qp = QP(ctx, a)\n"
        "        print(qpt, flags, 'ok', qp.qp_state)\n"
        "        qp.close()\n"
        "    except PyverbsRDMAError as ex:\n"
        "        print(qpt, flags, 'errno', ex.error_code)\n")
    p = run(sys.executable, str(script), device)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert p.stdout.splitlines() == ["2 0 ok 0", "4 0 ok 0", "4 2 errno 95"], \
        p.stdout + p.stderr[-2000:]

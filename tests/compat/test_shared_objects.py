"""Shared objects within a process: ``ibv_import_device`` / ``ibv_import_pd`` /
``ibv_import_mr`` / ``ibv_import_dm`` and ``unimport`` (pyverbs ``Context(cmd_fd=)``,
``PD(ctx, handle=)``, ``MR(pd, handle=, address=)``, ``DM(ctx, handle=)``), with the
kernel's handle semantics; a command FD from another process is refused (EOPNOTSUPP)."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from harness.ports import free_port
from harness.pyverbs import first_wc, rc_to_rts

from softrdma import verbs
from softrdma.compat.pyverbs import device as d
from softrdma.compat.pyverbs import enums as e
from softrdma.compat.pyverbs.cq import CQ
from softrdma.compat.pyverbs.mr import MR
from softrdma.compat.pyverbs.pd import PD
from softrdma.compat.pyverbs.pyverbs_error import PyverbsRDMAError
from softrdma.compat.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from softrdma.compat.pyverbs.wr import SGE, SendWR
from softrdma.drivers.host import registry
from softrdma.errors import InvalidArgument, NotSupported

_RW = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SOFTRDMA_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    registry.add("imp0", "lo", "roce", free_port())
    yield "imp0"
    mp.undo()


@pytest.fixture()
def ctx(dev: str) -> Iterator[d.Context]:
    c = d.Context(name=dev)
    yield c
    c.close()


def _errno(fn: Any, *args: Any, **kw: Any) -> tuple[int, str]:
    with pytest.raises(PyverbsRDMAError) as ei:
        fn(*args, **kw)
    return ei.value.error_code, str(ei.value)


class Rc:
    """An RC QP with a CQ on ``ctx``/``pd`` (imported or not)."""

    def __init__(self, ctx: d.Context, pd: PD) -> None:
        self.ctx = ctx
        self.cq = CQ(ctx, 16)
        qa = QPAttr()
        qa.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
        self.qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                    cap=QPCap(8, 8, 1, 1)), qa)

    def connect(self, peer: Rc) -> None:
        rc_to_rts(self.ctx, self.qp, peer.qp)

    def wc(self, timeout: float = 20.0) -> Any:
        return first_wc(self.cq, timeout)


def test_imported_objects_alias_the_originals_and_carry_rc_traffic(ctx: d.Context,
                                                                     dev: str) -> None:
    pd = PD(ctx)
    mr = MR(pd, 4096, _RW)
    ctx2 = d.Context(cmd_fd=os.dup(ctx.cmd_fd))
    try:
        assert ctx2.cmd_fd != ctx.cmd_fd
        assert os.fstat(ctx2.cmd_fd).st_ino == os.fstat(ctx.cmd_fd).st_ino
        assert ctx2.name == ctx.name and ctx2.query_device().node_guid == ctx.query_device().node_guid
        pd2 = PD(ctx2, handle=pd.handle)
        mr2 = MR(pd2, handle=mr.handle, address=mr.buf)
        assert (pd2.handle, mr2.handle) == (pd.handle, mr.handle)
        assert (mr2.lkey, mr2.rkey, mr2.length, mr2.buf) == (mr.lkey, mr.rkey, mr.length, mr.buf)
        mr.write(b"through the original", 20)
        assert mr2.read(20, 0) == b"through the original"
        # an RC QP created through the imported PD is the original PD's for the
        # engine's checks (IBA 10.6.3.2), so the peer writes into the imported MR
        server = Rc(ctx2, pd2)
        other = d.Context(name=dev)
        try:
            opd = PD(other)
            omr = MR(opd, 4096, _RW)
            client = Rc(other, opd)
            client.connect(server)
            server.connect(client)
            omr.write(b"rdma write into an imported MR", 30)
            wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                        sg=[SGE(omr.buf, 30, omr.lkey)])
            wr.set_wr_rdma(mr2.rkey, mr2.buf)
            client.qp.post_send(wr)
            assert client.wc().status == e.IBV_WC_SUCCESS
            assert mr.read(30, 0) == b"rdma write into an imported MR"
            # and back: the imported side writes from the imported MR (lkey check)
            wr = SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                        sg=[SGE(mr2.buf, 10, mr2.lkey)])
            wr.set_wr_rdma(omr.rkey, omr.buf + 100)
            server.qp.post_send(wr)
            assert server.wc().status == e.IBV_WC_SUCCESS
            assert omr.read(10, 100) == b"rdma write"
        finally:
            other.close()
        # unimport forgets the imports and destroys nothing
        mr2.unimport()
        pd2.unimport()
        assert mr2.closed and pd2.closed and not mr.closed and not pd.closed
        assert not server.qp.closed  # what was created through the import stays
        assert mr.read(4, 0) == b"rdma"
        assert MR(pd, 64, _RW).lkey != mr.lkey  # the original PD still allocates
    finally:
        ctx2.close()
    assert not ctx.runtime.closed and not mr.closed  # the original context is untouched


def test_unknown_or_destroyed_handle_is_einval(ctx: d.Context) -> None:
    pd = PD(ctx)
    mr = MR(pd, 64, _RW)
    ctx2 = d.Context(cmd_fd=os.dup(ctx.cmd_fd))
    try:
        assert _errno(PD, ctx2, handle=pd.handle + 1000)[0] == errno.EINVAL
        pd2 = PD(ctx2, handle=pd.handle)
        assert _errno(MR, pd2, handle=mr.handle + 1000)[0] == errno.EINVAL
        assert _errno(MR, pd2, handle=pd.handle if pd.handle != mr.handle else 99)[0] \
            == errno.EINVAL
        h = mr.handle
        mr.close()  # ibv_dereg_mr: the handle names nothing any more
        assert _errno(MR, pd2, handle=h)[0] == errno.EINVAL
        assert _errno(mr.unimport)[0] == errno.EINVAL  # not an imported MR
        # deregistering an imported MR deregisters the shared one
        mr3 = MR(pd, 64, _RW)
        imp = MR(pd2, handle=mr3.handle)
        imp.close()
        assert mr3.closed and ctx.port.lookup_mr(mr3.lkey) is None
        # a deallocated original PD: its import can make nothing
        pd.close()
        with pytest.raises(InvalidArgument):
            pd2._check()
        assert _errno(MR, pd2, 64, _RW)[0] == errno.EINVAL
    finally:
        ctx2.close()


def test_closing_the_original_context_leaves_the_import_working(dev: str) -> None:
    ctx = d.Context(name=dev)
    pd = PD(ctx)
    ctx2 = d.Context(cmd_fd=os.dup(ctx.cmd_fd))
    pd2 = PD(ctx2, handle=pd.handle)
    ctx.close()  # pyverbs: closes (deallocates) the original's objects
    assert pd.closed
    # the device stays open while a context refers to it, as a uverbs file does
    assert not ctx2.runtime.closed
    assert _errno(MR, pd2, 64, _RW)[0] == errno.EINVAL  # the shared PD is gone
    new_pd = PD(ctx2)
    mr = MR(new_pd, 64, _RW)
    mr.write(b"still open", 10)
    assert mr.read(10, 0) == b"still open"
    assert ctx2.query_port(1).state == e.IBV_PORT_ACTIVE
    fd2 = ctx2.cmd_fd
    ctx2.close()
    assert ctx2.runtime.closed  # the last context closed the device
    with pytest.raises(OSError):
        os.fstat(fd2)  # the imported context owned its descriptor
    # nothing refers to the device any more: its FD cannot be imported
    fd = os.dup(0)
    try:
        assert _errno(d.Context, cmd_fd=fd)[0] == errno.EOPNOTSUPP
    finally:
        os.close(fd)


def test_import_dm(ctx: d.Context) -> None:
    dm = d.DM(ctx, d.AllocDmAttr(length=256))
    ctx2 = d.Context(cmd_fd=os.dup(ctx.cmd_fd))
    try:
        dm2 = d.DM(ctx2, handle=dm.handle)
        dm.copy_to_dm(0, b"\xab" * 64, 64)
        assert dm2.copy_from_dm(0, 64) == b"\xab" * 64
        dm2.unimport()
        assert not dm.closed
        assert _errno(d.DM, ctx2, handle=dm.handle + 7)[0] == errno.EINVAL
    finally:
        ctx2.close()


def test_bad_and_foreign_command_fds(ctx: d.Context) -> None:
    r, w = os.pipe()  # open, but no softrdma context's
    try:
        code, msg = _errno(d.Context, cmd_fd=r)
        assert code == errno.EOPNOTSUPP and "within the process" in msg
    finally:
        os.close(r)
        os.close(w)
    assert _errno(d.Context, cmd_fd=r)[0] == errno.EBADF  # closed now
    with pytest.raises(NotSupported):
        verbs.Context.import_device(0)


_CHILD = """
import socket, sys
from softrdma.compat.pyverbs.device import Context
ctx = Context(name=sys.argv[1])
s = socket.socket(fileno=int(sys.argv[2]))
socket.send_fds(s, [b"x"], [ctx.cmd_fd])
s.recv(1)
ctx.close()
"""


def test_a_command_fd_from_another_process_is_refused(ctx: d.Context, dev: str) -> None:
    """An FD received over SCM_RIGHTS names the other process's device file, whose
    objects live there: EOPNOTSUPP with the reason (rdma-core's tests then skip)."""
    a, b = socket.socketpair()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, dev, str(b.fileno())],
                             pass_fds=[b.fileno()])
    try:
        b.close()
        a.settimeout(60)
        _msg, fds, _flags, _addr = socket.recv_fds(a, 1, 1)
        assert len(fds) == 1
        try:
            code, msg = _errno(d.Context, cmd_fd=fds[0])
            assert code == errno.EOPNOTSUPP
            assert "not the command FD of a softrdma device context open in this process" in msg
        finally:
            os.close(fds[0])
        a.send(b"x")
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        a.close()


def test_native_import_device(dev: str) -> None:
    ctx = verbs.Context(dev)
    ctx2 = verbs.Context.import_device(os.dup(ctx.async_fileno()))
    try:
        assert ctx2.port is ctx.port and ctx2.name == ctx.name
        pd = verbs.PD(ctx2)
        mr = verbs.MR(pd, buffer=bytearray(64), access=int(e.IBV_ACCESS_LOCAL_WRITE))
        assert ctx.port.lookup_mr(mr.lkey) is not None  # one engine, one key space
        ctx.close()
        assert not ctx2.runtime.closed
    finally:
        ctx2.close()
    assert ctx2.runtime.closed

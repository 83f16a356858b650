"""What ``softrdma rping`` runs (:mod:`softrdma.tools.rdmacm.rping` has its flags and checks):
rping.c's control block, its rdma_cm event handler and completion handler, the server
(one client, or ``-P``: every client in its own thread until stopped) and the client.

Exit status (``run``): 0 when the run succeeded, 1 otherwise: an error completion
(``cq completion failed status N``), a rejected or unreachable connection, data that
does not verify (``-V``: ``data mismatch!``), a peer silent for ``--timeout`` seconds,
or a client whose ``-C`` pings did not all complete. rping.c decides its result before
disconnecting; so does this one (a failed run is not turned into success by the
DISCONNECTED event that its own disconnect brings).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from ... import enums as e
from ... import verbs as v
from ...cm import rdma_cm as rc
from ...errors import SoftRdmaError
from ..lines import say
from ..waiting import announce_wait
from .rping import (
    ADDR_RESOLVED,
    CONNECT_REQUEST,
    CONNECTED,
    DISCONNECTED,
    ERROR,
    IDLE,
    INFO,
    RDMA_READ_ADV,
    RDMA_READ_COMPLETE,
    RDMA_WRITE_ADV,
    RDMA_WRITE_COMPLETE,
    ROUTE_RESOLVED,
    RPING_SQ_DEPTH,
    check_args,
    ping_pattern,
)

__all__ = ["Cb", "Rping", "run"]

IDLE_WAIT_S = 0.0002
CM_WAIT_S = 0.05  # waits on the event channel (woken at once by an event)
INIT_MASK = int(e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
DISCONNECT_WAIT_S = 30.0  # the DREQ/DREP exchange, its CM retries included (ends at the event)


class _Fail(Exception):
    """An rping error: printed on stderr, exit status 1."""


class Cb:
    """One rping side (rping.c ``struct rping_cb``): its state and "semaphore", its
    verbs objects and, on a server, the connection's child id. ``post`` is rping's
    ``sem_post``; completions are polled by whoever waits on this control block."""

    def __init__(self, app: Rping, cm_id: Any = None) -> None:
        self.app = app
        self.a = app.a
        self.server = app.server
        self.state = IDLE
        self.sem = 0
        self.cv = threading.Condition()
        self.cm_id = cm_id
        self.child: Any = None
        self.qp: Any = None
        self.cq: Any = None
        self.pd: Any = None
        self.mrs: dict[str, Any] = {}
        self.remote = (0, 0, 0)  # addr, rkey, len

    def post(self, state: int | None = None) -> None:
        with self.cv:
            if state is not None:
                self.state = state
            self.sem += 1
            self.cv.notify_all()

    def log(self, msg: str) -> None:
        self.app.log(msg)

    # ---- waiting: rping's sem_wait, with completions polled here (its cq_thread) -----------
    def sem_wait(self, forever: bool = False) -> None:
        """Wait for the next ``post``. ``--timeout`` seconds without one is a failure
        (rping waits for ever; a peer that stops answering must not hang the tool),
        except for a server waiting for its next client (``forever``)."""
        deadline = None if forever else time.monotonic() + self.a.timeout
        while True:
            with self.cv:
                if self.sem:
                    self.sem -= 1
                    return
            did = self._poll_cq()
            if self.app.pump_here:
                did = self.app.pump_cm() or did
            if did:
                continue
            if deadline is not None and time.monotonic() > deadline:
                raise _Fail(f"no answer from the peer for {self.a.timeout:g} s (state "
                            f"{self.state})")
            if self.cq is None and self.app.pump_here:
                self.app.ch.poll(CM_WAIT_S)  # only rdma_cm events can come: sleep on them
                continue
            with self.cv:
                if not self.sem:
                    self.cv.wait(IDLE_WAIT_S)

    def _poll_cq(self) -> bool:
        cq = self.cq
        did = False
        while cq is not None:
            _n, wcs = cq.poll(1)
            if not wcs:
                break
            self._wc(wcs[0])
            did = True
        return did

    def _wc(self, wc: Any) -> None:
        if wc.status:
            if wc.status == e.IBV_WC_WR_FLUSH_ERR:
                return
            say(f"cq completion failed status {wc.status}", file=sys.stderr)
            self.post(ERROR)
            return
        op = wc.opcode
        if op == e.IBV_WC_SEND:
            self.log("send completion")
        elif op == e.IBV_WC_RDMA_WRITE:
            self.log("rdma write completion")
            self.post(RDMA_WRITE_COMPLETE)
        elif op == e.IBV_WC_RDMA_READ:
            self.log("rdma read completion")
            self.post(RDMA_READ_COMPLETE)
        elif op == e.IBV_WC_RECV:
            self.log("recv completion")
            if wc.byte_len != INFO.size:
                say(f"Received bogus data, size {wc.byte_len}", file=sys.stderr)
                self.post(ERROR)
                return
            if self.server:
                self.remote = INFO.unpack(self.mrs["recv"].read(INFO.size, 0))
                addr, rkey, n = self.remote
                self.log(f"Received rkey {rkey:x} addr {addr:x} len {n} from peer")
                nxt = RDMA_READ_ADV if (self.state <= CONNECTED
                                        or self.state == RDMA_WRITE_COMPLETE) \
                    else RDMA_WRITE_ADV
            else:
                nxt = RDMA_WRITE_ADV if self.state == RDMA_READ_ADV else RDMA_WRITE_COMPLETE
            self._post_recv()
            self.post(nxt)
        else:
            self.log("unknown!!!!! completion")
            self.post(ERROR)

    # ---- resources (rping_setup_qp / rping_setup_buffers) -----------------------------------
    def setup(self, cid: Any) -> None:
        ctx = cid.verbs
        self.pd = v.PD(ctx)
        self.log("created pd")
        self.cq = v.CQ(ctx, RPING_SQ_DEPTH * 2)
        self.log("created cq")
        attr = v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                            cap=v.QPCap(RPING_SQ_DEPTH, 2, 1, 1))
        if self.a.self_create_qp:
            # -q (rping_create_qp): ibv_create_qp, then INIT with no remote access; the
            # CM's attributes come later through rdma_init_qp_attr (self_modify_qp)
            self.qp = v.QP(self.pd, attr)
            self.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_INIT, pkey_index=0, port_num=1,
                                    qp_access_flags=0), INIT_MASK)
        else:
            self.qp = cid.create_qp(self.pd, attr)
        self.log(f"created qp (qpn={self.qp.qp_num})")
        rw = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ
                 | e.IBV_ACCESS_REMOTE_WRITE)
        self.mrs["recv"] = v.MR(self.pd, INFO.size, int(e.IBV_ACCESS_LOCAL_WRITE))
        self.mrs["send"] = v.MR(self.pd, INFO.size, 0)
        self.mrs["rdma"] = v.MR(self.pd, self.a.size, rw)
        if not self.server:
            self.mrs["start"] = v.MR(self.pd, self.a.size, rw)
        self.log("allocated & registered buffers...")
        self._post_recv()

    def self_modify_qp(self, cid: Any) -> None:
        """rping_self_modify_qp: INIT, RTR, RTS with ``rdma_init_qp_attr``'s attributes."""
        for state in (e.IBV_QPS_INIT, e.IBV_QPS_RTR, e.IBV_QPS_RTS):
            attr, mask = cid.init_qp_attr(int(state))
            self.qp.modify(attr, mask)

    def conn_param(self) -> Any:
        """rping_init_conn_param (with -q: the QP's number)."""
        return rc.ConnParam(responder_resources=1, initiator_depth=1, retry_count=7,
                            rnr_retry_count=7,
                            qp_num=self.qp.qp_num if self.a.self_create_qp else 0)

    def await_state(self, expected: int, name: str) -> bool:
        """:meth:`sem_wait`, then rping.c's check: True in state ``expected``, else its
        ``wait for NAME state N`` line (on stderr) and False."""
        self.sem_wait()
        if self.state == expected:
            return True
        say(f"wait for {name} state {self.state}", file=sys.stderr)
        return False

    def _post_recv(self) -> None:
        mr = self.mrs["recv"]
        self.qp.post_recv(v.RecvWR(0, 1, [v.SGE(mr.addr, INFO.size, mr.lkey)]))

    def send_info(self, mr: Any | None = None) -> None:
        """The SEND of rping_format_send (an advertisement, or the server's go-ahead)."""
        sm = self.mrs["send"]
        if mr is not None:
            sm.write(INFO.pack(mr.addr, mr.rkey, self.a.size), INFO.size, 0)
            self.log(f"RDMA addr {mr.addr:x} rkey {mr.rkey:x} len {self.a.size}")
        self.qp.post_send(v.SendWR(1, None, 1, [v.SGE(sm.addr, INFO.size, sm.lkey)],
                                   e.IBV_WR_SEND, e.IBV_SEND_SIGNALED))

    def rdma(self, opcode: int, length: int) -> None:
        mr = self.mrs["rdma"]
        wr = v.SendWR(2, None, 1, [v.SGE(mr.addr, length, mr.lkey)], opcode,
                      e.IBV_SEND_SIGNALED)
        addr, rkey, _n = self.remote
        wr.set_wr_rdma(rkey, addr)
        self.qp.post_send(wr)

    # ---- the server's ping loop (rping_test_server) -----------------------------------------
    def test_server(self) -> int:
        """Serve pings until the client disconnects (0) or something fails (-1)."""
        ret = 0
        while True:
            # the client's source advertisement; rping.c prints the "wait for" line at
            # every end, the client's disconnect included (rxe: "... state 10")
            if not self.await_state(RDMA_READ_ADV, "RDMA_READ_ADV"):
                ret = -1
                break
            self.log("server received sink adv")
            self.rdma(e.IBV_WR_RDMA_READ, self.remote[2])
            self.log("server posted rdma read req ")
            if not self.await_state(RDMA_READ_COMPLETE, "RDMA_READ_COMPLETE"):
                ret = -1
                break
            self.log("server received read complete")
            data = self.mrs["rdma"].read(self.a.size, 0)
            text = data.split(b"\0", 1)[0]
            if self.a.verbose:
                say(f"server ping data: {text.decode('latin-1')}")
            self.send_info()
            self.log("server posted go ahead")
            if not self.await_state(RDMA_WRITE_ADV, "RDMA_WRITE_ADV"):
                ret = -1
                break
            self.log("server received sink adv")
            self.rdma(e.IBV_WR_RDMA_WRITE, len(text) + 1)
            if not self.await_state(RDMA_WRITE_COMPLETE, "RDMA_WRITE_COMPLETE"):
                ret = -1
                break
            self.log("server rdma write complete ")
            self.send_info()
            self.log("server posted go ahead")
        # rping.c: the client's disconnect is how a server's run ends well
        return 0 if self.state == DISCONNECTED else ret

    def serve(self, child: Any) -> int:
        """Accept ``child``'s connection, run the ping loop, disconnect."""
        self.child = child
        self.setup(child)
        self.log("accepting client connection request")
        if self.a.self_create_qp:
            self.self_modify_qp(child)
            child.accept(self.conn_param())
        else:
            child.accept(rc.ConnParam(responder_resources=1, initiator_depth=1))
        self.sem_wait()
        if self.state == ERROR:
            say(f"wait for CONNECTED state {self.state}", file=sys.stderr)
            return -1
        ret = self.test_server()
        self.disconnect(child)
        return ret

    def disconnect(self, cid: Any) -> None:
        if self.state == DISCONNECTED:
            return
        try:
            if self.a.self_create_qp and self.qp is not None:
                self.qp.modify(v.QPAttr(qp_state=e.IBV_QPS_ERR), int(e.IBV_QP_STATE))
            cid.disconnect()
        except SoftRdmaError:
            return
        end = time.monotonic() + DISCONNECT_WAIT_S
        while self.state != DISCONNECTED and time.monotonic() < end:
            if self.app.pump_here:
                if not self.app.pump_cm():
                    time.sleep(0.001)
            else:
                with self.cv:
                    self.cv.wait(0.01)

    def close(self) -> None:
        for cid in (self.child,):
            if cid is not None:
                cid.destroy()
        if self.qp is not None:
            self.qp.close()
        for mr in self.mrs.values():
            mr.close()
        for obj in (self.cq, self.pd):
            if obj is not None:
                obj.close()


class Rping:
    """The rping program: its rdma_cm channel and id, and the control blocks
    (``struct rping_cb`` per connection)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.server = bool(args.server)
        self.debug = args.debug
        self.ch = rc.EventChannel()
        self.cb = Cb(self)
        self.cm_id = rc.CmId(self.ch, rc.RDMA_PS_TCP, context=self.cb)
        self.cb.cm_id = self.cm_id
        self.prefer = args.device or args.transport
        self.pump_here = True  # False while a persistent server's main loop pumps
        self.failures = 0
        self.served = 0

    def log(self, msg: str) -> None:
        if self.debug:
            say(msg)

    # ---- rdma_cm events (rping's cm_thread) -------------------------------------------------
    def pump_cm(self) -> bool:
        did = False
        while self.ch.pending():
            try:
                ev = self.ch.get_cm_event(0)
            except TimeoutError:
                break
            self.ch.ack(ev)
            self._cma_event(ev)
            did = True
        return did

    def _cma_event(self, ev: Any) -> None:
        T = rc.RdmaCmEventType
        cb: Cb = ev.id.context if isinstance(ev.id.context, Cb) else self.cb
        self.log(f"cma_event type {rc.event_str(ev.event)} cma_id "
                 f"({'parent' if ev.id is self.cm_id else 'child'})")
        k = ev.event
        if k == T.ADDR_RESOLVED:
            cb.state = ADDR_RESOLVED
            ev.id.resolve_route(2000)
        elif k == T.ROUTE_RESOLVED:
            cb.post(ROUTE_RESOLVED)
        elif k == T.CONNECT_REQUEST:
            cb.child = ev.id
            self.log("child cma created")
            cb.post(CONNECT_REQUEST)
        elif k == T.CONNECT_RESPONSE:
            cb.post(CONNECTED)
        elif k == T.ESTABLISHED:
            self.log("ESTABLISHED")
            cb.post(None if self.server else CONNECTED)
        elif k in (T.ADDR_ERROR, T.ROUTE_ERROR, T.CONNECT_ERROR, T.UNREACHABLE, T.REJECTED):
            say(f"cma event {rc.event_str(k)}, error {ev.status}", file=sys.stderr)
            if ev.reject is not None:
                self.log(ev.reject.text)
            cb.post(ERROR)
        elif k == T.DISCONNECTED:
            say(f"{'server' if self.server else 'client'} DISCONNECT EVENT...", file=sys.stderr)
            cb.post(DISCONNECTED)
        elif k == T.DEVICE_REMOVAL:
            say("cma detected device removal!!!!", file=sys.stderr)
            cb.post(ERROR)
        elif k != T.TIMEWAIT_EXIT:
            say(f"unhandled event: {rc.event_str(k)}, ignoring", file=sys.stderr)

    # ---- server -------------------------------------------------------------------------------
    def bind_server(self) -> None:
        host = self.a.addr if self.a.addr is not None else "0.0.0.0"
        self.cm_id.bind_addr((host, self.a.port), device=self.prefer)
        self.log("rdma_bind_addr successful")
        self.log("rdma_listen")
        self.cm_id.listen(3)
        announce_wait("rping", self.a.port)  # once, on stderr (tools.waiting)

    def run_server(self) -> int:
        self.bind_server()
        cb = self.cb
        cb.sem_wait(forever=True)
        if cb.state != CONNECT_REQUEST:
            raise _Fail(f"wait for CONNECT_REQUEST state {cb.state}")
        ret = cb.serve(cb.child)
        if ret:
            say(f"rping server failed: {ret}", file=sys.stderr)
        return ret

    def run_persistent_server(self) -> int:
        """``-P`` (rping_run_persistent_server): every client gets its own control block
        and thread; this thread takes the rdma_cm events and the next clients, until
        stopped."""
        self.bind_server()
        listening = self.cb
        self.pump_here = False
        while True:
            self._wait_connect_request(listening)
            child = listening.child
            cb = Cb(self)
            child.context = cb
            threading.Thread(target=self._serve_one, args=(cb, child), daemon=True,
                             name="rping-persistent-server").start()

    def _wait_connect_request(self, listening: Cb) -> None:
        """Take rdma_cm events (for every connection) until the next CONNECT_REQUEST."""
        while True:
            with listening.cv:
                if listening.sem:
                    listening.sem -= 1
                    break
            try:
                ev = self.ch.get_cm_event(CM_WAIT_S)
            except TimeoutError:
                continue
            self.ch.ack(ev)
            self._cma_event(ev)
        if listening.state != CONNECT_REQUEST:
            raise _Fail(f"wait for CONNECT_REQUEST state {listening.state}")

    def _serve_one(self, cb: Cb, child: Any) -> None:
        try:
            ret = cb.serve(child)
        except (_Fail, SoftRdmaError) as exc:
            say(str(exc), file=sys.stderr)
            ret = -1
        finally:
            try:
                cb.close()
            except SoftRdmaError:
                pass
        if ret:
            self.failures += 1
            say(f"rping server failed: {ret}", file=sys.stderr)
        self.served += 1

    # ---- client -------------------------------------------------------------------------------
    def run_client(self) -> int:
        cb = self.cb
        src = (self.a.source, 0) if self.a.source else None
        self.cm_id.resolve_addr(src, (self.a.addr, self.a.port), 2000, device=self.prefer)
        cb.sem_wait()
        if cb.state != ROUTE_RESOLVED:
            raise _Fail(f"waiting for addr/route resolution state {cb.state}")
        self.log("rdma_resolve_addr - rdma_resolve_route successful")
        cb.setup(self.cm_id)
        self.cm_id.connect(cb.conn_param())
        cb.sem_wait()
        if cb.state != CONNECTED:
            raise _Fail(f"wait for CONNECTED state {cb.state}")
        if self.a.self_create_qp:  # CONNECT_RESPONSE: move our QP, then the RTU
            cb.self_modify_qp(self.cm_id)
            self.cm_id.establish()
        self.log("rdma_connect successful")
        ret = self.test_client(cb)
        if ret:
            say(f"rping client failed: {ret}", file=sys.stderr)
        cb.disconnect(self.cm_id)
        return ret

    def test_client(self, cb: Cb) -> int:
        """rping_test_client; the result is decided before the client disconnects."""
        ret = 0
        start = 65
        ping = 0
        size = self.a.size
        count = self.a.count
        while not count or ping < count:
            cb.state = RDMA_READ_ADV
            data = ping_pattern(ping, start, size)
            start = start + 1 if start < 122 else 65
            cb.mrs["start"].write(data, size, 0)
            cb.send_info(cb.mrs["start"])
            if not cb.await_state(RDMA_WRITE_ADV, "RDMA_WRITE_ADV"):
                ret = -1
                break
            cb.send_info(cb.mrs["rdma"])
            if not cb.await_state(RDMA_WRITE_COMPLETE, "RDMA_WRITE_COMPLETE"):
                ret = -1
                break
            got = cb.mrs["rdma"].read(size, 0)
            if self.a.validate and got != data:
                say("data mismatch!", file=sys.stderr)
                return -1
            if self.a.verbose:
                text = got.split(b"\0", 1)[0].decode("latin-1")
                say(f"ping data: {text}")
            ping += 1
        if ret and cb.state == DISCONNECTED and not count:
            return 0  # rping.c: without -C the server's disconnect ends the run
        return ret

    def close(self) -> None:
        try:
            self.cb.close()
        finally:
            self.cm_id.destroy()
            self.ch.close()


def run(args: argparse.Namespace) -> int:
    """``softrdma rping``: exit status 0 on success, 1 on failure."""
    check_args(args)
    r = Rping(args)
    try:
        if r.server:
            ret = r.run_persistent_server() if args.persistent else r.run_server()
        else:
            ret = r.run_client()
        return 0 if ret == 0 else 1
    except _Fail as exc:
        say(str(exc), file=sys.stderr)
        return 1
    finally:
        r.close()
        rc.release_devices()

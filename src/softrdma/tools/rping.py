"""``softrdma rping``: rdma-core's ``rping`` (librdmacm/examples/rping.c) on the rdma_cm API.

The ping/pong loop, as rping.c, over one RC connection set up by
:mod:`softrdma.cm.rdma_cm` (RoCE: IB CM + Annex A11; iWARP: TCP + MPA)::

    client sends source rkey/addr/len          (struct rping_rdma_info: !QII, big-endian)
    server RDMA READs the "ping" data from it
    server sends "go ahead" on the READ completion
    client sends sink rkey/addr/len
    server RDMA WRITEs the data back into the sink
    server sends "go ahead" on the WRITE completion; the client verifies (-V), prints
    (-v) ``ping data: rdma-ping-<n>: ABC...`` and starts again

``-C`` pings (0: for ever), ``-S`` bytes of ping data (rping's limits: 26 .. 65535),
port 7174 by default; the client disconnects at the end, each side reporting
``client DISCONNECT EVENT...`` / ``server DISCONNECT EVENT...`` on stderr. rping's
exit status: 0 on success. Options beyond rping: ``--transport roce|iwarp`` (which
kind of device serves the address; default roce) and ``--device NAME``.
"""

from __future__ import annotations

import argparse
import ipaddress
import struct
import sys
import time
from typing import Any

__all__ = ["add_arguments", "run", "INFO", "ping_pattern"]

INFO = struct.Struct("!QII")  # struct rping_rdma_info {__be64 buf; __be32 rkey; __be32 size}
RPING_BUFSIZE = 64 * 1024
RPING_MIN_BUFSIZE = len("2147483647") + 1 + len("rdma-ping-%d: ") + 1
RPING_SQ_DEPTH = 16
DEFAULT_PORT = 7174
MSG_FMT = "rdma-ping-%d: "

# rping.c test_state
(IDLE, CONNECT_REQUEST, ADDR_RESOLVED, ROUTE_RESOLVED, CONNECTED, RDMA_READ_ADV,
 RDMA_READ_COMPLETE, RDMA_WRITE_ADV, RDMA_WRITE_COMPLETE, DISCONNECTED, ERROR) = range(1, 12)


def ping_pattern(ping: int, start: int, size: int) -> bytes:
    """The client's ping data for ping number ``ping`` (rping_test_client): the header,
    then letters from ``start`` cycling through 65..122, the last byte NUL."""
    head = (MSG_FMT % ping).encode()[:size]
    out = bytearray(head)
    c = start
    for _ in range(len(head), size):
        out.append(c)
        c = c + 1 if c < 122 else 65
    out[size - 1] = 0
    return bytes(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    side = p.add_mutually_exclusive_group(required=True)
    side.add_argument("-s", dest="server", action="store_true", help="server side")
    side.add_argument("-c", dest="client", action="store_true", help="client side")
    p.add_argument("-a", dest="addr", default=None,
                   help="address (server: to bind, default any; client: the server's)")
    p.add_argument("-I", dest="source", default=None, help="source address for the client")
    p.add_argument("-p", dest="port", type=int, default=DEFAULT_PORT, help="port (7174)")
    p.add_argument("-C", dest="count", type=int, default=0, help="ping count (0: for ever)")
    p.add_argument("-S", dest="size", type=int, default=64, help="ping data size (64)")
    p.add_argument("-v", dest="verbose", action="count", default=0,
                   help="display ping data to stdout")
    p.add_argument("-V", dest="validate", action="count", default=0,
                   help="validate ping data")
    p.add_argument("-d", dest="debug", action="count", default=0, help="debug printfs")
    p.add_argument("--transport", choices=("roce", "iwarp"), default="roce",
                   help="which kind of softrdma device to use (default roce)")
    p.add_argument("--device", default=None, help="the softrdma device to use by name")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="give up on a wait after this many seconds (default 30)")


class _Fail(Exception):
    """An rping error: printed on stderr, exit status 1."""


class Rping:
    """One rping side (the rping_cb control block)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from ..cm import rdma_cm as rc  # noqa: PLC0415

        self.rc = rc
        self.a = args
        self.server = bool(args.server)
        self.state = IDLE
        self.sem = 0
        self.debug = args.debug
        self.ch = rc.EventChannel()
        self.cm_id = rc.CmId(self.ch, rc.RDMA_PS_TCP, context=self)
        self.child: Any = None
        self.qp: Any = None
        self.cq: Any = None
        self.pd: Any = None
        self.mrs: dict[str, Any] = {}
        self.remote = (0, 0, 0)  # addr, rkey, len
        self.prefer = args.device or args.transport

    def log(self, msg: str) -> None:
        if self.debug:
            print(msg, flush=True)

    # ---- the event pump: CM events and completions (rping's cm_thread + cq_thread) ---------
    def sem_wait(self) -> None:
        deadline = time.monotonic() + self.a.timeout
        while self.sem == 0:
            if not self._pump():
                if time.monotonic() > deadline:
                    raise _Fail(f"timed out in state {self.state}")
                time.sleep(0.0002)
        self.sem -= 1

    def _pump(self) -> bool:
        did = False
        while self.ch.pending():
            try:
                ev = self.ch.get_cm_event(0)
            except TimeoutError:
                break
            self.ch.ack(ev)
            self._cma_event(ev)
            did = True
        cq = self.cq
        if cq is not None:
            while True:
                _n, wcs = cq.poll(1)
                if not wcs:
                    break
                self._wc(wcs[0])
                did = True
        return did

    def _cma_event(self, ev: Any) -> None:
        rc = self.rc
        T = rc.RdmaCmEventType
        self.log(f"cma_event type {rc.event_str(ev.event)} cma_id "
                 f"({'parent' if ev.id is self.cm_id else 'child'})")
        k = ev.event
        if k == T.ADDR_RESOLVED:
            self.state = ADDR_RESOLVED
            ev.id.resolve_route(2000)
        elif k == T.ROUTE_RESOLVED:
            self.state = ROUTE_RESOLVED
            self.sem += 1
        elif k == T.CONNECT_REQUEST:
            self.state = CONNECT_REQUEST
            self.child = ev.id
            self.log("child cma created")
            self.sem += 1
        elif k == T.CONNECT_RESPONSE:
            self.state = CONNECTED
            self.sem += 1
        elif k == T.ESTABLISHED:
            self.log("ESTABLISHED")
            if not self.server:
                self.state = CONNECTED
            self.sem += 1
        elif k in (T.ADDR_ERROR, T.ROUTE_ERROR, T.CONNECT_ERROR, T.UNREACHABLE, T.REJECTED):
            print(f"cma event {rc.event_str(k)}, error {ev.status}", file=sys.stderr)
            if ev.reject is not None:
                self.log(ev.reject.text)
            self.state = ERROR
            self.sem += 1
        elif k == T.DISCONNECTED:
            print(f"{'server' if self.server else 'client'} DISCONNECT EVENT...",
                  file=sys.stderr, flush=True)
            self.state = DISCONNECTED
            self.sem += 1
        elif k == T.DEVICE_REMOVAL:
            print("cma detected device removal!!!!", file=sys.stderr)
            self.state = ERROR
            self.sem += 1
        elif k != T.TIMEWAIT_EXIT:
            print(f"unhandled event: {rc.event_str(k)}, ignoring", file=sys.stderr)

    def _wc(self, wc: Any) -> None:
        from .. import enums as e  # noqa: PLC0415

        if wc.status:
            if wc.status == e.IBV_WC_WR_FLUSH_ERR:
                return
            print(f"cq completion failed status {wc.status}", file=sys.stderr)
            self.state = ERROR
            self.sem += 1
            return
        op = wc.opcode
        if op == e.IBV_WC_SEND:
            self.log("send completion")
        elif op == e.IBV_WC_RDMA_WRITE:
            self.log("rdma write completion")
            self.state = RDMA_WRITE_COMPLETE
            self.sem += 1
        elif op == e.IBV_WC_RDMA_READ:
            self.log("rdma read completion")
            self.state = RDMA_READ_COMPLETE
            self.sem += 1
        elif op == e.IBV_WC_RECV:
            self.log("recv completion")
            if wc.byte_len != INFO.size:
                print(f"Received bogus data, size {wc.byte_len}", file=sys.stderr)
                self.state = ERROR
            elif self.server:
                self.remote = INFO.unpack(self.mrs["recv"].read(INFO.size, 0))
                addr, rkey, n = self.remote
                self.log(f"Received rkey {rkey:x} addr {addr:x} len {n} from peer")
                if self.state <= CONNECTED or self.state == RDMA_WRITE_COMPLETE:
                    self.state = RDMA_READ_ADV
                else:
                    self.state = RDMA_WRITE_ADV
            else:
                self.state = RDMA_WRITE_ADV if self.state == RDMA_READ_ADV \
                    else RDMA_WRITE_COMPLETE
            if self.state != ERROR:
                self._post_recv()
            self.sem += 1
        else:
            self.log("unknown!!!!! completion")
            self.state = ERROR
            self.sem += 1

    # ---- resources (rping_setup_qp / rping_setup_buffers) -----------------------------------
    def setup(self, cid: Any) -> None:
        from .. import enums as e  # noqa: PLC0415
        from .. import verbs as v  # noqa: PLC0415

        ctx = cid.verbs
        self.pd = v.PD(ctx)
        self.log("created pd")
        self.cq = v.CQ(ctx, RPING_SQ_DEPTH * 2)
        self.log("created cq")
        attr = v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                            cap=v.QPCap(RPING_SQ_DEPTH, 2, 1, 1))
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

    def _post_recv(self) -> None:
        from .. import verbs as v  # noqa: PLC0415

        mr = self.mrs["recv"]
        self.qp.post_recv(v.RecvWR(0, 1, [v.SGE(mr.addr, INFO.size, mr.lkey)]))

    def _send_info(self, mr: Any | None = None) -> None:
        """The SEND of rping_format_send (an advertisement, or the server's go-ahead)."""
        from .. import enums as e  # noqa: PLC0415
        from .. import verbs as v  # noqa: PLC0415

        sm = self.mrs["send"]
        if mr is not None:
            sm.write(INFO.pack(mr.addr, mr.rkey, self.a.size), INFO.size, 0)
            self.log(f"RDMA addr {mr.addr:x} rkey {mr.rkey:x} len {self.a.size}")
        self.qp.post_send(v.SendWR(1, None, 1, [v.SGE(sm.addr, INFO.size, sm.lkey)],
                                   e.IBV_WR_SEND, e.IBV_SEND_SIGNALED))

    def _rdma(self, opcode: int, length: int) -> None:
        from .. import enums as e  # noqa: PLC0415
        from .. import verbs as v  # noqa: PLC0415

        mr = self.mrs["rdma"]
        wr = v.SendWR(2, None, 1, [v.SGE(mr.addr, length, mr.lkey)], opcode,
                      e.IBV_SEND_SIGNALED)
        addr, rkey, _n = self.remote
        wr.set_wr_rdma(rkey, addr)
        self.qp.post_send(wr)

    # ---- server -------------------------------------------------------------------------------
    def run_server(self) -> int:
        from .. import enums as e  # noqa: PLC0415

        rc = self.rc
        host = self.a.addr if self.a.addr is not None else "0.0.0.0"
        self.cm_id.bind_addr((host, self.a.port), device=self.prefer)
        self.log("rdma_bind_addr successful")
        self.log("rdma_listen")
        self.cm_id.listen(3)
        self.sem_wait()
        if self.state != CONNECT_REQUEST:
            raise _Fail(f"wait for CONNECT_REQUEST state {self.state}")
        child = self.child
        self.setup(child)
        self.log("accepting client connection request")
        child.accept(rc.ConnParam(responder_resources=1, initiator_depth=1))
        self.sem_wait()
        if self.state == ERROR:
            raise _Fail(f"wait for CONNECTED state {self.state}")
        ret = 0
        while True:
            self.sem_wait()  # the client's source advertisement
            if self.state != RDMA_READ_ADV:
                if self.state != DISCONNECTED:
                    print(f"wait for RDMA_READ_ADV state {self.state}", file=sys.stderr)
                    ret = -1
                break
            self.log("server received sink adv")
            self._rdma(e.IBV_WR_RDMA_READ, self.remote[2])
            self.log("server posted rdma read req ")
            self.sem_wait()
            if self.state != RDMA_READ_COMPLETE:
                print(f"wait for RDMA_READ_COMPLETE state {self.state}", file=sys.stderr)
                ret = -1
                break
            self.log("server received read complete")
            data = self.mrs["rdma"].read(self.a.size, 0)
            text = data.split(b"\0", 1)[0]
            if self.a.verbose:
                print(f"server ping data: {text.decode('latin-1')}", flush=True)
            self._send_info()
            self.log("server posted go ahead")
            self.sem_wait()
            if self.state != RDMA_WRITE_ADV:
                print(f"wait for RDMA_WRITE_ADV state {self.state}", file=sys.stderr)
                ret = -1
                break
            self.log("server received sink adv")
            self._rdma(e.IBV_WR_RDMA_WRITE, len(text) + 1)
            self.sem_wait()
            if self.state != RDMA_WRITE_COMPLETE:
                print(f"wait for RDMA_WRITE_COMPLETE state {self.state}", file=sys.stderr)
                ret = -1
                break
            self.log("server rdma write complete ")
            self._send_info()
            self.log("server posted go ahead")
        if self.state != DISCONNECTED:
            self._disconnect(child)
        return 0 if self.state == DISCONNECTED else ret

    # ---- client -------------------------------------------------------------------------------
    def run_client(self) -> int:
        rc = self.rc
        if self.a.addr is None:
            raise _Fail("the client needs -a ADDR (the server's address)")
        src = (self.a.source, 0) if self.a.source else None
        self.cm_id.resolve_addr(src, (self.a.addr, self.a.port), 2000, device=self.prefer)
        self.sem_wait()
        if self.state != ROUTE_RESOLVED:
            raise _Fail(f"waiting for addr/route resolution state {self.state}")
        self.log("rdma_resolve_addr - rdma_resolve_route successful")
        self.setup(self.cm_id)
        self.cm_id.connect(rc.ConnParam(responder_resources=1, initiator_depth=1,
                                        retry_count=7, rnr_retry_count=7))
        self.sem_wait()
        if self.state != CONNECTED:
            raise _Fail(f"wait for CONNECTED state {self.state}")
        self.log("rdma_connect successful")
        ret = 0
        start = 65
        ping = 0
        size = self.a.size
        while not self.a.count or ping < self.a.count:
            self.state = RDMA_READ_ADV
            data = ping_pattern(ping, start, size)
            start = start + 1 if start < 122 else 65
            self.mrs["start"].write(data, size, 0)
            self._send_info(self.mrs["start"])
            self.sem_wait()
            if self.state != RDMA_WRITE_ADV:
                print(f"wait for RDMA_WRITE_ADV state {self.state}", file=sys.stderr)
                ret = -1
                break
            self._send_info(self.mrs["rdma"])
            self.sem_wait()
            if self.state != RDMA_WRITE_COMPLETE:
                print(f"wait for RDMA_WRITE_COMPLETE state {self.state}", file=sys.stderr)
                ret = -1
                break
            got = self.mrs["rdma"].read(size, 0)
            if self.a.validate and got != data:
                print("data mismatch!", file=sys.stderr)
                ret = -1
                break
            if self.a.verbose:
                text = got.split(b"\0", 1)[0].decode("latin-1")
                print(f"ping data: {text}", flush=True)
            ping += 1
        self._disconnect(self.cm_id)
        return 0 if ret == 0 or self.state == DISCONNECTED else ret

    def _disconnect(self, cid: Any) -> None:
        from ..errors import SoftRdmaError  # noqa: PLC0415

        try:
            cid.disconnect()
        except SoftRdmaError:
            return
        end = time.monotonic() + 5
        while self.state != DISCONNECTED and time.monotonic() < end:
            if not self._pump():
                time.sleep(0.001)

    def close(self) -> None:
        for cid in (self.child, self.cm_id):
            if cid is not None:
                cid.destroy()
        if self.qp is not None:
            self.qp.close()
        for mr in self.mrs.values():
            mr.close()
        for obj in (self.cq, self.pd):
            if obj is not None:
                obj.close()
        self.ch.close()


def _check(args: argparse.Namespace) -> None:
    from ..errors import InvalidArgument  # noqa: PLC0415

    if not RPING_MIN_BUFSIZE <= args.size <= RPING_BUFSIZE - 1:
        raise InvalidArgument("-S", f"Invalid size {args.size} (valid range is "
                                    f"{RPING_MIN_BUFSIZE} to {RPING_BUFSIZE - 1})")
    if args.count < 0:
        raise InvalidArgument("-C", f"Invalid count {args.count}")
    if not 0 <= args.port <= 0xFFFF:
        raise InvalidArgument("-p", f"port {args.port} not in 0..65535")
    for name in ("addr", "source"):
        val = getattr(args, name)
        if val is not None:
            try:
                ipaddress.ip_address(val)
            except ValueError:
                raise InvalidArgument("-a" if name == "addr" else "-I",
                                      f"not an IP address: {val!r}") from None


def run(args: argparse.Namespace) -> int:
    """``softrdma rping``: exit status 0 on success, 1 on failure."""
    from ..cm import rdma_cm as rc  # noqa: PLC0415

    _check(args)
    r = Rping(args)
    try:
        ret = r.run_server() if r.server else r.run_client()
        if ret:
            print(f"rping {'server' if r.server else 'client'} failed: {ret}", file=sys.stderr)
        return 0 if ret == 0 else 1
    except _Fail as exc:
        print(str(exc), file=sys.stderr)
        return 1
    finally:
        r.close()
        rc.release_devices()

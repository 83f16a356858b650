"""Worked example for an application developer: an rdma_cm echo service with asyncio.

A server and a client in one process, connected through rdma_cm (RDMA_PS_TCP) by IP
address and port, as librdmacm programs connect:

1. the server listens; the client resolves the address and route, creates its RC QP
   and connects, putting the address and R_Key of a reply buffer in the private data;
2. the client SENDs a message; the server receives it and RDMA WRITEs it back, upper
   case, straight into the client's reply buffer, then SENDs a 4-byte "done" marker;
3. both disconnect.

Every wait is an ``await``: ``EventChannel.next_event()`` for connection events,
``CQ.wait()`` for work completions, so one event loop drives both sides.

Run it (the device is ``softrdma_lo`` unless ``--device`` names another; both transports
work, ``--device softrdma_iw_lo`` for iWARP)::

    python examples/app_echo_asyncio.py --message "hello, rdma"
"""

from __future__ import annotations

import argparse
import asyncio
import struct

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.cm import rdma_cm as rc

T = rc.RdmaCmEventType
ACCESS = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
BUF = 4096
REPLY_AT = 2048  # the client's reply area: the second half of its buffer
MARKER_AT = 1024  # where the server builds its 4-byte "done" marker (the reply length)
ADDR_KEY = struct.Struct("!QI")  # private data: reply VA, R_Key


class Side:
    """A connection's verbs objects: PD, CQ, RC QP (made by the rdma_cm id), one MR."""

    def __init__(self, cid: rc.CmId) -> None:
        self.cid = cid
        self.pd = v.PD(cid.verbs)
        self.cq = v.CQ(cid.verbs, 16)
        self.qp = cid.create_qp(self.pd, v.QPInitAttr(
            qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=v.QPCap(4, 4, 1, 1)))
        self.mr = v.MR(self.pd, BUF, ACCESS)
        self.pending: list[v.WC] = []  # completions polled and not yet handed out

    def post_recv(self, offset: int, length: int) -> None:
        self.qp.post_recv(v.RecvWR(1, 1, [v.SGE(self.mr.addr + offset, length,
                                                self.mr.lkey)]))

    async def completion(self) -> v.WC:
        """The next completion. ``cq.wait`` returns every completion the CQ holds, which
        may be more than one (our SEND's and the peer's answer can arrive together):
        the others wait in ``self.pending``."""
        if not self.pending:
            self.pending.extend(await self.cq.wait(timeout=10))
        wc = self.pending.pop(0)
        if wc.status != e.IBV_WC_SUCCESS:
            raise RuntimeError(f"completion failed: {v.wc_status_str(wc.status)}")
        return wc

    def close(self) -> None:
        self.cid.destroy_qp()
        for obj in (self.mr, self.cq, self.pd):
            obj.close()
        self.cid.destroy()


async def expect(ch: rc.EventChannel, kind: T) -> rc.RdmaCmEvent:
    ev = await asyncio.wait_for(ch.next_event(), 10)
    ch.ack(ev)
    if ev.event != kind:
        raise RuntimeError(f"expected {rc.event_str(kind)}, got {ev.text}")
    return ev


async def server(ch: rc.EventChannel, listen_id: rc.CmId) -> None:
    ev = await expect(ch, T.CONNECT_REQUEST)
    side = Side(ev.id)
    assert ev.param is not None  # a CONNECT_REQUEST carries the client's ConnParam
    reply_va, rkey = ADDR_KEY.unpack(ev.param.private_data[:ADDR_KEY.size])
    side.post_recv(0, BUF)
    side.cid.accept(rc.ConnParam())
    await expect(ch, T.ESTABLISHED)
    wc = await side.completion()  # the client's SEND
    text = side.mr.read(wc.byte_len, 0).decode()
    print(f"server: received {text!r} ({wc.byte_len} bytes)")
    answer = text.upper().encode()
    side.mr.write(answer, len(answer), 0)
    write = v.SendWR(2, None, 1, [v.SGE(side.mr.addr, len(answer), side.mr.lkey)],
                     e.IBV_WR_RDMA_WRITE)
    write.set_wr_rdma(rkey, reply_va)
    side.mr.write(struct.pack("!I", len(answer)), 4, MARKER_AT)
    done = v.SendWR(3, None, 1, [v.SGE(side.mr.addr + MARKER_AT, 4, side.mr.lkey)])
    side.qp.post_send(write)
    await side.completion()
    side.qp.post_send(done)  # after the WRITE: RC keeps the order (IBA 9.5)
    await side.completion()
    print(f"server: wrote {len(answer)} bytes into the client's buffer, sent done")
    await expect(ch, T.DISCONNECTED)
    side.close()
    listen_id.destroy()


async def client(ch: rc.EventChannel, addr: tuple[str, int], message: str,
                 device: str) -> str:
    cid = rc.CmId(ch, rc.RDMA_PS_TCP)
    cid.resolve_addr(None, addr, 2000, device=device)
    await expect(ch, T.ADDR_RESOLVED)
    cid.resolve_route(2000)
    await expect(ch, T.ROUTE_RESOLVED)
    side = Side(cid)
    side.post_recv(0, 4)  # the server's "done" marker
    private = ADDR_KEY.pack(side.mr.addr + REPLY_AT, side.mr.rkey)
    cid.connect(rc.ConnParam(private_data=private))
    await expect(ch, T.ESTABLISHED)
    data = message.encode()
    side.mr.write(data, len(data), 64)
    side.qp.post_send(v.SendWR(1, None, 1, [v.SGE(side.mr.addr + 64, len(data),
                                                  side.mr.lkey)]))
    await side.completion()  # our SEND
    await side.completion()  # the server's done marker
    (length,) = struct.unpack("!I", side.mr.read(4, 0))
    reply = side.mr.read(length, REPLY_AT).decode()
    print(f"client: the server wrote back {reply!r}")
    cid.disconnect()
    await expect(ch, T.DISCONNECTED)
    side.close()
    return reply


async def main(device: str, port: int, message: str) -> str:
    host = "127.0.0.1"
    sch, cch = rc.EventChannel(), rc.EventChannel()
    listen_id = rc.CmId(sch, rc.RDMA_PS_TCP)
    listen_id.bind_addr((host, port), device=device)
    listen_id.listen(4)
    try:
        _, reply = await asyncio.gather(server(sch, listen_id),
                                        client(cch, (host, port), message, device))
    finally:
        rc.release_devices()
    return reply


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="softrdma_lo")
    p.add_argument("--port", type=int, default=7471)
    p.add_argument("--message", default="hello, rdma")
    a = p.parse_args()
    got = asyncio.run(main(a.device, a.port, a.message))
    raise SystemExit(0 if got == a.message.upper() else 1)

"""Fuzz targets: the receive paths and decoders that take bytes from the network (or, for
devd, from another local user), each as a function of one byte string (``TARGETS``).

Each target turns its bytes into inputs with :class:`Provider` (header fields, a mutated
valid message, a chunking, the time) and feeds them to an engine set up as in the tests;
any exception it lets out is a defect (malformed input is counted and dropped, or
answered with a Terminate, never raised; the wire decoders raise only
:class:`~softrdma.errors.DecodeError`). ``tools/dev/fuzz.py`` drives them with atheris
(coverage-guided, libFuzzer's flags); ``tests/tools/test_fuzz_targets.py`` runs each on a
few hundred seeded random inputs so that they keep working.

* ``ib``: RoCE transport packets (BTHs of every opcode aimed at live RC, UC and UD QPs
  and at unknown ones, in and out of sequence; raw bytes) into two engine ports, their
  timers run between them;
* ``roce``: the packets of real SENDs and WRITEs (some damaged, then given a valid
  ICRC; some damaged after it) in coalesced reads of 1-16 segments with GSO segment IDs
  and hints, through the RoCEv2 driver's receive path (ICRC, ID recovery, the MIDDLE run
  path) into an engine;
* ``ibcm``: CM MADs, the REQ, REP, RTU of a live connection and more, and a REQ to an
  IP CM (Annex A11) listener, with bytes changed or cut, into both CM agents;
* ``devd``: control records of every op (and others), cut or with a JSON or random tail,
  some with a pipe or a socket passed along, from a local client to an in-process devd,
  which must stay up and answer a good client after each input;
* ``ipoib``: IPoIB messages (IPv4, IPv6, ARP, ND and garbage, any EtherType) over UD and
  connections, CM requests and events, and IP packets from the host, into two interfaces;
* ``iwarp``: a valid RDMAP stream (every operation) with bytes flipped, set, inserted,
  deleted or cut, delivered in chunks into a responder, then its end (as
  ``tests/iwarp/test_iwarp_fuzz.py``, whose checks it repeats);
* ``mpa``: an MPA Request (into a responder) or Reply (into an initiator) of every
  kind (v1/v2, CRC, markers, RTR offers, private data), bytes changed or cut, in chunks,
  then accepted or rejected (RFC 5044 §7.1, RFC 6581);
* ``pcap``: real rxe captures (and siw's, where ``../shared`` is there) with bytes
  changed or cut, through ``pcap-check``;
* ``wire``: every byte decoder of ``softrdma.wire`` and ``softrdma.ipoib``.
"""

from __future__ import annotations

import io
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softrdma.errors import DecodeError, SoftRdmaError

__all__ = ["Provider", "TARGETS", "close_devd"]

DATA = Path(__file__).resolve().parents[1] / "data"


class Provider:
    """Values taken from the front of a byte string (atheris' FuzzedDataProvider in
    spirit, without atheris): once it runs out, the smallest value of each kind."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def raw(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + max(n, 0)]
        self.pos += len(out)
        return out

    def number(self, lo: int, hi: int) -> int:
        """An integer of ``lo`` .. ``hi`` (both included)."""
        span = hi - lo
        if span <= 0:
            return lo
        raw = self.raw((span.bit_length() + 7) // 8)
        return lo + int.from_bytes(raw, "big") % (span + 1) if raw else lo

    def flag(self) -> bool:
        return bool(self.number(0, 1))

    def pick(self, items: list[Any]) -> Any:
        return items[self.number(0, len(items) - 1)]

    def mutate(self, base: bytes, max_changes: int = 8) -> bytes:
        """``base`` with up to ``max_changes`` bytes set, maybe cut short."""
        b = bytearray(base)
        for _ in range(self.number(0, max_changes)):
            if b:
                b[self.number(0, len(b) - 1)] = self.number(0, 255)
        if b and self.number(0, 9) == 0:
            del b[self.number(0, len(b)):]
        return bytes(b)


# ---- ib: the RoCE transport engine -----------------------------------------------------------
_IB_OPS = [*range(0x00, 0x19), *range(0x20, 0x2C), 0x64, 0x65, *range(0xA0, 0xAC), 0x81, 0xFF]


def ib(data: bytes) -> None:
    from harness.engine import Endpoint, Net, connect, gid4
    from softrdma import enums as e
    from softrdma.ib.port import RxMeta
    from softrdma.seam.types import SGE, RecvWQE

    p = Provider(data)
    net = Net(seed=1)
    pa, pb = net.add_port(1), net.add_port(2)
    eps = []
    for qpt in (e.IBV_QPT_RC, e.IBV_QPT_UD, e.IBV_QPT_UC):
        a, b = Endpoint(pa, qpt, size=1 << 14), Endpoint(pb, qpt, size=1 << 14)
        connect(a, b)
        eps += [b, a]
    for ep in eps:
        for i in range(4):
            ep.qp.post_recv(RecvWQE(i, [SGE(ep.mr.addr + i * 1024, 1024, ep.mr.lkey)]))
    now = 0.0
    for _ in range(p.number(1, 12)):
        if p.number(0, 3) == 0:
            pkt = p.raw(p.number(0, 200))
        else:
            qp = p.pick(eps).qp
            qpn = qp.qpn if p.number(0, 9) else p.number(0, 0xFFFFFF)
            psn = p.number(0xFFFFE0, 0xFFFFFF) if p.flag() else p.number(0, 0xFFFFFF)
            bth = struct.pack(">BBHII", p.pick(_IB_OPS), p.number(0, 255),
                              0xFFFF if p.flag() else p.number(0, 0xFFFF), qpn,
                              (0x80000000 if p.flag() else 0) | psn)
            pkt = bth + p.raw(p.number(0, 300))
        dst = pb if p.number(0, 5) else pa
        src = gid4(1) if dst is pb else gid4(2)
        if p.number(0, 7) == 0:
            src = gid4(p.number(0, 255))
        dst.receive(memoryview(pkt), RxMeta(src, dst.gids[0]), now)
        now += p.number(0, 2000) * 1e-3
        for port in (pa, pb):
            port.on_timer(now)
            port.take_tx()


# ---- roce: the RoCEv2 driver's receive path ---------------------------------------------------
_A_IP, _B_IP = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])


def roce(data: bytes) -> None:
    import itertools

    from harness.engine import Endpoint, Net, connect
    from harness.recording_link import RecordingLink
    from softrdma import enums as e
    from softrdma.drivers.links.link import Datagram
    from softrdma.drivers.runtime.roce import Runtime
    from softrdma.seam.types import SGE, RecvWQE, SendWQE
    from softrdma.wire import roce as wroce

    p = Provider(data)
    net = Net()
    keys = (itertools.count(0x100).__next__, itertools.count(0x200).__next__)
    a = Endpoint(net.add_port(1, max_mtu=4096, key_alloc=keys[0]), size=1 << 16)
    b = Endpoint(net.add_port(2, max_mtu=4096, key_alloc=keys[1]), size=1 << 16)
    qpt = p.pick([e.IBV_QPT_RC, e.IBV_QPT_UC])
    ua, ub = (Endpoint(a.port, qpt, size=1 << 14), Endpoint(b.port, qpt, size=1 << 14))
    connect(a, b, mtu=p.number(1, 5))
    connect(ua, ub)
    for ep in (b, ub):
        for i in range(3):
            ep.qp.post_recv(RecvWQE(i, [SGE(ep.mr.addr + i * 4096, 4096, ep.mr.lkey)]))
    # the packets of real requests from a: SENDs and WRITEs of a few sizes
    for k in range(p.number(1, 3)):
        size = p.number(0, 9000)
        sge = [SGE(a.mr.addr, size, a.mr.lkey)]
        if p.flag():
            w = SendWQE(k, int(e.IBV_WR_SEND), int(e.IBV_SEND_SIGNALED), sge)
        else:
            w = SendWQE(k, int(e.IBV_WR_RDMA_WRITE), 0, sge, remote_addr=b.mr.addr,
                        rkey=b.mr.rkey)
        a.qp.post_send(w, 0.0)
    bodies = [b"".join(bytes(x) for x in tx.parts) for tx in a.port.take_tx()]
    bodies = [p.mutate(x, 3) if p.number(0, 3) == 0 else x for x in bodies]
    link = RecordingLink(local_ip=_B_IP)
    rt = Runtime(b.port, link, mode="manual")
    try:
        i = 0
        while i < len(bodies):
            batch = p.number(1, 16)
            id_base = p.number(0, 0xFFFF) if p.number(0, 3) == 0 else 0
            dgs = []
            for j, body in enumerate(bodies[i:i + batch]):
                ident = (id_base + j) & 0xFFFF
                raw = body if len(body) < 12 else body + wroce.udp_send_icrc(
                    _A_IP, _B_IP, 50123, 4791, [body], ident=ident)  # too short for one
                if p.number(0, 15) == 0:  # damaged after its ICRC: dropped, counted
                    raw = p.mutate(raw, 2)
                # a segment of a coalesced read (hint j) is never empty (UdpRx slices a
                # read by its GRO size); an empty datagram comes alone
                hint = j if raw and p.flag() else -1
                dgs.append(Datagram(memoryview(raw), _A_IP, _B_IP, 50123, 4791,
                                    p.number(0, 3), 64, b"", hint))
            i += batch
            link.rx = dgs
            rt.progress()
        rt.progress()
    finally:
        rt.close(close_link=False)


# ---- ibcm: the IB CM agents ------------------------------------------------------------------
def ibcm(data: bytes) -> None:
    from harness.cm import Pair
    from harness.cm_ibcm import connect
    from softrdma.ibcm.ipcm import ip_listen
    from softrdma.wire import cm as wcm
    from softrdma.wire.ipcm import IpCmHeader, ip_cm_service_id

    p = Provider(data)
    pair = Pair()
    try:
        connect(pair)
        ip_listen(pair.b.new_id(), 18515)  # an A11 listener (IBA Annex A11) beside it
        pair.run(0.5)
        bases = [wcm.encode(m.msg, tid=m.hdr.tid) for m in pair.log]
        # a REQ to the A11 Service ID, Table 1 private data from a's address to b's
        hdr = IpCmHeader.make(pair.a.ip, pair.b.ip, 4000).encode()
        bases.append(wcm.encode(wcm.Req(
            local_comm_id=0x1234, service_id=ip_cm_service_id(6, 18515), local_ca_guid=7,
            local_qpn=0x99, starting_psn=7, path_mtu=3, max_cm_retries=3,
            local_cm_response_timeout=19, primary_local_gid=pair.a.gid,
            primary_remote_gid=pair.b.gid, primary_hop_limit=64, primary_local_ack_timeout=19,
            private_data=hdr + bytes(20)), tid=5))
        for _ in range(p.number(1, 6)):
            mad = p.mutate(p.pick(bases))
            node, src = (pair.b, pair.a.gid) if p.flag() else (pair.a, pair.b.gid)

            def deliver(now: float, node: Any = node, src: bytes = src, mad: bytes = mad) -> None:
                node.agent.on_mad(mad, src, 1, now, dst_gid=node.gid)
            node.ctx.runtime.call_now(deliver)
            if p.number(0, 3) == 0:
                pair.run(p.number(1, 100) * 0.01)
    finally:
        for n in (pair.a, pair.b):
            n.ctx.close()


# ---- devd: the control channel, as a local user may speak it --------------------------------------
_DEVD: dict[str, Any] = {}


def _devd() -> dict[str, Any]:
    """One devd in this process (a private state directory, a device on 127.0.0.1) and a
    client of its own that asks it something after every input; :func:`close_devd` (or
    the interpreter's exit) stops it."""
    if not _DEVD:
        import atexit

        from harness.devd import start_devd
        from softrdma.drivers.devd.client import DevdLink

        state = Path(tempfile.mkdtemp(prefix="softrdma-fuzz-devd-"))
        running = start_devd(state, "fz0")
        link = DevdLink(running.record, state_dir=state, spawn=False, direct=False)
        _DEVD.update(running=running, link=link, state=state)
        atexit.register(close_devd)
    return _DEVD


def close_devd() -> None:
    """Stop the devd of the ``devd`` target, if one runs."""
    import shutil

    if not _DEVD:
        return
    _DEVD["link"].close()
    _DEVD["running"].devd.shutdown()
    _DEVD["running"].thread.join(5)
    shutil.rmtree(_DEVD["state"], ignore_errors=True)
    _DEVD.clear()


def devd(data: bytes) -> None:
    import select
    import socket

    from softrdma.drivers.devd import proto

    d = _devd()
    running = d["running"]
    p = Provider(data)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    held: list[Any] = []
    try:
        s.connect(str(proto.socket_path("fz0", d["state"])))
        _msg, fds, _, _ = socket.recv_fds(s, 4096, 1)
        held += [socket.socket(fileno=fd) for fd in fds]  # the data channel
        for _ in range(p.number(1, 8)):
            op = p.pick([*range(1, 19), p.number(0, 255)])
            rec = proto.with_seq(proto.REQ.pack(op, p.number(0, 0xFFFFFFFF), p.raw(16).ljust(16, b"\0")),
                                 p.number(0, 255))
            k = p.number(0, 5)
            if k == 0:
                rec = rec[:p.number(0, len(rec))]
            elif k == 1:
                rec += p.pick([b'{"rcvd_pkts": 1}', b"{not json", b"[]", b'{"a": [{}]}',
                               p.raw(p.number(0, 64))])
            fds_out: list[int] = []
            own: list[int] = []  # descriptors of ours, closed once sent
            if p.number(0, 7) == 0:  # descriptors with it: a pipe end or a UDP socket
                if p.flag():
                    r, w = os.pipe()
                    os.close(w)
                    fds_out = own = [r]
                else:
                    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    held.append(u)
                    fds_out = [u.fileno()]
            try:
                if fds_out:
                    socket.send_fds(s, [rec or b"\0"], fds_out)
                else:
                    s.send(rec or b"\0")
            except OSError:
                break  # devd dropped this client
            finally:
                for fd in own:
                    os.close(fd)
            if select.select([s], [], [], 0.05)[0]:
                try:
                    s.recv(proto.MAX_CTRL)
                except OSError:
                    break
    finally:
        s.close()
        for h in held:
            h.close()
    # devd is alive and still answers a well-behaved client at once
    assert running.thread.is_alive()
    d["link"].stats()


# ---- ipoib: the interface engine -------------------------------------------------------------
def ipoib(data: bytes) -> None:
    from harness.ipoib_net import connected_net, make_net, v4, v6

    p = Provider(data)
    net = connected_net() if p.flag() else make_net(mode="datagram")
    a, b = net.ifs
    now = 0.0
    seeds = [v4(2, 1, 100), v6(2, 1, 200), v4(2, 1, 3000, df=False), bytes(28)]
    for _ in range(p.number(1, 10)):
        op = p.number(0, 7)
        f = a if p.flag() else b
        if op <= 2:
            body = p.mutate(p.pick(seeds), 6) if p.flag() else p.raw(p.number(0, 120))
            etype = p.pick([0x0800, 0x86DD, 0x0806, p.number(0, 0xFFFF)])
            msg = struct.pack(">HH", etype, p.number(0, 0xFFFF) if p.number(0, 5) == 0 else 0) + body
            if op == 0:
                f.receive_ud(msg, p.raw(16).ljust(16, b"\0"), p.number(0, 0xFFFFFF), now)
            elif op == 1:
                f.receive_conn(p.number(0, 5), msg, now)
            else:
                f.send_ip(body, now)
        elif op == 3:
            f.conn_request(p.number(0, 100), p.raw(16).ljust(16, b"\0"), p.raw(p.number(0, 60)),
                           p.pick(["RC", "UC"]), now)
        elif op == 4:
            f.conn_established(p.number(0, 5), now,
                               rep_private_data=p.raw(p.number(0, 60)) if p.flag() else None)
        elif op == 5:
            f.conn_closed(p.number(0, 5), now, refused=p.flag())
        elif op == 6:
            f.conn_progress(p.number(0, 5), now)
        else:
            now += p.number(0, 100000) * 0.01
            f.on_timer(now)
        for g in (a, b):
            g.take_output()


# ---- iwarp: the RDMAP/DDP/MPA receive path ---------------------------------------------------
def iwarp(data: bytes) -> None:
    from harness.iwarp_sut import MUTATIONS, Sut, mutated

    p = Provider(data)
    sut = Sut(p.flag(), p.flag())
    muts = [(p.pick(list(MUTATIONS)), p.number(0, 0xFFFF), p.number(0, 255))
            for _ in range(p.number(1, 6))]
    d = mutated(sut.stream, muts)
    sut.feed(d, [p.number(1, 300) for _ in range(p.number(0, 8))])
    sut.finish()


# ---- mpa: the MPA Request/Reply exchange -----------------------------------------------------
def mpa_setup(data: bytes) -> None:
    from harness.iwarp import Side
    from harness.iwarp_sut import end_setup
    from softrdma.iwarp.engine import ConnState, IwarpConn
    from softrdma.iwarp.mpa_setup import MpaConfig
    from softrdma.wire import mpa

    p = Provider(data)
    initiator = p.flag()
    s = Side("s")
    s.post_recv(s.mr(64), 64, wr_id=1)
    cfg = MpaConfig(crc=p.flag(), markers=p.flag(), p2p=p.flag(), rtr_send=p.flag())
    conn = IwarpConn(s.dev, initiator=initiator, cfg=cfg, qp=s.qp if initiator else None)
    s.conn = conn
    v2 = (mpa.MpaV2Params(p.number(0, 0x3FFF), p.number(0, 0x3FFF), p.flag(), p.flag(),
                          p.flag(), p.flag()) if p.flag() else None)
    frame = (mpa.MpaReply if initiator else mpa.MpaRequest).build(
        v2=v2, user_data=p.raw(p.number(0, 40)), crc=p.flag(), markers=p.flag(),
        reject=initiator and p.number(0, 7) == 0)
    stream = p.mutate(frame.encode() + p.raw(p.number(0, 60)))
    i = 0
    while i < len(stream):
        n = p.number(1, 64) if p.flag() else len(stream)
        conn.receive(stream[i:i + n])
        i += n
        if conn.state == ConnState.ACCEPT_WAIT:
            if p.number(0, 5):
                conn.accept(s.qp)
            else:
                conn.reject(p.raw(p.number(0, 20)))
        conn.pull_tx()
    end_setup(s, initiator)


# ---- pcap: pcap-check on damaged captures ----------------------------------------------------
# RoCE captures of rxe (tests/data), and where ../shared is beside the checkout (CI) its
# small siw captures too, so that the iWARP checker (TCP reassembly, MPA) is fuzzed as well
_SHARED = DATA.parents[2] / "shared" / "captures"
_PCAPS = [DATA / "rxe_write_bw_tail_loss.pcap", DATA / "rxe_read_bw_tail_loss.pcap",
          *(p for p in (_SHARED / n for n in ("iwarp_rping.pcap", "iwarp_crc_rping.pcap",
                                               "host_peer_mpa.pcap")) if p.is_file())]


def pcap(data: bytes) -> None:
    from softrdma.tools.capture import pcap_check

    p = Provider(data)
    base = bytearray(p.pick(_PCAPS).read_bytes())
    for _ in range(p.number(0, 12)):
        i = p.number(24 if p.number(0, 9) else 0, len(base) - 1)
        n = p.number(1, 4)
        base[i:i + n] = p.raw(n)
    if p.number(0, 9) == 0:
        del base[p.number(0, len(base)):]
    fd, path = tempfile.mkstemp(suffix=".pcap")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(base)
        pcap_check.run([path], io.StringIO(), err=io.StringIO(), verbose=p.flag())
    finally:
        os.unlink(path)


# ---- wire: the decoders ----------------------------------------------------------------------
def _decoders() -> list[Callable[[bytes], object]]:
    from softrdma.ipoib import encap, hwaddr, ip, nd
    from softrdma.wire import cm, ddp, ipcm, iwarp_ib, mad, mpa, roce_frame, rocev1, tcpstream, xrc

    return [
        cm.decode, ddp.decode_ddp, ddp.ReadRequest.decode, ddp.Terminate.decode,
        ddp.decode_segment, lambda b: ib_decode(b), ipcm.IpCmHeader.decode_private_data,
        ipcm.decode_consumer_ari, iwarp_ib.Hello.decode, iwarp_ib.HelloReply.decode,
        iwarp_ib.SdpHeader.decode, mad.decode_header, mpa.MpaV2Params.decode,
        mpa.decode_mpa_frame, lambda b: roce_frame.parse_frame(b, 1),
        lambda b: roce_frame.parse_frame(b, 101), lambda b: roce_frame.parse_frame(b, 113),
        rocev1.parse_grh, rocev1.parse_ethernet, lambda b: tcpstream.parse_tcp(1, b),
        lambda b: tcpstream.parse_tcp(113, b), xrc.unpack_xrceth, encap.decode_encap,
        encap.ArpPacket.decode, hwaddr.HwAddr.decode, hwaddr.CmData.decode, ip.parse, nd.decode,
        lambda b: list(mpa.FpduDeframer(crc=True, markers=False).feed(b)),
        lambda b: list(mpa.FpduDeframer(crc=False, markers=True).feed(b)),
    ]


def ib_decode(b: bytes) -> object:
    from softrdma.wire import ib as wib
    return wib.decode(memoryview(b))


def wire(data: bytes) -> None:
    if not data:
        return
    decoders = _decoders()
    try:
        decoders[data[0] % len(decoders)](data[1:])
    except (DecodeError, SoftRdmaError):
        pass


TARGETS: dict[str, Callable[[bytes], None]] = {
    "ib": ib, "roce": roce, "ibcm": ibcm, "devd": devd, "ipoib": ipoib, "iwarp": iwarp, "mpa": mpa_setup, "pcap": pcap,
    "wire": wire,
}

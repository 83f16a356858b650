"""Capture-driven regression test of the CM Starting PSN convention (issue 9).

The rxe side of ``../shared/captures/roce_rping.pcap`` (``rping -C 5`` between two Linux
guests; g1 = 10.50.0.11 server, g2 = 10.50.0.12 client) is played against softrdma on the
in-memory fabric, with the virtual clock, in both roles:

- softrdma as the client (10.50.0.12): the capture's REP (rxe's comm ID, QPN 0x19 and
  Starting PSN 0xdfb32c) answers softrdma's REQ; softrdma's first SEND must carry the
  REP's Starting PSN, and rxe's READ and SEND, at the REQ's Starting PSN and after, must
  be answered (READ response, ACK) at those PSNs;
- softrdma as the server (10.50.0.11): the capture's REQ (rxe's comm ID, QPN 0x19,
  Starting PSN 0xffef7c) reaches softrdma's listener; rxe's SEND at the REP's Starting
  PSN must be accepted and ACKed at that PSN (not answered with a duplicate ACK), and
  softrdma's first request (rping's READ) must carry the REQ's Starting PSN.

That is Linux's convention (``drivers/infiniband/core/cm.c``): each side announces in its
REQ or REP the PSN it *receives* at; the peer sends from it (``../shared/specs/ib-cm.md``
REQ offset 44, REP offset 20). softrdma's own random choices (its comm ID and Starting
PSN) are scripted to the capture's values, so every rxe packet replays with only its
destination QPN (softrdma's QP) and, for rxe's READ, the remote key and address changed;
ICRCs are recomputed (IBA 9.8, ../shared/specs/roce.md §2). Each softrdma packet is compared with the
capture's: opcode, destination QPN, PSN, payload length, AETH syndrome and MSN, and the
CM message type and its comm IDs and Starting PSN. What the fabric delivered, captured,
passes ``softrdma pcap-check`` with its conversation checks.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness.cm import Node

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.links.fabric import Fabric, FabricLink
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.ibcm.agent import AcceptParams, ConnParams, IbCmId
from softrdma.ibcm.events import CmEvent, CmEventType
from softrdma.tools.capture import pcap_check
from softrdma.wire import cm as wcm
from softrdma.wire import ib, roce
from softrdma.wire.opcodes import ICRC_SIZE, Hdr
from softrdma.wire.pcap import read_pcap

CAPTURE = Path("/work/shared/captures/roce_rping.pcap")
SERVER_IP, CLIENT_IP = "10.50.0.11", "10.50.0.12"
GSI_QPN = 1
RTS = int(e.IBV_QPS_RTS)
ACCESS = int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE)
STEP = 0.01  # virtual seconds between replay steps: far below every timeout


@dataclass
class Frame:
    index: int
    src: str
    packet: ib.IBPacket
    cm: wcm.CmMessage | None


def _ip(b: bytes) -> str:
    return ".".join(str(x) for x in b)


def _frames() -> list[Frame]:
    out = []
    for rec in read_pcap(CAPTURE):
        f = roce.parse_frame(rec.data, rec.linktype)
        if f is None:
            continue
        p = f.packet
        msg = wcm.decode(p.payload).msg if p.dqpn == GSI_QPN else None
        out.append(Frame(rec.index, _ip(f.src_ip), p, msg))
    return out


class ScriptedRng(random.Random):
    """The CM agent's RNG with its 24-bit (Starting PSN) and 32-bit (comm ID) draws
    scripted to the capture's values; anything else is random as usual."""

    def __init__(self, psns: list[int], comm_ids: list[int]) -> None:
        super().__init__(7)
        self.script = {24: list(psns), 32: list(comm_ids)}

    def getrandbits(self, k: int) -> int:
        q = self.script.get(k)
        return q.pop(0) if q else super().getrandbits(k)


class Replay:
    """softrdma (one Node) and rxe (a raw fabric link playing the capture's frames)."""

    def __init__(self, softrdma_ip: str, capture: Path | None = None) -> None:
        self.frames = {f.index: f for f in _frames()}
        self.clock = VirtualClock()
        self.fab = Fabric(self.clock, seed=3)
        self.capture = capture
        if capture is not None:
            self.fab.capture(capture)
        self.node = Node(self.fab, softrdma_ip, 5)
        self.rxe_ip = CLIENT_IP if softrdma_ip == SERVER_IP else SERVER_IP
        self.rxe: FabricLink = self.fab.link(self.rxe_ip)
        self.events: list[CmEvent] = []
        self.qp, self.cq = self.node.qp()
        self.mr = v.MR(self.node.pd, 4096, ACCESS)

    def script_cm(self, psn: int, comm_id: int) -> None:
        self.node.agent.rng = ScriptedRng([psn], [comm_id])

    def run(self) -> None:
        self.clock.run_until(self.clock.now() + STEP)

    def inject(self, index: int, **changes: int) -> None:
        """Send capture frame ``index`` from rxe's side, with BTH/RETH fields changed."""
        fr = self.frames[index]
        assert fr.src == self.rxe_ip, f"frame {index} is not rxe's"
        p = ib.decode(memoryview(ib.encode(fr.packet)))
        if p.dqpn != GSI_QPN:
            p.dqpn = self.qp.qp_num
        for k, val in changes.items():
            setattr(p, k, val)
        body = ib.encode(p)
        dst = bytes(int(x) for x in self.node.ip.split("."))
        src = bytes(int(x) for x in self.rxe_ip.split("."))
        sport = 0xC000 | index
        icrc = roce.udp_send_icrc(src, dst, sport, roce.ROCE_V2_UDP_PORT, [body])
        self.rxe.send(dst, roce.ROCE_V2_UDP_PORT, sport, [body, icrc])
        self.run()

    def expect(self, index: int) -> ib.IBPacket:
        """softrdma's next packet to rxe must be capture frame ``index`` (see module doc)."""
        self.run()
        got = self.rxe.recv_batch(1)
        assert got, f"softrdma sent nothing where the capture has frame {index}"
        p = ib.decode(memoryview(bytes(got[0].data[:-ICRC_SIZE])))
        want = self.frames[index]
        assert want.src == self.node.ip, f"frame {index} is not softrdma's"
        w = want.packet
        what = f"frame {index} ({w.info.name})"
        assert (p.info.name, p.dqpn) == (w.info.name, w.dqpn), what
        if w.dqpn != GSI_QPN:  # QP1's PSNs count all of a host's MADs: not this test's
            assert p.psn == w.psn, f"{what}: PSN {p.psn:#08x}, the capture has {w.psn:#08x}"
        assert len(p.payload) == len(w.payload), what
        if w.info.hdrs & Hdr.AETH:
            assert (p.syndrome, p.msn) == (w.syndrome, w.msn), f"{what}: AETH"
        if want.cm is not None:
            m = wcm.decode(p.payload).msg
            assert type(m) is type(want.cm), what
            for name in ("local_comm_id", "remote_comm_id", "starting_psn"):
                if hasattr(m, name):
                    assert getattr(m, name) == getattr(want.cm, name), f"{what}: {name}"
        return p

    def completion(self, wr_id: int) -> Any:
        n, wcs = self.cq.poll(4)
        assert n == 1, f"no completion for wr {wr_id}"
        (wc,) = wcs
        assert (wc.wr_id, wc.status) == (wr_id, e.IBV_WC_SUCCESS)
        return wc

    def post_send(self, wr_id: int, index: int) -> None:
        """Post the SEND of capture frame ``index`` (same payload)."""
        data = bytes(self.frames[index].packet.payload)
        self.mr.write(data, len(data), 1024)
        self.qp.post_send(v.SendWR(wr_id, None, 1, [v.SGE(self.mr.addr + 1024, len(data),
                                                          self.mr.lkey)]))

    def pcap_check(self) -> None:
        """The replayed conversation, as the fabric delivered it, passes pcap-check."""
        assert self.capture is not None
        self.fab.stop_capture()
        out = io.StringIO()
        assert pcap_check.run([str(self.capture)], out, err=out) == 0, out.getvalue()
        assert out.getvalue().splitlines()[-1].endswith(": 1 connection followed, 0 inconsistent")

    def post_recv(self, wr_id: int) -> None:
        self.qp.post_recv(v.RecvWR(wr_id, 1, [v.SGE(self.mr.addr + 2048, 1024, self.mr.lkey)]))


def _cm(r: Replay, index: int) -> Any:
    return r.frames[index].cm


def test_capture_is_the_expected_rping() -> None:
    """The frames this test replays are what it assumes (Linux's convention on the wire)."""
    f = {x.index: x for x in _frames()}
    req, rep = f[1].cm, f[2].cm
    assert isinstance(req, wcm.Req) and isinstance(rep, wcm.Rep)
    assert (req.local_qpn, rep.local_qpn, req.starting_psn, rep.starting_psn) == (
        0x19, 0x19, 0xFFEF7C, 0xDFB32C)
    assert (f[4].src, f[4].packet.info.name, f[4].packet.psn) == (
        CLIENT_IP, "RC_SEND_ONLY", rep.starting_psn)
    assert (f[6].src, f[6].packet.info.name, f[6].packet.psn) == (
        SERVER_IP, "RC_RDMA_READ_REQUEST", req.starting_psn)


@pytest.mark.iba("12.6.5", "12.6.8")
def test_softrdma_client_against_rxe_server(tmp_path: Path) -> None:
    r = Replay(CLIENT_IP, tmp_path / "client.pcap")
    req, rep = _cm(r, 1), _cm(r, 2)
    r.script_cm(req.starting_psn, req.local_comm_id)
    cid: IbCmId = r.node.agent.create_id(r.events.append)
    cid.connect(r.qp, ConnParams(req.service_id, req.primary_remote_gid,
                                 private_data=req.private_data, path_mtu=req.path_mtu))
    r.expect(1)                                   # REQ
    r.inject(2)                                   # rxe's REP
    r.expect(3)                                   # RTU
    assert [ev.type for ev in r.events] == [CmEventType.ESTABLISHED]
    assert r.qp.qp_state == RTS and r.qp.engine.dest_qpn == rep.local_qpn
    r.post_recv(100)
    r.post_send(1, 4)
    sent = r.expect(4)                            # the first SEND: at the REP's Starting PSN
    assert sent.psn == rep.starting_psn
    r.inject(5)                                   # rxe's ACK
    r.completion(1)
    src = r.frames[7].packet.payload               # what rxe reads: the capture's bytes
    r.mr.write(bytes(src), len(src), 0)
    r.inject(6, va=r.mr.addr, rkey=r.mr.rkey)     # rxe's READ at the REQ's Starting PSN
    resp = r.expect(7)
    assert resp.psn == req.starting_psn and bytes(resp.payload) == bytes(src)
    r.inject(8)                                   # rxe's SEND
    ack = r.expect(9)                             # an ACK of it, not a duplicate ACK
    assert ack.syndrome & ib.AETH_TYPE_MASK == ib.AETH_ACK and ack.psn == req.starting_psn + 1
    assert r.completion(100).byte_len == len(r.frames[8].packet.payload)
    r.post_send(2, 10)
    assert r.expect(10).psn == rep.starting_psn + 1
    r.inject(11)
    r.completion(2)
    r.pcap_check()


@pytest.mark.iba("12.6.5", "12.6.8")
def test_softrdma_server_against_rxe_client(tmp_path: Path) -> None:
    r = Replay(SERVER_IP, tmp_path / "server.pcap")
    req, rep = _cm(r, 1), _cm(r, 2)
    r.script_cm(rep.starting_psn, rep.local_comm_id)
    def on(ev: CmEvent) -> None:
        r.events.append(ev)
        if ev.type == CmEventType.CONNECT_REQUEST:
            ev.cm_id.accept(r.qp, AcceptParams(private_data=rep.private_data))

    lst: IbCmId = r.node.agent.create_id(on)
    lst.listen(req.service_id)
    r.inject(1)                                   # rxe's REQ
    r.expect(2)                                   # REP: softrdma's comm ID and PSN
    r.inject(3)                                   # rxe's RTU
    types = [ev.type for ev in r.events]
    assert types[0] == CmEventType.CONNECT_REQUEST and CmEventType.ESTABLISHED in types, types
    assert r.qp.qp_state == RTS and r.qp.engine.dest_qpn == req.local_qpn
    r.post_recv(100)
    r.inject(4)                                   # rxe's SEND at the REP's Starting PSN
    ack = r.expect(5)                             # ACKed at that PSN: accepted
    assert ack.syndrome & ib.AETH_TYPE_MASK == ib.AETH_ACK and ack.psn == rep.starting_psn
    assert r.completion(100).byte_len == len(r.frames[4].packet.payload)
    rd = r.frames[6].packet
    wr = v.SendWR(1, None, 1, [v.SGE(r.mr.addr, rd.dma_len, r.mr.lkey)],
                  opcode=int(e.IBV_WR_RDMA_READ))
    wr.set_wr_rdma(rd.rkey, rd.va)
    r.qp.post_send(wr)
    first = r.expect(6)                           # softrdma's first request: the REQ's PSN
    assert first.psn == req.starting_psn and (first.va, first.rkey) == (rd.va, rd.rkey)
    r.inject(7)                                   # rxe's READ response
    r.completion(1)
    data = bytes(r.frames[7].packet.payload)
    assert r.mr.read(len(data), 0) == data
    r.post_send(2, 8)
    assert r.expect(8).psn == req.starting_psn + 1
    r.inject(9)
    r.completion(2)
    r.post_recv(101)
    r.inject(10)                                  # rxe's second SEND
    assert r.expect(11).psn == rep.starting_psn + 1
    r.completion(101)
    r.pcap_check()


@pytest.mark.parametrize("role", [SERVER_IP, CLIENT_IP])
def test_replay_leaves_nothing_unread(role: str) -> None:
    """A control for expect(): a softrdma node that is told nothing sends nothing."""
    r = Replay(role)
    r.run()
    assert r.rxe.recv_batch() == []

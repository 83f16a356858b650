"""Every peer-caused error is answered with the right Terminate, then teardown.

A raw test peer speaks bytes built with softrdma.wire.mpa / softrdma.wire.ddp to the
engine under test (the responder, or the initiator for reply errors), and the bytes the
engine sends back are decoded with the same codecs: exactly one Terminate (untagged,
QN 2, MSN 1, MO 0, L), its Layer / EType / Error Code (RFC 5040 §4.8 Figure 9,
RFC 5041 §7.2, RFC 5044 §8, RFC 6581), Hdrct M/D/R per RFC 5040 Figure 10 with the
offending DDP header (and Read Request header) copied byte for byte, and the DDP Segment
Length as siw computes it. Locally: the QP is in ERR, the work request hit has its error
status, every other one is flushed, and the engine asks to close.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest
from harness.iwarp import ACC_ALL, Side

from softrdma import enums as e
from softrdma.iwarp.engine import ConnState, IwarpConn
from softrdma.iwarp.mpa_setup import MpaConfig
from softrdma.iwarp.terminate import IwarpFault
from softrdma.seam.types import MemoryRegion
from softrdma.wire import ddp, mpa
from softrdma.wire.ddp import (
    UNTAGGED,
    DdpTagged,
    DdpUntagged,
    DdpUntaggedErrorCode,
    RdmapOpcode,
    ReadRequest,
    Segment,
)

ERR = int(e.IBV_QPS_ERR)
FLUSH = int(e.IBV_WC_WR_FLUSH_ERR)
RDMAP, DDP, LLP = 0, 1, 2


class RawPeer:
    """The initiator side, as bytes: MPA Request, then hand-made FPDUs."""

    def __init__(self, sut: Side, *, crc: bool = False, markers: bool = False,
                 sut_cfg: MpaConfig | None = None, ird: int = 4, ord_: int = 4) -> None:
        self.sut = sut
        sut.conn = IwarpConn(sut.dev, initiator=False, cfg=sut_cfg)
        req = mpa.MpaRequest.build(v2=mpa.MpaV2Params(ird, ord_), crc=crc)
        sut.conn.receive(req.encode())
        assert sut.conn.state == ConnState.ACCEPT_WAIT
        sut.conn.accept(sut.qp)
        rep = self.take()
        frame = mpa.decode_mpa_frame(rep[:20 + int.from_bytes(rep[18:20], "big")])
        assert isinstance(frame, mpa.MpaReply)
        self.crc = crc or frame.crc
        self.enc = mpa.FpduEncoder(crc=self.crc, markers=frame.markers)
        self.dfr = mpa.FpduDeframer(crc=self.crc, markers=markers)

    def take(self) -> bytes:
        out = b"".join(bytes(x) for x in self.sut.conn.pull_tx())
        self.sut.conn.tx_sent(len(out))
        return out

    def fpdu(self, ulpdu: bytes) -> bytes:
        return b"".join(bytes(x) for x in self.enc.encode([ulpdu]))

    def send(self, *ulpdus: bytes) -> None:
        self.sut.conn.receive(b"".join(self.fpdu(u) for u in ulpdus))

    def segments(self) -> list[Segment]:
        return [ddp.decode_segment(f.ulpdu) for f in self.dfr.feed(self.take())]


def one_terminate(segs: list[Segment]) -> tuple[DdpUntagged, ddp.Terminate]:
    terms = [s for s in segs if s.terminate is not None]
    assert len(terms) == 1 and segs[-1] is terms[0]
    h = terms[0].ddp
    assert isinstance(h, DdpUntagged)
    assert (h.opcode, h.qn, h.msn, h.mo, h.last) == (RdmapOpcode.TERMINATE, 2, 1, 0, True)
    assert ddp.check_segment(terms[0]) is None
    t = terms[0].terminate
    assert t is not None
    return h, t


def send_seg(msn: int, payload: bytes, *, op: int = RdmapOpcode.SEND, qn: int = 0, mo: int = 0,
             last: bool = True, inv: int = 0, dv: int = 1, rv: int = 1) -> bytes:
    return ddp.encode_segment_bytes(Segment(
        DdpUntagged(op, qn, msn, mo, last, inv, dv=dv, rv=rv), payload))


def write_seg(stag: int, to: int, payload: bytes, *, op: int = 0, last: bool = True,
              dv: int = 1) -> bytes:
    return ddp.encode_segment_bytes(Segment(DdpTagged(op, stag, to, last, dv=dv), payload))


def rreq_seg(msn: int, rr: ReadRequest, qn: int = 1) -> bytes:
    return ddp.encode_segment_bytes(Segment(
        DdpUntagged(RdmapOpcode.RDMA_READ_REQUEST, qn, msn), b"", rr))


@dataclass
class Case:
    name: str
    layer: int
    etype: int
    code: int
    hdr: str  # "" none, "D" DDP header, "DR" DDP + Read Request header
    seg_len: int | None = None


def _sut() -> tuple[Side, dict[str, MemoryRegion]]:
    s = Side("sut")
    other_pd = object()
    mrs = {
        "rw": s.mr(4096),
        "ro": s.mr(4096, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)),
        "wo": s.mr(4096, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)),
        "other": s.mr(4096, ACC_ALL, pd=other_pd),
        "rbuf": s.mr(4096),
    }
    return s, mrs


def _ulpdu_for(name: str, m: dict[str, MemoryRegion]) -> bytes:
    rw, ro, wo, other = m["rw"], m["ro"], m["wo"], m["other"]
    p = b"q" * 40
    if name == "write-invalid-stag":
        return write_seg(0x00ABCD01, 0x10000, p)
    if name == "write-bounds":
        return write_seg(rw.rkey, 0x10000 + 4090, p)
    if name == "write-other-pd":
        return write_seg(other.rkey, 0x10000, p)
    if name == "write-no-access":
        return write_seg(ro.rkey, 0x10000, p)
    if name == "write-to-wrap":
        return write_seg(rw.rkey, (1 << 64) - 8, p)
    if name == "read-invalid-stag":
        return rreq_seg(1, ReadRequest(7, 0, 100, 0x00ABCD01, 0x10000))
    if name == "read-bounds":
        return rreq_seg(1, ReadRequest(7, 0, 100, ro.rkey, 0x10000 + 4000))
    if name == "read-no-access":
        return rreq_seg(1, ReadRequest(7, 0, 100, wo.rkey, 0x10000))
    if name == "read-other-pd":
        return rreq_seg(1, ReadRequest(7, 0, 100, other.rkey, 0x10000))
    if name == "read-to-wrap":
        return rreq_seg(1, ReadRequest(7, 0, 100, ro.rkey, (1 << 64) - 50))
    if name == "read-bad-msn":
        return rreq_seg(3, ReadRequest(7, 0, 0, 0, 0))
    if name == "read-bad-qn":
        return rreq_seg(1, ReadRequest(7, 0, 0, 0, 0), qn=0)
    if name == "send-bad-msn":
        return send_seg(5, p)
    if name == "send-bad-qn":
        return send_seg(1, p, qn=1)
    if name == "send-bad-mo":
        return send_seg(1, p, mo=8)
    if name == "send-too-long":
        return send_seg(1, b"x" * 200)
    if name == "ddp-version-untagged":
        return send_seg(1, p, dv=2)
    if name == "ddp-version-tagged":
        return write_seg(rw.rkey, 0x10000, p, dv=0)
    if name == "rdmap-version":
        return send_seg(1, p, rv=2)
    if name == "opcode-untagged":
        return send_seg(1, p, op=0x9)
    if name == "opcode-tagged":
        return write_seg(rw.rkey, 0x10000, p, op=RdmapOpcode.SEND)
    if name == "inv-other-pd":
        return send_seg(1, p, op=RdmapOpcode.SEND_INVALIDATE, inv=other.rkey)
    if name == "inv-unknown":
        return send_seg(1, p, op=RdmapOpcode.SEND_SE_INVALIDATE, inv=0x00ABCD01)
    if name == "rresp-unsolicited":
        return write_seg(rw.rkey, 0x10000, p, op=RdmapOpcode.RDMA_READ_RESPONSE)
    raise AssertionError(name)


T, U = ddp.DdpEtype.TAGGED_BUFFER, ddp.DdpEtype.UNTAGGED_BUFFER
PROT, OPER = ddp.RdmapEtype.REMOTE_PROTECTION, ddp.RdmapEtype.REMOTE_OPERATION
CASES = [
    Case("write-invalid-stag", DDP, T, 0x00, "D", 40),
    Case("write-bounds", DDP, T, 0x01, "D", 40),
    Case("write-other-pd", DDP, T, 0x02, "D", 40),
    Case("write-no-access", DDP, T, 0x00, "D", 40),  # siw: DDP has no access-rights code
    Case("write-to-wrap", DDP, T, 0x03, "D", 40),
    Case("read-invalid-stag", RDMAP, PROT, 0x00, "DR", 0),
    Case("read-bounds", RDMAP, PROT, 0x01, "DR", 0),
    Case("read-no-access", RDMAP, PROT, 0x02, "DR", 0),
    Case("read-other-pd", RDMAP, PROT, 0x03, "DR", 0),
    Case("read-to-wrap", RDMAP, PROT, 0x04, "DR", 0),
    Case("read-bad-msn", DDP, U, 0x03, "D", 0),
    Case("read-bad-qn", DDP, U, 0x01, "D", 0),
    Case("send-bad-msn", DDP, U, 0x03, "D", 40),
    Case("send-bad-qn", DDP, U, 0x01, "D", 40),
    Case("send-bad-mo", DDP, U, 0x04, "D", 40),
    Case("send-too-long", DDP, U, 0x05, "D", 200),
    Case("ddp-version-untagged", DDP, U, 0x06, ""),
    Case("ddp-version-tagged", DDP, T, 0x04, ""),
    Case("rdmap-version", RDMAP, OPER, 0x05, "D", 40),
    Case("opcode-untagged", RDMAP, OPER, 0x06, "D", 40),
    Case("opcode-tagged", RDMAP, OPER, 0x06, "D", 40),
    Case("inv-other-pd", RDMAP, PROT, 0x09, "D", 40),
    Case("inv-unknown", RDMAP, PROT, 0x09, "D", 40),
    Case("rresp-unsolicited", DDP, 0, 0, ""),
]


@pytest.mark.parametrize("crc", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_ddp_rdmap_errors(case: Case, crc: bool) -> None:
    sut, mrs = _sut()
    rbuf = mrs["rbuf"]
    sut.post_recv(rbuf, 100, wr_id=1)
    sut.post_recv(rbuf, 100, wr_id=2)
    peer = RawPeer(sut, crc=crc)
    bad = _ulpdu_for(case.name, mrs)
    peer.send(bad)
    h, t = one_terminate(peer.segments())
    assert (t.layer, t.etype, t.code) == (case.layer, case.etype, case.code), t.describe()
    hl = 14 if bad[0] & 0x80 else 18
    assert (t.m, t.d, t.r) == ("D" in case.hdr, "D" in case.hdr, "R" in case.hdr)
    if "D" in case.hdr:
        assert t.ddp_hdr == bad[:hl]
        assert t.ddp_seg_len == case.seg_len
    if "R" in case.hdr:
        assert t.rdmap_hdr == bad[18:46]
    # teardown: the QP is in ERR, the receives completed (the one in use with its error)
    conn = sut.conn
    assert conn is not None and conn.state == ConnState.FAILED and conn.want_close
    assert sut.qp.state == ERR and conn.internal_errors == 0
    statuses = [(w.wr_id, w.status) for w in sut.rcq]
    want_first = {"send-too-long": int(e.IBV_WC_LOC_LEN_ERR),
                  "inv-other-pd": int(e.IBV_WC_REM_INV_REQ_ERR),
                  "inv-unknown": int(e.IBV_WC_REM_INV_REQ_ERR)}.get(case.name, FLUSH)
    assert statuses == [(1, want_first), (2, FLUSH)]
    # nothing more is accepted or sent
    peer.send(send_seg(1, b"late"))
    assert peer.take() == b""


def test_no_receive_buffer() -> None:
    sut, _m = _sut()
    peer = RawPeer(sut)
    bad = send_seg(1, b"hello")
    peer.send(bad)
    _h, t = one_terminate(peer.segments())
    assert (t.layer, t.etype, t.code) == (DDP, 2, 0x02)
    assert t.ddp_hdr == bad[:18] and t.ddp_seg_len == 5


@pytest.mark.parametrize("qn", [0, 1])
def test_a_read_request_shorter_than_its_header_is_terminated(qn: int) -> None:
    """A Read Request ULPDU of 28 octets, its DDP header and only 10 of the Read Request
    header's 28 (found by fuzzing): a Terminate with DDP Segment Length 0 (siw counts the
    octets past the headers; none here), on the wrong QN the DDP Invalid QN, on the right
    one RDMAP's Remote Operation error. It once raised from the Terminate's own encoding
    (a length of -18), out of the receive path."""
    sut, _m = _sut()
    peer = RawPeer(sut)
    hdr = UNTAGGED.pack(0x01 | 0x40, 0x40 | RdmapOpcode.RDMA_READ_REQUEST, 0, qn, 1, 0)
    peer.send(hdr + bytes(10))
    _h, t = one_terminate(peer.segments())
    want = (DDP, 2, 0x01) if qn == 0 else (RDMAP, 2, 0xFF)
    assert (t.layer, t.etype, t.code) == want
    assert t.ddp_hdr == hdr and t.ddp_seg_len == 0
    assert sut.conn is not None and sut.conn.internal_errors == 0
    assert sut.qp.state == ERR


def test_a_fault_whose_terminate_cannot_be_built_still_ends_the_stream() -> None:
    """The last resort of ``IwarpConn.fail``: a fault carrying a header that cannot be
    encoded (a bug of ours, as the negative length above was) is answered with a Local
    Catastrophic Terminate and counted as an internal error; nothing is raised."""
    sut, _m = _sut()
    peer = RawPeer(sut)
    assert sut.conn is not None
    sut.conn.fail(IwarpFault.ddp_untagged(DdpUntaggedErrorCode.INVALID_QN, "test",
                                          bytes(18), -1))
    _h, t = one_terminate(peer.segments())
    assert (t.layer, t.etype, t.ddp_hdr) == (RDMAP, 0, None)
    assert sut.conn.internal_errors == 1 and sut.qp.state == ERR


def test_too_many_reads_ird() -> None:
    sut, m = _sut()
    peer = RawPeer(sut, sut_cfg=MpaConfig(ird=1, ord=1), ird=1, ord_=1)
    ro = m["ro"]
    r1 = rreq_seg(1, ReadRequest(7, 0, 10, ro.rkey, 0x10000))
    r2 = rreq_seg(2, ReadRequest(7, 0, 10, ro.rkey, 0x10000))
    peer.send(r1, r2)
    segs = peer.segments()
    _h, t = one_terminate(segs)
    assert (t.layer, t.etype, t.code) == (RDMAP, 2, ddp.RdmapErrorCode.CATASTROPHIC_LOCALIZED)
    assert t.ddp_hdr == r2[:18] and not t.r


def test_bad_crc() -> None:
    sut, m = _sut()
    sut.post_recv(m["rbuf"], 100, wr_id=1)
    peer = RawPeer(sut, crc=True)
    f = bytearray(peer.fpdu(send_seg(1, b"abcdef")))
    f[-1] ^= 0x40
    sut.conn.receive(bytes(f))
    _h, t = one_terminate(peer.segments())
    assert (t.layer, t.etype, t.code) == (LLP, 0, 0x02) and not (t.m or t.d or t.r)
    assert [(w.wr_id, w.status) for w in sut.rcq] == [(1, int(e.IBV_WC_GENERAL_ERR))]


def test_bad_crc_beats_a_header_error() -> None:
    """A header error in an FPDU whose CRC is wrong is reported as the CRC error."""
    sut, _m = _sut()
    peer = RawPeer(sut, crc=True)
    f = bytearray(peer.fpdu(write_seg(0x00ABCD01, 0, b"zz")))
    f[-2] ^= 1
    sut.conn.receive(bytes(f))
    _h, t = one_terminate(peer.segments())
    assert (t.layer, t.code) == (LLP, 0x02)


def test_marker_mismatch() -> None:
    sut, m = _sut()
    sut.post_recv(m["rbuf"], 4096, wr_id=1)
    peer = RawPeer(sut, sut_cfg=MpaConfig(markers=True))
    assert peer.enc.markers
    f = bytearray(peer.fpdu(send_seg(1, b"m" * 1000)))
    assert f[0:4] == b"\0\0\0\0"  # the first marker, FPDUPTR 0
    f[512 + 3] ^= 4  # FPDUPTR of the second marker
    sut.conn.receive(bytes(f))
    _h, t = one_terminate(peer.segments())
    assert (t.layer, t.etype, t.code) == (LLP, 0, 0x03)


def test_ulpdu_length_too_short() -> None:
    sut, _m = _sut()
    peer = RawPeer(sut)
    sut.conn.receive(struct.pack("!H", 6) + bytes(10))
    _h, t = one_terminate(peer.segments())
    assert (t.layer, t.code) == (LLP, 0x03)


@pytest.mark.parametrize("bad", ["key", "pdlen", "revision", "enhanced-no-block"])
def test_malformed_mpa_request(bad: str) -> None:
    sut, _m = _sut()
    sut.conn = IwarpConn(sut.dev, initiator=False)
    frame = bytearray(mpa.MpaRequest.build(v2=mpa.MpaV2Params(1, 1)).encode())
    if bad == "key":
        frame[4] = ord("X")
    elif bad == "pdlen":
        frame[18:20] = struct.pack("!H", 513)
    elif bad == "revision":
        frame[17] = 7
    else:
        frame = frame[:18] + b"\0\0"
    sut.conn.receive(bytes(frame))
    out = b"".join(bytes(x) for x in sut.conn.pull_tx())
    segs = [ddp.decode_segment(f.ulpdu) for f in mpa.FpduDeframer(crc=False, markers=False).feed(out)]
    _h, t = one_terminate(segs)
    assert (t.layer, t.etype, t.code) == (LLP, 0, 0x04)
    assert sut.conn.state == ConnState.FAILED and sut.conn.want_close


@pytest.mark.parametrize("bad", ["key", "no-enhanced", "no-rtr"])
def test_bad_mpa_reply(bad: str) -> None:
    sut, _m = _sut()
    cfg = MpaConfig(p2p=bad == "no-rtr", rtr_read=False)
    sut.conn = IwarpConn(sut.dev, initiator=True, cfg=cfg, qp=sut.qp)
    req = b"".join(bytes(x) for x in sut.conn.pull_tx())
    assert isinstance(mpa.decode_mpa_frame(req), mpa.MpaRequest)
    if bad == "key":
        rep = bytearray(mpa.MpaReply.build(v2=mpa.MpaV2Params(1, 1)).encode())
        rep[12] = ord("q")
    elif bad == "no-enhanced":
        rep = bytearray(mpa.MpaReply.build(revision=1).encode())
    else:
        rep = bytearray(mpa.MpaReply.build(v2=mpa.MpaV2Params(1, 1, True, rtr_read=True)).encode())
    sut.conn.receive(bytes(rep))
    out = b"".join(bytes(x) for x in sut.conn.pull_tx())
    segs = [ddp.decode_segment(f.ulpdu) for f in mpa.FpduDeframer(crc=False, markers=False).feed(out)]
    _h, t = one_terminate(segs)
    want = 0x07 if bad == "no-rtr" else 0x04
    assert (t.layer, t.etype, t.code) == (LLP, 0, want)
    assert sut.qp.state == ERR


def test_rtr_mismatch() -> None:
    sut, m = _sut()
    sut.post_recv(m["rbuf"], 100, wr_id=1)
    sut.conn = IwarpConn(sut.dev, initiator=False)
    req = mpa.MpaRequest.build(v2=mpa.MpaV2Params(1, 1, True, rtr_write=True))
    sut.conn.receive(req.encode())
    sut.conn.accept(sut.qp)
    b"".join(bytes(x) for x in sut.conn.pull_tx())
    enc = mpa.FpduEncoder(crc=False, markers=False)
    sut.conn.receive(b"".join(bytes(x) for x in enc.encode([send_seg(1, b"not an RTR")])))
    out = b"".join(bytes(x) for x in sut.conn.pull_tx())
    segs = [ddp.decode_segment(f.ulpdu) for f in mpa.FpduDeframer(crc=False, markers=False).feed(out)]
    _h, t = one_terminate(segs)
    assert (t.layer, t.code) == (LLP, 0x07)


def test_peer_terminate_fails_the_qp() -> None:
    """A Terminate from the peer: the oldest outstanding request gets the mapped error,
    the others are flushed, and no Terminate goes back (RFC 5040 §5.4)."""
    sut, m = _sut()
    sut.post_recv(m["rbuf"], 100, wr_id=1)
    peer = RawPeer(sut)
    rw = m["rw"]
    sut.post(e.IBV_WR_RDMA_READ, rw, 10, wr_id=5, rkey=0x1234, raddr=0)
    sut.post(e.IBV_WR_RDMA_WRITE, rw, 10, wr_id=6, rkey=0x1234, raddr=0)
    sent = peer.segments()
    assert [s.ddp.opcode for s in sent] == [1, 0]
    term = ddp.Terminate(RDMAP, PROT, 0, True, True, False, 0, 0, ddp.encode_ddp(sent[0].ddp))
    peer.send(ddp.encode_segment_bytes(Segment(DdpUntagged(RdmapOpcode.TERMINATE, 2, 1), b"",
                                               None, term)))
    assert peer.take() == b""
    assert sut.conn is not None and sut.conn.term_received == term
    assert sut.qp.state == ERR and sut.conn.want_close
    assert [(w.wr_id, w.status) for w in sut.scq] == [
        (5, int(e.IBV_WC_REM_ACCESS_ERR)), (6, FLUSH)]
    assert [(w.wr_id, w.status) for w in sut.rcq] == [(1, FLUSH)]


@pytest.mark.parametrize("where", [3, 18, 40, 60])
def test_peer_closes_mid_message(where: int) -> None:
    sut, m = _sut()
    sut.post_recv(m["rbuf"], 4096, wr_id=1)
    sut.post_recv(m["rbuf"], 4096, wr_id=2)
    peer = RawPeer(sut)
    seg1 = send_seg(1, b"a" * 50, last=False)
    f = peer.fpdu(seg1)
    sut.conn.receive(f[:where])
    sut.post(e.IBV_WR_RDMA_READ, m["rw"], 10, wr_id=7, rkey=0x1234, raddr=0)
    sut.conn.on_eof()
    assert sut.qp.state == ERR and sut.conn.want_close
    assert sorted((w.wr_id, w.status) for w in sut.rcq) == [(1, FLUSH), (2, FLUSH)]
    assert [(w.wr_id, w.status) for w in sut.scq] == [(7, FLUSH)]
    assert all(s.terminate is None for s in peer.segments())  # EOF: no Terminate

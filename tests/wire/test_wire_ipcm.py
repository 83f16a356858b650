"""IP CM Service private data, Service IDs and ARI (softrdma.wire.ipcm, IBA Annex A11),
and the iWARP-over-IB Hello/HelloReply private data (softrdma.wire.iwarp_ib).

Oracles: the REQs of the rdma_cm captures (addresses checked against the frames' own IP
headers and UDP/TCP ports known from the tools' defaults), the examples in A11.5's text,
Tables 3-5 written out byte by byte, and the Hello/HelloReply figures of the iWARP
mapping draft assembled here by hand.
"""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softrdma.errors import DecodeError, InvalidArgument
from softrdma.wire import cm, ipcm, iwarp_ib, mad, roce
from softrdma.wire.pcap import read_pcap

CAPTURES = Path("/work/shared/captures")
V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address

# capture -> listening port of the tool (rping 7174, ucmatose 7471, perftest 18515).
PORTS = {"roce_rping": 7174, "roce_ucmatose": 7471, "roce_write_bw_rdmacm": 18515}


def capture_reqs(name: str) -> list[tuple[cm.Req, roce.RoceFrame]]:
    out = []
    for rec in read_pcap(CAPTURES / f"{name}.pcap"):
        f = roce.parse_frame(rec.data, rec.linktype)
        if f is None or f.packet.dqpn != mad.GSI_QPN:
            continue
        m = cm.decode(f.packet.payload)
        if isinstance(m.msg, cm.Req):
            out.append((m.msg, f))
    return out


# ------------------------------------------------------------------------- captures
def test_rping_req_private_data() -> None:
    [(req, frame)] = capture_reqs("roce_rping")
    hdr, consumer = ipcm.IpCmHeader.decode_private_data(req.private_data)
    assert (hdr.majv, hdr.minv, hdr.ipv, hdr.res) == (0, 0, 4, 0)
    assert hdr.src_port == 0xA1B1
    assert hdr.src_addr == V4("10.50.0.12") == V4(frame.src_ip)
    assert hdr.dst_addr == V4("10.50.0.11") == V4(frame.dst_ip)
    # Linux writes IPv4 as 12 zero bytes + the address: exactly CA11-5 (not ::ffff:).
    assert hdr.src_ip == bytes(12) + frame.src_ip
    assert hdr.dst_ip == bytes(12) + frame.dst_ip
    assert consumer == bytes(ipcm.IPCM_REQ_CONSUMER_MAX)
    assert ipcm.check_req(hdr, local_addrs={V4("10.50.0.11")}) is None
    assert ipcm.check_req(hdr, accept_v4_mapped=False) is None
    # Re-encoding the header gives the private data back.
    assert hdr.private_data(consumer) == req.private_data


@pytest.mark.parametrize("name", sorted(PORTS))
def test_capture_service_ids(name: str) -> None:
    reqs = capture_reqs(name)
    assert reqs
    for req, frame in reqs:
        sid = req.service_id
        assert ipcm.is_ip_cm_service_id(sid)
        assert ipcm.parse_ip_cm_service_id(sid) == (ipcm.IPPROTO_TCP, PORTS[name])
        assert ipcm.parse_rdma_cm_service_id(sid) == (ipcm.RdmaPortSpace.TCP, PORTS[name])
        assert sid == ipcm.rdma_cm_service_id(ipcm.RdmaPortSpace.TCP, PORTS[name])
        assert sid == ipcm.ip_cm_service_id(ipcm.IPPROTO_TCP, PORTS[name])
        hdr, _ = ipcm.IpCmHeader.decode_private_data(req.private_data)
        assert (hdr.src_addr, hdr.dst_addr) == (V4(frame.src_ip), V4(frame.dst_ip))
        assert 1024 <= hdr.src_port <= 65535  # an ephemeral port of the client
        # The GIDs are the IPv4-mapped forms of the same addresses (RoCEv2).
        assert req.primary_local_gid == V6("::ffff:" + str(hdr.src_addr)).packed


# ------------------------------------------------------------------------- Table 1
def test_header_layout_by_hand() -> None:
    h = ipcm.IpCmHeader.make("192.168.1.2", V4("10.0.0.1"), 0x1234)
    want = (bytes([0x00, 0x40, 0x12, 0x34]) + bytes(12) + bytes([192, 168, 1, 2])
            + bytes(12) + bytes([10, 0, 0, 1]))
    assert h.encode() == want
    h.majv, h.minv, h.res = 0xA, 0x5, 0xF
    assert h.encode()[:2] == b"\xa5\x4f"
    h6 = ipcm.IpCmHeader.make("fe80::1", "2001:db8::2", 1)
    assert h6.encode()[1] == 0x60
    assert h6.src_addr == V6("fe80::1") and h6.dst_addr == V6("2001:db8::2")
    assert h6.encode()[4:20] == V6("fe80::1").packed


def test_header_errors() -> None:
    with pytest.raises(InvalidArgument, match="IPv4 source with IPv6 destination"):
        ipcm.IpCmHeader.make("1.2.3.4", "::1", 1)
    with pytest.raises(DecodeError, match="needs 36 bytes, got 35"):
        ipcm.IpCmHeader.decode_private_data(bytes(35))
    with pytest.raises(InvalidArgument, match="at most 56 bytes of consumer private data"):
        ipcm.IpCmHeader().private_data(bytes(57))
    assert len(ipcm.IpCmHeader().private_data(bytes(180), limit=ipcm.IPCM_SIDR_CONSUMER_MAX)) == 216
    with pytest.raises(InvalidArgument) as ei:
        ipcm.IpCmHeader(src_port=70000).encode()
    assert ei.value.argument == "ipcm.src_port"
    bad = ipcm.IpCmHeader(ipv=5)
    with pytest.raises(DecodeError, match="IP version 5 is reserved"):
        _ = bad.src_addr


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=36, max_size=92))
def test_any_private_data_round_trips(pd: bytes) -> None:
    hdr, consumer = ipcm.IpCmHeader.decode_private_data(pd)
    assert consumer == pd[36:]
    assert hdr.encode() + consumer == pd
    assert ipcm.IpCmHeader.decode(hdr.encode()) == hdr


@settings(max_examples=100, deadline=None)
@given(st.ip_addresses(v=4) | st.ip_addresses(v=6), st.integers(0, 65535), st.data())
def test_addresses_round_trip(src: ipcm.IpAddress, port: int, data: st.DataObject) -> None:
    dst = data.draw(st.ip_addresses(v=src.version))
    h = ipcm.IpCmHeader.make(src, dst, port)
    back = ipcm.IpCmHeader.decode(h.encode())
    assert (back.src_addr, back.dst_addr, back.src_port, back.ipv) == (src, dst, port,
                                                                       src.version)
    assert ipcm.check_req(back, local_addrs={dst}) is None


# ------------------------------------------------------------------------- checks
def _v4(**kw: int) -> ipcm.IpCmHeader:
    h = ipcm.IpCmHeader.make("10.0.0.2", "10.0.0.1", 5000)
    for k, v in kw.items():
        setattr(h, k, v)
    return h


def test_check_req_codes_and_order() -> None:
    A = ipcm.IpCmAri
    # CA11-11: versions first, even when the IPV is also wrong.
    r = ipcm.check_req(_v4(majv=1, minv=3, ipv=5))
    assert r is not None and r.code == A.MAJOR_VERSION and r.suggested == b"\x00"
    r = ipcm.check_req(_v4(minv=1, ipv=5))
    assert r is not None and r.code == A.MINOR_VERSION
    # CA11-3.1.2: a lower minor version is accepted by a newer server.
    assert ipcm.check_req(_v4(minv=1), minor=2) is None
    r = ipcm.check_req(_v4(ipv=5))
    assert r is not None and r.code == A.IPV and r.suggested == b"\x04\x06"
    r = ipcm.check_req(_v4(), ip_versions=(6,))
    assert r is not None and r.code == A.IPV
    # CA11-5: bits 127-32 of IPv4 fields are zero; ::ffff: tolerated unless strict.
    h = _v4()
    h.src_ip = bytes(10) + b"\xff\xff" + h.src_ip[12:]
    assert ipcm.check_req(h) is None
    r = ipcm.check_req(h, accept_v4_mapped=False)
    assert r is not None and r.code == A.SOURCE_IP
    h = _v4()
    h.dst_ip = b"\x01" + h.dst_ip[1:]
    r = ipcm.check_req(h)
    assert r is not None and r.code == A.DESTINATION_IP
    r = ipcm.check_req(_v4(), local_addrs={V4("10.0.0.9")})
    assert r is not None and r.code == A.UNKNOWN_IP


# ------------------------------------------------------------------------- Table 2
def test_service_ids() -> None:
    # The two examples of A11.5.
    assert ipcm.ip_cm_service_id(ipcm.IPPROTO_SCTP, 2049) == 0x0000000001840801
    assert ipcm.ip_cm_service_id(ipcm.IPPROTO_TCP, 3260) == 0x0000000001060CBC
    assert ipcm.parse_ip_cm_service_id(0x0000000001840801) == (132, 2049)
    assert ipcm.ip_cm_service_id(ipcm.IPPROTO_UDP, 0) == 0x0000000001110000
    for sid in (0x0000000002060CBC, 0x0100000001060CBC, 0x0000000000020CBC, 0):
        assert ipcm.parse_ip_cm_service_id(sid) is None
        assert not ipcm.is_ip_cm_service_id(sid)
    with pytest.raises(InvalidArgument, match="port must be 0..65535"):
        ipcm.ip_cm_service_id(6, 65536)
    with pytest.raises(InvalidArgument, match="IP protocol number must be 0..255"):
        ipcm.ip_cm_service_id(256, 1)


def test_rdma_cm_port_spaces() -> None:
    # Annex A11; ../shared/specs/ib-cm.md §6.1.
    assert ipcm.rdma_cm_service_id(ipcm.RdmaPortSpace.TCP, 0x1234) == 0x0000000001061234
    assert ipcm.rdma_cm_service_id(ipcm.RdmaPortSpace.UDP, 1) == 0x0000000001110001
    assert ipcm.rdma_cm_service_id(ipcm.RdmaPortSpace.IB, 2) == 0x00000000013F0002
    assert ipcm.rdma_cm_service_id(ipcm.RdmaPortSpace.IPOIB, 3) == 0x0000000000020003
    assert ipcm.parse_rdma_cm_service_id(0x00000000013F0002) == (ipcm.RdmaPortSpace.IB, 2)
    assert ipcm.parse_rdma_cm_service_id(0x0000000001070002) is None  # no such space
    assert ipcm.parse_rdma_cm_service_id(0x0000000101060002) is None
    assert 0x0000000001061234 & ipcm.RDMA_IB_IP_PS_MASK == 0x0000000001060000
    # RDMA_PS_UDP is UDP in the A11 range; RDMA_PS_IB (0x3F) is outside any IP protocol use.
    assert ipcm.parse_ip_cm_service_id(0x0000000001110001) == (ipcm.IPPROTO_UDP, 1)
    with pytest.raises(InvalidArgument):
        ipcm.rdma_cm_service_id(0x10000, 1)


# ------------------------------------------------------------------------- Tables 3-5
def test_ari_table_values() -> None:
    assert [(a.name, a.value) for a in ipcm.IpCmAri] == [
        ("UNSPECIFIED", 0), ("MAJOR_VERSION", 1), ("MINOR_VERSION", 2), ("IPV", 3),
        ("SOURCE_IP", 4), ("DESTINATION_IP", 5), ("UNKNOWN_IP", 6)]
    assert (ipcm.RejectionLayer.IP_CM, ipcm.RejectionLayer.ULP) == (0, 1)


def test_reject_with_ip_cm_ari_on_the_wire() -> None:
    rej = ipcm.reject(0x11, 0x22, ipcm.IpCmReject(ipcm.IpCmAri.MINOR_VERSION, b"\x00"))
    wire = cm.encode(rej, tid=7)
    m = cm.decode(wire)
    assert isinstance(m.msg, cm.Rej)
    # REJ body: reason 28 at body 10, ARI at body 12 (MAD 36): Table 4 bytes 0-4.
    assert wire[32] >> 6 == cm.MsgType.REQ
    assert wire[33] >> 1 == 5 and wire[34:36] == b"\x00\x1c"
    assert wire[36:41] == bytes([0x00, 0x02, 0x01, 0x00, 0x00]) and wire[41:108] == bytes(67)
    assert m.msg.reason == cm.RejReason.CONSUMER_DEFINED and m.msg.ari_length == 5
    assert ipcm.decode_consumer_ari(m.msg.ari_data) == ipcm.IpCmReject(2, b"\x00")
    # A plain "unspecified" reject: 4 ARI bytes, no suggested value.
    plain = ipcm.reject(1, 2, ipcm.IpCmReject())
    assert plain.ari_length == 4 and plain.ari == b"\x00\x00\x00\x00"
    ulp = ipcm.reject(1, 2, ipcm.UlpReject(b"why"), private_data=b"pd")
    assert ulp.ari == b"\x01why" and ulp.ari_length == 4
    back = cm.decode(cm.encode(ulp)).msg
    assert isinstance(back, cm.Rej)
    assert ipcm.decode_consumer_ari(back.ari_data) == ipcm.UlpReject(b"why")
    assert back.private_data[:2] == b"pd"


def test_ari_errors() -> None:
    with pytest.raises(DecodeError, match="empty"):
        ipcm.decode_consumer_ari(b"")
    with pytest.raises(DecodeError, match="unknown rejection layer 0x02"):
        ipcm.decode_consumer_ari(b"\x02\x00")
    with pytest.raises(DecodeError, match="needs 4 bytes, got 2"):
        ipcm.decode_consumer_ari(b"\x00\x01")
    with pytest.raises(DecodeError, match="suggested value length 3 exceeds the 1 bytes"):
        ipcm.decode_consumer_ari(b"\x00\x01\x03\x00\x09")
    with pytest.raises(InvalidArgument, match="at most 68 bytes"):
        ipcm.IpCmReject(1, bytes(69)).encode()
    with pytest.raises(InvalidArgument, match="at most 71 bytes"):
        ipcm.UlpReject(bytes(72)).encode()
    assert len(ipcm.IpCmReject(1, bytes(68)).encode()) == cm.ARI_SIZE


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 255), st.binary(max_size=68), st.integers(0, 255))
def test_ari_round_trip(code: int, suggested: bytes, filler: int) -> None:
    r = ipcm.IpCmReject(code, suggested, filler)
    assert ipcm.decode_consumer_ari(r.encode()) == r
    # Zero-filled to 72 bytes as it travels in a REJ, it still decodes the same.
    assert ipcm.decode_consumer_ari(r.encode() + bytes(72 - len(r.encode()))) == r


# ------------------------------------------------------------------------- iWARP over IB
def test_hello_byte_exact_from_the_figure() -> None:
    """Figure 1 (Hello), row by row, assembled independently of the codec."""
    src, dst = V4("10.50.0.12"), V4("10.50.0.11")
    want = b"".join([
        bytes([0x00, 0x00]) + (4).to_bytes(2, "big"),      # MID 0 | Rsvd | bufs 4
        (0x1000).to_bytes(4, "big"),                       # len
        bytes(4), bytes(4),                                # Reserved, Reserved
        bytes([0x22, 0x41, 0x00, 0x00]),                   # MajVer 2 MinVer 2 IPVer 4 FlowC 1
        (65536).to_bytes(4, "big"),                        # DesRemRcvSz
        (8192).to_bytes(4, "big"),                         # LocalRcvSz
        (40000).to_bytes(2, "big") + bytes(2),             # Local Port | Reserved
        bytes(12) + src.packed,                            # Src IP (127-0)
        bytes(12) + dst.packed,                            # Dst IP (127-0)
    ])
    assert len(want) == iwarp_ib.HELLO_SIZE == 64
    h = iwarp_ib.Hello.make(src, dst, 40000, bufs=4, des_rem_rcv_sz=65536, local_rcv_sz=8192)
    h.length = 0x1000
    assert h.encode() == want
    back = iwarp_ib.Hello.decode(want)
    assert back == h
    assert (back.src_addr, back.dst_addr, back.flowc) == (src, dst, iwarp_ib.FlowControl.ULP)
    # It fits the REQ private data with room to spare; decode from a full REQ.
    req = cm.decode(cm.encode(cm.Req(private_data=want))).msg
    assert isinstance(req, cm.Req)
    assert iwarp_ib.Hello.decode(req.private_data) == h


def test_hello_reply_byte_exact_from_the_figure() -> None:
    want = (bytes([0x01, 0x00, 0x00, 0x10]) + (0).to_bytes(4, "big") + bytes(8)
            + bytes([0x22, 0x00, 0x00, 0x00]) + (32768).to_bytes(4, "big"))
    assert len(want) == iwarp_ib.HELLO_REPLY_SIZE == 24
    r = iwarp_ib.HelloReply(bufs=16, act_rcv_sz=32768)
    assert r.encode() == want
    assert iwarp_ib.HelloReply.decode(want) == r
    rep = cm.decode(cm.encode(cm.Rep(private_data=want))).msg
    assert isinstance(rep, cm.Rep)
    assert iwarp_ib.HelloReply.decode(rep.private_data).act_rcv_sz == 32768


def test_hello_mid_and_sizes_checked() -> None:
    reply = iwarp_ib.HelloReply().encode()
    with pytest.raises(DecodeError, match="Hello: MID 1, expected 0"):
        iwarp_ib.Hello.decode(reply + bytes(40))
    with pytest.raises(DecodeError, match="HelloReply: MID 0, expected 1"):
        iwarp_ib.HelloReply.decode(iwarp_ib.Hello().encode())
    with pytest.raises(DecodeError, match="hello: needs 64 bytes, got 63"):
        iwarp_ib.Hello.decode(bytes(63))
    with pytest.raises(InvalidArgument) as ei:
        iwarp_ib.Hello(flowc=16).encode()
    assert ei.value.argument == "hello.flowc"
    with pytest.raises(InvalidArgument, match="IPv6 source with IPv4 destination"):
        iwarp_ib.Hello.make("::1", "1.2.3.4", 1)


def test_hello_ipv6_and_sdp_header() -> None:
    h = iwarp_ib.Hello.make("fe80::1", "fe80::2", 7, flowc=iwarp_ib.FlowControl.TRANSPORT)
    wire = h.encode()
    assert wire[17] == 0x60 and wire[32:48] == V6("fe80::1").packed
    assert iwarp_ib.Hello.decode(wire).dst_addr == V6("fe80::2")
    # The 16-byte per-Send header (FlowC = 0): MID, flags, bufs, len, mseq, mseq_ack.
    s = iwarp_ib.SdpHeader(mid=0xFF, flags=0, bufs=3, length=1016, mseq=9, mseq_ack=8)
    assert s.encode() == struct.pack("!BBHIII", 0xFF, 0, 3, 1016, 9, 8)
    assert iwarp_ib.SdpHeader.decode(s.encode()) == s
    # The Hello and HelloReply begin with the same 16-byte header.
    assert iwarp_ib.SdpHeader.decode(iwarp_ib.HelloReply(bufs=5).encode()).bufs == 5


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=64, max_size=92))
def test_any_hello_round_trips(raw: bytes) -> None:
    raw = b"\x00" + raw[1:]
    assert iwarp_ib.Hello.decode(raw).encode() == raw[:64]
    r = b"\x01" + raw[1:24]
    assert iwarp_ib.HelloReply.decode(r).encode() == r
    assert iwarp_ib.SdpHeader.decode(raw).encode() == raw[:16]


def test_iwarp_service_ids() -> None:
    assert iwarp_ib.iwarp_ib_service_id(0) == 0x0000000000020000
    assert iwarp_ib.iwarp_ib_service_id(3260) == 0x0000000000020CBC
    assert iwarp_ib.parse_iwarp_ib_service_id(0x0000000000020CBC) == 3260
    assert iwarp_ib.parse_iwarp_ib_service_id(0x0000000001060CBC) is None
    assert iwarp_ib.parse_iwarp_ib_service_id(0x0000000000030CBC) is None
    with pytest.raises(InvalidArgument):
        iwarp_ib.iwarp_ib_service_id(-1)

"""IBA Annex A11 (RDMA IP CM Service): every compliance statement, on the fabric.

| id          | statement (A11.8 summary)                         | tests |
|-------------|---------------------------------------------------|-------|
| CA11-1      | REQ private data format (Table 1)                 | test_ca11_1_req_private_data_table_1, test_ca11_1_ipv6 |
| CA11-2      | MajV must match, else reject                      | test_ca11_2_major_version_mismatch_rejected |
| CA11-3      | minor version downward compatibility              | test_ca11_3_client_shifts_down_to_the_server_minor |
| CA11-3.1.1  | MinV higher than ours rejected                    | test_ca11_3_1_1_higher_minor_rejected |
| CA11-3.1.2  | MinV equal or lower accepted                      | test_ca11_3_1_2_equal_and_lower_minor_accepted |
| CA11-4      | IPV not supported rejected                        | test_ca11_4_ip_version_rejected (parametrised) |
| CA11-5      | IPv4 in bits 31-0, bits 127-32 zero               | test_ca11_5_client_zeroes_bits_127_32, test_ca11_5_server_checks_the_format, test_ca11_5_v4_mapped_form_tolerated |
| CA11-6      | Service ID format (Table 2)                       | test_ca11_6_service_ids (parametrised), test_ca11_6_sctp_service_connects |
| CA11-7      | A11-range REQ private data read as Table 1        | test_ca11_7_a11_range_parsed_by_any_listener, test_ca11_7_other_range_passed_raw |
| CA11-8      | REJ 8 when IP CM is unsupported / nobody listens  | test_ca11_8_no_listener_rej_8, test_ca11_8_ip_cm_not_supported_rej_8 |
| oA11-1      | REJ 28 + A11.7 ARI when parameters not accepted   | test_oa11_1_rej_28_with_ari |
| CA11-9      | ARI format Table 4                                | test_ca11_9_ari_is_table_4 |
| CA11-10     | IP CM layer ARI (Table 5) in byte 1               | test_ca11_10_table_5_code_in_byte_1 (parametrised over every code path) |
| oA11-2      | suggested value format                            | test_oa11_2_suggested_values |
| CA11-11     | versions verified first                           | test_ca11_11_versions_checked_first (parametrised) |

Plus: Table 5 code 0x06 "Unknown IP Address" (test_unknown_ip_address_rejected,
test_bound_listener_checks_its_own_address), every A11 rejection path reaches the client as a distinct, readable event
(test_every_rejection_has_a_distinct_text) and consumer private data is delivered
intact both ways (test_consumer_private_data_intact).
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from harness.cm import Pair, T

from softrdma.ibcm.agent import AcceptParams, CmConfig, ConnParams, IbCmId
from softrdma.ibcm.events import CmEvent
from softrdma.ibcm.ipcm import IpCmClient, ip_listen
from softrdma.ibcm.state import CmState
from softrdma.wire import cm as wcm
from softrdma.wire.cm import CmAttr, RejReason
from softrdma.wire.ipcm import (
    IPPROTO_SCTP,
    IPPROTO_TCP,
    IPPROTO_UDP,
    IpCmAri,
    IpCmHeader,
    ip_cm_service_id,
    pack_ip_field,
)

PORT = 7174
SID = ip_cm_service_id(IPPROTO_TCP, PORT)
A_IP, B_IP = "10.9.0.1", "10.9.0.2"


def server(p: Pair, *, bind: str | None = None, minor: int = 0, port: int = PORT,
           proto: int = IPPROTO_TCP, accept: bool = True) -> IbCmId:
    lst = p.b.new_id()
    ip_listen(lst, port, proto=proto, bind=bind, minor=minor)
    if accept:
        # QPs made beforehand (a handler could make them too: it runs outside the lock)
        qps = [p.b.qp()[0] for _ in range(2)]

        def on(ev: CmEvent) -> None:
            if ev.type == T.CONNECT_REQUEST:
                ev.cm_id.accept(qps.pop(), AcceptParams(private_data=b"server says hi"))
        p.b.on = on
    return lst


def client(p: Pair, *, minor: int = 0, port: int = PORT, proto: int = IPPROTO_TCP,
           private_data: bytes = b"", src: str = A_IP, dst: str = B_IP) -> tuple[IbCmId, IpCmClient]:
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    cl = IpCmClient(cid, minor=minor)
    cl.connect(qa, src, dst, port, src_port=40001, proto=proto, private_data=private_data)
    return cid, cl


def raw_req(p: Pair, hdr: IpCmHeader | bytes, sid: int = SID) -> IbCmId:
    """A REQ whose private data is exactly ``hdr`` (crafted, as a non-conforming peer)."""
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    pd = hdr if isinstance(hdr, bytes) else hdr.encode()
    cid.connect(qa, ConnParams(sid, p.b.gid, private_data=pd))
    return cid


def good_hdr(**kw: Any) -> IpCmHeader:
    h = IpCmHeader.make(A_IP, B_IP, 40001)
    for k, val in kw.items():
        setattr(h, k, val)
    return h


def rejected(p: Pair) -> CmEvent:
    evs = p.a.of(T.REJECTED)
    assert len(evs) == 1, p.a.events
    return evs[0]


def last_rej(p: Pair) -> wcm.Rej:
    rejs = p.sent(CmAttr.REJ)
    assert rejs
    return rejs[-1]


# ---------------------------------------------------------------------------- CA11-1
def test_ca11_1_req_private_data_table_1() -> None:
    p = Pair()
    server(p)
    cid, _ = client(p, private_data=b"consumer bytes")
    p.run(1)
    (req,) = p.sent(CmAttr.REQ)
    pd = req.private_data
    assert pd[0] == 0x00  # MajV 0, MinV 0
    assert pd[1] == 0x40  # IPV 4, Res 0
    assert pd[2:4] == (40001).to_bytes(2, "big")
    assert pd[4:20] == bytes(12) + ipaddress.IPv4Address(A_IP).packed
    assert pd[20:36] == bytes(12) + ipaddress.IPv4Address(B_IP).packed
    assert pd[36:50] == b"consumer bytes" and pd[50:92] == bytes(42)
    (cr,) = p.b.of(T.CONNECT_REQUEST)
    assert cr.remote_ip == ipaddress.ip_address(A_IP) and cr.remote_port == 40001
    assert cr.local_ip == ipaddress.ip_address(B_IP) and cr.local_port == PORT
    assert p.a.types(cid) == [T.ESTABLISHED]


def test_ca11_1_ipv6() -> None:
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)  # a raw listener: the A11 dialect is installed by the CM (CA11-7)
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    hdr = IpCmHeader.make("fd00::1", "fd00::2", 5)
    # over the IPv4 GIDs: A11 carries the IP addresses, the path carries the GIDs
    cid.connect(qa, ConnParams(SID, p.b.gid, private_data=hdr.private_data(b"v6")))
    p.run(1)
    (req,) = p.sent(CmAttr.REQ)
    assert req.private_data[1] == 0x60
    assert req.private_data[4:20] == ipaddress.IPv6Address("fd00::1").packed
    # the server is not fd00::2: Unknown IP Address (code 6)
    ev = rejected(p)
    assert ev.reject is not None and ev.reject.ip_cm is not None
    assert ev.reject.ip_cm.code == IpCmAri.UNKNOWN_IP


def test_consumer_private_data_intact() -> None:
    p = Pair()
    server(p)
    data = bytes(range(1, 57))  # the full 56 bytes of Table 1 bytes 36-91
    cid, _ = client(p, private_data=data)
    p.run(1)
    (cr,) = p.b.of(T.CONNECT_REQUEST)
    assert cr.private_data == data
    (est,) = p.a.of(T.ESTABLISHED)
    assert est.private_data[:14] == b"server says hi"
    with pytest.raises(Exception, match="56"):
        client(p, private_data=bytes(57))


# ---------------------------------------------------------------------------- versions
def test_ca11_2_major_version_mismatch_rejected() -> None:
    p = Pair()
    server(p)
    raw_req(p, good_hdr(majv=1))
    p.run(1)
    rej = last_rej(p)
    assert rej.reason == RejReason.CONSUMER_DEFINED
    assert rej.ari_data[:4] == bytes((0x00, IpCmAri.MAJOR_VERSION, 1, 0))
    assert rej.ari_data[4:5] == b"\x00"  # suggested: the major version served
    ev = rejected(p)
    assert ev.reject is not None and "major version" in ev.reject.text
    assert p.b.of(T.CONNECT_REQUEST) == []


def test_ca11_3_1_1_higher_minor_rejected() -> None:
    p = Pair()
    server(p, minor=1)
    raw_req(p, good_hdr(minv=2))
    p.run(1)
    rej = last_rej(p)
    assert rej.ari_data[:5] == bytes((0x00, IpCmAri.MINOR_VERSION, 1, 0, 1))
    assert "minor version" in rejected(p).text


@pytest.mark.parametrize("minv", [0, 1])
def test_ca11_3_1_2_equal_and_lower_minor_accepted(minv: int) -> None:
    p = Pair()
    server(p, minor=1)
    cid = raw_req(p, good_hdr(minv=minv))
    p.run(1)
    assert p.a.types(cid) == [T.ESTABLISHED]
    assert p.b.of(T.CONNECT_REQUEST)[0].info["ip_cm"].minv == minv


def test_ca11_3_client_shifts_down_to_the_server_minor() -> None:
    p = Pair()
    server(p, minor=0)
    cid, cl = client(p, minor=3)
    p.run(1)
    assert cl.downgrades == [0]
    reqs = p.sent(CmAttr.REQ)
    assert [r.private_data[0] & 0xF for r in reqs] == [3, 0]
    assert p.a.types(cid) == [T.ESTABLISHED]  # the consumer sees only the outcome
    assert cid.state == CmState.ESTABLISHED


# ---------------------------------------------------------------------------- IPV, addresses
@pytest.mark.parametrize("ipv,bind,suggested", [(6, B_IP, b"\x04"), (5, None, b"\x04\x06"),
                                                (0, None, b"\x04\x06")])
def test_ca11_4_ip_version_rejected(ipv: int, bind: str | None, suggested: bytes) -> None:
    p = Pair()
    server(p, bind=bind)
    raw_req(p, good_hdr(ipv=ipv))
    p.run(1)
    rej = last_rej(p)
    assert rej.ari_data == bytes((0, IpCmAri.IPV, len(suggested), 0)) + suggested
    assert "IP version not supported" in rejected(p).text


def test_ca11_5_client_zeroes_bits_127_32() -> None:
    p = Pair()
    server(p)
    client(p)
    p.run(1)
    (req,) = p.sent(CmAttr.REQ)
    assert req.private_data[4:16] == bytes(12) and req.private_data[20:32] == bytes(12)
    assert pack_ip_field(ipaddress.IPv4Address(A_IP)) == bytes(12) + bytes((10, 9, 0, 1))


@pytest.mark.parametrize("field,code", [("src_ip", IpCmAri.SOURCE_IP),
                                        ("dst_ip", IpCmAri.DESTINATION_IP)])
def test_ca11_5_server_checks_the_format(field: str, code: int) -> None:
    p = Pair()
    server(p)
    h = good_hdr()
    setattr(h, field, b"\x20\x01" + bytes(10) + getattr(h, field)[12:])
    raw_req(p, h)
    p.run(1)
    assert last_rej(p).ari_data[:4] == bytes((0, code, 0, 0))
    assert ("source" if code == IpCmAri.SOURCE_IP else "destination") in rejected(p).text


def test_ca11_5_v4_mapped_form_tolerated() -> None:
    p = Pair()
    server(p)
    h = good_hdr()
    h.src_ip = bytes(10) + b"\xff\xff" + h.src_ip[12:]  # what Linux would also accept
    cid = raw_req(p, h)
    p.run(1)
    assert p.a.types(cid) == [T.ESTABLISHED]


def test_unknown_ip_address_rejected() -> None:
    p = Pair()
    server(p)
    raw_req(p, IpCmHeader.make(A_IP, "10.9.0.99", 1))
    p.run(1)
    assert last_rej(p).ari_data[:4] == bytes((0, IpCmAri.UNKNOWN_IP, 0, 0))
    assert "unknown IP address" in rejected(p).text


def test_bound_listener_checks_its_own_address() -> None:
    p = Pair()
    server(p, bind=B_IP)
    cid, _ = client(p)
    p.run(1)
    assert p.a.types(cid) == [T.ESTABLISHED]


# ---------------------------------------------------------------------------- Service IDs
@pytest.mark.parametrize("proto,port,sid", [
    (IPPROTO_TCP, 3260, 0x0000000001060CBC),  # iSER, the annex's example
    (IPPROTO_SCTP, 2049, 0x0000000001840801),  # NFSv4-RDMA over SCTP, the annex's example
    (IPPROTO_UDP, 53, 0x0000000001110035),
])
def test_ca11_6_service_ids(proto: int, port: int, sid: int) -> None:
    assert ip_cm_service_id(proto, port) == sid
    p = Pair()
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    IpCmClient(cid).connect(qa, A_IP, B_IP, port, proto=proto)
    (req,) = p.sent(CmAttr.REQ)
    assert req.service_id == sid
    assert req.service_id >> 24 == 0x01 and (req.service_id >> 16) & 0xFF == proto
    del cid


def test_ca11_6_sctp_service_connects() -> None:
    p = Pair()
    server(p, proto=IPPROTO_SCTP, port=2049)
    cid, _ = client(p, proto=IPPROTO_SCTP, port=2049)
    p.run(1)
    assert p.a.types(cid) == [T.ESTABLISHED]
    assert p.b.of(T.CONNECT_REQUEST)[0].info["protocol"] == IPPROTO_SCTP


# ---------------------------------------------------------------------------- CA11-7, CA11-8
def test_ca11_7_a11_range_parsed_by_any_listener() -> None:
    p = Pair()
    lst = p.b.new_id()
    lst.listen(SID)  # no dialect given
    client(p, private_data=b"x")
    p.run(1)
    (cr,) = p.b.of(T.CONNECT_REQUEST)
    assert cr.remote_ip == ipaddress.ip_address(A_IP) and cr.private_data[:1] == b"x"
    assert lst.dialect is not None and lst.dialect.name == "ip_cm"


def test_ca11_7_other_range_passed_raw() -> None:
    p = Pair()
    lst = p.b.new_id()
    lst.listen(0x0000000002060000 | PORT)  # outside the A11 prefix
    raw_req(p, b"\x77" * 40, sid=0x0000000002060000 | PORT)
    p.run(1)
    (cr,) = p.b.of(T.CONNECT_REQUEST)
    assert cr.remote_ip is None and cr.private_data[:40] == b"\x77" * 40


@pytest.mark.iba("12.6.7")
def test_ca11_8_no_listener_rej_8() -> None:
    p = Pair()
    client(p)
    p.run(1)
    rej = last_rej(p)
    assert rej.reason == RejReason.INVALID_SERVICE_ID and rej.message_rejected == 0
    assert rejected(p).reject.reason == 8  # type: ignore[union-attr]


def test_ca11_8_ip_cm_not_supported_rej_8() -> None:
    p = Pair(config_b=CmConfig(ip_cm_supported=False))
    server(p)
    client(p)
    p.run(1)
    assert last_rej(p).reason == RejReason.INVALID_SERVICE_ID
    assert p.b.of(T.CONNECT_REQUEST) == []


# ---------------------------------------------------------------------------- ARI
def test_oa11_1_rej_28_with_ari() -> None:
    p = Pair()
    server(p)
    raw_req(p, good_hdr(majv=2))
    p.run(1)
    rej = last_rej(p)
    assert rej.reason == 28 and rej.message_rejected == wcm.MsgType.REQ
    assert rej.ari_length == 5 and rej.ari_data[0] == 0x00


def test_ca11_9_ari_is_table_4() -> None:
    p = Pair()
    server(p)
    raw_req(p, good_hdr(ipv=9))
    p.run(1)
    ari = last_rej(p).ari_data
    layer, code, slen, filler = ari[:4]
    assert (layer, code, filler) == (0x00, IpCmAri.IPV, 0)  # RDMA IP CM Service layer
    assert len(ari) == 4 + slen and ari[4:] == b"\x04\x06"


@pytest.mark.parametrize("hdr,code", [
    (good_hdr(majv=3), IpCmAri.MAJOR_VERSION),
    (good_hdr(minv=1), IpCmAri.MINOR_VERSION),
    (good_hdr(ipv=7), IpCmAri.IPV),
    (good_hdr(src_ip=b"\x01" * 16), IpCmAri.SOURCE_IP),
    (good_hdr(dst_ip=b"\x01" * 16), IpCmAri.DESTINATION_IP),
    (IpCmHeader.make(A_IP, "10.1.1.1", 1), IpCmAri.UNKNOWN_IP),
])
def test_ca11_10_table_5_code_in_byte_1(hdr: IpCmHeader, code: int) -> None:
    p = Pair()
    server(p)
    raw_req(p, hdr)
    p.run(1)
    assert last_rej(p).ari_data[1] == code


def test_oa11_2_suggested_values() -> None:
    p = Pair()
    server(p, minor=2)
    raw_req(p, good_hdr(minv=5))
    p.run(1)
    ev = rejected(p)
    assert ev.reject is not None and ev.reject.ip_cm is not None
    assert ev.reject.ip_cm.suggested == b"\x02"
    assert "server suggests version 2" in ev.reject.text


# ---------------------------------------------------------------------------- CA11-11
@pytest.mark.parametrize("hdr,code", [
    (good_hdr(majv=1, minv=9, ipv=9, src_ip=b"\xff" * 16), IpCmAri.MAJOR_VERSION),
    (good_hdr(minv=9, ipv=9, dst_ip=b"\xff" * 16), IpCmAri.MINOR_VERSION),
    (good_hdr(ipv=9, src_ip=b"\xff" * 16), IpCmAri.IPV),
])
def test_ca11_11_versions_checked_first(hdr: IpCmHeader, code: int) -> None:
    p = Pair()
    server(p)
    raw_req(p, hdr)
    p.run(1)
    assert last_rej(p).ari_data[1] == code


# ---------------------------------------------------------------------------- events
def test_every_rejection_has_a_distinct_text() -> None:
    texts = set()
    cases: list[tuple[Any, dict[str, Any]]] = [
        (good_hdr(majv=1), {}), (good_hdr(minv=1), {}), (good_hdr(ipv=5), {}),
        (good_hdr(src_ip=b"\x01" * 16), {}), (good_hdr(dst_ip=b"\x01" * 16), {}),
        (IpCmHeader.make(A_IP, "10.1.1.1", 1), {}), (good_hdr(), {"listen": False}),
        (good_hdr(), {"reject": True}),
    ]
    for hdr, how in cases:
        p = Pair()
        if how.get("listen", True):
            lst = server(p, accept=not how.get("reject"))
            if how.get("reject"):
                p.b.on = lambda ev: ev.cm_id.reject(b"no") \
                    if ev.type == T.CONNECT_REQUEST else None
            del lst
        raw_req(p, hdr)
        p.run(1)
        ev = rejected(p)
        assert ev.text.startswith("REJECTED: ")
        texts.add(ev.text)
    p = Pair()
    p.fab.partition(B_IP)
    client(p)
    p.run(200)
    (un,) = p.a.of(T.UNREACHABLE)
    texts.add(un.text)
    assert len(texts) == len(cases) + 1, texts

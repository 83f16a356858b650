"""MAD framing and CM message codecs (softrdma.wire.mad, softrdma.wire.cm).

Oracles: the CM MADs of the rxe captures (byte-exact round trips, and a REQ rebuilt from
values alone), tshark's decode of the same packets (one tshark run per capture), and the
offsets/bit positions (IBA 13.4.2 MAD header, 12.6 CM messages) of ../shared/specs/ib-cm.md §1-3 written out by hand below (independent of the
layout tables in the code).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import shutil
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softrdma.errors import DecodeError, InvalidArgument
from softrdma.wire import cm, ipcm, mad, roce
from softrdma.wire.pcap import read_pcap

CAPTURES = Path("/work/shared/captures")
CM_CAPTURES = ("roce_rping", "roce_ucmatose", "roce_write_bw_rdmacm")
HAVE_TSHARK = shutil.which("tshark") is not None

# CM MADs per capture, in frame order (tshark -Y infiniband.cm of each capture).
EXPECTED_ATTRS = {
    "roce_rping": [(1, 0x10), (2, 0x13), (3, 0x14), (64, 0x15), (65, 0x16)],
    "roce_ucmatose": [(1, 0x10), (2, 0x13), (3, 0x14), (24, 0x15), (25, 0x16)],
    "roce_write_bw_rdmacm": [(1, 0x10), (2, 0x13), (3, 0x14), (24, 0x10), (25, 0x13),
                             (26, 0x14), (286, 0x15), (287, 0x16), (288, 0x15), (289, 0x16)],
}


@cache
def qp1_payloads(name: str) -> tuple[tuple[int, bytes, roce.RoceFrame], ...]:
    """(frame number, UD payload, frame) of every packet to QP1 in a capture."""
    out = []
    for rec in read_pcap(CAPTURES / f"{name}.pcap"):
        f = roce.parse_frame(rec.data, rec.linktype)
        if f is None or f.packet.dqpn != mad.GSI_QPN:
            continue
        assert f.packet.opcode == 0x64 and f.packet.qkey == mad.GSI_QKEY  # UD SEND_ONLY
        out.append((rec.index, bytes(f.packet.payload), f))
    return tuple(out)


# ------------------------------------------------------------------------- captures
@pytest.mark.parametrize("name", CM_CAPTURES)
@pytest.mark.iba("12.6")
def test_capture_cm_mads_round_trip_byte_exact(name: str) -> None:
    seen = []
    for index, payload, _f in qp1_payloads(name):
        m = cm.decode(payload)
        seen.append((index, m.hdr.attr_id))
        assert m.encode() == payload
        assert cm.encode(m.msg, hdr=m.hdr) == payload
        assert type(m.msg).ATTR_ID == m.hdr.attr_id
        assert cm.check_mad(memoryview(payload)) is None
        # Memoryview input decodes identically.
        assert cm.decode(memoryview(payload)) == m
    assert seen == EXPECTED_ATTRS[name]


def test_capture_headers_and_answers_share_tids() -> None:
    for name in CM_CAPTURES:
        mads = [cm.decode(p) for _i, p, _f in qp1_payloads(name)]
        for m in mads:
            h = m.hdr
            assert (h.base_version, h.mgmt_class, h.class_version, h.method) == (1, 7, 2, 3)
            assert (h.status, h.class_specific, h.rsvd_18, h.attr_mod) == (0, 0, 0, 0)
            assert not h.is_response
        # REQ/REP/RTU of one connection carry one TID and matching comm IDs.
        reqs = [(m.hdr, m.msg) for m in mads if isinstance(m.msg, cm.Req)]
        reps = [(m.hdr, m.msg) for m in mads if isinstance(m.msg, cm.Rep)]
        rtus = [(m.hdr, m.msg) for m in mads if isinstance(m.msg, cm.Rtu)]
        assert len(reqs) == len(reps) == len(rtus) > 0
        for rh, req in reqs:
            ph, rep = next(x for x in reps if x[1].remote_comm_id == req.local_comm_id)
            th, rtu = next(x for x in rtus if x[1].local_comm_id == req.local_comm_id)
            assert rh.tid == ph.tid == th.tid
            assert rtu.remote_comm_id == rep.local_comm_id


@pytest.mark.iba("12.6.5")
def test_rping_req_rebuilt_from_values() -> None:
    """The rping REQ, built from the values tshark shows, equals the captured MAD."""
    (_i, captured, _f) = qp1_payloads("roce_rping")[0]
    pd = ipcm.IpCmHeader.make("10.50.0.12", "10.50.0.11", 0xA1B1).private_data()
    req = cm.Req(
        local_comm_id=0xADF97548, service_id=ipcm.ip_cm_service_id(ipcm.IPPROTO_TCP, 7174),
        local_ca_guid=0x505400FFFE000002, local_qpn=0x19, responder_resources=1,
        initiator_depth=1, remote_cm_response_timeout=20, starting_psn=0xFFEF7C,
        local_cm_response_timeout=20, retry_count=7, pkey=0xFFFF, path_mtu=3,
        rnr_retry_count=7, max_cm_retries=15,
        primary_local_lid=cm.PERMISSIVE_LID, primary_remote_lid=cm.PERMISSIVE_LID,
        primary_local_gid=ipaddress.IPv6Address("::ffff:10.50.0.12").packed,
        primary_remote_gid=ipaddress.IPv6Address("::ffff:10.50.0.11").packed,
        primary_flow_label=0x3B075, primary_hop_limit=64, primary_local_ack_timeout=0x13,
        private_data=pd)
    assert cm.encode(req, tid=0x000000064875F9AD) == captured


# ------------------------------------------------------------------------- tshark
def _i(s: str) -> int:
    return int(s, 0)


def _gid4(s: str) -> bytes:
    return ipaddress.IPv6Address("::ffff:" + s).packed


def _hex(s: str) -> bytes:
    return bytes.fromhex(s.replace(":", ""))


def _ipcm(m: cm.CmMad) -> ipcm.IpCmHeader:
    assert isinstance(m.msg, cm.Req)
    return ipcm.IpCmHeader.decode_private_data(m.msg.private_data)[0]


def _attr(name: str) -> Callable[[Any], Any]:
    return lambda m: getattr(m.msg, name)


Getter = Callable[[Any], Any]  # takes a cm.CmMad whose msg is the row's class
# tshark field -> (message class or None for the MAD header, getter, parser of tshark's text)
TSHARK: dict[str, tuple[type | None, Getter, Callable[[str], Any]]] = {
    "infiniband.mad.baseversion": (None, lambda m: m.hdr.base_version, _i),
    "infiniband.mad.mgmtclass": (None, lambda m: m.hdr.mgmt_class, _i),
    "infiniband.mad.classversion": (None, lambda m: m.hdr.class_version, _i),
    "infiniband.mad.method": (None, lambda m: m.hdr.method, _i),
    "infiniband.mad.status": (None, lambda m: m.hdr.status, _i),
    "infiniband.mad.classspecific": (None, lambda m: m.hdr.class_specific, _i),
    "infiniband.mad.transactionid": (None, lambda m: m.hdr.tid, _i),
    "infiniband.mad.attributeid": (None, lambda m: m.hdr.attr_id, _i),
    "infiniband.mad.attributemodifier": (None, lambda m: m.hdr.attr_mod, _i),
    "infiniband.cm.req": (cm.Req, _attr("local_comm_id"), _i),
    "infiniband.cm.req.serviceid": (cm.Req, _attr("service_id"), _i),
    "infiniband.cm.req.serviceid.protocol": (
        cm.Req, lambda m: (m.msg.service_id >> 16) & 0xFF, _i),
    "infiniband.cm.req.serviceid.dport": (cm.Req, lambda m: m.msg.service_id & 0xFFFF, _i),
    "infiniband.cm.req.localcaguid": (cm.Req, _attr("local_ca_guid"), _i),
    "infiniband.cm.req.localqkey": (cm.Req, _attr("local_qkey"), _i),
    "infiniband.cm.req.localqpn": (cm.Req, _attr("local_qpn"), _i),
    "infiniband.cm.req.responderres": (cm.Req, _attr("responder_resources"), _i),
    "infiniband.cm.req.localeecn": (cm.Req, _attr("local_eecn"), _i),
    "infiniband.cm.req.initdepth": (cm.Req, _attr("initiator_depth"), _i),
    "infiniband.cm.req.remoteeecn": (cm.Req, _attr("remote_eecn"), _i),
    "infiniband.cm.req.remoteresptout": (cm.Req, _attr("remote_cm_response_timeout"), _i),
    "infiniband.cm.req.transpsvctype": (cm.Req, _attr("transport_service_type"), _i),
    "infiniband.cm.req.e2eflowctrl": (cm.Req, _attr("end_to_end_flow_control"), _i),
    "infiniband.cm.req.startpsn": (cm.Req, _attr("starting_psn"), _i),
    "infiniband.cm.req.localresptout": (cm.Req, _attr("local_cm_response_timeout"), _i),
    "infiniband.cm.req.retrcount": (cm.Req, _attr("retry_count"), _i),
    "infiniband.cm.req.pkey": (cm.Req, _attr("pkey"), _i),
    "infiniband.cm.req.pppmtu": (cm.Req, _attr("path_mtu"), _i),
    "infiniband.cm.req.rdcexist": (cm.Req, _attr("rdc_exists"), _i),
    "infiniband.cm.req.rnrretrcount": (cm.Req, _attr("rnr_retry_count"), _i),
    "infiniband.cm.req.maxcmretr": (cm.Req, _attr("max_cm_retries"), _i),
    "infiniband.cm.req.srq": (cm.Req, _attr("srq"), _i),
    "infiniband.cm.req.ext_transport": (cm.Req, _attr("extended_transport_type"), _i),
    "infiniband.cm.req.prim_locallid": (cm.Req, _attr("primary_local_lid"), _i),
    "infiniband.cm.req.prim_remotelid": (cm.Req, _attr("primary_remote_lid"), _i),
    "infiniband.cm.req.prim_localgid_ipv4": (cm.Req, _attr("primary_local_gid"), _gid4),
    "infiniband.cm.req.prim_remotegid_ipv4": (cm.Req, _attr("primary_remote_gid"), _gid4),
    # Wireshark 4.0 reads the 20-bit flow label from 3 bytes and the packet rate from
    # the first byte of the word at body offset 88, so it shows flow_label >> 8 and
    # bits 17:12 of the flow label (the real packet rate is the low 6 bits of byte 91).
    "infiniband.cm.req.prim_flowlabel": (cm.Req, lambda m: m.msg.primary_flow_label >> 8, _i),
    "infiniband.cm.req.prim_pktrate": (
        cm.Req, lambda m: (m.msg.primary_flow_label >> 12) & 0x3F, _i),
    "infiniband.cm.req.prim_tfcclass": (cm.Req, _attr("primary_traffic_class"), _i),
    "infiniband.cm.req.prim_hoplim": (cm.Req, _attr("primary_hop_limit"), _i),
    "infiniband.cm.req.prim_sl": (cm.Req, _attr("primary_sl"), _i),
    "infiniband.cm.req.prim_subnetlocal": (cm.Req, _attr("primary_subnet_local"), _i),
    "infiniband.cm.req.prim_localacktout": (cm.Req, _attr("primary_local_ack_timeout"), _i),
    "infiniband.cm.req.prim_reserved2": (cm.Req, _attr("rsvd_95"), _i),
    "infiniband.cm.req.alt_locallid": (cm.Req, _attr("alt_local_lid"), _i),
    "infiniband.cm.req.alt_remotelid": (cm.Req, _attr("alt_remote_lid"), _i),
    "infiniband.cm.req.alt_localgid": (cm.Req, _attr("alt_local_gid"), _hex),
    "infiniband.cm.req.alt_remotegid": (cm.Req, _attr("alt_remote_gid"), _hex),
    "infiniband.cm.req.alt_flowlabel": (cm.Req, lambda m: m.msg.alt_flow_label >> 8, _i),
    "infiniband.cm.req.alt_tfcclass": (cm.Req, _attr("alt_traffic_class"), _i),
    "infiniband.cm.req.alt_hoplim": (cm.Req, _attr("alt_hop_limit"), _i),
    "infiniband.cm.req.alt_sl": (cm.Req, _attr("alt_sl"), _i),
    "infiniband.cm.req.alt_subnetlocal": (cm.Req, _attr("alt_subnet_local"), _i),
    "infiniband.cm.req.alt_localacktout": (cm.Req, _attr("alt_local_ack_timeout"), _i),
    "infiniband.cm.req.ip_cm.majv": (cm.Req, lambda m: _ipcm(m).majv, _i),
    "infiniband.cm.req.ip_cm.minv": (cm.Req, lambda m: _ipcm(m).minv, _i),
    "infiniband.cm.req.ip_cm.ipv": (cm.Req, lambda m: _ipcm(m).ipv, _i),
    "infiniband.cm.req.ip_cm.reserved": (cm.Req, lambda m: _ipcm(m).res, _i),
    "infiniband.cm.req.ip_cm.sport": (cm.Req, lambda m: _ipcm(m).src_port, _i),
    "infiniband.cm.req.ip_cm.sip4": (cm.Req, lambda m: _ipcm(m).src_addr,
                                     ipaddress.IPv4Address),
    "infiniband.cm.req.ip_cm.dip4": (cm.Req, lambda m: _ipcm(m).dst_addr,
                                     ipaddress.IPv4Address),
    "infiniband.cm.req.ip_cm.private": (
        cm.Req, lambda m: m.msg.private_data[ipcm.IPCM_HEADER_SIZE:], _hex),
    "infiniband.cm.rep": (cm.Rep, _attr("local_comm_id"), _i),
    "infiniband.cm.rep.remotecommid": (cm.Rep, _attr("remote_comm_id"), _i),
    "infiniband.cm.rep.localqkey": (cm.Rep, _attr("local_qkey"), _i),
    "infiniband.cm.rep.localqpn": (cm.Rep, _attr("local_qpn"), _i),
    "infiniband.cm.rep.localeecn": (cm.Rep, _attr("local_eecn"), _i),
    "infiniband.cm.rep.startpsn": (cm.Rep, _attr("starting_psn"), _i),
    "infiniband.cm.rep.respres": (cm.Rep, _attr("responder_resources"), _i),
    "infiniband.cm.rep.initdepth": (cm.Rep, _attr("initiator_depth"), _i),
    "infiniband.cm.rep.tgtackdelay": (cm.Rep, _attr("target_ack_delay"), _i),
    "infiniband.cm.rep.failoveracc": (cm.Rep, _attr("failover_accepted"), _i),
    "infiniband.cm.rep.e2eflowctrl": (cm.Rep, _attr("end_to_end_flow_control"), _i),
    "infiniband.cm.rep.rnrretrcount": (cm.Rep, _attr("rnr_retry_count"), _i),
    "infiniband.cm.rep.srq": (cm.Rep, _attr("srq"), _i),
    "infiniband.cm.rep.localcaguid": (cm.Rep, _attr("local_ca_guid"), _i),
    "infiniband.cm.rep.private": (cm.Rep, _attr("private_data"), _hex),
    "infiniband.cm.rtu.localcommid": (cm.Rtu, _attr("local_comm_id"), _i),
    "infiniband.cm.rtu.remotecommid": (cm.Rtu, _attr("remote_comm_id"), _i),
    "infiniband.cm.rtu.private": (cm.Rtu, _attr("private_data"), _hex),
    "infiniband.cm.dreq.localcommid": (cm.Dreq, _attr("local_comm_id"), _i),
    "infiniband.cm.dreq.remotecommid": (cm.Dreq, _attr("remote_comm_id"), _i),
    "infiniband.cm.req.remoteqpneecn": (cm.Dreq, _attr("remote_qpn_eecn"), _i),
    "infiniband.cm.dreq.private": (cm.Dreq, _attr("private_data"), _hex),
    "infiniband.cm.drsp.localcommid": (cm.Drep, _attr("local_comm_id"), _i),
    "infiniband.cm.drsp.remotecommid": (cm.Drep, _attr("remote_comm_id"), _i),
    "infiniband.cm.drsp.private": (cm.Drep, _attr("private_data"), _hex),
}


@pytest.mark.skipif(not HAVE_TSHARK, reason="tshark not installed: no decode oracle")
@pytest.mark.parametrize("name", CM_CAPTURES)
@pytest.mark.iba("12.6")
def test_fields_agree_with_tshark(name: str) -> None:
    names = list(TSHARK)
    cmd = ["tshark", "-n", "-r", str(CAPTURES / f"{name}.pcap"), "-Y", "infiniband.mad",
           "-T", "fields", "-E", "separator=|", "-E", "occurrence=f", "-e", "frame.number"]
    for n in names:
        cmd += ["-e", n]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    rows = {int(r.split("|")[0]): r.split("|")[1:] for r in out.splitlines() if r}
    ours = {i: cm.decode(p) for i, p, _f in qp1_payloads(name)}
    assert sorted(rows) == sorted(ours)
    for index, m in ours.items():
        compared = 0
        for field_name, text in zip(names, rows[index], strict=True):
            cls, get, parse = TSHARK[field_name]
            if cls is not None and not isinstance(m.msg, cls):
                continue
            assert text, f"frame {index}: tshark shows no {field_name}"
            assert get(m) == parse(text), f"frame {index}: {field_name}"
            compared += 1
        want = sum(1 for c, _g, _p in TSHARK.values() if c is None or isinstance(m.msg, c))
        assert compared == want


# ------------------------------------------------------------------------- bit positions
# (class, field, value, MAD offset of the first byte touched, expected bytes there),
# written from ../shared/specs/ib-cm.md §1-3 ("Body off" + 24), every other byte staying zero.
POSITIONS: list[tuple[type[cm.CmMessage], str, int, int, bytes]] = [
    (cm.Req, "local_comm_id", 0x01020304, 24, b"\x01\x02\x03\x04"),
    (cm.Req, "service_id", 0x0000000001061C06, 32, bytes.fromhex("0000000001061c06")),
    (cm.Req, "local_qkey", 0x11223344, 52, b"\x11\x22\x33\x44"),
    (cm.Req, "local_qpn", 0xABCDEF, 56, b"\xab\xcd\xef"),
    (cm.Req, "responder_resources", 0x7F, 59, b"\x7f"),
    (cm.Req, "initiator_depth", 0x42, 63, b"\x42"),
    (cm.Req, "remote_cm_response_timeout", 0x1F, 67, b"\xf8"),
    (cm.Req, "transport_service_type", 3, 67, b"\x06"),
    (cm.Req, "end_to_end_flow_control", 1, 67, b"\x01"),
    (cm.Req, "starting_psn", 0x123456, 68, b"\x12\x34\x56"),
    (cm.Req, "local_cm_response_timeout", 20, 71, b"\xa0"),
    (cm.Req, "retry_count", 7, 71, b"\x07"),
    (cm.Req, "pkey", 0x8001, 72, b"\x80\x01"),
    (cm.Req, "path_mtu", 5, 74, b"\x50"),
    (cm.Req, "rdc_exists", 1, 74, b"\x08"),
    (cm.Req, "rnr_retry_count", 6, 74, b"\x06"),
    (cm.Req, "max_cm_retries", 15, 75, b"\xf0"),
    (cm.Req, "srq", 1, 75, b"\x08"),
    (cm.Req, "extended_transport_type", 1, 75, b"\x01"),
    (cm.Req, "primary_remote_lid", 0xBEEF, 78, b"\xbe\xef"),
    (cm.Req, "primary_flow_label", 0xFFFFF, 112, b"\xff\xff\xf0\x00"),
    (cm.Req, "primary_packet_rate", 0x3F, 115, b"\x3f"),
    (cm.Req, "primary_hop_limit", 0x40, 117, b"\x40"),
    (cm.Req, "primary_sl", 0xF, 118, b"\xf0"),
    (cm.Req, "primary_subnet_local", 1, 118, b"\x08"),
    (cm.Req, "primary_local_ack_timeout", 0x13, 119, b"\x98"),
    (cm.Req, "alt_local_lid", 0x1234, 120, b"\x12\x34"),
    (cm.Req, "alt_flow_label", 1, 156, b"\x00\x00\x10\x00"),
    (cm.Req, "alt_packet_rate", 1, 159, b"\x01"),
    (cm.Req, "alt_sl", 1, 162, b"\x10"),
    (cm.Req, "alt_local_ack_timeout", 1, 163, b"\x08"),
    (cm.Req, "sap_supported", 1, 163, b"\x04"),
    (cm.Mra, "remote_comm_id", 0xCAFEBABE, 28, b"\xca\xfe\xba\xbe"),
    (cm.Mra, "message_mraed", 2, 32, b"\x80"),
    (cm.Mra, "service_timeout", 24, 33, b"\xc0"),
    (cm.Rej, "message_rejected", 1, 32, b"\x40"),
    (cm.Rej, "ari_length", 72, 33, b"\x90"),
    (cm.Rej, "reason", 28, 34, b"\x00\x1c"),
    (cm.Rep, "local_qkey", 0x01234567, 32, b"\x01\x23\x45\x67"),
    (cm.Rep, "local_qpn", 0x000019, 36, b"\x00\x00\x19"),
    (cm.Rep, "local_eecn", 0x000777, 40, b"\x00\x07\x77"),
    (cm.Rep, "starting_psn", 0xDFB3AC, 44, b"\xdf\xb3\xac"),
    (cm.Rep, "responder_resources", 4, 48, b"\x04"),
    (cm.Rep, "initiator_depth", 5, 49, b"\x05"),
    (cm.Rep, "target_ack_delay", 15, 50, b"\x78"),
    (cm.Rep, "failover_accepted", 3, 50, b"\x06"),
    (cm.Rep, "end_to_end_flow_control", 1, 50, b"\x01"),
    (cm.Rep, "rnr_retry_count", 7, 51, b"\xe0"),
    (cm.Rep, "srq", 1, 51, b"\x10"),
    (cm.Rep, "local_ca_guid", 0x505400FFFE000001, 52, bytes.fromhex("505400fffe000001")),
    (cm.Dreq, "remote_qpn_eecn", 0x000019, 32, b"\x00\x00\x19"),
    (cm.SidrReq, "request_id", 7, 24, b"\x00\x00\x00\x07"),
    (cm.SidrReq, "pkey", 0x7FFF, 28, b"\x7f\xff"),
    (cm.SidrReq, "service_id", 0x0000000001111234, 32, bytes.fromhex("0000000001111234")),
    (cm.SidrRep, "status", 4, 28, b"\x04"),
    (cm.SidrRep, "info_length", 72, 29, b"\x48"),
    (cm.SidrRep, "qpn", 0x123456, 32, b"\x12\x34\x56"),
    (cm.SidrRep, "service_id", 0x0102030405060708, 36, bytes.fromhex("0102030405060708")),
    (cm.SidrRep, "qkey", 0x01234567, 44, b"\x01\x23\x45\x67"),
    (cm.Lap, "remote_qpn_eecn", 0xABCDEF, 36, b"\xab\xcd\xef"),
    (cm.Lap, "remote_cm_response_timeout", 20, 39, b"\xa0"),
    (cm.Lap, "alt_local_lid", 0x0102, 44, b"\x01\x02"),
    (cm.Lap, "alt_remote_lid", 0x0304, 46, b"\x03\x04"),
    (cm.Lap, "alt_flow_label", 0x12345, 80, b"\x12\x34\x50"),
    (cm.Lap, "alt_traffic_class", 0xB8, 83, b"\xb8"),
    (cm.Lap, "alt_hop_limit", 0xFF, 84, b"\xff"),
    (cm.Lap, "alt_packet_rate", 0x3F, 85, b"\x3f"),
    (cm.Lap, "alt_sl", 2, 86, b"\x20"),
    (cm.Lap, "alt_local_ack_timeout", 31, 87, b"\xf8"),
    (cm.Apr, "info_length", 9, 32, b"\x09"),
    (cm.Apr, "status", 13, 33, b"\x0d"),
]


@pytest.mark.parametrize(("cls", "name", "value", "off", "want"), POSITIONS,
                         ids=[f"{c.__name__}.{n}" for c, n, *_ in POSITIONS])
@pytest.mark.iba("12.6")
def test_field_bit_positions(cls: type[cm.CmMessage], name: str, value: int, off: int,
                             want: bytes) -> None:
    kw: dict[str, Any] = {name: value}
    msg = cls(**kw)
    if isinstance(msg, (cm.Req, cm.SidrReq)):  # these default pkey to 0xFFFF
        msg.pkey = value if name == "pkey" else 0
    wire = cm.encode(msg, tid=0)
    body = wire[mad.MAD_HDR_SIZE:]
    assert wire[off:off + len(want)] == want
    assert body.count(0) == len(body) - sum(1 for b in want if b)
    assert getattr(cm.decode(wire).msg, name) == value


@pytest.mark.parametrize(("cls", "offset"), [
    (cm.Req, 164), (cm.Mra, 34), (cm.Rej, 108), (cm.Rep, 60), (cm.Rtu, 32), (cm.Dreq, 36),
    (cm.Drep, 32), (cm.SidrReq, 40), (cm.SidrRep, 120), (cm.Lap, 88), (cm.Apr, 108),
])
def test_private_data_is_the_tail(cls: type[cm.CmMessage], offset: int) -> None:
    size = cm.PRIVATE_DATA_SIZE[cls.ATTR_ID]
    assert offset + size == mad.MAD_SIZE
    pd = bytes(range(1, size + 1)) if size < 256 else b""
    msg = cls(private_data=pd)
    wire = cm.encode(msg)
    assert wire[offset:] == pd
    # A short private data is zero-filled, and decodes to the full field.
    short = cm.encode(cls(private_data=b"hi"))
    assert short[offset:offset + 2] == b"hi" and short[offset + 2:] == bytes(size - 2)
    assert cm.decode(short).msg.private_data == b"hi" + bytes(size - 2)


@pytest.mark.iba("12.6.7")
def test_ari_and_additional_info_positions() -> None:
    rej = cm.Rej(ari=b"\x00\x06\x00\x00", ari_length=4, reason=cm.RejReason.CONSUMER_DEFINED)
    wire = cm.encode(rej)
    assert wire[36:40] == b"\x00\x06\x00\x00" and wire[40:108] == bytes(68)
    back = cm.decode(wire).msg
    assert isinstance(back, cm.Rej) and back.ari_data == b"\x00\x06\x00\x00"
    back.ari_length = 127  # 7-bit field: the ARI in use is clamped to 72 bytes
    assert back.ari_data == b"\x00\x06" + bytes(70)
    assert cm.encode(cm.SidrRep(info=b"\xaa" * 72))[48:120] == b"\xaa" * 72
    assert cm.encode(cm.Apr(info=b"\xbb" * 72))[36:108] == b"\xbb" * 72
    gid = bytes(range(16))
    assert cm.encode(cm.Lap(alt_remote_gid=gid))[64:80] == gid
    assert cm.encode(cm.Req(primary_local_gid=gid))[80:96] == gid
    assert cm.encode(cm.Req(alt_remote_gid=gid))[140:156] == gid


# ------------------------------------------------------------------------- property tests
MESSAGE_CLASSES = list(cm.MESSAGE_TYPES.values())


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(body=st.binary(min_size=mad.MAD_DATA_SIZE, max_size=mad.MAD_DATA_SIZE),
       tid=st.integers(0, 2**64 - 1), mod=st.integers(0, 2**32 - 1),
       status=st.integers(0, 0xFFFF), rsvd=st.integers(0, 0xFFFF))
@pytest.mark.iba("12.6")
def test_any_body_round_trips(cls: type[cm.CmMessage], body: bytes, tid: int, mod: int,
                              status: int, rsvd: int) -> None:
    """Any 232 bytes under any header decode and re-encode exactly (reserved bits kept)."""
    hdr = mad.MadHeader(1, 7, 2, 3, status, 0, tid, cls.ATTR_ID, rsvd, mod)
    wire = hdr.encode() + body
    m = cm.decode(wire)
    assert isinstance(m.msg, cls)
    assert m.hdr == hdr
    assert m.encode() == wire
    assert cm.check_mad(memoryview(wire)) is None


def _values(cls: type[cm.CmMessage]) -> st.SearchStrategy[dict[str, Any]]:
    lay = cls.LAYOUT
    return st.fixed_dictionaries({
        name: (st.binary(min_size=w // 8, max_size=w // 8)
               if name in ("private_data", "ari", "info") or name.endswith("_gid")
               else st.integers(0, (1 << w) - 1))
        for name, w in lay.widths.items()})


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_values_round_trip(cls: type[cm.CmMessage], data: st.DataObject) -> None:
    values = data.draw(_values(cls))
    msg = cls(**values)
    tid = data.draw(st.integers(0, 2**64 - 1))
    m = cm.decode(cm.encode(msg, tid=tid))
    assert m.msg == msg
    assert m.hdr == cm.cm_header(msg, tid)


# ------------------------------------------------------------------------- errors
def _good() -> bytes:
    return cm.encode(cm.Rtu(local_comm_id=1, remote_comm_id=2), tid=5)


def _patched(off: int, b: int) -> bytes:
    w = bytearray(_good())
    w[off] = b
    return bytes(w)


@pytest.mark.parametrize(("wire", "text"), ids=lambda v: v if isinstance(v, str) else "", argvalues=[
    (_good()[:255], "must be 256 bytes, got 255"),
    (_good() + b"\0", "must be 256 bytes, got 257"),
    (b"", "got 0"),
    (_patched(0, 2), "base version 2"),
    (_patched(1, 4), "management class 0x04 is not CM"),
    (_patched(2, 1), "class version 1, expected 2"),
    (_patched(17, 0x20), "attribute 0x0020 (unknown) is not a CM message"),
    (_patched(17, 0x01), "attribute 0x0001 (CLASS_PORT_INFO) is not a CM message"),
    (_patched(17, 0x1B), "attribute 0x001b (SAP) is not a CM message"),
])
def test_malformed_mads_raise_decode_error(wire: bytes, text: str) -> None:
    with pytest.raises(DecodeError, match=text.replace("(", r"\(").replace(")", r"\)")):
        cm.decode(wire)
    err = cm.check_mad(memoryview(wire))
    if wire[1:2] != b"\x07" and len(wire) == 256 and wire[0] == 1 or "0x0001" in text:
        assert err is None  # another class, or CM ClassPortInfo: header checked only
    else:
        assert err is not None and text.split(" (")[0] in err


def test_decode_body_checks_size() -> None:
    with pytest.raises(DecodeError, match="body must be 232 bytes, got 100"):
        cm.decode_body(cm.CmAttr.REQ, bytes(100))
    assert cm.decode_body(cm.CmAttr.DREP, bytes(232)) == cm.Drep(private_data=bytes(224))


def test_check_mad_other_classes() -> None:
    host = qp1_payloads("host_peer_roce")
    assert [mad.decode_header(p).mgmt_class for _i, p, _f in host] == [4, 4, 4]
    for _i, p, _f in host:
        assert cm.check_mad(memoryview(p)) is None
    resp = mad.decode_header(host[-1][1])
    assert resp.method == mad.Method.GET_RESP and resp.is_response
    assert resp.attr_id == mad.CommonAttr.CLASS_PORT_INFO
    # CM ClassPortInfo is checked by its header only.
    h = mad.MadHeader(attr_id=cm.CmAttr.CLASS_PORT_INFO, method=mad.Method.GET, tid=9)
    assert cm.check_mad(memoryview(mad.build_mad(h, b"\x01\x02"))) is None
    assert "must be 256 bytes, got 24" in str(cm.check_mad(memoryview(h.encode())))


@pytest.mark.parametrize(("msg", "arg", "text"), [
    (cm.Req(local_qpn=1 << 24), "req.local_qpn", "does not fit in 24 bits"),
    (cm.Req(remote_cm_response_timeout=32), "req.remote_cm_response_timeout", "5 bits"),
    (cm.Req(primary_flow_label=-1), "req.primary_flow_label", "-1 does not fit"),
    (cm.Req(primary_local_gid=bytes(15)), "req.primary_local_gid", "exactly 16 bytes, got 15"),
    (cm.Req(private_data=bytes(93)), "req.private_data", "at most 92 bytes, got 93"),
    (cm.Rej(ari=bytes(73)), "rej.ari", "at most 72 bytes"),
    (cm.Rej(reason="28"), "rej.reason", "must be an int"),  # type: ignore[arg-type]
    (cm.Rtu(private_data="x"), "rtu.private_data", "must be bytes"),  # type: ignore[arg-type]
    (cm.Mra(message_mraed=4), "mra.message_mraed", "2 bits"),
])
def test_encode_rejects_bad_values(msg: cm.CmMessage, arg: str, text: str) -> None:
    with pytest.raises(InvalidArgument, match=text) as ei:
        cm.encode(msg)
    assert ei.value.argument == arg


def test_encode_fast_path_matches_checked_path() -> None:
    """Layout.encode packs plain ints and exact-size bytes at once and hands anything else
    to the checked path: both give the same bytes, and a bool in a wide field is refused
    either way."""
    lay = cm.Req.LAYOUT
    plain = cm.Req(local_qpn=0x123456, end_to_end_flow_control=1, private_data=bytes(92))
    assert lay.encode(plain) == lay._encode_checked(plain)
    short = cm.Req(private_data=b"rate")  # padded with zeros to 92 bytes
    assert lay.encode(short) == lay._encode_checked(short) == lay.encode(
        cm.Req(private_data=b"rate" + bytes(88)))
    odd = [
        cm.Req(local_qpn=0x123456, end_to_end_flow_control=True),  # bool, 1-bit field
        cm.Req(transport_service_type=cm.TransportServiceType.UC),  # an IntEnum
        cm.Req(private_data=bytearray(b"ab")),  # type: ignore[arg-type]  # short, padded
        cm.Req(primary_local_gid=memoryview(bytes(range(16)))),  # type: ignore[arg-type]
    ]
    for m in odd:
        assert lay.encode(m) == lay._encode_checked(m)
    assert lay.encode(odd[0]) == lay.encode(cm.Req(local_qpn=0x123456, end_to_end_flow_control=1))
    with pytest.raises(InvalidArgument, match="must be an int") as ei:
        lay.encode(cm.Req(local_qpn=True))
    assert ei.value.argument == "req.local_qpn"


def test_layout_code_is_made_at_first_use() -> None:
    """A Layout makes its straight-line values/encode code at the first call of either
    (a process imports every CM layout and uses few), and the same code serves both from
    then on: the first call of each kind gives what the compiled code gives."""
    rep = mad.Layout("t", [mad.u32(("a", 24), ("b", 8)), mad.u16("c"), mad.u32("d")])
    assert rep._vals == rep._values_first and rep._enc == rep._encode_first
    vals = rep.values(bytes(range(10)))
    assert vals == [0x000102, 0x03, 0x0405, 0x06070809]
    made_vals, made_enc = rep._vals, rep._enc
    assert made_vals != rep._values_first and made_enc != rep._encode_first
    assert made_vals(bytes(range(10))) == vals
    other = mad.Layout("t", rep.units)  # its first call is an encode
    obj = type("O", (), {"a": 0x000102, "b": 3, "c": 0x0405, "d": 0x06070809})()
    assert other.encode(obj) == bytes(range(10)) == rep.encode(obj)
    assert other._enc != other._encode_first and other.values(bytes(range(10))) == vals


def test_encode_header_must_match_message() -> None:
    hdr = cm.cm_header(cm.Rep(), tid=1)
    assert cm.encode(cm.Rep(), hdr=hdr) == cm.encode(cm.Rep(), tid=1)
    with pytest.raises(InvalidArgument, match="0x0013 does not match Rtu"):
        cm.encode(cm.Rtu(), hdr=hdr)
    with pytest.raises(InvalidArgument, match="at most 232"):
        mad.build_mad(hdr, bytes(233))


# ------------------------------------------------------------------------- tables
@pytest.mark.iba("12.6")
def test_private_data_sizes_and_enums() -> None:
    # IBA 12.6; ../shared/specs/ib-cm.md §2, column "Private data bytes".
    assert {a.name: n for a, n in cm.PRIVATE_DATA_SIZE.items()} == {
        "REQ": 92, "MRA": 222, "REJ": 148, "REP": 196, "RTU": 224, "DREQ": 220, "DREP": 224,
        "SIDR_REQ": 216, "SIDR_REP": 136, "LAP": 168, "APR": 148}
    assert sorted(cm.MESSAGE_TYPES) == list(range(0x10, 0x1B))
    assert int(cm.RejReason.INVALID_SERVICE_ID) == 8 and int(cm.RejReason.STALE_CONN) == 10
    assert int(cm.RejReason.CONSUMER_DEFINED) == 28
    assert int(cm.RejReason.VENDOR_OPTION_NOT_SUPPORTED) == 35
    assert 34 not in {r.value for r in cm.RejReason}
    assert [r.value for r in cm.RejReason][:33] == list(range(1, 34))
    assert {int(r) for r in cm.ROCE_FORBIDDEN_REJ_REASONS} == {13, 19}  # CA16-11
    assert {int(s) for s in cm.ROCE_FORBIDDEN_APR_STATUS} == {7}  # CA16-13
    assert [s.value for s in cm.AprStatus] == list(range(14))
    assert [s.value for s in cm.SidrStatus] == list(range(6))
    assert (cm.MsgType.REQ, cm.MsgType.REP, cm.MsgType.OTHER) == (0, 1, 2)
    assert cm.time_code_s(20) == pytest.approx(4.294967296)  # rdma_cm's CM timeout ~4.29 s
    with pytest.raises(InvalidArgument):
        cm.time_code_s(32)


def test_mad_header_layout() -> None:
    h = mad.MadHeader(1, 0x07, 2, 0x83, 0x1234, 0x5678, 0x1122334455667788, 0x0010, 0x9ABC,
                      0xDEADBEEF)
    assert h.encode() == bytes.fromhex("01070283123456781122334455667788"
                                       "00109abcdeadbeef")
    assert mad.MadHeader.decode(h.encode()) == h
    assert h.is_response
    with pytest.raises(DecodeError, match="needs 24 bytes, got 10"):
        mad.MadHeader.decode(bytes(10))
    hdr, data = mad.split_mad(mad.build_mad(h, b"abc"))
    assert hdr == h and bytes(data) == b"abc" + bytes(229)


def _body_classes(cls: type[mad.Body]) -> list[type[mad.Body]]:
    out: list[type[mad.Body]] = []
    for sub in cls.__subclasses__():
        if "LAYOUT" in vars(sub):
            out.append(sub)
        out += _body_classes(sub)
    return out


def test_body_fields_follow_their_layout_in_order() -> None:
    """Body.decode hands the layout's values to the dataclass constructor by position, so
    every coded class of the package (CM messages, the MAD and IP CM headers, the iWARP
    Hello and SDP headers) must list its fields in layout order; check_fields refuses a
    class that does not, before any decode could fill the wrong field."""
    import softrdma.wire.iwarp_ib  # noqa: F401  (its Body classes register on import)

    classes = _body_classes(mad.Body)
    names = {c.__name__ for c in classes}
    assert {"Req", "Rep", "Rtu", "Dreq", "Drep", "Rej", "MadHeader", "IpCmHeader",
            "SdpHeader"} <= names
    for c in classes:
        c.check_fields()
        assert tuple(f.name for f in dataclasses.fields(c)) == c.LAYOUT.names  # type: ignore[arg-type]

    @dataclasses.dataclass(slots=True)
    class Swapped(mad.Body):
        b: int = 0
        a: int = 0
        LAYOUT: ClassVar[mad.Layout] = mad.Layout("swapped", [mad.u8("a"), mad.u8("b")])

    with pytest.raises(TypeError, match="in another order"):
        Swapped.check_fields()


def test_decode_fills_each_field_from_its_own_bits() -> None:
    """Decoding puts every value in its own field (the constructor takes them by
    position): distinct values in every field of a REQ and its MAD header come back
    field by field, and re-encode to the same bytes."""
    lay = cm.Req.LAYOUT
    vals: dict[str, Any] = {}
    for i, name in enumerate(lay.names):
        width = lay.widths[name]
        if name in {"private_data"} or width % 8 == 0 and width > 64:
            vals[name] = bytes((i + k) & 0xFF for k in range(width // 8))
        else:
            vals[name] = (i * 0x9E3779B1 + 1) & ((1 << width) - 1)
    req = cm.Req(**vals)
    got = cm.decode(cm.encode(req, tid=0x1122334455667788))
    assert isinstance(got.msg, cm.Req)
    for name in lay.names:
        assert getattr(got.msg, name) == vals[name], name
    assert got.hdr.tid == 0x1122334455667788 and got.hdr.attr_id == cm.Req.ATTR_ID
    assert got.encode() == cm.encode(req, tid=0x1122334455667788)

"""The REQ/REP/RTU/DREQ/DREP softrdma sends, captured from the fabric, as tshark dissects
them: the IP CM fields (``infiniband.cm.req.ip_cm.*``) carry the right values, and
``softrdma pcap-check`` re-encodes every MAD byte for byte (ICRC included)."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest
from harness.cm import Pair, T

from softrdma.ibcm.agent import AcceptParams
from softrdma.ibcm.ipcm import IpCmClient, ip_listen
from softrdma.tools.capture.pcap_check import check_file

HAVE_TSHARK = shutil.which("tshark") is not None


def capture(path: Path) -> tuple[Pair, int, int]:
    p = Pair()
    p.fab.capture(path)
    qb, _ = p.b.qp()
    ip_listen(p.b.new_id(), 7471)
    p.b.on = lambda ev: ev.cm_id.accept(qb, AcceptParams(private_data=b"rep pd")) \
        if ev.type == T.CONNECT_REQUEST else None
    qa, _ = p.a.qp()
    cid = p.a.new_id()
    IpCmClient(cid).connect(qa, "10.9.0.1", "10.9.0.2", 7471, src_port=41234,
                            private_data=b"tshark!")
    p.run(1)
    cid.disconnect()
    p.run(5)
    p.fab.stop_capture()
    return p, qa.qp_num, qb.qp_num


def fields(path: Path, flt: str, *names: str) -> list[list[str]]:
    out = subprocess.run(["tshark", "-r", str(path), "-Y", flt, "-T", "fields",
                          *(x for n in names for x in ("-e", n))],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [line.split("\t") for line in out.splitlines()]


@pytest.mark.iba("12.6")
def test_capture_passes_pcap_check(tmp_path: Path) -> None:
    path = tmp_path / "cm.pcap"
    capture(path)
    out = io.StringIO()
    assert check_file(str(path), out, err=out) == 0, out.getvalue()
    assert out.getvalue().endswith("5 packets, 5 ok, 0 failed\n"
                                   f"{path}: 1 connection followed, 0 inconsistent\n")


@pytest.mark.skipif(not HAVE_TSHARK, reason="tshark not installed")
def test_tshark_decodes_ip_cm_fields(tmp_path: Path) -> None:
    path = tmp_path / "cm.pcap"
    p, qpn_a, qpn_b = capture(path)
    info = fields(path, "infiniband", "_ws.col.Info")
    assert [i[0].strip() for i in info] == ["CM: ConnectRequest", "CM: ConnectReply",
                                           "CM: ReadyToUse", "CM: DisconnectRequest",
                                           "CM: DisconnectReply"]
    (req,) = fields(path, "infiniband.cm.req", "infiniband.cm.req.serviceid.prefix",
                    "infiniband.cm.req.serviceid.protocol", "infiniband.cm.req.serviceid.dport",
                    "infiniband.cm.req.ip_cm.majv", "infiniband.cm.req.ip_cm.minv",
                    "infiniband.cm.req.ip_cm.ipv", "infiniband.cm.req.ip_cm.sport",
                    "infiniband.cm.req.ip_cm.sip4", "infiniband.cm.req.ip_cm.dip4",
                    "infiniband.cm.req.ip_cm.private", "infiniband.cm.req.localqpn",
                    "infiniband.deth.q_key", "infiniband.deth.srcqp")
    assert req[:10] == ["0000000001", "0x06", hex(7471), "0x00", "0x00", "0x04",
                        hex(41234), "10.9.0.1", "10.9.0.2", b"tshark!".hex() + "00" * 49]
    assert int(req[10], 16) == qpn_a
    assert int(req[11], 16) == 0x80010000 and int(req[12], 16) == 1
    (rep,) = fields(path, "infiniband.cm.rep", "infiniband.cm.rep.localqpn",
                    "infiniband.cm.rep.remotecommid")
    assert int(rep[0], 16) == qpn_b
    (rtu,) = fields(path, "infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.localcommid",
                    "infiniband.cm.rtu.remotecommid")
    assert int(rtu[0], 16) == int(rep[1], 16)  # the client's comm ID, echoed by the REP

"""``softrdma ladder``: the ladder diagram and PSN plot of captures that softrdma's own
``pcap=`` support writes (RoCEv2 over a lossy in-memory fabric, RoCEv1, iWARP over real
TCP), read through the project's decoders; the SVG opened in headless Chromium."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from harness import ports
from harness.gso_frames import _batch_frame, _segments
from harness.iwarp_session import _iwarp_session
from harness.trace import rc_pair, rc_send

from softrdma import enums as e
from softrdma import verbs as v
from softrdma.drivers.cm import iwconnect
from softrdma.drivers.links.fabric import Fabric
from softrdma.drivers.runtime.clock import VirtualClock
from softrdma.tools import cli
from softrdma.tools.capture.ladder_draw import MissingMatplotlib, draw_ladder
from softrdma.tools.capture.ladder_events import Ladder, capture_events
from softrdma.wire.pcap import PcapWriter, read_pcap
from softrdma.wire.tcpstream import parse_tcp

mpimg = pytest.importorskip("matplotlib.image")

SEND_MIDDLE = 0x01


def _lossy_send(pcap: Path, roce_ver: str = "2", drop_middle: bool = True) -> None:
    """A 4000-byte SEND (FIRST, 2 MIDDLEs, LAST at PMTU 1024) whose first MIDDLE the
    fabric drops once: the responder NAKs (PSN sequence error), the requester goes back."""
    fab = Fabric(VirtualClock())
    ctxs, sides = rc_pair(fab, ("10.8.0.1", "10.8.0.2"), pcap, roce_ver=roce_ver)
    if drop_middle:
        fab.add_rule(lambda d: SEND_MIDDLE in (d.data[0], d.data[40] if len(d.data) > 40 else -1),
                     "drop", count=1)
    try:
        rc_send(fab, sides, 4000)
    finally:
        for c in ctxs:
            c.close()


def _rows(lad: Ladder, kind: str) -> list[str]:
    return [r.label for r in lad.rows if r.kind == kind]


def test_roce_ladder_nak_retransmission_and_middle_runs(tmp_path: Path) -> None:
    pcap = tmp_path / "lossy.pcap"
    _lossy_send(pcap)
    lad = capture_events(pcap)
    assert len(lad.lanes) == 2
    assert {a for a, _ in lad.lanes} == {"10.8.0.1", "10.8.0.2"}
    assert all(re.fullmatch(r"QP 0x[0-9a-f]+", q) for _, q in lad.lanes), lad.lanes
    naks = _rows(lad, "nak")
    assert naks and all("PSN sequence error" in n and "MSN" in n for n in naks), naks
    assert any(lab.startswith("retransmitted SEND") for lab in _rows(lad, "retrans"))
    # The retransmitted run of MIDDLEs is one arrow with its PSN range.
    assert any(re.search(r"SEND MIDDLE x[23] PSN 0x[0-9a-f]+\.\.0x[0-9a-f]+", r.label)
               and r.count in (2, 3) for r in lad.rows), [r.label for r in lad.rows]
    assert _rows(lad, "ack") and all("MSN 1" in a for a in _rows(lad, "ack"))
    # Every arrow goes between the two lanes, one end each.
    assert all(r.src != r.dst for r in lad.rows)
    (series,) = [v for v in lad.psns.values() if any(p.kind == "nak" for p in v)]
    assert any(p.kind == "retrans" for p in series)


def test_capture_loss_is_a_gap_not_a_retransmission(tmp_path: Path) -> None:
    whole = tmp_path / "whole.pcap"
    _lossy_send(whole, drop_middle=False)
    recs = list(read_pcap(whole))
    cut = tmp_path / "cut.pcap"
    with PcapWriter(cut, recs[0].linktype) as w:
        for r in recs:
            if r.index != 3:  # the second MIDDLE, lost by the capture only
                w.write(r.data, r.ts)
    assert _rows(capture_events(whole), "gap") == []
    lad = capture_events(cut)
    gaps = _rows(lad, "gap")
    assert len(gaps) == 1 and "(1 packet) not in the capture" in gaps[0], gaps
    assert _rows(lad, "retrans") == [] and _rows(lad, "nak") == []


def test_gso_batch_is_split_into_its_packets(tmp_path: Path) -> None:
    """A capture on lo holds a UDP GSO batch as one datagram: its packets are rows."""
    pcap = tmp_path / "gso.pcap"
    with PcapWriter(pcap, 1) as w:
        w.write(_batch_frame(_segments(6, last=300)), 1.0)
    lad = capture_events(pcap)
    assert [r.label for r in lad.rows] == ["SEND FIRST PSN 0x64 len 1024",
                                           "SEND MIDDLE x4 PSN 0x65..0x68",
                                           "SEND LAST PSN 0x69 len 300"]
    assert _rows(lad, "gap") == []


def test_rocev1_ladder(tmp_path: Path) -> None:
    pcap = tmp_path / "v1.pcap"
    _lossy_send(pcap, roce_ver="1")
    lad = capture_events(pcap)
    assert len(lad.lanes) == 2 and _rows(lad, "nak") and _rows(lad, "retrans")


def test_iwarp_ladder_mpa_and_segment_runs(tmp_path: Path) -> None:
    pcap = tmp_path / "iw.pcap"
    _iwarp_session(pcap)
    lad = capture_events(pcap)
    cms = _rows(lad, "cm")
    assert [c.split(" rev")[0] for c in cms] == ["MPA Request", "MPA Reply"], cms
    assert len(lad.lanes) == 2 and all(q.startswith("port ") for _, q in lad.lanes)
    data = _rows(lad, "data")
    assert sum(lab.startswith("Send MSN") for lab in data) == 4, data
    assert any(lab.startswith("RDMA Write STag") for lab in data), data
    # The 300000-byte SEND goes as many DDP segments: one arrow for the run.
    assert any(r.count >= 5 and r.label.startswith("Send MSN 4") for r in lad.rows), lad.rows
    assert _rows(lad, "gap") == []


def test_iwarp_tcp_retransmission_and_capture_loss(tmp_path: Path) -> None:
    """A TCP segment captured twice is a retransmission; one missing from the capture
    is a gap that ends that direction's rows."""
    pcap = tmp_path / "iw.pcap"
    _iwarp_session(pcap)
    recs = list(read_pcap(pcap))
    sends = [r for r in recs if (s := parse_tcp(r.linktype, r.data)) is not None
             and len(s.payload) > 100]
    twice, lost = sends[2], sends[-1]
    out = tmp_path / "edited.pcap"
    with PcapWriter(out, recs[0].linktype) as w:
        for r in recs:
            if r is not lost:
                w.write(r.data, r.ts)
            if r is twice:
                w.write(r.data, r.ts)
    lad = capture_events(out)
    (re_row,) = _rows(lad, "retrans")
    seg = parse_tcp(twice.linktype, twice.data)
    assert seg is not None
    assert re_row.startswith(f"TCP retransmission: {len(seg.payload)} octets at stream "
                             "offset "), re_row
    (gap,) = _rows(lad, "gap")
    assert "octets missing at stream offset" in gap
    assert _rows(capture_events(pcap), "retrans") == []


def test_iwarp_terminate_is_marked(tmp_path: Path) -> None:
    """An RDMA Write to a wrong STag over real TCP: the responder's Terminate (RFC 5040
    §7.2, DDP tagged buffer error) is its own row."""
    pcap = tmp_path / "term.pcap"
    port = ports.free_port()
    ctx = v.Context(transport="iwarp", pcap=pcap)
    try:
        pd = v.PD(ctx)
        cq = v.CQ(ctx, 8)
        qps = [v.QP(pd, v.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                                     cap=v.QPCap(4, 4, 1, 1))) for _ in range(2)]
        mr = v.MR(pd, 8192, int(e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE))
        lst = iwconnect.listen(ctx, port)
        t = threading.Thread(target=lambda: lst.accept(qps[1], b""))
        t.start()
        iwconnect.connect(qps[0], "127.0.0.1", port, b"")
        t.join(30)
        w = v.SendWR(3, None, 1, [v.SGE(mr.addr, 64, mr.lkey)],
                     opcode=int(e.IBV_WR_RDMA_WRITE))
        w.set_wr_rdma(mr.rkey ^ 0x5500, mr.addr + 4096)
        qps[0].post_send(w)
        deadline = time.monotonic() + 60  # until the requester has the Terminate
        while qps[0].query()[0].qp_state not in (e.IBV_QPS_ERR, e.IBV_QPS_SQE):
            assert time.monotonic() < deadline, "no Terminate came back"
            time.sleep(0.01)
        lst.close()
    finally:
        ctx.close()
    lad = capture_events(pcap)
    (term,) = _rows(lad, "term")
    assert term.startswith("Terminate: DDP / Tagged Buffer Error / Invalid STag"), term
    (row,) = [r for r in lad.rows if r.kind == "term"]
    (write,) = [r for r in lad.rows if r.label.startswith("RDMA Write")]
    assert (row.src, row.dst) == (write.dst, write.src)


def _svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]


def _not_blank(png: Path) -> None:
    img = mpimg.imread(str(png))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, img.shape
    assert float(np.var(img[..., :3])) > 1e-3, "the picture is blank"


def test_cli_draws_svg_and_psn_plot(tmp_path: Path) -> None:
    pcap = tmp_path / "lossy.pcap"
    _lossy_send(pcap)
    svg, png = tmp_path / "ladder.svg", tmp_path / "psn.png"
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli.main(["ladder", str(pcap), "-o", str(svg), "--plot", str(png)])
    assert rc == 0, out.getvalue()
    texts = _svg_texts(svg)
    assert "10.8.0.1" in texts and "10.8.0.2" in texts, texts
    assert any("NAK PSN sequence error" in t for t in texts), texts
    assert any(t.startswith("retransmitted SEND") for t in texts), texts
    _not_blank(png)
    # Without -o the rows are printed.
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["ladder", str(pcap)]) == 0
    assert "[nak] NAK PSN sequence error" in out.getvalue()


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    bogus = tmp_path / "not.pcap"
    bogus.write_bytes(b"hello, not a capture")
    assert cli.main(["ladder", str(bogus), "-o", str(tmp_path / "x.svg")]) == 1
    err = capsys.readouterr().err
    assert "not a capture" in err and "Traceback" not in err
    assert cli.main(["ladder", str(tmp_path / "missing.pcap")]) == 1
    assert "No such file" in capsys.readouterr().err
    empty = tmp_path / "empty.pcap"
    PcapWriter(empty).close()
    assert cli.main(["ladder", str(empty)]) == 0
    assert "note: no RoCE or iWARP traffic in 0 frames" in capsys.readouterr().out
    pcap = tmp_path / "ok.pcap"
    _lossy_send(pcap, drop_middle=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingMatplotlib, match="'matplotlib'"):
        draw_ladder(capture_events(pcap), tmp_path / "y.svg")
    assert cli.main(["ladder", str(pcap), "-o", str(tmp_path / "y.svg")]) == 1
    assert "needs the Python package 'matplotlib'" in capsys.readouterr().err


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed (.ci/run installs it: apt-get install chromium)")


def test_svg_renders_in_headless_chromium(tmp_path: Path) -> None:
    """Open the SVG as a person would, in a browser, and look at the screenshot."""
    browser = _chromium()
    pcap = tmp_path / "lossy.pcap"
    _lossy_send(pcap)
    svg = tmp_path / "ladder.svg"
    assert cli.main(["ladder", str(pcap), "-o", str(svg)]) == 0
    texts = _svg_texts(svg)
    lanes = [a for a, b in zip(texts, texts[1:], strict=False)
             if re.fullmatch(r"10\.8\.0\.[12]", a) and re.fullmatch(r"QP 0x[0-9a-f]+", b)]
    assert sorted(lanes) == ["10.8.0.1", "10.8.0.2"], texts
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1200,900", svg.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists(), "chromium wrote no screenshot"
    _not_blank(shot)
    img = mpimg.imread(str(shot))
    # The arrows' colours are on the page: the NAK's red and the ACK's green.
    rgb = (img[..., :3] * 255).astype(int)
    red = ((rgb[..., 0] > 180) & (rgb[..., 1] < 80) & (rgb[..., 2] < 80)).sum()
    green = ((rgb[..., 1] > 110) & (rgb[..., 0] < 90) & (rgb[..., 2] < 90)).sum()
    assert red > 20 and green > 20, (red, green)

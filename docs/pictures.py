"""Generate the pictures of the docs (docs/images/) from real runs of softrdma.

    python docs/pictures.py [OUTDIR]        # default: docs/images next to this script

- ``rping-ladder.svg``: ``softrdma rping`` server and client as two processes on the RoCE
  device on ``lo`` (a private state directory), the client run with ``--pcap``; the
  ladder of that capture (``softrdma ladder``).
- ``lossy-ladder.svg``, ``lossy-psn.png``: ``examples/nic_lossy_fabric.py`` (a 64 KiB
  RDMA WRITE and a SEND over a fabric that drops and reorders, virtual clock, seed 7):
  NAKs, go-back-N retransmissions; its ladder and its PSN plot.
- ``processes.svg``: the block diagram of docs/design.md "One packet's path" and
  "Processes": processes, devd, the reuseport group and its BPF program.

``tests/docs/test_pictures.py`` runs this script and compares what it makes with the files
checked in. Needs matplotlib (``pip install 'softrdma[pictures]'``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from softrdma.drivers.host.registry import Registry
from softrdma.tools.capture.ladder_draw import draw_ladder, draw_psn_plot, pyplot, save
from softrdma.tools.capture.ladder_events import capture_events

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "pictures_lo"


def _rping_capture(work: Path) -> tuple[Path, int]:
    """Run rping (server and client processes, 3 pings) with the client's ``--pcap``;
    returns the capture and the device's UDP port (a free one, not 4791, so that the
    device does not collide with others on the host)."""
    state = work / "state"
    reg = Registry(state)
    reg.delete("softrdma_lo")
    udp_port = random.randrange(20000, 60000)
    reg.add(DEVICE, "lo", "roce", udp_port)
    env = dict(os.environ, SOFTRDMA_STATE_DIR=str(state), SOFTRDMA_SHARED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"),
                                                      os.environ.get("PYTHONPATH")) if p))
    pcap = work / "rping.pcap"
    port = str(random.randrange(20000, 60000))
    cmd = [sys.executable, "-m", "softrdma"]
    server = subprocess.Popen([*cmd, "rping", "-s", "-a", "127.0.0.1", "-p", port, "-C", "3",
                               "--timeout", "30"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # until the server listens
            if pcap.exists():
                pcap.unlink()
            client = subprocess.run([*cmd, "--pcap", str(pcap), "rping", "-c", "-a",
                                     "127.0.0.1", "-p", port, "-C", "3", "--timeout", "30"],
                                    env=env, capture_output=True, text=True, timeout=90)
            if client.returncode == 0:
                break
            if "REJECTED" not in client.stderr or time.monotonic() > deadline:
                raise RuntimeError(f"rping client failed: {client.stderr.strip()}")
            time.sleep(0.25)
        server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    return pcap, udp_port


def _lossy_capture(work: Path) -> Path:
    spec = importlib.util.spec_from_file_location("nic_lossy_fabric",
                                                  ROOT / "examples" / "nic_lossy_fabric.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pcap = work / "lossy.pcap"
    with contextlib.redirect_stdout(io.StringIO()):
        if mod.run(0.05, 0.02, 7, pcap) != 0:
            raise RuntimeError("examples/nic_lossy_fabric.py failed")
    return pcap


def _box(ax: Any, x: float, y: float, w: float, h: float, text: str, color: str) -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02",
                                facecolor=color, edgecolor="#333333"))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)


def _arrow(ax: Any, a: tuple[float, float], b: tuple[float, float], text: str = "",
           style: str = "-|>", color: str = "#333333") -> None:
    ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": style, "color": color})
    if text:
        ax.text((a[0] + b[0]) / 2 + 0.1, (a[1] + b[1]) / 2, text, fontsize=7,
                color=color, va="center")


def processes_diagram(path: Path) -> None:
    """docs/design.md's processes, devd and reuseport/BPF delivery, as boxes and arrows."""
    plt = pyplot()
    fig = plt.figure(figsize=(10, 7.4))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 7.4)
    ax.axis("off")
    app = "#e8f0fb"
    for i, name in enumerate(("process A", "process B")):
        x = 0.3 + i * 3.3
        _box(ax, x, 4.3, 3.0, 1.5, f"{name}\nverbs / rdma_cm API\ntransport engine (its QPs)\n"
             "progress thread, own UDP socket", app)
    _box(ax, 7.0, 4.3, 2.7, 1.5, "devd (one per device)\nQPN allocation, QP1 / CM\n"
         "multicast, unknown QPNs\nport counters", "#fdf1dc")
    _box(ax, 0.3, 2.2, 9.4, 1.2, "kernel: SO_REUSEPORT group of (ip, 4791)  +  devd's classic "
         "BPF program (SO_ATTACH_REUSEPORT_CBPF)\nBTH DestQP (UDP payload bytes 5-7) -> the "
         "owning process's socket;  QP1, multicast, unknown QPNs -> devd's socket", "#eeeeee")
    _box(ax, 0.3, 0.3, 9.4, 0.9, "wire: Eth | IPv4/IPv6 | UDP 4791 | BTH ... payload | ICRC",
         "#ffffff")
    _arrow(ax, (5.0, 1.2), (5.0, 2.2), "datagrams", style="<|-|>")
    for x in (1.8, 5.1):
        _arrow(ax, (x, 3.4), (x, 4.3), "sends from its own socket;\nreceives its QPs' datagrams",
               style="<|-|>")
    _arrow(ax, (8.35, 3.4), (8.35, 4.3), "QP1, multicast,\nunknown QPNs")
    for x in (1.8, 5.1):
        ax.annotate("", xy=(x, 5.8), xytext=(8.35, 5.8),
                    arrowprops={"arrowstyle": "<|-|>", "color": "#b05000",
                                "connectionstyle": "arc3,rad=0.25"})
    ax.text(6.7, 6.25, "control, QPNs, CM routing (Unix SEQPACKET)", fontsize=7,
            color="#b05000", ha="center")
    ax.text(5.0, 7.2, "softrdma on one host: shared device, direct delivery "
            "(docs/design.md, Processes)", ha="center", fontsize=10, fontweight="bold")
    save(fig, path)


def generate(out: Path) -> list[Path]:
    """Make every picture into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory(prefix="softrdma-pictures-") as d:
        work = Path(d)
        rping, udp_port = _rping_capture(work)
        draw_ladder(capture_events(rping, (udp_port,)), out / "rping-ladder.svg",
                    "softrdma rping -C 3 over RoCEv2 on lo (client's --pcap)")
        made.append(out / "rping-ladder.svg")
        lossy = capture_events(_lossy_capture(work), max_rows=160)
        draw_ladder(lossy, out / "lossy-ladder.svg",
                    "examples/nic_lossy_fabric.py: NAK and go-back-N (drop 5%, reorder 2%, seed 7)")
        draw_psn_plot(lossy, out / "lossy-psn.png", "examples/nic_lossy_fabric.py: PSN against "
                      "time")
        made += [out / "lossy-ladder.svg", out / "lossy-psn.png"]
    processes_diagram(out / "processes.svg")
    made.append(out / "processes.svg")
    return made


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "images"
    for p in generate(target):
        print(p)

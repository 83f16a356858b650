"""``softrdma run``: librdmacm's SRQ calls (``rdma_create_srq(_ex)``,
``rdma_destroy_srq``), ``rdma_create_qp_ex`` and ``rdma_notify``, with librdmacm's
defaults (the PD from ``id->pd``, CQs and channels made for the id, the QP on
``id->srq``, ``rdma_post_recv`` to the SRQ), on RoCE and iWARP (tests/capi/cm_srq.c)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.capi import cm_device, compile_c, preloaded, tcp_port
from harness.capi_pairs import pair

from softrdma.verbs.device import IWARP_LOOPBACK


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return cm_device("capisrq", None, tmp_path, monkeypatch)


@pytest.mark.parametrize("transport", ["roce", "iwarp"])
def test_srq_qp_ex_and_notify_through_rdma_cm(device: str, transport: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's two receives go through id->srq (wr_ids 40, 41, the data and the
    QP number checked); the client's two SENDs through the ibv_wr_* API of a QP made by
    rdma_create_qp_ex; rdma_notify is EINVAL before the accept and EISCONN after it on
    RoCE, 0 on iWARP (as Linux cma.c, which passes it to the IB CM only). The client
    disconnects once the server's "done" came: its DREQ, earlier, could reach the server
    between the accept and those checks (beside busy loops: EINVAL from TIMEWAIT)."""
    if transport == "iwarp":
        monkeypatch.setenv("SOFTRDMA_CAPI_DEVICE", IWARP_LOOPBACK)
    exe = compile_c(tmp_path, "cm_srq", "-lrdmacm", "-libverbs")
    port = str(tcp_port())
    (sout, serr), (cout, cerr) = pair(preloaded(str(exe), "server", port),
                                      preloaded(str(exe), "client", port))
    assert sout.splitlines() == ["listening", "recv 40 14 srq message 0",
                                 "recv 41 14 srq message 1", f"notify {transport}", "ok"], \
        (sout, serr)
    assert cout.splitlines() == ["sent 70 srq message 0", "sent 71 srq message 1",
                                 "recv done", "ok"], \
        (cout, cerr)

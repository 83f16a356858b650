"""What the suite checks on both sides after each case (pure: the runner feeds it text).

Guest: rxe's hardware counters (``rdma statistic show link rxe0/1``, the same values as
``/sys/class/infiniband/rxe0/ports/1/hw_counters``) before and after the case, and
``rdma res show qp`` after it. softrdma: the tool's exit status and output, and its
device daemon's counters (``softrdma.drivers.devd.daemon.STAT_NAMES``) before and after.

Rules, each a named finding:

* ``error completion``: rxe counted ``retry_exceeded_err`` / ``retry_rnr_exceeded_err`` /
  ``send_err`` (the QP went to the error state); a tool printed a failed completion;
* ``retransmission storm``: rxe's ``completer_retry_err`` (its retransmit timer fired),
  ``rcvd_seq_err`` (NAK-sequence received), ``duplicate_request`` and
  ``out_of_seq_request`` (it received a PSN it had seen / was not expecting) together
  exceed :data:`STORM_MIN` and :data:`STORM_FRACTION` of the packets it received, or
  softrdma's devd dropped datagrams (``unknown_qpn``, ``malformed``, ``client_full``)
  beyond :data:`STORM_MIN`;
* ``stuck QP``: a user QP is still listed in the guest once the tools have exited;
* ``MPA CRC``: in a case where softrdma asks for the MPA CRC, the capture's MPA Reply
  lacks C, an FPDU lacks its CRC, tshark finds a bad one, or FPDUs went only one way
  (:func:`mpa_crc_findings`, fed tshark's MPA fields).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["guest_findings", "softrdma_findings", "mpa_crc_findings", "TSHARK_MPA_FIELDS", "STORM_MIN", "STORM_FRACTION",
           "ERROR_COUNTERS", "RETRY_COUNTERS", "DEVD_DROP_COUNTERS"]

ERROR_COUNTERS = ("retry_exceeded_err", "retry_rnr_exceeded_err", "send_err")
RETRY_COUNTERS = ("completer_retry_err", "rcvd_seq_err", "duplicate_request",
                  "out_of_seq_request")
DEVD_DROP_COUNTERS = ("unknown_qpn", "malformed", "client_full")
# The emulated (TCG) guest's timers jump when the loaded host deschedules it, so rxe's
# retransmit timer sometimes fires while the ACK is on its way: a few percent of retries
# are seen in clean runs (write_lat: 13 retries in 201 packets). A divergence makes every
# request retry (up to its retry count), as many retries as requests or more.
STORM_MIN = 16
STORM_FRACTION = 0.2


def guest_findings(delta: Mapping[str, int], leftover_qps: list[str]) -> list[str]:
    """Findings from rxe's counter changes over a case and the QPs left afterwards."""
    out: list[str] = []
    errs = {k: delta[k] for k in ERROR_COUNTERS if delta.get(k)}
    if errs:
        out.append("error completion in the guest: "
                   + ", ".join(f"{k} +{v}" for k, v in errs.items()))
    retries = {k: delta[k] for k in RETRY_COUNTERS if delta.get(k)}
    total = sum(retries.values())
    rcvd = delta.get("rcvd_pkts", 0)
    if total > STORM_MIN and total > STORM_FRACTION * max(rcvd, 1):
        out.append(f"retransmission storm in the guest ({total} of {rcvd} packets: "
                   + ", ".join(f"{k} +{v}" for k, v in retries.items()) + ")")
    if leftover_qps:
        out.append(f"stuck QP in the guest after the case: {leftover_qps[0]}"
                   + (f" (+{len(leftover_qps) - 1} more)" if len(leftover_qps) > 1 else ""))
    return out


def softrdma_findings(delta: Mapping[str, int]) -> list[str]:
    """Findings from softrdma's devd counter changes over a case."""
    drops = {k: delta[k] for k in DEVD_DROP_COUNTERS if delta.get(k)}
    if sum(drops.values()) > STORM_MIN:
        return ["softrdma's devd dropped datagrams: "
                + ", ".join(f"{k} +{v}" for k, v in drops.items())]
    return []


#: tshark ``-T fields`` columns :func:`mpa_crc_findings` reads, one row per MPA frame or
#: FPDU-carrying segment: the sender (its TCP port), Request/Reply markers, the C flag, the CRC check
TSHARK_MPA_FIELDS = ("tcp.srcport", "iwarp_mpa.key.req", "iwarp_mpa.key.rep", "iwarp_mpa.crc_flag",
                     "iwarp_mpa.crc_check")


def mpa_crc_findings(rows: list[list[str]], bad_crc: int) -> list[str]:
    """Findings for a case that asked for the MPA CRC (RFC 5044 §7.1): ``rows`` are
    tshark's :data:`TSHARK_MPA_FIELDS` of each MPA frame and FPDU segment, ``bad_crc`` the
    number of "Bad CRC32" verdicts in its ``-V`` output."""
    out: list[str] = []
    reply = [r for r in rows if len(r) > 3 and r[2]]
    if not reply:
        out.append("MPA CRC: no MPA Reply in the capture")
    elif not all(r[3] in ("1", "True") for r in reply):
        out.append("MPA CRC: the MPA Reply does not set C (CRC not in use)")
    fpdus = [r for r in rows if len(r) > 4 and not r[1] and not r[2]]
    senders = {r[0] for r in fpdus}
    if len(senders) < 2:
        out.append(f"MPA CRC: FPDUs from {len(senders)} side(s) only")
    without = sorted({r[0] for r in fpdus if not r[4]})
    if without:
        out.append("MPA CRC: FPDUs without a CRC from " + ", ".join(without))
    if bad_crc:
        out.append(f"MPA CRC: tshark found {bad_crc} bad CRC32c")
    return out

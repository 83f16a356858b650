"""The REJ devd answers on its own, and when it may (``softrdma.drivers.devd.daemon``).

A REQ nobody listens for is answered with REJ reason 8, Invalid Service ID (a SIDR_REQ:
SIDR_REP status 1), as a CM without a listener would (IBA 12.6.7, A11 CA11-8); a DREQ
for a connection of a process that has gone with DREP (Linux ``cm_issue_drep``). An answer
goes to the source address of the REQ, so
before answering the daemon makes sure the REQ is one a real CM sent, and bounds what it
sends to any one address (the daemon must not become a reflector):

* the DETH Q_Key must be QP1's, ``GSI_QKEY`` 0x80010000 (IBA 13.5.1, 10.2.4.1): QP1
  drops any other, as the listening process's QP1 does (checked first);
* the ICRC must be correct (RoCEv2, IBA A17.8; for IPv4 the Identification the socket
  does not show is recovered, :func:`softrdma.wire.roce.recover_ipv4_id`);
* the source must be a unicast address (not unspecified, multicast or broadcast), and
  the REQ's Primary Local Port GID must be that address (A11: the active side's GID);
* at most :data:`REJ_BURST` answers per source, refilled at :data:`REJ_PER_SECOND`
  (a token bucket per source address, :class:`~softrdma.ibcm.ratelimit.RejLimiter`,
  shared with the CM agent).
"""

from __future__ import annotations

import ipaddress

from softrdma.drivers.links.link import Datagram
from softrdma.errors import SoftRdmaError
from softrdma.ibcm.ratelimit import REJ_BURST, REJ_PER_SECOND, RejLimiter
from softrdma.wire import cm as wcm
from softrdma.wire import ib as wib
from softrdma.wire.gid import ip_to_gid
from softrdma.wire.mad import GSI_QKEY
from softrdma.wire.opcodes import BTH_SIZE, UD_SEND_ONLY
from softrdma.wire.roce import icrc_ok_udp, icrc_v1, recover_ipv4_id
from softrdma.wire.rocev1 import LOOPBACK_GID

__all__ = ["REJ_BURST", "REJ_PER_SECOND", "RejLimiter", "answer_for", "gsi_qkey_ok",
           "sane_request"]

MAD_OFF = BTH_SIZE + 8  # BTH + DETH, then the 256-byte MAD
MAD_SIZE = 256
QPN_GSI = 1
ICRC_SIZE = 4


def _unicast(ip: bytes) -> bool:
    addr = ipaddress.ip_address(ip)
    return not (addr.is_unspecified or addr.is_multicast or ip == b"\xff\xff\xff\xff")


def gsi_qkey_ok(data: bytes | bytearray | memoryview) -> bool:
    """Whether the DETH of ``data`` (BTH .. ICRC) carries QP1's Q_Key ``GSI_QKEY``
    (IBA 13.5.1: QP1's Q_Key is 0x80010000; a UD QP drops a datagram whose Q_Key is not
    its own, IBA 10.2.4.1)."""
    return (len(data) >= MAD_OFF
            and int.from_bytes(data[BTH_SIZE:BTH_SIZE + 4], "big") == GSI_QKEY)


def sane_request(dg: Datagram, dport: int) -> bool:
    """Whether ``dg`` (BTH .. ICRC) carries QP1's Q_Key, a correct ICRC and a unicast
    source address.

    A RoCEv1 frame (``dg.grh``, Annex A16): the RoCEv1 ICRC over its GRH, and a unicast
    SGID other than the loopback GID (A16.7.2)."""
    data = dg.data
    if not gsi_qkey_ok(data) or not _unicast(dg.src_ip):
        return False
    if dg.grh:
        return (len(data) > ICRC_SIZE and dg.src_ip != LOOPBACK_GID
                and icrc_v1(dg.grh, (data[:-ICRC_SIZE],)) == data[-ICRC_SIZE:])
    if len(dg.src_ip) == 4:
        return recover_ipv4_id(dg.src_ip, dg.dst_ip, dg.sport, dport, data) is not None
    return icrc_ok_udp(dg.src_ip, dg.dst_ip, dg.sport, dport, data)


def answer_for(dg: Datagram) -> tuple[bytes, bytes] | None:
    """The (BTH+DETH, MAD) answering an unlistened REQ / SIDR_REQ, or a DREQ for a comm
    ID nobody holds, in ``dg``; None when it is not one (or a REQ names another sender in
    its Primary Local Port GID)."""
    try:
        got = wcm.decode(bytes(dg.data[MAD_OFF:MAD_OFF + MAD_SIZE]))
    except SoftRdmaError:
        return None
    msg = got.msg
    if isinstance(msg, wcm.Req):
        if bytes(msg.primary_local_gid) != ip_to_gid(dg.src_ip):
            return None
        ans: wcm.CmMessage = wcm.Rej(
            local_comm_id=0, remote_comm_id=msg.local_comm_id,
            message_rejected=wcm.MsgType.REQ, reason=wcm.RejReason.INVALID_SERVICE_ID)
    elif isinstance(msg, wcm.SidrReq):
        ans = wcm.SidrRep(request_id=msg.request_id, status=wcm.SidrStatus.UNSUPPORTED,
                          service_id=msg.service_id)
    elif isinstance(msg, wcm.Dreq):
        # a DREQ for a connection whose process has gone: DREP, as Linux's cm_issue_drep
        # answers a DREQ naming no connection (the peer leaves at once, not after its
        # DREQ retries; IBA 12.9.7: the DREQ's sender goes to TimeWait either way)
        ans = wcm.Drep(local_comm_id=msg.remote_comm_id, remote_comm_id=msg.local_comm_id)
    else:
        return None
    mad = wcm.encode(ans, tid=got.hdr.tid)
    src_qp = int.from_bytes(dg.data[BTH_SIZE + 5:BTH_SIZE + 8], "big")  # DETH SrcQP
    hdr = wib.bth(UD_SEND_ONLY, 0xFFFF, src_qp, 0) + wib.deth(GSI_QKEY, QPN_GSI)
    return hdr, mad

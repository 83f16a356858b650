"""RoCE encapsulation: RoCEv2 (IPv4/IPv6 + UDP 4791), RoCEv1 (EtherType 0x8915 + GRH), ICRC.

Implements IBA Annex A16 and Annex A17. This module holds the UDP source-port conventions
of Linux (§1: :func:`flow_label_from_qpns`, :func:`udp_sport_from_flow_label`,
:func:`rxe_udp_sport`) and re-exports, as one facade for its many callers:

* the IP and UDP headers (:mod:`softrdma.wire.ipudp`: :func:`ipv4_header`,
  :func:`ipv6_header`, :func:`udp_header`, :func:`udp_checksum`);
* the ICRC (§2, IBA 7.8.1; :mod:`softrdma.wire.icrc`): :func:`icrc` (RoCEv2 over IPv4 or
  IPv6), :func:`icrc_v1` (RoCEv1);
* the ICRC from a UDP socket (:mod:`softrdma.wire.icrc_udp`: :func:`udp_send_icrc`,
  :func:`icrc_ok_udp`, the GSO/GRO runs);
* the full-frame codec for captures (:mod:`softrdma.wire.roce_frame`: :func:`parse_frame`,
  :func:`build_frame`, :func:`frame_icrc_ok`).
"""

from __future__ import annotations

from .gid import ipv4_mapped, unmap_ipv4
from .icrc import icrc, icrc_v1
from .icrc_udp import (
    GSO_IDS,
    icrc_ok_udp,
    icrc_ok_udp_id,
    icrc_ok_udp_run,
    recover_ipv4_id,
    udp_gso_iov,
    udp_payload_with_icrc,
    udp_run_bodies,
    udp_send_icrc,
)
from .ipudp import (
    ETH_P_IP,
    ETH_P_IPV6,
    IB_GRH_FLOWLABEL_MASK,
    IPPROTO_UDP,
    ROCE_V2_UDP_PORT,
    inet_checksum,
    ipv4_header,
    ipv6_header,
    udp_checksum,
    udp_header,
)
from .roce_frame import (
    RoceFrame,
    build_frame,
    frame_icrc,
    frame_icrc_ok,
    icrc_ok_frame,
    parse_frame,
)
from .rocev1 import ETH_P_ROCE_V1 as ROCE_V1_ETHERTYPE
from .rocev1 import GRH_NEXT_HEADER_BTH

__all__ = [
    "ROCE_V2_UDP_PORT", "ROCE_V1_ETHERTYPE", "RXE_ROCE_V2_SPORT",
    "GRH_NEXT_HEADER_BTH", "IB_GRH_FLOWLABEL_MASK", "ETH_P_IP", "ETH_P_IPV6", "IPPROTO_UDP",
    "flow_label_from_qpns", "udp_sport_from_flow_label", "rxe_udp_sport",
    "ipv4_header", "ipv6_header", "udp_header", "inet_checksum", "udp_checksum",
    "icrc", "icrc_v1", "icrc_ok_udp", "icrc_ok_udp_id", "icrc_ok_udp_run", "udp_send_icrc",
    "udp_payload_with_icrc", "udp_gso_iov", "udp_run_bodies", "GSO_IDS",
    "RoceFrame", "parse_frame", "build_frame", "frame_icrc", "frame_icrc_ok", "icrc_ok_frame",
    "ipv4_mapped", "unmap_ipv4", "recover_ipv4_id",
]

RXE_ROCE_V2_SPORT = 0xC000  # rxe.h; also IB_ROCE_UDP_ENCAP_VALID_PORT_MIN (ib_verbs.h)


# --------------------------------------------------------------------------- ports
def flow_label_from_qpns(lqpn: int, rqpn: int) -> int:
    """Symmetric 20-bit flow label of a QP pair (ib_verbs.h ``rdma_calc_flow_label``).

    ``v = lqpn * rqpn`` (64-bit), ``v ^= v >> 20``, ``v ^= v >> 40``, low 20 bits.
    """
    v = ((lqpn & 0xFFFFFFFF) * (rqpn & 0xFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
    v ^= v >> 20
    v ^= v >> 40
    return v & IB_GRH_FLOWLABEL_MASK


def udp_sport_from_flow_label(fl: int) -> int:
    """RoCEv2 UDP source port from a flow label (ib_verbs.h ``rdma_flow_label_to_udp_sport``).

    ``(fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)``, ORed with 0xC000.
    """
    lo = fl & 0x03FFF
    hi = fl & 0xFC000
    return ((lo ^ (hi >> 14)) | RXE_ROCE_V2_SPORT) & 0xFFFF


def rxe_udp_sport(lqpn: int, rqpn: int | None = None, flow_label: int = 0) -> int:
    """The RoCEv2 UDP source port rxe uses for QP ``lqpn``.

    At creation (no peer, ``rqpn`` None; the port a UD QP, never given an address vector,
    keeps): rxe_qp.c ``rxe_qp_init_req``, ``0xC000 + (hash_32(qpn, 14) & 0x3FFF)`` with
    ``hash_32(v, b) = (v * 0x61C88647 mod 2^32) >> (32 - b)`` (linux/hash.h).

    A connected QP after ``modify_qp`` with a GRH address (peer ``rqpn``): rxe_verbs.c
    ``rxe_modify_qp`` -> ib_verbs.h ``rdma_get_udp_sport``: the AH flow label, or if it
    is 0 the label computed from the two QPNs, mapped to a port.
    """
    if rqpn is None:
        return RXE_ROCE_V2_SPORT + ((((lqpn * 0x61C88647) & 0xFFFFFFFF) >> 18) & 0x3FFF)
    fl = flow_label or flow_label_from_qpns(lqpn, rqpn)
    return udp_sport_from_flow_label(fl)

"""The interop cases where softrdma asks for the MPA CRC (``+mpa_crc``) and their capture
check (:func:`softrdma.interop.checks.mpa_crc_findings`); the live run is ``softrdma
interop --only mpa_crc`` in the lab."""

from __future__ import annotations

from softrdma.interop import cases as C
from softrdma.interop import checks

EP = C.Endpoint("10.50.0.14", "10.50.0.24", softrdma="python3 -m softrdma")
REQ, REP = "4d504120494420526571204672616d65", "4d504120494420526570204672616d65"


def test_cases_ask_for_crc_with_softrdma_as_initiator() -> None:
    crc = C.select(C.all_cases(), "mpa_crc")
    assert [c.name for c in crc] == ["rping+mpa_crc/siw/s64", "rping+mpa_crc/siw/s3000",
                                     "write_bw-R+mpa_crc/siw/s4096",
                                     "rping+mpa_crc/siw-crc/s64"]
    assert all(c.mpa_crc and c.fabric in ("siw", "siw-crc") for c in crc)
    # the earlier patterns still select only the plain cases
    assert not any(c.mpa_crc for c in C.select(C.all_cases(), "rping/siw*"))
    fabrics = [c.fabric for c in C.all_cases()]
    assert fabrics == sorted(fabrics, key=fabrics.index)  # one guest setup per link
    for case in crc:
        client = C.commands(case, "softrdma-client", EP)  # softrdma = MPA initiator
        assert client.server_on_guest and "SOFTRDMA" not in client.server
        assert client.client.startswith("env SOFTRDMA_MPA_CRC=1 python3 -m softrdma ")
        server = C.commands(case, "softrdma-server", EP)
        assert server.server.startswith("env SOFTRDMA_MPA_CRC=1 python3 -m softrdma ")
    plain = next(c for c in C.all_cases() if c.name == "rping/siw/s64")
    assert "SOFTRDMA_MPA_CRC" not in C.commands(plain, "softrdma-client", EP).client


def _rows(reply_c: str, crcs: dict[str, list[str]]) -> list[list[str]]:
    rows = [["50410", REQ, "", "1", ""], ["7174", "", REP, reply_c, ""]]
    for port, vals in crcs.items():
        rows += [[port, "", "", "", v] for v in vals]
    return rows


def test_crc_findings() -> None:
    good = _rows("1", {"50410": ["0x2da7e96a"], "7174": ["0xd777c1de", "0x6bac0f18"]})
    assert checks.mpa_crc_findings(good, 0) == []
    assert checks.mpa_crc_findings(good, 2) == ["MPA CRC: tshark found 2 bad CRC32c"]
    off = checks.mpa_crc_findings(_rows("0", {"50410": [""], "7174": [""]}), 0)
    assert off == ["MPA CRC: the MPA Reply does not set C (CRC not in use)",
                   "MPA CRC: FPDUs without a CRC from 50410, 7174"]
    one_way = checks.mpa_crc_findings(_rows("1", {"50410": ["0x1"]}), 0)
    assert one_way == ["MPA CRC: FPDUs from 1 side(s) only"]
    assert checks.mpa_crc_findings([], 0)[0] == "MPA CRC: no MPA Reply in the capture"

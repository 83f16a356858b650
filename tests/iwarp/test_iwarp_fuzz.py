"""Fuzzing the iWARP receive path and decoders with hypothesis.

Random bytes and mutated valid streams (bytes flipped, cut, inserted, dropped; delivered
in random chunks) go into the engine's receive path in every phase (MPA Request, MPA
Reply, full operation with CRC/markers on and off). Properties: no exception escapes;
the engine never needed its last-resort catch-all (``internal_errors == 0``: every
malformed input is detected by a real check); after the peer's EOF the QP is in ERR
and every posted work request has completed exactly once (no hung QP); whatever the
engine sent back decodes. The wire decoders raise only DecodeError on garbage.
"""

from __future__ import annotations

from harness.iwarp import Side
from harness.iwarp_sut import MUTATIONS, Sut, end_setup, mutated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softrdma.errors import DecodeError
from softrdma.iwarp.engine import ConnState, IwarpConn
from softrdma.wire import ddp, mpa

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


cuts_st = st.lists(st.integers(1, 200), max_size=12)


@FUZZ
@given(crc=st.booleans(), markers=st.booleans(), data=st.binary(max_size=600), cuts=cuts_st)
def test_random_bytes_in_full_operation(crc: bool, markers: bool, data: bytes,
                                        cuts: list[int]) -> None:
    sut = Sut(crc, markers)
    sut.feed(data, cuts)
    sut.finish()


mutation = st.tuples(st.sampled_from(MUTATIONS),
                     st.integers(0, 10**6), st.integers(0, 255))


@FUZZ
@given(crc=st.booleans(), markers=st.booleans(), muts=st.lists(mutation, min_size=1, max_size=4),
       cuts=cuts_st)
def test_mutated_valid_streams(crc: bool, markers: bool, muts: list[tuple[str, int, int]],
                               cuts: list[int]) -> None:
    sut = Sut(crc, markers)
    sut.feed(mutated(sut.stream, muts), cuts)
    sut.finish()


@FUZZ
@given(data=st.binary(max_size=300), initiator=st.booleans(), cuts=cuts_st)
def test_random_bytes_during_mpa_setup(data: bytes, initiator: bool, cuts: list[int]) -> None:
    s = Side("s")
    s.post_recv(s.mr(64), 64, wr_id=1)
    conn = IwarpConn(s.dev, initiator=initiator, qp=s.qp if initiator else None)
    s.conn = conn
    head = mpa.KEY_REP if initiator else mpa.KEY_REQ
    for blob in (data, head + data):
        i = 0
        for c in cuts:
            conn.receive(blob[i:i + c])
            i += c
        conn.receive(blob[i:])
        if conn.state == ConnState.ACCEPT_WAIT:
            conn.accept(s.qp)
        conn.pull_tx()
    end_setup(s, initiator)


@FUZZ
@given(data=st.binary(max_size=120))
def test_wire_decoders_raise_only_decode_error(data: bytes) -> None:
    for fn in (ddp.decode_segment, ddp.decode_ddp, ddp.Terminate.decode,
               ddp.ReadRequest.decode, mpa.decode_mpa_frame):
        try:
            fn(data)
        except DecodeError:
            pass
    p = mpa.MpaFrameParser()
    try:
        p.feed(data)
    except DecodeError:
        pass
    for crc in (False, True):
        for markers in (False, True):
            try:
                mpa.FpduDeframer(crc=crc, markers=markers).feed(data)
            except DecodeError:
                pass

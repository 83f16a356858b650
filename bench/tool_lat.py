"""The command-line tools' latency, as a user runs them (issue 26, "the tools are as fast
as the bench").

Each figure runs a tool's server and client as two processes on the loopback (the
default device, as ``softrdma rc-pingpong`` without ``-d`` opens it) and reads the
client's own report:

* ``rc_pingpong_us``: ``softrdma rc-pingpong -s 64 -n N``: microseconds per iteration (one
  round trip), as the tool prints it;
* ``perftest_lat_us``: ``softrdma send-lat`` / ``write-lat -s 64 -n N --json``: the typical
  latency (perftest's ``t_typical``, half a round trip), times two: a round trip.

``bench/run.py`` sets them beside the bench's own ping-pong round trip (two times
``roce_bench.rc_send_lat``) measured in the same run. Both tools wait, each iteration,
for their SEND's completion (the peer's ACK) as well as for the answer, as
``ibv_rc_pingpong`` and perftest do; the bench's ping waits only for the answer.
Run: ``python bench/tool_lat.py``; ``--breakdown`` measures where the round trip goes
(:func:`breakdown`), ending with the real tools (``rc-pingpong``, ``send-lat``) as two
processes on the default device, their cost per round trip taken as the difference of
a long and a short run (:func:`tool_cost`: start-up, connection and exit cancel out).

Where the tools' round trip goes (measured with ``SOFTRDMA_SPIN_US=0``, so that every
wait sleeps and CPU time is work rather than spinning, and with ``cProfile`` call counts,
which load does not change): rc-pingpong's data loop now makes as many Python calls per
round trip as the bench's loop on the same shared device (326 against 325; it made 356:
an import statement per SEND, the TTL ancillary data of its ``hop_limit`` 1 rebuilt for
every packet, a second quick poll per wait). send-lat and write-lat made 7-12 % more
than rc-pingpong (a receive posted per message before the next SEND, a deadline and an
f-string per wait); now, per round trip and side (``cProfile`` of the real tools, a run
of 2500 minus one of 500, ``SOFTRDMA_SPIN_US=0``): rc-pingpong 319-320, send-lat 312,
write-lat 313-318. The receive refills of all three leave the round trip: rc-pingpong
posted 499 receives at once (about 0.9 us each) on one round trip in 499, send-lat one
(3 us) on every round trip; both now post up to 16 right after a SEND, while its answer
travels. The real tools' CPU per round trip (``--breakdown``'s last rows) is that of
rc-pingpong's loop in the bench's processes. What separates the tools from this figure's baseline is not the tools' code
(``--breakdown``, ``SOFTRDMA_SPIN_US=0``, load 15-19, CPU per round trip of both
processes): awaiting each SEND's ACK costs +6-12 % CPU and one more context switch per
round trip (2.2 -> 3.2; ``rc_send_lat_ackwait``), the shared device through devd +5-12 %
CPU (about 30 more Python calls per round trip in the devd client; ``shared_lat``), and
rc-pingpong's loop beside the bench's on that device +0-3 %. At such load the mean round
trip (rc-pingpong's usec/iter, and the bench's) is 2-5 times the median and varies
2-3x between runs of the same code; perftest's ``t_typical`` is a median.

Why the ACK wait costs more round-trip time than CPU: a side that awaits its SEND's ACK
can post its next SEND only once two datagrams of the peer arrived, the answer and the
ACK, which the peer's one thread sends one after the other (the answer first, its
coalesced ACK right after, ``Runtime.post_send``), and which this side reads in two
polls, often waking twice. The bench's ping-pong has one datagram per half round trip
on that path; its ACKs leave and are read while the peer works. On a contended machine
(the busy poll's ``PollPacer.hold_acks``) a QP whose earlier requests were all
acknowledged sends the ACK it owes in one GSO send with its request
(``EngineQP.ack_rides_with``), so the peer finds both in its socket at once (on an idle
machine the request leaves first and the ACK right after: the peer begins on the
request meanwhile, 103-105 against 108-112 us per iteration; docs/design.md): awaiting
ACKs, context switches per round trip 3.8-4.0 -> 2.6-2.7 (both processes, the bench's
``wait_send`` ping-pong, load 4-10, n = 6 alternated, two series), CPU per round trip
-10-20 %, round trip 424 -> 291 us beside a plain ping-pong of 295 -> 274 us. The real
tools (:func:`tool_cost`'s long-minus-short CPU and context switches of both processes,
the client's own figure; old and new alternated, n = 8, load 3-9): rc-pingpong 554 ->
364 us/iter, CPU 364 -> 299 us, context switches 4.1 -> 2.6; send-lat 315 -> 239 us,
365 -> 271, 3.9 -> 2.4; write-lat 310 -> 255 us, 350 -> 294, 4.0 -> 2.5 (a first
series at load ~10: context switches 4.3-4.8 -> 2.9-3.5, times too noisy to say).
On an idle machine the ACK now leaves first, promptly: a request that arrives after
every request of ours was acknowledged asks for its ACK at the end of the step that
takes it (``Port.ack_prompt``), so the peer reads the ACK while the answer is being
made and only the answer is on its path (the ACK's build and send, about 10 us, stays
on ours): the bench's ``wait_send`` ping-pong 86.6 -> 79.7 us per round trip, send-lat
96.2 -> 90.7 us (old and new alternated six times, medians; docs/design.md).
Each tool packet also carries IP_TOS and
IP_TTL ancillary data (``hop_limit`` 1 of rdma-core's pingpongs, 255 of perftest's;
0.3 us more per ``sendmsg`` than a plain send, measured on this machine), where the
bench's TTL 64 needs none.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
TIMEOUT_S = 300.0  # one tool run, server and client (a busy machine is slow; never hit)
_USEC_ITER = re.compile(r"=\s*([0-9.]+)\s*usec/iter")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("SOFTRDMA_CONNECT_RETRY", "60")  # the client may start before the server
    return env


def _pair(args: list[str]) -> str:
    """Run ``softrdma ARGS`` as the server and ``softrdma ARGS 127.0.0.1`` as the client;
    the client's standard output (RuntimeError naming both sides' output if one failed)."""
    cmd = [sys.executable, "-m", "softrdma", *args]
    env = _env()
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, env=env, text=True)
    try:
        client = subprocess.run([*cmd, "127.0.0.1"], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, env=env, timeout=TIMEOUT_S,
                                check=False)
        try:
            s_out, _ = server.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            s_out, _ = server.communicate()
        if client.returncode != 0 or server.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: client rc {client.returncode}: "
                               f"{(client.stdout + client.stderr)[-400:]!r}; server rc "
                               f"{server.returncode}: {s_out[-400:]!r}")
        return client.stdout
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _children_usage() -> tuple[float, int]:
    """CPU seconds and context switches of every child reaped so far (both tool sides)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


def tool_cost(tool: str, iters: int, port: int, short: int = 300
              ) -> tuple[float, float, float]:
    """The real tool's (``rc-pingpong``, ``send-lat`` ...) cost per round trip, server and
    client processes together: a run of ``short`` iterations subtracted from one of
    ``iters`` (start-up, connection and exit cancel out); returns (us per round trip,
    CPU us per round trip, context switches per round trip)."""
    runs = []
    for n in (short, iters):
        c0, w0 = _children_usage()
        t0 = time.perf_counter()
        _pair([tool, "-p", str(port), "-s", "64", "-n", str(n)])
        dt = time.perf_counter() - t0
        c1, w1 = _children_usage()
        runs.append((dt, c1 - c0, w1 - w0))
    k = 1e6 / (iters - short)
    (ds, cs, ws), (dl, cl, wl) = runs
    return (dl - ds) * k, (cl - cs) * k, (wl - ws) * k / 1e6


def rc_pingpong_us(iters: int, port: int, size: int = 64) -> float:
    """``softrdma rc-pingpong -s SIZE -n ITERS``: the client's microseconds per iteration."""
    out = _pair(["rc-pingpong", "-p", str(port), "-s", str(size), "-n", str(iters)])
    m = _USEC_ITER.search(out)
    if m is None:
        raise RuntimeError(f"rc-pingpong printed no usec/iter: {out[-400:]!r}")
    return float(m.group(1))


def perftest_lat_us(tool: str, iters: int, port: int, size: int = 64) -> float:
    """``softrdma TOOL -s SIZE -n ITERS --json`` (``send-lat``, ``write-lat`` ...): the
    client's typical latency times two (a round trip, microseconds)."""
    out = _pair([tool, "-p", str(port), "-s", str(size), "-n", str(iters), "--json"])
    try:
        doc: Any = json.loads(out.strip().splitlines()[-1])
        return 2.0 * float(doc["results"][0]["t_typical"])
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise RuntimeError(f"{tool} --json: no t_typical in {out[-400:]!r}") from exc


# ---- the breakdown: which step of "tool vs bench" costs what --------------------------

#: (name, loop, device): the bench's ping-pong as the figure's baseline runs it, the same
#: awaiting each SEND's ACK (as the tools do), that on a shared device (devd, as the tools
#: open the default device), and rc-pingpong's own data loop (Endpoint.run) there
STEPS = (("bench", "plain", "inproc"), ("+ ACK wait", "ackwait", "inproc"),
         ("+ shared device", "ackwait", "shared"), ("rc-pingpong loop", "tool", "shared"),
         ("rc-pingpong tool", "proc", "rc-pingpong"), ("send-lat tool", "proc", "send-lat"))


def _step_side(conn: Connection, loop: str, kind: str, where: Any, iters: int,
               client: bool) -> None:
    """One process of a :func:`breakdown` step: connect through ``conn``, run, report
    (seconds, CPU seconds and context switches of the whole process, every thread)."""
    import roce_bench as rb
    import shared_bench as sb

    from softrdma.tools.ibverbs.pingpong_endpoint import Endpoint
    from softrdma.tools.ibverbs.pingpong_options import Options

    side: Any = sb.Side(kind, where, 4096, rb.RX_DEPTH)
    if loop == "tool":  # the tool's endpoint on the bench side's device (its own PD, QP)
        ep = Endpoint(side.ctx, Options(kind="rc", size=64, iters=iters))
        conn.send(ep.local)
        ep.connect(conn.recv())
    else:
        conn.send(side.info())
        side.connect(conn.recv())
        side.arm_pingpong()
    conn.send("ready")
    conn.recv()
    ru0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), \
        time.perf_counter()
    if loop == "tool":
        ep.run(client)
    elif client:
        side.ping(iters, None, loop == "ackwait")
    else:
        side.pong(iters, loop == "ackwait")
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    conn.send((dt, cpu, ru.ru_nvcsw + ru.ru_nivcsw - ru0.ru_nvcsw - ru0.ru_nivcsw))
    conn.recv()
    if loop == "tool":
        ep.close()
    side.close()


def _step(loop: str, kind: str, iters: int, state: str, name: str, port: int
          ) -> tuple[float, float, float]:
    """One step's (us per round trip, CPU us per round trip of both processes, context
    switches per round trip of both processes)."""
    import shared_bench as sb

    ctx = mp.get_context("fork")
    wheres = sb._wheres(kind, state, name, port)
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_step_side, args=(pipes[i][1], loop, kind, wheres[i], iters,
                                                  i == 0)) for i in range(2)]
    for pr in procs:
        pr.start()
    try:
        a, b = (pipes[i][0] for i in range(2))
        ia, ib = a.recv(), b.recv()
        a.send(ib)
        b.send(ia)
        a.recv()
        b.recv()
        a.send("go")
        b.send("go")
        (dt, ca, wa), (_, cb, wb) = a.recv(), b.recv()
        a.send("bye")
        b.send("bye")
        for pr in procs:
            pr.join(10)
        return dt / iters * 1e6, (ca + cb) / iters * 1e6, (wa + wb) / iters
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.kill()


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def breakdown(iters: int = 2000, reps: int = 3) -> dict[str, list[tuple[float, float, float]]]:
    """Each of :data:`STEPS` ``reps`` times, alternated: from the figure's baseline to the
    tool, one difference at a time. ``SOFTRDMA_SPIN_US=0`` makes every wait sleep, so
    that CPU time is work rather than spinning."""
    import shared_bench as sb

    out: dict[str, list[tuple[float, float, float]]] = {n: [] for n, _, _ in STEPS}
    for _ in range(reps):
        for name, loop, kind in STEPS:
            if loop == "proc":  # the tool itself, on the default device (as the figure)
                out[name].append(tool_cost(kind, iters, _free_tcp_port()))
                continue
            out[name].append(sb._device(lambda st, nm, pt, lp=loop, kd=kind:
                                        _step(lp, kd, iters, st, nm, pt)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--port", type=int, default=46311, help="TCP port of the exchange")
    ap.add_argument("--breakdown", action="store_true", help="where the round trip goes")
    ap.add_argument("--reps", type=int, default=3, help="--breakdown: runs of each step")
    a = ap.parse_args(argv)
    if a.breakdown:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        sys.path.insert(0, SRC)
        res = breakdown(a.iters, a.reps)
        for name, vals in res.items():
            print(f"{name:18s} us/rt {statistics.median(x[0] for x in vals):7.1f}  "
                  f"CPU us/rt {statistics.median(x[1] for x in vals):7.1f}  context "
                  f"switches/rt {statistics.median(x[2] for x in vals):5.2f}  (medians of "
                  f"{len(vals)})")
        return 0
    print(f"rc-pingpong: {rc_pingpong_us(a.iters, a.port):.1f} us/iter")
    for i, tool in enumerate(("send-lat", "write-lat")):
        print(f"{tool}: round trip {perftest_lat_us(tool, a.iters, a.port + 1 + i):.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

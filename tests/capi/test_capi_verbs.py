"""``softrdma run``: a C program of our own checks completion fields and libibverbs-style
errors (tests/capi/wc_check.c); the wrapper refuses what it cannot preload; the build
names the packages it misses."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.capi import (
    compile_c,
    need_build,
    need_tool,
    preloaded,
    run,
    run_cmd,
    run_pair,
    tcp_port,
)
from harness.device import private_device, reap, veth_device_netns
from harness.wait import StreamLines, wait_until

from softrdma import enums as e
from softrdma.capi import build, launch
from softrdma.verbs import device_list


@pytest.fixture()
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    need_build()
    yield private_device("capiwc", tmp_path, monkeypatch)


def test_completion_fields_errors_and_fork(device: str, tmp_path: Path) -> None:
    """tests/capi/wc_check.c: the fields of a SEND-with-immediate's completions (inline
    data from an unregistered buffer), a remote access error completion, libibverbs-style
    errors, a CQ overrun's asynchronous event; and fork: a C fork() runs Python's at-fork handlers through the library's
    pthread_atfork, so the child gives up the device it inherited (its QP fails) and opens
    its own, and the parent goes on."""
    exe = compile_c(tmp_path, "wc_check", "-libverbs")
    p = run(str(exe), device, "fork")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "ok: fork: the child opens its own device, its inherited QP fails" in p.stdout
    oks = [ln for ln in p.stdout.splitlines() if ln.startswith("ok: ")]
    assert len(oks) == 12, p.stdout
    assert "ok: a request changed in place between posts sends what it says now" in oks
    assert "ok: bad R_Key -> remote access error" in oks
    assert "ok: bad R_Key -> local access violation work queue error on the responder's QP" in oks
    assert "ok: CQ overrun -> CQ error on that CQ; the queued completion stays pollable" in oks


def test_empty_poll_and_completion_cost(device: str, tmp_path: Path) -> None:
    """The figures the design promises in order of magnitude: an empty ibv_poll_cq stays
    in C (well under a microsecond even with its occasional yield). 100,000 polls, not
    the bench's million: every 16th yields the CPU, which beside busy processes can last
    a time slice of theirs (a million polls once took over the test's 180 s)."""
    exe = compile_c(tmp_path, "wc_check", "-libverbs")
    p = run(str(exe), device, "bench", "100000")
    assert p.returncode == 0, (p.stdout, p.stderr)
    # the thread's CPU time per poll: the wall time includes whatever else the machine runs
    empty = re.search(r"empty_poll_cpu_ns ([\d.]+)", p.stdout)
    rnd = re.search(r"send_round_us ([\d.]+)", p.stdout)
    assert empty and rnd, p.stdout
    # entering Python for an empty poll would cost several microseconds
    assert float(empty.group(1)) < 2000, p.stdout


def test_the_program_takes_the_wrappers_process(tmp_path: Path) -> None:
    """``softrdma run`` execs the program: a SIGTERM to it (``timeout``, a test harness)
    stops the program, none is left running (a wrapper that waited for its child left
    the child behind, holding its device's UDP port), and its exit status is the
    program's."""
    need_build()
    marker = tmp_path / "started"
    p = subprocess.Popen(run_cmd("sh", "-c", f'touch {marker}; exec sleep 300'))
    try:
        wait_until(lambda: marker.exists() and
                   Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep", timeout=120)
        p.terminate()
        assert p.wait(timeout=60) == -signal.SIGTERM
    finally:
        reap(p)
    assert run("sh", "-c", "exit 7").returncode == 7


def test_refuses_setuid_program(tmp_path: Path) -> None:
    need_build()
    exe = tmp_path / "suid-true"
    shutil.copy(shutil.which("true") or "/bin/true", exe)
    exe.chmod(0o755 | stat.S_ISUID)
    p = run(str(exe))
    assert p.returncode == 1
    assert "setuid" in p.stderr and p.stderr.count("\n") == 1


def test_refuses_static_program(tmp_path: Path) -> None:
    need_build()
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "static-prog"
    c = subprocess.run(["gcc", "-static", "-o", str(exe), str(src)], capture_output=True,
                       check=False)
    if c.returncode != 0:
        pytest.skip("no static libc here (Debian package libc6-dev)")
    assert launch.why_not_preloadable(str(exe)) is not None
    p = run(str(exe))
    assert p.returncode == 1 and "statically linked" in p.stderr


def test_dynamic_program_is_preloadable() -> None:
    assert launch.why_not_preloadable(shutil.which("true") or "/bin/true") is None


def test_no_program_and_unknown_program() -> None:
    need_build()
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "softrdma", "run"], capture_output=True,
                       text=True, env=env, check=False, timeout=60)
    assert p.returncode == 2 and "no program given" in p.stderr
    p = run("no-such-program-softrdma")
    assert p.returncode == 127 and "command not found" in p.stderr


def test_unknown_device_is_refused_before_the_program_runs(tmp_path: Path) -> None:
    """``-d`` naming no device stops before the program starts (as ``ibv_devinfo -d``
    refuses it), naming the devices there are, with or without ``--print-env``; a
    device that exists is the program's first."""
    need_build()
    marker = tmp_path / "ran"
    p = subprocess.run([sys.executable, "-m", "softrdma", "run", "-d", "no_such_dev", "--",
                        "touch", str(marker)], capture_output=True, text=True, check=False,
                       timeout=60)
    assert p.returncode == 1 and not marker.exists()
    assert p.stderr.startswith("softrdma run: error: -d no_such_dev: no softrdma device")
    assert "softrdma_iw_lo" in p.stderr and p.stderr.count("\n") == 1
    p = subprocess.run([sys.executable, "-m", "softrdma", "run", "-d", "no_such_dev",
                        "--print-env"], capture_output=True, text=True, check=False, timeout=60)
    assert p.returncode == 1 and p.stdout == "" and "no softrdma device" in p.stderr
    assert device_list.unknown_device("softrdma_iw_lo") is None
    tool = shutil.which("ibv_devices")
    if tool is None:
        pytest.skip("ibv_devices is not installed (Debian package ibverbs-utils)")
    p = subprocess.run([sys.executable, "-m", "softrdma", "run", "-d", "softrdma_iw_lo", "--",
                        tool], capture_output=True, text=True, check=False, timeout=60)
    rows = [line.split()[0] for line in p.stdout.splitlines()[2:] if line.strip()]
    assert p.returncode == 0 and rows[0] == "softrdma_iw_lo", p.stdout + p.stderr


def test_print_env_for_other_launchers() -> None:
    lib = need_build()
    p = subprocess.run([sys.executable, "-m", "softrdma", "run", "--print-env"],
                       capture_output=True, text=True, check=False, timeout=60)
    assert p.returncode == 0
    assert f"export LD_PRELOAD={lib}" in p.stdout.splitlines()
    assert "export SOFTRDMA_CAPI_PYTHON=" in p.stdout
    # the printed environment alone (no wrapper) runs a program on softrdma
    env = dict(os.environ)
    for line in p.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    tool = shutil.which("ibv_devices")
    if tool is None:
        pytest.skip("ibv_devices is not installed (Debian package ibverbs-utils)")
    out = subprocess.run([tool], env=env, capture_output=True, text=True, check=False,
                         timeout=60)
    assert out.returncode == 0 and "softrdma_iw_lo" in out.stdout, out.stderr


def test_an_interpreter_that_cannot_start_fails_the_verbs(device: str) -> None:
    """A C program whose interpreter cannot start (no standard library: empty
    ``SOFTRDMA_CAPI_PATH`` and ``PYTHONPATH``, a ``PYTHONHOME`` that does not exist) gets a message and
    verbs that fail with ELIBBAD, and goes on as libibverbs programs do with a failed
    verb (ibv_devices prints its own message). Before, cffi started the interpreter, and
    Python's fatal start-up error ended the program inside its first verb."""
    tool = need_tool("ibv_devices", "ibverbs-utils")
    p = run("env", "SOFTRDMA_CAPI_PATH=", "PYTHONPATH=", "PYTHONHOME=/nonexistent", tool)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "softrdma: cannot start Python" in p.stderr
    assert f"Failed to get IB devices list: {os.strerror(80)}" in p.stderr  # ELIBBAD


def test_the_launcher_imports_none_of_the_verbs() -> None:
    """``softrdma run`` itself only builds (or finds) the library and sets the environment;
    the program's embedded interpreter imports the verbs. The launcher importing them too
    cost every program about 60 ms (they took two thirds of its start-up)."""
    code = ("import sys, runpy; sys.argv = ['softrdma', 'run', '--print-env']\n"
            "try:\n    runpy.run_module('softrdma', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print(sorted(m for m in sys.modules if m.startswith('softrdma.verbs')))")
    need_build()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=False, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "export LD_PRELOAD=" in p.stdout
    assert p.stdout.splitlines()[-1] == "[]", p.stdout


def test_the_librdmacm_half_is_imported_at_the_first_rdma_call_only() -> None:
    """The init code registers the verbs and a stub for each librdmacm entry point
    (:mod:`softrdma.capi.cmlazy`): a program that never calls librdmacm never imports
    the rdma_cm layer (about a fifth of its start-up). The stubs' table, the functions
    they call and the C declarations name the same entry points."""
    from softrdma.capi import cdefs, cmbridge, cmlazy

    declared = set(re.findall(r"\b(sr_py_cm_\w+)\(", cdefs.PY_EXPORTS))
    assert declared and declared == set(cmlazy.ENTRY_POINTS) == set(cmbridge.FUNCTIONS)
    assert cmlazy.RETURNS_HANDLE <= declared  # no misspelt name left without its flag
    stub = cmlazy.stubs()["sr_py_cm_channel"]
    assert stub[1] is True and stub[0].__name__ == "sr_py_cm_channel"
    need_build()
    tool = shutil.which("ibv_devices")
    if tool is None:
        pytest.skip("ibv_devices is not installed (Debian package ibverbs-utils)")
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}  # the embedded imports, on stderr
    p = subprocess.run([sys.executable, "-m", "softrdma", "run", "--", tool], env=env,
                       capture_output=True, text=True, check=False, timeout=60)
    assert p.returncode == 0 and "softrdma_iw_lo" in p.stdout, p.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines()
                if line.startswith("import time:")}
    assert {"softrdma.capi.bridge", "softrdma.capi.cmlazy"} <= imported, p.stderr[-2000:]
    assert not {"softrdma.capi.cmbridge", "softrdma.cm.rdma_cm"} & imported


def test_build_names_missing_debian_packages(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTRDMA_CAPI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.setattr(build, "VERBS_H", tmp_path / "no-verbs.h")
    with pytest.raises(build.BuildError) as exc:
        build.build()
    msg = str(exc.value)
    assert "gcc" in msg and "libibverbs-dev" in msg and "python3-dev" in msg


def test_cache_is_keyed_by_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOFTRDMA_CAPI_CACHE", str(tmp_path))
    first = build.library_path()
    assert first.parent.parent == tmp_path and first.parent.name.startswith("capi-")
    monkeypatch.setattr(build, "_source", lambda: "/* another source */")
    assert build.library_path() != first


# ---- issue 22: verbs the stock tools do not cover (tests/capi/verbs_check.c) ------------
VERBS_CHECKS = [
    "ok: async fd non-blocking (EAGAIN, poll); SRQ_LIMIT_REACHED names the SRQ, limit "
    "disarmed; ibv_destroy_srq waits for the event's ack",
    "ok: UD receive: GRH in the first 40 bytes (IPv4 header of 127.0.0.1), data after it, "
    "byte_len 72, src_qp",
    "ok: sq_sig_all 0: three unsignaled sends and one signaled -> one send completion",
    "ok: sq_sig_all 1: every send completes without IBV_SEND_SIGNALED",
    "ok: inline data gathered from 3 unregistered buffers, copied at post time",
    "ok: ibv_create_cq_ex (flow tag -> EOPNOTSUPP); start/next/end_poll read",
    "ok: ibv_resize_cq 4 -> 64 keeps the 4 queued completions in order",
    "ok: ibv_rereg_mr(CHANGE_TRANSLATION) moves the region",
    "ok: ibv_query_device_ex: ODP (RC send), max_dm_size 262144, completion clock 1 GHz",
    "ok: device memory: zero-based MR read and written over RC",
    "ok: threads: 50 receives through ibv_get_cq_event",
    "ok: XRC: SRQ 0x",
    "ok: a message longer than the receive buffer: local length error (responder), remote "
    "invalid request error (requester), then flush errors on both",
    "ok: post_recv: EINVAL in RESET, ENOMEM past max_recv_wr (also after a refill), data "
    "and completions in posting order, flushed in order in ERR",
    "ok: post_srq_recv: ENOMEM past max_wr (also after a refill), a resize below the queued "
    "WQEs refused, two QPs take them in posting order, the limit event exactly at its level",
    "ok: a parent domain's allocators make the CQ, RQ and SRQ rings (USE_DEFAULT too); "
    "traffic on them; PD, TD and parent domain EBUSY while used",
    "ok: ibv_create_flow, ibv_reg_dmabuf_mr -> NULL, EOPNOTSUPP",
    "ok: teardown",
]


@pytest.mark.iba("10.2.9.6", "11.4.1.1")
def test_verbs_check_program(device: str, tmp_path: Path) -> None:
    """tests/capi/verbs_check.c, each check on data and completion fields: the async event
    fd made non-blocking (EAGAIN, then poll) and an SRQ limit event naming its SRQ, whose
    ``ibv_destroy_srq`` returns only once the event was acknowledged; UD with
    the GRH in the first 40 bytes; unsignaled sends (sq_sig_all 0 and 1); inline data
    gathered from unregistered buffers; ibv_cq_ex polling; ibv_resize_cq with queued
    completions; ibv_rereg_mr; device memory; ODP and ibv_advise_mr; one thread blocked in
    ibv_get_cq_event while another busy-polls; XRC in one context (ibv_post_send and
    ibv_wr_set_xrc_srqn); the error completions of a message too long for its receive
    buffer; ``ibv_post_recv``'s rules kept by the C receive ring (EINVAL in RESET, ENOMEM
    past ``max_recv_wr``, posting order with several SGEs in a chain, flushes in ERR); the
    same for ``ibv_post_srq_recv`` and the SRQ's ring (ENOMEM, a resize below the queued
    WQEs, two QPs taking WQEs in posting order, the limit event exactly at its level);
    thread and parent domains (the allocators make the CQ's, the QP's and the SRQ's C
    rings, and free them; traffic on them; EBUSY while in use); verbs not served fail with
    NULL and EOPNOTSUPP."""
    exe = compile_c(tmp_path, "verbs_check", "-libverbs", "-lpthread")
    p = run(str(exe), device)
    assert p.returncode == 0, (p.stdout, p.stderr)
    oks = [ln for ln in p.stdout.splitlines() if ln.startswith("ok: ")]
    assert len(oks) == len(VERBS_CHECKS), p.stdout
    for line, want in zip(oks, VERBS_CHECKS, strict=True):
        assert line.startswith(want), (line, want)


def _pair_report(out: str) -> tuple[int, int]:
    m = re.search(r"(\d+) bytes in [\d.]+ seconds", out)
    n = re.search(r"(\d+) iters in", out)
    assert m and n, out
    return int(m.group(1)), int(n.group(1))


# ibv_rc_pingpong's device-feature flags (rc_pingpong.c): -o registers the buffer with
# IBV_ACCESS_ON_DEMAND (ibv_query_device_ex odp_caps), -O registers the whole address space
# (implicit ODP: ibv_reg_mr(pd, NULL, SIZE_MAX, ...)), -P prefetches (ibv_advise_mr), -j
# sends from device memory (ibv_alloc_dm, ibv_reg_dm_mr zero-based, ibv_memcpy_*_dm); -c
# checks the data received (-o alone is -o -P without the ibv_advise_mr call)
@pytest.mark.parametrize("flags", [("-o", "-P"), ("-O", "-P"), ("-j",)],
                         ids=["odp-prefetch", "implicit-odp-prefetch", "dm"])
def test_rc_pingpong_feature_flags(device: str, flags: tuple[str, ...]) -> None:
    need_tool("ibv_rc_pingpong", "ibverbs-utils")
    port = tcp_port()
    common = ["ibv_rc_pingpong", "-d", device, "-g", "0", "-n", "20", "-c", "-p", str(port),
              *flags]
    procs, outs = run_pair(preloaded(*common), preloaded(*common, "127.0.0.1"), port)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert "Couldn't prefetch" not in err
        assert _pair_report(out) == (2 * 4096 * 20, 20)


def test_rc_pingpong_completion_timestamps(device: str) -> None:
    """ibv_rc_pingpong -t: the device has a completion clock (ibv_query_device_ex
    completion_timestamp_mask, hca_core_clock 1 GHz: CLOCK_MONOTONIC ns), the CQ an
    extended one with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP; each side prints the cycles
    between its receive completions: one round trip each, together within the run's
    span of the two processes (Linux rxe has no completion clock)."""
    need_tool("ibv_rc_pingpong", "ibverbs-utils")
    port = tcp_port()
    common = ["ibv_rc_pingpong", "-d", device, "-g", "0", "-n", "100", "-c", "-t",
              "-p", str(port)]
    began = time.monotonic()
    procs, outs = run_pair(preloaded(*common), preloaded(*common, "127.0.0.1"), port)
    span_ns = (time.monotonic() - began) * 1e9
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        cycles = {k: float(v) for k, v in re.findall(
            r"^(Max|Min|Average) receive completion clock cycles = ([\d.]+)$", out, re.M)}
        assert set(cycles) == {"Max", "Min", "Average"}, out
        assert 0 < cycles["Min"] <= cycles["Average"] <= cycles["Max"], out
        # The 99 gaps between the 100 receives lie within the processes' span. Not
        # within the tool's own timed run: the server's first receive may complete
        # before it starts its clock (the client's first SEND leaves at once), by a
        # time slice or more on a loaded machine. And the clock counts nanoseconds: 99
        # round trips take well over 5 us each.
        assert cycles["Average"] * 99 <= span_ns, (out, span_ns)
        assert cycles["Average"] * 99 >= 99 * 5e3, out


@pytest.mark.iba("9.8.5")
def test_xsrq_pingpong(device: str) -> None:
    """ibv_xsrq_pingpong: XRC from C (ibv_open_xrcd on a file, ibv_create_srq_ex of type
    XRC, ibv_get_srq_num, ibv_create_qp_ex of XRC INI and TGT QPs, sends naming the remote
    SRQ number; unsignaled but the last); the server sleeps on completion events; -o: the
    buffer is an ODP MR (ibv_query_device_ex xrc_odp_caps: XRC SEND and SRQ_RECV)."""
    need_tool("ibv_xsrq_pingpong", "ibverbs-utils")
    port = tcp_port()
    common = ["ibv_xsrq_pingpong", "-d", device, "-g", "0", "-n", "10", "-o", "-p", str(port)]
    procs, outs = run_pair(preloaded(*common, "-e"), preloaded(*common, "127.0.0.1"), port)
    addrs = []
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert out.splitlines()[-1] == "success", out
        local = re.search(r"local: .*SRQN ([0-9a-f]+)", out)
        remote = re.search(r"remote: .*SRQN ([0-9a-f]+)", out)
        assert local and remote, out
        addrs.append((local.group(1), remote.group(1)))
    # each side sent to the SRQ number the other reported
    assert addrs[0][0] == addrs[1][1] and addrs[1][0] == addrs[0][1], addrs


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
@pytest.mark.iba("11.6.3.3")
def test_asyncwatch_port_events(tmp_path: Path) -> None:
    """The stock ibv_asyncwatch on a device on a veth interface in a namespace of the
    test's: PORT_ERR when the interface goes down, PORT_ACTIVE when it comes back,
    GID_CHANGE when an address is added, each with port 1 (as rxe posts them)."""
    need_build()
    tool = need_tool("ibv_asyncwatch", "ibverbs-utils")
    env = dict(os.environ, SOFTRDMA_STATE_DIR=str(tmp_path / "state"), SOFTRDMA_SHARED="0")
    with veth_device_netns("srcaw", "caw0", "10.78.0.1", env, 60) as (ns, sh):
        watch: subprocess.Popen[str] | None = None
        try:
            watch = subprocess.Popen(["ip", "netns", "exec", ns, *preloaded(tool, "-d", "caw0")],
                                     env=env, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
            assert watch.stdout is not None and watch.stderr is not None
            lines = StreamLines(watch.stdout)
            head = lines.wait_for(r"async event FD")
            assert re.fullmatch(r"caw0: async event FD \d+", head.string.strip()), head.string
            # each change once the watcher reported the one before
            sh("ip", "link", "set", "d0", "down")
            lines.wait_for("IBV_EVENT_PORT_ERR")
            sh("ip", "link", "set", "d0", "up")
            lines.wait_for("IBV_EVENT_PORT_ACTIVE")
            sh("ip", "addr", "add", "10.78.0.2/24", "dev", "d0")
            lines.wait_for("IBV_EVENT_GID_CHANGE")
            watch.kill()
            watch.wait(timeout=60)
            events = lines.join().split("\n", 1)[1].splitlines()
            assert events == [
                f"  event_type IBV_EVENT_PORT_ERR ({int(e.IBV_EVENT_PORT_ERR)}), port 1",
                f"  event_type IBV_EVENT_PORT_ACTIVE ({int(e.IBV_EVENT_PORT_ACTIVE)}), port 1",
                f"  event_type IBV_EVENT_GID_CHANGE ({int(e.IBV_EVENT_GID_CHANGE)}), port 1",
            ]
        finally:
            if watch is not None:
                reap(watch)


def test_busy_polling_pair_under_load(device: str) -> None:
    """Two busy-polling ibv_rc_pingpong processes beside two CPU-bound processes (the 2
    cores of CI taken): the spinning pollers leave the progress threads their turn."""
    need_tool("ibv_rc_pingpong", "ibverbs-utils")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        port = tcp_port()
        common = ["ibv_rc_pingpong", "-d", device, "-g", "0", "-n", "100", "-s", "64", "-c",
                  "-p", str(port)]
        procs, outs = run_pair(preloaded(*common), preloaded(*common, "127.0.0.1"), port)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, (out, err)
        assert _pair_report(out) == (2 * 64 * 100, 100)

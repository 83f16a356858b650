"""``softrdma rdma-core-tests``: rdma-core's own pyverbs test suite, run on softrdma.

Debian's ``python3-pyverbs`` ships rdma-core's tests in ``/usr/share/doc/rdma-core/tests``
(some files gzipped). This command

1. installs that package with ``apt-get`` (non-interactive) when the directory is
   missing and ``--no-install`` is not given;
2. copies the tests to a temporary directory and gunzips the ``.gz`` files;
3. runs ``run_tests.py --dev DEV --gid N -v`` with softrdma's pyverbs first on the path
   (:func:`softrdma.tools.suites.pyverbs_run.shim_env`); as root, in a private mount namespace
   where softrdma's devices appear under ``/sys/class/infiniband`` with their
   ``device/net/<iface>`` entry (:mod:`softrdma.tools.suites.sysfs_ns`), so the rdma_cm tests
   find the address to connect to; otherwise those skip and the report says why;
4. as root, reserves ``--hugepages`` 2 MiB huge pages for the run (given back after;
   :mod:`softrdma.tools.suites.hugepages`), so the huge-page MR tests run rather than skip;
5. with ``--real-pyverbs``, runs the suite through Debian's own pyverbs (Cython over
   libibverbs) under ``softrdma run`` instead of softrdma's pyverbs layer: the C
   interface (:mod:`softrdma.capi`) is preloaded, attaches to the suite's interpreter
   (this Python, which must be the one the real pyverbs is built for) and serves its
   libibverbs calls; only the ``pyverbs`` package is taken from ``--pyverbs-dir``;
6. echoes unittest's lines to stderr as they come, each prefixed with the seconds since the
   start (``-q`` turns this off), so a run that is cut short still shows where it was;
7. parses unittest's verbose output and prints, per test file, the passed / failed /
   errored / skipped counts and the skip reasons, then exactly one line
   ``rdma-core tests: N passed, N failed, N errors, N skipped``.

Failing tests are reported, not fatal: the exit status is 0 whenever the suite ran to its
end, and 1 when it could not (no tests, install failure, timeout, no test result parsed) or
stopped early (the test process died before unittest's ``Ran N tests`` line: the report
names the test file it stopped in, see :func:`stopped_early`).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TextIO

from softrdma import verbs
from softrdma.compat import DEVICE_ENV
from softrdma.errors import SoftRdmaError
from softrdma.tools.suites import hugepages, sysfs_ns
from softrdma.tools.suites.pyverbs_run import shim_env

__all__ = ["TESTS_DIR", "TestResult", "FileSummary", "parse_verbose", "summarize",
           "format_report", "stopped_early", "run_streamed", "prepare_tests", "add_arguments", "run", "real_pyverbs_env",
           "REAL_PYVERBS_DIR"]

TESTS_DIR = Path("/usr/share/doc/rdma-core/tests")
PACKAGE = "python3-pyverbs"
#: where Debian's python3-pyverbs installs the real pyverbs package
REAL_PYVERBS_DIR = Path("/usr/lib/python3/dist-packages")

_HEADER = re.compile(r"^(\w+) \((tests\.(\w+)\.[\w.]+)\)(.*)$")
_STATUS = re.compile(
    r"(?:\.\.\. |^)(ok|FAIL|ERROR|expected failure|unexpected success|"
    r"skipped (?P<q>['\"])(?P<reason>.*)(?P=q))\s*$", re.MULTILINE)
_ERROR_HDR = re.compile(r"^(ERROR|FAIL): (\w+) \((tests\.(\w+)[\w.]*)\)")


@dataclass
class TestResult:
    """One test's outcome: ``status`` is passed / failed / error / skipped."""

    test_id: str
    file: str
    status: str
    reason: str = ""


@dataclass
class FileSummary:
    """Counts for one test file (``test_qp`` ...)."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


def _status(token: str) -> str:
    if token == "ok" or token == "expected failure":
        return "passed"
    if token == "FAIL" or token == "unexpected success":
        return "failed"
    if token == "ERROR":
        return "error"
    return "skipped"


def parse_verbose(text: str) -> list[TestResult]:
    """The results in unittest's ``-v`` output (tests may print between the test's name
    and its status, and docstrings add a line)."""
    lines = text.splitlines()
    results: list[TestResult] = []
    seen: set[str] = set()
    i = 0
    n = len(lines)
    while i < n:
        m = _HEADER.match(lines[i])
        if m is None:
            i += 1
            continue
        test_id, file = m.group(2), m.group(3)
        chunk = [m.group(4)]
        j = i + 1
        while j < n and not _HEADER.match(lines[j]) and not lines[j].startswith(("=" * 10, "-" * 10)):
            chunk.append(lines[j])
            j += 1
        found = list(_STATUS.finditer("\n".join(chunk)))
        if found and test_id not in seen:
            last = found[-1]
            token = last.group(1)
            seen.add(test_id)
            status = "skipped" if token.startswith("skipped") else _status(token)
            results.append(TestResult(test_id, file, status, last.group("reason") or ""))
        i = j
    # errors outside a test (setUpClass, module import) appear only in the error list
    for line in lines:
        m2 = _ERROR_HDR.match(line)
        if m2 is not None and m2.group(2) in ("setUpClass", "tearDownClass", "setUpModule"):
            tid = f"{m2.group(2)} ({m2.group(3)})"
            if tid not in seen:
                seen.add(tid)
                results.append(TestResult(tid, m2.group(4), "error"))
    return results


def _problem_lines(text: str) -> dict[str, str]:
    """test id -> last line of its traceback (the exception) from the error/failure list."""
    out: dict[str, str] = {}
    blocks = re.split(r"^={20,}$", text, flags=re.MULTILINE)
    for b in blocks:
        m = re.search(r"^(?:ERROR|FAIL): \w+ \((tests\.[\w.]+)\)", b, flags=re.MULTILINE)
        if m is None:
            continue
        body = [ln for ln in b.strip().splitlines() if ln.strip() and not ln.startswith("-" * 10)]
        for ln in reversed(body):
            if not ln.startswith(("Ran ", "FAILED", "OK")):
                out[m.group(1)] = ln.strip()[:160]
                break
    return out


def summarize(results: list[TestResult], text: str = "") -> dict[str, FileSummary]:
    """Per-file counts, skip reasons and (from ``text``) one line per failure."""
    problems = _problem_lines(text)
    out: dict[str, FileSummary] = {}
    for r in results:
        s = out.setdefault(r.file, FileSummary())
        if r.status == "passed":
            s.passed += 1
        elif r.status == "failed":
            s.failed += 1
        elif r.status == "error":
            s.errors += 1
        else:
            s.skipped += 1
            s.reasons[r.reason] += 1
        if r.status in ("failed", "error"):
            s.problems.append(f"{r.test_id.split('.')[-1]}: {problems.get(r.test_id, r.status)}")
    return dict(sorted(out.items()))


def format_report(summary: dict[str, FileSummary]) -> str:
    """The per-file table (with skip reasons and failures) and the one summary line."""
    rows = [f"{'test file':28} {'passed':>6} {'failed':>6} {'errors':>6} {'skipped':>7}"]
    rows.append("-" * len(rows[0]))
    tot = FileSummary()
    for name, s in summary.items():
        rows.append(f"{name:28} {s.passed:6d} {s.failed:6d} {s.errors:6d} {s.skipped:7d}")
        for reason, count in s.reasons.most_common():
            rows.append(f"{'':30}skipped x{count}: {reason}")
        for p in s.problems:
            rows.append(f"{'':30}{p}")
        tot.passed += s.passed
        tot.failed += s.failed
        tot.errors += s.errors
        tot.skipped += s.skipped
    rows.append("-" * len(rows[0]))
    rows.append(f"{'total':28} {tot.passed:6d} {tot.failed:6d} {tot.errors:6d} {tot.skipped:7d}")
    rows.append(f"rdma-core tests: {tot.passed} passed, {tot.failed} failed, "
                f"{tot.errors} errors, {tot.skipped} skipped")
    return "\n".join(rows)


_RAN = re.compile(r"^Ran \d+ tests? in ", re.MULTILINE)


def stopped_early(text: str, returncode: int, results: list[TestResult]) -> str | None:
    """Why the run in ``text`` (exit status ``returncode``) is partial, or None when unittest
    reached its ``Ran N tests`` summary. A process that dies mid-suite (a crash, a signal,
    ``os._exit``) prints no summary; the message names the file of the last test seen."""
    if _RAN.search(text) is not None:
        return None
    how = (f"killed by signal {-returncode}" if returncode < 0
           else f"exit status {returncode}")
    where = (f"in {results[-1].file} (last test {results[-1].test_id})" if results
             else "before any test result")
    return (f"the suite stopped early ({how}) {where} after {len(results)} results; "
            "the remaining tests did not run")


def run_streamed(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float,
                 echo: TextIO | None) -> tuple[bytes, int, bool]:
    """Run ``cmd`` with stdout and stderr merged; return its output, exit status and whether
    it ran past ``timeout`` seconds (then its whole process group is killed). Each line is
    also written to ``echo`` as it comes, prefixed with the seconds since the start, so a
    run cut short still shows which test it was in and how long each took."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    chunks: list[bytes] = []

    def pump(stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            chunks.append(line)
            if echo is not None:
                text = line.decode("utf-8", "replace").rstrip("\n")
                echo.write(f"[{time.monotonic() - start:7.1f} s] {text}\n")
                echo.flush()

    reader = threading.Thread(target=pump, args=(proc.stdout,), daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    reader.join(timeout=10)  # a grandchild that kept the pipe open must not hang us
    proc.stdout.close()
    return b"".join(chunks), proc.returncode, timed_out


def _install() -> str | None:
    """Install python3-pyverbs with apt-get; an error message, or None on success."""
    apt = shutil.which("apt-get")
    if apt is None:
        return f"{TESTS_DIR} is missing and apt-get is not available to install {PACKAGE}"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = [apt, "install", "-y", "--no-install-recommends", PACKAGE]
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None:
            return f"installing {PACKAGE} needs root (apt-get install {PACKAGE})"
        cmd = [sudo, "-n", "env", "DEBIAN_FRONTEND=noninteractive", *cmd]
    print(f"softrdma rdma-core-tests: installing {PACKAGE} ...", file=sys.stderr)
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"apt-get install {PACKAGE} failed: {exc}"
    if proc.returncode != 0:
        tail = proc.stdout.strip().splitlines()[-3:]
        return f"apt-get install {PACKAGE} failed ({proc.returncode}): {' | '.join(tail)}"
    return None


def prepare_tests(src: Path, dst: Path) -> Path:
    """Copy the test directory ``src`` to ``dst/tests`` and gunzip its ``.gz`` files."""
    target = dst / "tests"
    shutil.copytree(src, target)
    for gz in sorted(target.rglob("*.gz")):
        with gzip.open(gz, "rb") as fin, open(gz.with_suffix(""), "wb") as fout:
            shutil.copyfileobj(fin, fout)
        gz.unlink()
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dev", metavar="NAME", default=None,
                        help="softrdma device to test (default: $SOFTRDMA_PYVERBS_DEVICE or "
                        "the registry's first device)")
    parser.add_argument("--gid", type=int, default=0, metavar="N",
                        help="GID index the traffic tests use (default 0)")
    parser.add_argument("--tests-dir", type=Path, default=TESTS_DIR, metavar="DIR",
                        help=f"rdma-core's tests (default {TESTS_DIR})")
    parser.add_argument("--no-install", action="store_true",
                        help=f"do not install {PACKAGE} when the tests are missing")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                        help="give up on the suite after S seconds (default 1800)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="do not echo unittest's lines to stderr as the tests finish "
                        "(the report is printed either way)")
    parser.add_argument("--log", type=Path, metavar="FILE",
                        help="also write unittest's full output to FILE")
    parser.add_argument("--hugepages", type=int, default=16, metavar="N",
                        help="as root, reserve N 2 MiB huge pages for the run when fewer are "
                        "(restored after; 0: leave the pool alone; default 16)")
    parser.add_argument("--real-pyverbs", action="store_true",
                        help="run the suite through the real pyverbs (Cython over "
                        "libibverbs) under softrdma run, not softrdma's pyverbs layer")
    parser.add_argument("--pyverbs-dir", type=Path, default=REAL_PYVERBS_DIR, metavar="DIR",
                        help="with --real-pyverbs: the directory holding the real pyverbs "
                        f"package (default {REAL_PYVERBS_DIR})")
    parser.add_argument("tests", nargs="*", metavar="TEST",
                        help="run only these tests (unittest names, e.g. "
                        "tests.test_qp.QPTest)")


def _default_device() -> str | None:
    want = os.environ.get(DEVICE_ENV)
    names = [d.name for d in verbs.get_device_list() if d.type == "roce"]
    if want and want in names:
        return want
    return names[0] if names else None


def _netdevs() -> dict[str, str]:
    """softrdma's devices and their network interfaces (for ``sysfs_ns``)."""
    return {d.name: d.netdev for d in verbs.get_device_list() if d.netdev}


def real_pyverbs_env(dev: str, pyverbs_dir: Path, tmp: Path) -> dict[str, str]:
    """The environment that runs the suite (this Python) through the real pyverbs in
    ``pyverbs_dir`` under ``softrdma run``: the C interface preloaded, its device ``dev``
    first, and a directory in ``tmp`` holding only a link to the real ``pyverbs`` package
    on ``PYTHONPATH`` (nothing else of ``pyverbs_dir`` shadows this Python's packages).
    Raises ``ValueError`` when that pyverbs is missing or built for another Python, and
    the C interface's ``BuildError`` when it cannot be built."""
    from softrdma.capi import build, launch

    package = pyverbs_dir / "pyverbs"
    if not (package / "__init__.py").is_file():
        raise ValueError(f"no pyverbs package in {pyverbs_dir} (apt-get install {PACKAGE})")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    built = sorted(p.name for p in package.glob("device.*.so"))
    if built and not (package / f"device{suffix}").is_file():
        raise ValueError(f"the pyverbs in {pyverbs_dir} is built for another Python "
                         f"({', '.join(built)}), not for this one ({sys.executable}, "
                         f"{suffix}): run softrdma with that Python")
    link_dir = tmp / "real-pyverbs"
    link_dir.mkdir()
    (link_dir / "pyverbs").symlink_to(package.resolve(), target_is_directory=True)
    env = launch.preload_env(build.build(), dev, python_host=True)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(link_dir), env.get("PYTHONPATH")) if p)
    return env


def run(args: argparse.Namespace) -> int:
    """Run the suite and print the report; 0 when it ran to its end, 1 when it could not
    or stopped early."""
    tests_dir: Path = args.tests_dir
    if not (tests_dir / "run_tests.py").is_file():
        if args.no_install or tests_dir != TESTS_DIR:
            print(f"softrdma rdma-core-tests: error: no rdma-core tests in {tests_dir}",
                  file=sys.stderr)
            return 1
        err = _install()
        if err is not None or not (tests_dir / "run_tests.py").is_file():
            print(f"softrdma rdma-core-tests: error: {err or f'{PACKAGE} has no tests'}",
                  file=sys.stderr)
            return 1
    dev = args.dev or _default_device()
    if dev is None:
        print("softrdma rdma-core-tests: error: no softrdma RoCE device "
              "(softrdma link add NAME netdev IFACE)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="softrdma-rdma-core-tests-") as tmp:
        tdir = prepare_tests(tests_dir, Path(tmp))
        env = shim_env(dev)
        if getattr(args, "real_pyverbs", False):
            try:
                env = real_pyverbs_env(dev, getattr(args, "pyverbs_dir", REAL_PYVERBS_DIR),
                                       Path(tmp))
            except (ValueError, SoftRdmaError) as exc:
                print(f"softrdma rdma-core-tests: error: {exc}", file=sys.stderr)
                return 1
        cmd = [sys.executable, "run_tests.py", "--dev", dev, "--gid", str(args.gid), "-v",
               *args.tests]
        no_ns = sysfs_ns.unavailable_reason()
        if no_ns is None:
            stash = Path(tmp) / "sysclass"
            stash.mkdir()
            cmd = sysfs_ns.wrap(_netdevs(), cmd, stash)
        with hugepages.reserved(args.hugepages) as no_huge:
            echo = None if getattr(args, "quiet", False) else sys.stderr
            out, returncode, timed_out = run_streamed(cmd, tdir, env, args.timeout, echo)
    text = out.decode("utf-8", "replace")
    if args.log is not None:
        args.log.write_text(text)
    results = parse_verbose(text)
    via = ("the real pyverbs under softrdma run" if getattr(args, "real_pyverbs", False)
           else "softrdma's pyverbs")
    print(f"rdma-core's pyverbs tests on softrdma device {dev} (GID index {args.gid}), "
          f"through {via}")
    if no_ns is not None:
        print(f"note: the rdma_cm tests skip: they find the device's netdev in "
              f"/sys/class/infiniband, and {no_ns}")
    if no_huge is not None:
        print(f"note: the huge-page tests skip: {no_huge}")
    print(format_report(summarize(results, text)))
    if timed_out:
        print(f"softrdma rdma-core-tests: error: the suite did not finish within "
              f"{args.timeout:g} s", file=sys.stderr)
        return 1
    if not results:
        tail = " | ".join(text.strip().splitlines()[-3:])
        print(f"softrdma rdma-core-tests: error: no test results ({tail})", file=sys.stderr)
        return 1
    partial = stopped_early(text, returncode, results)
    if partial is not None:
        print(f"softrdma rdma-core-tests: error: {partial}", file=sys.stderr)
        return 1
    return 0

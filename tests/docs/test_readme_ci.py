"""README.md opens with the two commands, and .ci/run runs exactly the test command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", text, re.S)][:2]


def test_readme_opens_with_install_and_demo_then_tests() -> None:
    text = (ROOT / "README.md").read_text()
    first, second = readme_commands()
    assert text.index(first) < 200  # the very first thing after the title
    assert first.endswith("softrdma demo") and "pip install ." in first
    assert "python -m pytest" in second and "pip install '.[test]'" in second


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in ci if line.strip() and not line.lstrip().startswith("#")]
    assert readme_commands()[1] in commands
    # after it, only the interop smoke (it runs in the environment the test command made)
    after = commands[commands.index(readme_commands()[1]) + 1:]
    assert len(after) == 1 and "softrdma interop --smoke" in after[0]


def test_readme_documents_the_interop_suite() -> None:
    text = (ROOT / "README.md").read_text()
    assert "softrdma interop" in text and "python -m softrdma.interop" in text
    assert "--smoke" in text


def _stress(*args: str) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run([str(ROOT / ".ci" / "stress"), *args], capture_output=True, text=True,
                       timeout=300, env=env)
    m = re.search(r"^stress: (\d+) busy loops on \d+ cores \(pids ([\d ]+)\)$", r.stderr, re.M)
    assert m is not None, r.stderr
    pids = [int(p) for p in m.group(2).split()]
    assert len(pids) == int(m.group(1))
    return r, pids


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except (OSError, IndexError):
        return True


def test_stress_job_runs_pytest_beside_busy_loops_and_stops_them() -> None:
    """`.ci/stress [N] [pytest args]`: N busy loops (default 2 x cores) beside `python -m
    pytest ARGS`; its exit status is pytest's, and the loops are gone when it exits, also
    when pytest fails. The README documents it next to `.ci/slow`."""
    r, pids = _stress("3", "--version")
    assert r.returncode == 0 and "pytest" in r.stdout + r.stderr
    assert len(pids) == 3 and all(_gone(p) for p in pids)
    r, pids = _stress("--no-such-option")  # default N; pytest fails (usage error)
    assert r.returncode == 4
    assert len(pids) == 2 * (os.cpu_count() or 1) and all(_gone(p) for p in pids)
    readme = (ROOT / "README.md").read_text()
    assert "`.ci/stress [N] [pytest args]`" in readme
    assert readme.index(".ci/stress") > readme.index(".ci/slow")

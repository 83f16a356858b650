"""README.md opens with the two commands, and .ci/run runs exactly the test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    commands = [line for line in ci if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1].strip() == readme_commands()[1]

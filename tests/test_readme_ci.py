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
    commands = [line.strip() for line in ci if line.strip() and not line.lstrip().startswith("#")]
    assert readme_commands()[1] in commands
    # after it, only the interop smoke (it runs in the environment the test command made)
    after = commands[commands.index(readme_commands()[1]) + 1:]
    assert len(after) == 1 and "softrdma interop --smoke" in after[0]


def test_readme_documents_the_interop_suite() -> None:
    text = (ROOT / "README.md").read_text()
    assert "softrdma interop" in text and "python -m softrdma.interop" in text
    assert "--smoke" in text

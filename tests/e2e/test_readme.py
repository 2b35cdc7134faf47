"""The README's examples run: its Python block publishes to a real stack, and its
two opening commands are the Makefile targets that CI calls."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import REPO, Stack, wait_until

README = (REPO / "README.md").read_text()


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_readme_python_example_publishes(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    block = re.search(r"```python\n(.*?)```", README, re.S)
    assert block is not None
    monkeypatch.setenv("ENGRAM_HOME", str(stack.home))
    monkeypatch.setenv("ENGRAM_KAFKA_BOOTSTRAP", stack.bootstrap)
    exec(compile(block.group(1), str(Path("README.md")), "exec"), {})
    wait_until(
        lambda: (
            stack.scalar("SELECT count() FROM events FINAL WHERE agent_id = 'readme-agent'") >= 2
        ),
        60,
        "the README's events in ClickHouse",
    )


def test_readme_recall_example_finds_the_memory(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 2, "the README has a publish and a recall example"
    monkeypatch.setenv("ENGRAM_HOME", str(stack.home))
    monkeypatch.setenv("ENGRAM_KAFKA_BOOTSTRAP", stack.bootstrap)
    exec(compile(blocks[0], "README.md", "exec"), {})

    def recalled() -> str | None:
        exec(compile(blocks[1], "README.md", "exec"), {})
        out = capsys.readouterr().out
        return out if "peanuts" in out else None

    out = wait_until(recalled, 60, "the README's recall to find the peanut allergy")
    assert "Remember: I am allergic to peanuts." in out

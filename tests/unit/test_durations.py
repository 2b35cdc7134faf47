"""The committed test-file lengths (tests/durations.json) that order a fresh clone's run."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.durations as durations
from tests.durations import by_file, committed

ROOT = Path(__file__).parent.parent.parent


def test_the_committed_lengths_name_test_files_that_exist() -> None:
    for kind in ("tansu", "kafka"):
        files = committed(kind)
        assert files, f"no committed lengths for {kind}"
        gone = [path for path in files if not (ROOT / path).is_file()]
        assert gone == [], f"refresh tests/durations.json (python -m tests.durations): {gone}"
        assert all(seconds >= 0 for seconds in files.values())


def test_the_longest_integration_files_are_known_on_both_brokers() -> None:
    tansu, kafka = committed("tansu"), committed("kafka")
    assert set(kafka) <= set(tansu)  # the Kafka pass reruns some of the first pass's files
    longest = max(kafka, key=kafka.__getitem__)
    assert longest.startswith("tests/integration/") and kafka[longest] > 10


def test_a_files_length_is_the_sum_of_its_tests() -> None:
    per_test = {"tests/a.py::one": 1.5, "tests/a.py::two[x]": 2.0, "tests/b.py::three": 0.25}
    assert by_file(per_test) == {"tests/a.py": 3.5, "tests/b.py": 0.25}


def test_no_committed_file_means_no_lengths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(durations, "PATH", tmp_path / "missing.json")
    assert committed("tansu") == {}
    (tmp_path / "bad.json").write_text("[1, 2]")
    monkeypatch.setattr(durations, "PATH", tmp_path / "bad.json")
    assert committed("kafka") == {}

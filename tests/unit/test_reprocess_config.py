"""``engram reprocess --config FILE``: what a config file may be, and the message for
each file it refuses (read by :func:`ops.reprocess.load_config`, no stack needed); and
the stack's wait for a reprocess's swap (:meth:`ops.reprocess.WorkerControl.wait_resumed`)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from ops.reprocess import WorkerControl, load_config
from processors import MemoryConfig


def written(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("name", ["new.toml", "NEW.TOML", "new.Toml"])
def test_toml_is_read_by_its_suffix_in_any_case(tmp_path: Path, name: str) -> None:
    path = written(tmp_path, name, '[forgetting]\ncurve = "fsrs"\n')
    assert load_config(path).forgetting.curve == "fsrs"


@pytest.mark.parametrize("name", ["new.json", "NEW.JSON", "new"])
def test_json_is_read_by_its_suffix_or_without_one(tmp_path: Path, name: str) -> None:
    path = written(tmp_path, name, '{"forgetting": {"curve": "fsrs"}}')
    assert load_config(path).forgetting.curve == "fsrs"


def test_an_explicit_empty_object_is_the_defaults(tmp_path: Path) -> None:
    assert load_config(written(tmp_path, "defaults.json", "{}")) == MemoryConfig()


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("params.yaml", "forgetting: {}", "a config is a .json or .toml file, not .yaml"),
        ("empty.toml", "", "is empty (write {} for the default parameters)"),
        ("blank.json", " \n\t\n", "is empty"),
        ("latin1.json", b'{"name": "caf\xe9"}', "is not UTF-8 text: invalid continuation"),
        ("broken.TOML", "[forgetting\n", "is not valid TOML"),
        ("broken.json", "{", "is not valid JSON"),
        ("typo.json", '{"forgetting": {"curv": "fsrs"}}', "forgetting.curv: Extra inputs"),
    ],
)
def test_a_file_that_is_not_a_config_is_refused_with_its_name_and_why(
    tmp_path: Path, name: str, content: str | bytes, message: str
) -> None:
    path = written(tmp_path, name, content)
    with pytest.raises(ValueError) as refused:
        load_config(path)
    assert path in str(refused.value) and message in str(refused.value)


# -- the stack's wait while its worker is stopped for a swap ---------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_swap_wait_stops_the_stack(signum: signal.Signals) -> None:
    """Stopping ``engram up`` while a reprocess holds its worker for the swap: the wait
    ends (the stack stops) instead of starting the worker again, and the handlers
    before the wait are back."""
    control, before = WorkerControl(), signal.getsignal(signum)
    sender = threading.Timer(0.3, os.kill, (os.getpid(), signum))
    sender.start()
    try:
        assert control.wait_resumed() is False
    finally:
        sender.cancel()
    assert signal.getsignal(signum) is before


def test_the_swap_wait_ends_when_the_worker_is_resumed() -> None:
    control, before = WorkerControl(), signal.getsignal(signal.SIGTERM)
    resumer = threading.Timer(0.3, control.resume, (None,))
    resumer.start()
    assert control.wait_resumed() is True
    assert control.next_derivation(timeout=1) is None
    assert signal.getsignal(signal.SIGTERM) is before

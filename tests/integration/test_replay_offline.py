"""``engram replay`` with the stack stopped: the archive is sealed and its keys are on
the stopped broker, so it says that (it said the agent had no events); ``engram
history`` answers from the history alone."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path

from engram import Memory, make_event
from tests.support import FAST_GROUP, engram_cmd, engram_env, start_stack, wait_until


def test_a_replay_of_a_sealed_archive_without_its_keys_says_so(tmp_path: Path) -> None:
    home = tmp_path / "home"
    stack = start_stack(home, **FAST_GROUP)
    agent = f"offline-{uuid.uuid4().hex[:6]}"
    try:
        with Memory(http=stack.http) as memory:
            memory.publish_many(
                [
                    make_event(
                        "fact.asserted",
                        agent_id=agent,
                        body={"namespace": "n", "key": f"k{i}", "value": "v"},
                    )
                    for i in range(3)
                ]
            )
        count = "SELECT count() FROM events FINAL WHERE agent_id = {a:String}"
        wait_until(lambda: stack.scalar(count, a=agent) == 3, 60, "the history archived")
    finally:
        assert stack.stop() == 0
    env = engram_env(home)
    moment = datetime.now(UTC).isoformat()
    for command, flag in (("replay", "--until"), ("history", "--as-of")):
        done = subprocess.run(
            engram_cmd(command, "--agent", agent, flag, moment),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert "Traceback" not in done.stderr, done.stderr
        said = " ".join(done.stderr.split())
        if command == "replay":
            assert done.returncode == 1, done.stderr
            assert f"the archive of {agent!r} is sealed and its keys are not at hand" in said
        else:
            assert done.returncode == 0, done.stderr
            assert "k2" in done.stdout  # the facts, from the history alone

"""The seconds each test file took, per broker, kept in the repository
(``tests/durations.json``) so that a fresh clone hands the longest files out first too.

``make test`` runs the files on three pytest workers, a whole file each, longest first
(``tests/conftest.py``, ``LongestFilesFirst``). The lengths come from pytest's cache of
the last runs on this machine; a fresh clone (CI) has no cache, and used to hand the
files out in collection order (alphabetical), where a long file can go out last and run
alone while the other workers have finished. The committed lengths fill that gap; a file
the cache knows takes the cache's length.

Refresh after tests were added or moved (it keeps the files that did not run, and
drops those that no longer exist)::

    .venv/bin/python -m tests.durations

reads the local cache of both brokers (written by ``make test``) and rewrites the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("durations.json")
CACHE_KEY = "engram/test-seconds/"
"""pytest's cache key (plus the broker's kind) of the seconds each test took (setup,
call and teardown) when it last ran: written by :class:`tests.conftest.LongestFilesFirst`."""


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def by_file(per_test: dict[str, float]) -> dict[str, float]:
    """Seconds per test file: the sum of its tests'."""
    files: dict[str, float] = {}
    for nodeid, seconds in per_test.items():
        path = file_of(nodeid)
        files[path] = files.get(path, 0.0) + seconds
    return files


def committed(kind: str) -> dict[str, float]:
    """The committed seconds per file on broker ``kind``; empty when there are none."""
    try:
        recorded: Any = json.loads(PATH.read_text())
    except (OSError, ValueError):
        return {}
    files = recorded.get(kind) if isinstance(recorded, dict) else None
    if not isinstance(files, dict):
        return {}
    return {str(p): float(s) for p, s in files.items() if isinstance(s, int | float)}


def main() -> None:
    """Rewrite ``tests/durations.json`` from this checkout's pytest cache."""
    root = Path(__file__).parent.parent
    cache = root / ".pytest_cache" / "v"
    out: dict[str, dict[str, float]] = {}
    for kind in ("tansu", "kafka"):
        merged = committed(kind)
        try:
            per_test = json.loads((cache / (CACHE_KEY + kind)).read_text())
        except (OSError, ValueError):
            per_test = {}
        merged |= by_file(per_test)
        kept = sorted(path for path in merged if (root / path).is_file())
        out[kind] = {path: round(merged[path], 1) for path in kept}
        print(f"{kind}: {len(per_test)} tests in the cache, {len(kept)} files")
    PATH.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()

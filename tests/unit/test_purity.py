"""``processors/`` stays pure: no I/O, no clock, no randomness, no infrastructure.

That is what makes replay and time travel exact; this test is the contract.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import processors

PROCESSORS = Path(processors.__file__).resolve().parent

FORBIDDEN_MODULES = frozenset(
    {
        "faust",
        "aiokafka",
        "mode",
        "qdrant_client",
        "clickhouse_connect",
        "chdb",
        "asyncio",
        "socket",
        "requests",
        "httpx",
        "random",
        "os",
        "subprocess",
        "time",
        "threading",
        "secrets",
    }
)
# dotted call names, matched on their last one or two parts: `datetime.now()`,
# `dt.datetime.now()` and `now()` imported from datetime are all caught
FORBIDDEN_CALLS = frozenset(
    {
        "datetime.now",
        "datetime.utcnow",
        "datetime.today",
        "date.today",
        "uuid.uuid4",
        "uuid4",
        "uuid1",
        "uuid.uuid1",
        "open",
        "time.time",
        "time.monotonic",
        "time.perf_counter",
    }
)
# names that are forbidden when imported from a module, e.g. `from uuid import uuid4`
FORBIDDEN_FROM_IMPORTS = frozenset({("uuid", "uuid4"), ("uuid", "uuid1"), ("builtins", "open")})


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def offences(source: str, filename: str = "<string>") -> list[str]:
    """``file:line what`` for every forbidden import or call in ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        line = getattr(node, "lineno", 0)
        where = f"{filename}:{line}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append((line, f"{where} imports {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            if root in FORBIDDEN_MODULES:
                found.append((line, f"{where} imports from {node.module}"))
            for alias in node.names:
                if (node.module, alias.name) in FORBIDDEN_FROM_IMPORTS:
                    found.append((line, f"{where} imports {alias.name} from {node.module}"))
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name is None:
                continue
            tail = name.split(".")
            if ".".join(tail[-2:]) in FORBIDDEN_CALLS or tail[-1] in FORBIDDEN_CALLS:
                found.append((line, f"{where} calls {name}()"))
    return [text for _, text in sorted(found)]


def processor_files() -> list[Path]:
    return sorted(PROCESSORS.rglob("*.py"))


def test_processors_exist() -> None:
    names = {p.name for p in processor_files()}
    assert {"__init__.py", "memory.py", "working.py", "config.py", "ids.py"} <= names


def test_processors_are_pure() -> None:
    found: list[str] = []
    for path in processor_files():
        rel = path.relative_to(PROCESSORS.parent)
        found += offences(path.read_text(encoding="utf-8"), str(rel))
    assert not found, "processors/ must not do I/O, read the clock or be random:\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("import random", "imports random"),
        ("import os.path", "imports os.path"),
        ("import asyncio as aio", "imports asyncio"),
        ("from faust import App", "imports from faust"),
        ("from qdrant_client.models import PointStruct", "imports from qdrant_client.models"),
        ("from time import time", "imports from time"),
        ("from uuid import uuid4", "imports uuid4 from uuid"),
        ("from datetime import datetime\nx = datetime.now()", "calls datetime.now()"),
        ("import datetime\nx = datetime.datetime.utcnow()", "calls datetime.datetime.utcnow()"),
        ("from datetime import date\nd = date.today()", "calls date.today()"),
        ("import uuid\nu = uuid.uuid4()", "calls uuid.uuid4()"),
        ("u = uuid4()", "calls uuid4()"),
        ("with open('f') as f:\n    pass", "calls open()"),
        ("def f():\n    import time\n    return time.time()", "calls time.time()"),
    ],
)
def test_scanner_catches_offences(snippet: str, expected: str) -> None:
    found = offences(snippet, "snippet.py")
    assert any(expected in f for f in found), found
    assert all(f.startswith("snippet.py:") for f in found)


def test_scanner_reports_the_line() -> None:
    found = offences("import json\n\nimport random\nx = 1\ny = datetime.now()\n", "m.py")
    assert found == ["m.py:3 imports random", "m.py:5 calls datetime.now()"]


@pytest.mark.parametrize(
    "snippet",
    [
        "from uuid import UUID, uuid5\nx = uuid5(NS, 'a')",
        "from datetime import datetime, timedelta\nx = datetime(2024, 1, 1) + timedelta(1)",
        "import hashlib\nh = hashlib.sha256(b'x').hexdigest()",
        "from collections import deque\nfrom . import time as t",
        "x = event.occurred_at.astimezone(UTC)",
        "from processors.opening import reopened",
    ],
)
def test_scanner_allows_pure_code(snippet: str) -> None:
    assert offences(snippet) == []

"""The fold runs compiled by mypyc (``setup.py``), from extensions built from its
current sources, and gives the same bytes as the same sources run as plain Python."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from ops.bench.common import compiled

REPO = Path(__file__).resolve().parents[2]
PURE = os.environ.get("ENGRAM_PURE_PYTHON") == "1"
REBUILD = "run `make` (or `pip install -e .`) to compile the fold again"


def compiled_modules() -> list[str]:
    """The modules ``setup.py`` compiles (its ``COMPILED`` and ``WIRE`` lists), as
    module names."""
    lists = {"COMPILED", "WIRE"}
    paths: list[str] = []
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in lists:
            lists.remove(getattr(node.targets[0], "id", ""))
            paths += ast.literal_eval(node.value)
    assert not lists, f"setup.py has no {sorted(lists)} list"
    return [path.removesuffix(".py").replace("/", ".") for path in paths]


def test_setup_compiles_the_fold_and_the_wire_codec() -> None:
    assert {"processors.memory", "processors.working", "processors.episodes"} <= set(
        compiled_modules()
    )
    assert "schemas.wire" in compiled_modules()


@pytest.mark.skipif(PURE, reason="ENGRAM_PURE_PYTHON=1: installed without compiling")
def test_the_fold_runs_compiled() -> None:
    for name in compiled_modules():
        path = str(importlib.import_module(name).__file__)
        assert path.endswith(tuple(EXTENSION_SUFFIXES)), f"{name} runs from {path}: {REBUILD}"
    assert compiled() == {"fold": True, "wire": True}  # what the benchmarks report


def setup_module_of_repo() -> object:
    """``setup.py`` imported as a module (its ``setup()`` call runs only as a script)."""
    spec = importlib.util.spec_from_file_location("engram_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the command lines setuptools' build backend gives setup.py for one `pip install -e .`
REQUIRES = ["egg_info"]
METADATA = ["dist_info", "--output-dir", "/tmp/x", "--keep-egg-info"]
EDITABLE = ["editable_wheel", "--dist-dir", "/tmp/y"]


def test_only_the_build_itself_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = setup_module_of_repo()
    only = setup._metadata_only  # type: ignore[attr-defined]
    assert only(REQUIRES) and only(METADATA)
    for argv in (EDITABLE, ["bdist_wheel"], ["build_ext", "--inplace"], ["develop"], []):
        assert not only(argv), argv
    assert not only(["egg_info", "build_ext"])  # metadata and a build: the build wins
    monkeypatch.delenv("ENGRAM_PURE_PYTHON", raising=False)
    monkeypatch.setattr(sys, "argv", ["setup.py", *METADATA])
    assert setup._extensions() == []  # type: ignore[attr-defined]


NATIVE = [
    "schemas._bare",
    "schemas._avro",
    "processors._text",
    "processors._summary",
    "processors._ids",
]
"""The C extensions setup.py must build."""


def c_sources() -> dict[str, Path]:
    """The C extensions' sources by module (``setup.py``'s ``NATIVE``)."""
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "NATIVE":
            native: dict[str, str] = ast.literal_eval(node.value)
            return {name: REPO / path for name, path in native.items()}
    raise AssertionError("setup.py has no NATIVE")


def test_setup_builds_the_c_extensions() -> None:
    sources = c_sources()
    assert set(sources) == set(NATIVE)
    for name, source in sources.items():
        assert source.is_file(), source
        assert name == str(source.relative_to(REPO).with_suffix("")).replace("/", ".")


@pytest.mark.skipif(PURE, reason="ENGRAM_PURE_PYTHON=1: installed without compiling")
@pytest.mark.parametrize("name", NATIVE)
def test_the_c_extension_is_built(name: str) -> None:
    path = str(importlib.import_module(name).__file__)
    assert path.endswith(tuple(EXTENSION_SUFFIXES)), f"{name}: {REBUILD}"


def test_no_extension_is_older_than_its_source() -> None:
    sources = [REPO / (name.replace(".", "/") + ".py") for name in compiled_modules()]
    for source in [*sources, *c_sources().values()]:
        for built in source.parent.glob(f"{source.stem}.*.so"):
            assert built.stat().st_mtime >= source.stat().st_mtime, (
                f"{built.name} is older than {source.name}: {REBUILD}"
            )


def _digests(cwd: Path, workload: str) -> dict[str, object]:
    command = [sys.executable, "-m", "ops.bench.processors", "--digest", "--events", "4000"]
    command += ["--agents", "20", "--workload", workload]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(PURE, reason="ENGRAM_PURE_PYTHON=1: nothing compiled to compare")
@pytest.mark.parametrize("workload", ["bench", "rich"])
def test_the_compiled_fold_gives_the_bytes_of_the_python_fold(
    tmp_path: Path, workload: str
) -> None:
    # a copy of the sources alone, first on the path when run from its directory
    ignore = shutil.ignore_patterns("*.so", "__pycache__")
    shutil.copytree(REPO / "processors", tmp_path / "processors", ignore=ignore)
    compiled, python = _digests(REPO, workload), _digests(tmp_path, workload)
    assert compiled["fold_compiled"] is True
    assert python["fold_compiled"] is False
    assert compiled["exponential"] == python["exponential"]
    assert compiled["fsrs"] == python["fsrs"]

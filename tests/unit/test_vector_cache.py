"""A reprocess reuses the live derivation's vectors (:class:`ops.reprocess.VectorCache`)
only when they were made by the running embedder: same model, same version. The record
of a reused vector names the running version, so a vector of an older version must be
embedded again, not relabelled."""

from __future__ import annotations

from ops.reprocess import VectorCache
from tests.unit.test_plain_records import one_created, one_embedded


def test_a_vector_of_the_running_version_is_reused_by_its_text() -> None:
    cache = VectorCache("m", "1")
    cache.note([one_created(), one_embedded()])
    assert cache.get(one_created().body.text) == [0.6, 0.8]
    assert cache.get("another text") is None
    assert cache.hits == 1


def test_a_vector_of_another_version_or_model_is_not_reused() -> None:
    for model, version in (("m", "2"), ("other", "1")):
        cache = VectorCache(model, version)
        cache.note([one_created(), one_embedded()])
        assert cache.get(one_created().body.text) is None

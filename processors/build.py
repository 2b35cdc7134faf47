"""Building frozen models from values that are valid by construction.

The processors make every derived event and every piece of their state from
values that were validated already (fields of decoded events) or that they
computed within the bounds of the contract (clamped scores, positive strengths).
Validating them again costs more than the whole rest of the fold, so they are
built as ``model_construct`` would build them, with less work: ``values`` must
hold every field of ``cls``, in declaration order, with the types validation
would give (a float for a float field), and ``given`` names the fields that a
validated construction would have been passed (its ``model_fields_set``).
Decoding is unaffected: whatever comes off the wire is validated as before.

The models are frozen, so pydantic never changes a ``model_fields_set`` in place
(``model_copy`` copies it first): the instances built at one place share theirs,
a :func:`fields` set that must not be changed either.

Reading fields: pydantic models define ``__getattr__``, so CPython cannot specialise
attribute reads on them, and ``model.field`` costs about five plain attribute reads.
The hot paths of the fold that read several fields of one event or body read its
``__dict__`` once and index it (``fields = event.__dict__; fields["occurred_at"]``).
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.reader import trusted, updated

__all__ = ["fields", "trusted", "updated"]


def fields(names: Iterable[str]) -> set[str]:
    """A ``model_fields_set`` for :func:`trusted`, shared by the models built with it."""
    return set(names)

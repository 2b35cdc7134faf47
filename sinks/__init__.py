"""Projections: idempotent, batched writers and the read side, one per backend."""

"""Recall and snapshots behind the HTTP API (``POST /v1/recall``, ``GET /v1/snapshot``,
``GET /v1/history``).

:class:`MemoryService` owns the blocking parts: recall runs on one thread of its
own (the embedding model and the vector store are used from one thread at a
time), snapshot reads run on the ClickHouse executor. Every recall is recorded
as a ``memory.recalled`` event, published before the answer returns, so what
an agent was shown is in the log even if the agent dies right after.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from engram.rebase import Refused, check_moment
from engram.recall import Recaller, recalled_event
from engram.results import DEFAULT_EPISODES, RecalledMemory, RecallResult, Snapshot
from engram.snapshot import UnknownAgent, take_snapshot
from processors import MemoryConfig
from processors.recall import RecallWeights
from schemas import Event
from schemas.base import Ident
from sinks.clickhouse import ClickHouseHistory
from sinks.keys import OpenEvent

log = logging.getLogger("engram.api")
Publish = Callable[[Sequence[Event]], Awaitable[None]]


def check_as_of(as_of: datetime) -> None:
    """ValueError for a moment the history cannot hold (:func:`engram.rebase.check_moment`:
    before 1900 or in the future); a naive one is the caller's to refuse."""
    if as_of.tzinfo is None:
        return
    try:
        check_moment(as_of)
    except Refused as refused:
        raise ValueError(f"as_of {refused}") from None


class RecallRequest(BaseModel):
    """A recall: ``agent_id`` is mandatory; ``user_id`` narrows to one user."""

    model_config = ConfigDict(extra="forbid")

    query: Annotated[str, Field(min_length=1, max_length=8192)]
    agent_id: Ident
    user_id: Ident | None = None
    session_id: Ident | None = None
    """Ids as the ``memory.recalled`` event that records the recall takes them."""
    k: Annotated[int, Field(ge=1, le=1000)] = 10
    layers: list[Literal["L2", "L3"]] | None = None
    min_importance: Annotated[float, Field(ge=1, le=10)] | None = None
    weights: RecallWeights | None = None
    include_forgotten: bool = False
    record: bool = True
    """False peeks: nothing is published and nothing is reinforced (for inspection)."""


class Problem(BaseModel):
    """An error answer: ``error`` says what failed, ``reason`` why."""

    error: str
    reason: str


class MemoryService:
    """Recall (with its ``memory.recalled`` record) and snapshots; ``open_event``
    opens the sealed events a replay reads (skipping shredded ones)."""

    def __init__(
        self,
        *,
        recaller: Recaller | None,
        history: ClickHouseHistory,
        publish: Publish,
        config: MemoryConfig | None = None,
        open_event: OpenEvent | None = None,
    ) -> None:
        self.open_event = open_event
        self.recaller = recaller
        self.history = history
        self.publish = publish
        self.config = config or MemoryConfig()
        self._recall_thread = ThreadPoolExecutor(1, thread_name_prefix="engram-recall")

    async def recall(self, request: RecallRequest) -> RecallResult:
        """Recall, publish the record, answer. A recall that found nothing is not
        recorded (it reinforces nothing, and would make an unknown agent known: a
        mistyped id, or a recall before the first event). Raises ``LookupError`` when
        this stack has no vector store, ``ValueError`` for a bad request."""
        recaller = self.recaller
        if recaller is None:
            raise LookupError("recall is not configured on this stack")

        def run() -> list[RecalledMemory]:
            return recaller.recall(
                request.query,
                agent_id=request.agent_id,
                user_id=request.user_id,
                k=request.k,
                layers=request.layers,
                min_importance=request.min_importance,
                weights=request.weights,
                include_forgotten=request.include_forgotten,
            )

        loop = asyncio.get_running_loop()
        memories = await loop.run_in_executor(self._recall_thread, run)
        if not request.record or not memories:
            return RecallResult(
                query=request.query,
                agent_id=request.agent_id,
                user_id=request.user_id,
                memories=memories,
            )
        event = recalled_event(
            request.query,
            request.agent_id,
            memories,
            user_id=request.user_id,
            session_id=request.session_id,
        )
        await self.publish([event])
        return RecallResult(
            query=request.query,
            agent_id=request.agent_id,
            user_id=request.user_id,
            memories=memories,
            event_id=event.event_id,
        )

    async def snapshot(
        self,
        agent_id: str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        as_of: datetime | None = None,
        episodes: int = DEFAULT_EPISODES,
    ) -> Snapshot:
        """:func:`engram.snapshot.take_snapshot` on the history's executor;
        ``ValueError`` for an ``as_of`` outside the history (:func:`check_as_of`)."""
        if as_of is not None:
            check_as_of(as_of)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.history.executor,
            lambda: take_snapshot(
                self.history,
                agent_id,
                user_id=user_id,
                session_id=session_id,
                as_of=as_of,
                episodes=episodes,
                config=self.config,
                open_event=self.open_event,
            ),
        )

    async def from_history(
        self,
        agent_id: str,
        *,
        as_of: datetime,
        user_id: str | None = None,
        session_id: str | None = None,
        episodes: int = DEFAULT_EPISODES,
    ) -> Snapshot:
        """:func:`engram.history.history_snapshot` (SQL as of ``as_of``) on the
        history's executor; ``ValueError`` for an ``as_of`` outside the history
        (:func:`check_as_of`)."""
        from engram.history import history_snapshot

        check_as_of(as_of)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.history.executor,
            lambda: history_snapshot(
                self.history.client,
                agent_id,
                as_of=as_of,
                user_id=user_id,
                session_id=session_id,
                episodes=episodes,
                config=self.config,
            ),
        )

    def close(self) -> None:
        self._recall_thread.shutdown(wait=False)


def memory_router(service: MemoryService) -> APIRouter:
    """``POST /v1/recall`` and ``GET /v1/snapshot``."""
    router = APIRouter(tags=["memory"])

    @router.post(
        "/v1/recall",
        response_model=RecallResult,
        summary="Recall an agent's memories",
        description=(
            "Hybrid recall (dense + BM25, fused by reciprocal rank, re-weighted by "
            "retention, recency and importance) over one agent's memories. The recall "
            "is recorded as a `memory.recalled` event, which reinforces what it returned."
        ),
        responses={
            422: {"description": "an invalid request"},
            503: {"model": Problem, "description": "no vector store, or the log refused"},
        },
    )
    async def recall(request: RecallRequest) -> RecallResult | JSONResponse:
        try:
            return await service.recall(request)
        except LookupError as missing:
            return problem(503, "recall unavailable", str(missing))
        except ValueError as bad:
            return problem(422, "invalid recall", str(bad))
        except Exception as error:  # the caller gets the reason; the log gets the trace
            log.exception("recall failed")
            return problem(500, "recall failed", repr(error))

    @router.get(
        "/v1/snapshot",
        response_model=Snapshot,
        summary="An agent's memory snapshot",
        description=(
            "Working memory, the latest episodes, current facts, persona, skills and the "
            "log position they reflect; `as_of` (ISO-8601 with offset, not in the future) "
            "reconstructs the snapshot at a past moment by replaying the agent's log. "
            "`user_id` narrows the episodes and listed memories to one user; working "
            "memory, facts and persona are the agent's, of every user (`session_id` "
            "narrows working memory to one session)."
        ),
        responses={404: {"model": Problem}, 422: {"model": Problem}},
    )
    async def snapshot(
        agent_id: Annotated[str, Query(min_length=1)],
        user_id: str | None = None,
        session_id: str | None = None,
        as_of: datetime | None = None,
        episodes: Annotated[int, Query(ge=0, le=1000)] = DEFAULT_EPISODES,
    ) -> Snapshot | JSONResponse:
        try:
            return await service.snapshot(
                agent_id, user_id=user_id, session_id=session_id, as_of=as_of, episodes=episodes
            )
        except UnknownAgent as unknown:
            return problem(404, "unknown agent", str(unknown))
        except ValueError as bad:
            return problem(422, "invalid snapshot request", str(bad))
        except Exception as error:
            log.exception("snapshot failed")
            return problem(500, "snapshot failed", repr(error))

    @router.get(
        "/v1/history",
        response_model=Snapshot,
        summary="An agent's memory as of a moment, from the history",
        description=(
            "The snapshot as of `as_of` (ISO-8601 with offset, not in the future) "
            "answered by SQL over the ClickHouse history alone; `/v1/snapshot?as_of=` "
            "answers the same by replaying the log."
        ),
        responses={404: {"model": Problem}, 422: {"model": Problem}},
    )
    async def history(
        agent_id: Annotated[str, Query(min_length=1)],
        as_of: datetime,
        user_id: str | None = None,
        session_id: str | None = None,
        episodes: Annotated[int, Query(ge=0, le=1000)] = DEFAULT_EPISODES,
    ) -> Snapshot | JSONResponse:
        try:
            return await service.from_history(
                agent_id, as_of=as_of, user_id=user_id, session_id=session_id, episodes=episodes
            )
        except UnknownAgent as unknown:
            return problem(404, "unknown agent", str(unknown))
        except ValueError as bad:
            return problem(422, "invalid history request", str(bad))
        except Exception as error:
            log.exception("history failed")
            return problem(500, "history failed", repr(error))

    return router


def problem(status: int, error: str, reason: str) -> JSONResponse:
    """The JSON error every engram endpoint answers with: what failed and why."""
    return JSONResponse(Problem(error=error, reason=reason).model_dump(), status_code=status)

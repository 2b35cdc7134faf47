"""Optional LLM summaries of episodes, computed once and recorded.

The fold (``processors/``) summarises every episode extractively: pure, the same
on every replay. When ``ENGRAM_LLM_URL`` is set, the :class:`LlmSummariser`
rewrites each group of derived events before the flush writes and publishes it:
every ``episode.closed`` gets a summary from an OpenAI-compatible chat-completions
endpoint (``summariser`` = ``llm:<model>``) and the episode's ``memory.created``
(kind ``episode``, ``memory_id`` = ``episode_id``) the same text. Ids, order and
every other field stay as the fold made them, so ClickHouse ``memory_changes``
and ``engram.memory`` hold one and the same record.

Guarantees:

- **Recorded once.** Before asking, the summariser looks up ``memory_changes`` for
  the same ``episode.closed`` event ids (deterministic ``uuid5``s of the source
  event) already recorded with an ``llm:`` summariser, and reuses what it finds,
  model name included. A redelivery after a crash, and a reprocess of the raw
  log into the same history (``engram up`` restoring the archive into an empty
  broker), re-fold the same events into the same ids and so reuse the record:
  the model is never asked twice about an episode it answered. A reprocess
  (``engram reprocess``) reuses them too where an episode has the same turns, and
  asks about the episodes its parameters cut differently. A history rebuilt from
  nothing has no record to reuse and would ask again.
- **Never fatal, bounded in time.** A timeout, an HTTP error or an empty or
  malformed answer keeps the extractive summary (a warning, counted in
  :attr:`LlmSummariser.stats`); such an episode has no LLM record, so a later
  re-fold asks again. All the calls of one flush share one deadline of
  ``timeout_s``: the pipeline waits for the model at most that long per flush.
  History reads (records, archived turns) are infrastructure: retried in place.
- **Bounded output.** Whitespace is normalised and a summary is cut to
  ``max_chars`` characters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from uuid import UUID

import httpx

from schemas import DerivedEvent, EpisodeClosed, InteractionRecorded, MemoryCreated
from sinks.clickhouse import ClickHouseHistory, SequencedEvent
from streams.retry import retry_in_place

log = logging.getLogger("engram.summariser")
T = TypeVar("T")

SYSTEM_PROMPT = (
    "You write the long-term memory of an AI agent. Summarise the conversation below "
    "in at most three short sentences: who wanted what, what was decided, and any "
    "facts, names, dates or preferences stated. Be factual and invent nothing. Write "
    "in the language of the conversation. Answer with the summary only."
)
TURN_CHARS = 2000
"""Characters of one turn sent to the model (the rest is cut)."""
_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL)

Turn = tuple[str, str]
"""A turn as the model sees it: ``(role, content)``."""


class Summariser(Protocol):
    async def rewrite(
        self, derived: list[DerivedEvent], raw: Sequence[SequencedEvent]
    ) -> list[DerivedEvent]:
        """``derived`` with its episodes' summaries replaced; ``raw`` is the group
        the events come from (where the turns of its episodes are found first).
        Same ids, same order; never raises but for cancellation."""
        ...


@dataclass(frozen=True)
class LlmEndpoint:
    """An OpenAI-compatible API: ``url`` is its base (``…/v1``)."""

    url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 20.0

    @property
    def name(self) -> str:
        """The ``summariser`` recorded in ``episode.closed``."""
        return f"llm:{self.model}"


@dataclass(frozen=True)
class Recorded:
    """A summary recorded in the history, and who made it."""

    summary: str
    summariser: str


class SummaryRecords(Protocol):
    async def recorded(self, closed: Sequence[EpisodeClosed]) -> dict[UUID, Recorded]:
        """The LLM summaries already recorded for these events, by event id."""
        ...

    async def turns(
        self, agent_ids: Collection[str], event_ids: Collection[str]
    ) -> dict[str, Turn]:
        """The archived ``interaction.recorded`` events among ``event_ids``, by id."""
        ...


class ClickHouseSummaryRecords:
    """:class:`SummaryRecords` read from the ClickHouse history (``memory_changes``
    with ``FINAL``: the latest record of an event wins; ``events``), on the
    history's executor."""

    def __init__(self, history: ClickHouseHistory) -> None:
        self.history = history

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.history.executor, fn)

    async def recorded(self, closed: Sequence[EpisodeClosed]) -> dict[UUID, Recorded]:
        """The recorded LLM summaries of these episodes, where the record summarised the
        same turns (``sources``): a reprocess whose new parameters cut an episode
        differently closes it with the same event id, and must not take the summary of
        other turns."""
        parameters = {
            "a": sorted({e.agent_id for e in closed}),
            "s": sorted({e.seq for e in closed}),
            "e": [str(e.event_id) for e in closed],
        }
        rows = await self._run(
            lambda: (
                self.history.client.query(
                    "SELECT toString(event_id), summary, summariser, sources FROM ("
                    " SELECT event_id, JSONExtractString(body, 'summary') AS summary,"
                    " JSONExtractString(body, 'summariser') AS summariser,"
                    " JSONExtract(body, 'sources', 'Array(String)') AS sources"
                    " FROM memory_changes FINAL"
                    " WHERE agent_id IN {a:Array(String)} AND seq IN {s:Array(UInt64)}"
                    " AND event_id IN {e:Array(UUID)} AND type = 'episode.closed')"
                    " WHERE startsWith(summariser, 'llm:') AND summary != ''",
                    parameters=parameters,
                ).result_rows
            )
        )
        turns = {str(e.event_id): list(e.body.sources) for e in closed}
        return {
            UUID(event_id): Recorded(summary, name)
            for event_id, summary, name, sources in rows
            if list(sources) == turns.get(event_id)
        }

    async def turns(
        self, agent_ids: Collection[str], event_ids: Collection[str]
    ) -> dict[str, Turn]:
        parameters = {"a": sorted(agent_ids), "e": sorted(event_ids)}
        rows = await self._run(
            lambda: (
                self.history.client.query(
                    "SELECT toString(event_id), body FROM events"
                    " WHERE agent_id IN {a:Array(String)} AND event_id IN {e:Array(UUID)}"
                    " AND type = 'interaction.recorded'",
                    parameters=parameters,
                ).result_rows
            )
        )
        found: dict[str, Turn] = {}
        for event_id, body in rows:
            values = json.loads(body)
            found[event_id] = (str(values.get("role", "")), str(values.get("content", "")))
        return found


@dataclass
class SummaryStats:
    """What the summariser did since it started."""

    asked: int = 0
    summarised: int = 0
    reused: int = 0
    failed: int = 0


class LlmSummariser:
    """Episode summaries from an OpenAI-compatible chat-completions endpoint,
    reused from the history when already recorded (see the module docstring)."""

    def __init__(
        self,
        endpoint: LlmEndpoint,
        records: SummaryRecords,
        *,
        max_concurrency: int = 4,
        max_chars: int = 1000,
    ) -> None:
        self.endpoint = endpoint
        self.records = records
        self.max_chars = max_chars
        self.slots = asyncio.Semaphore(max_concurrency)
        self.stats = SummaryStats()

    async def rewrite(
        self, derived: list[DerivedEvent], raw: Sequence[SequencedEvent]
    ) -> list[DerivedEvent]:
        closed = [e for e in derived if isinstance(e, EpisodeClosed)]
        if not closed:
            return derived
        recorded = await retry_in_place(
            lambda: self.records.recorded(closed), what="read recorded summaries"
        )
        self.stats.reused += len(recorded)
        todo = [e for e in closed if e.event_id not in recorded]
        fresh = await self._summarise(todo, raw) if todo else {}
        return with_summaries(derived, {**recorded, **fresh})

    async def _summarise(
        self, closed: Sequence[EpisodeClosed], raw: Sequence[SequencedEvent]
    ) -> dict[UUID, Recorded]:
        turns = await self._turns(closed, raw)
        headers = (
            {"Authorization": f"Bearer {self.endpoint.api_key}"} if self.endpoint.api_key else {}
        )
        async with httpx.AsyncClient(timeout=self.endpoint.timeout_s, headers=headers) as client:
            asks = {asyncio.ensure_future(self._ask(client, e, turns)): e for e in closed}
            _, late = await asyncio.wait(asks, timeout=self.endpoint.timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        answers: dict[UUID, Recorded] = {}
        for task, event in asks.items():
            if task in late:
                self._failed(event, f"no answer within {self.endpoint.timeout_s:g}s")
            elif task.exception() is not None:
                self._failed(event, repr(task.exception()))
            elif (summary := task.result()) is not None:
                answers[event.event_id] = Recorded(summary, self.endpoint.name)
        self.stats.summarised += len(answers)
        return answers

    async def _turns(
        self, closed: Sequence[EpisodeClosed], raw: Sequence[SequencedEvent]
    ) -> dict[str, Turn]:
        """The turns of ``closed``: from the group first, the rest from the archive
        (earlier groups are written before a later one is flushed)."""
        wanted = {source for e in closed for source in e.body.sources}
        found = dict(group_turns(raw, wanted))
        missing = wanted - found.keys()
        if missing:
            agents = {e.agent_id for e in closed}
            found |= await retry_in_place(
                lambda: self.records.turns(agents, missing), what="read archived turns"
            )
        return found

    async def _ask(
        self, client: httpx.AsyncClient, event: EpisodeClosed, turns: Mapping[str, Turn]
    ) -> str | None:
        sources = event.body.sources
        missing = [s for s in sources if s not in turns]
        if missing or not sources:
            self._failed(event, f"turns not found: {', '.join(missing) or 'none'}")
            return None
        request = chat_request(self.endpoint.model, [turns[s] for s in sources])
        async with self.slots:
            self.stats.asked += 1
            try:
                response = await client.post(f"{self.endpoint.url}/chat/completions", json=request)
                response.raise_for_status()
                answer = answer_of(response.json())
            except httpx.HTTPStatusError as error:
                self._failed(event, f"HTTP {error.response.status_code}")
                return None
            except Exception as error:  # a model is never a reason to stop the line
                self._failed(event, repr(error))
                return None
        summary = normalised(answer or "", self.max_chars)
        if not summary:
            self._failed(event, "empty or malformed answer")
            return None
        return summary

    def _failed(self, event: EpisodeClosed, reason: str) -> None:
        self.stats.failed += 1
        log.warning(
            "LLM summary of episode %s failed, keeping the extractive one: %s",
            event.body.episode_id,
            reason,
        )


def group_turns(
    raw: Iterable[SequencedEvent], wanted: Collection[str]
) -> Iterable[tuple[str, Turn]]:
    for item in raw:
        event = item.event
        if isinstance(event, InteractionRecorded):
            event_id = str(event.event_id)
            if event_id in wanted:
                yield event_id, (event.body.role, event.body.content)


def chat_request(model: str, turns: Sequence[Turn]) -> dict[str, Any]:
    """The chat-completions request for one episode: its turns as ``role: content`` lines."""
    lines = "\n".join(
        f"{role}: {' '.join(content.split())[:TURN_CHARS]}" for role, content in turns
    )
    return {
        "model": model,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": lines},
        ],
    }


def answer_of(payload: Any) -> str | None:
    """``choices[0].message.content`` of a chat-completions response, if it is text."""
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


def normalised(text: str, max_chars: int) -> str:
    """``text`` without reasoning blocks, on one line of single spaces, at most
    ``max_chars`` characters (cut ones end with an ellipsis)."""
    flat = " ".join(_THINKING.sub(" ", text).split())
    if len(flat) <= max_chars:
        return flat
    return flat[: max_chars - 1].rstrip() + "…"


def with_summaries(
    derived: Sequence[DerivedEvent], summaries: Mapping[UUID, Recorded]
) -> list[DerivedEvent]:
    """``derived`` with the summaries of its ``episode.closed`` events (by event id)
    and the same text in each episode's ``memory.created`` (made by the same source
    event, ``memory_id`` = ``episode_id``); everything else as it was."""
    if not summaries:
        return list(derived)
    texts = {
        (e.source_event_id, e.body.episode_id): summaries[e.event_id].summary
        for e in derived
        if isinstance(e, EpisodeClosed) and e.event_id in summaries
    }
    out: list[DerivedEvent] = []
    for event in derived:
        if isinstance(event, EpisodeClosed) and event.event_id in summaries:
            record = summaries[event.event_id]
            body = event.body.model_copy(
                update={"summary": record.summary, "summariser": record.summariser}
            )
            event = event.model_copy(update={"body": body})
        elif isinstance(event, MemoryCreated) and event.body.kind == "episode":
            text = texts.get((event.source_event_id, event.body.memory_id))
            if text is not None:
                event = event.model_copy(
                    update={"body": event.body.model_copy(update={"text": text})}
                )
        out.append(event)
    return out

"""Purging an erased subject from one agent's ClickHouse history (issue 7).

Given a ``subject.erased`` of agent ``A`` at sequence ``E``, among ``A``'s rows before
``E``:

- the subject's raw events leave the archive (``events``), but the erasure requests
  (no content: the audit trail);
- the subject's memory changes leave the live ``memory_changes`` and every kept
  version of it, and so does every change of the subject's memories, whoever made it;
- shared documents are re-derived without the subject: the persona versions the
  other users made (whole documents, which carried what the subject had set) take the
  bodies of the fold's re-merged versions, read from the agent's latest checkpoint
  (written with the erasure) by their source event; versions the fold no longer has
  leave; the ``previous_value`` of the other users' ``fact.set`` on the keys the
  subject set follows the chain of the changes that remain;
- the agent's state checkpoints before the erasure leave, the latest one
  (``agent_states``) and those kept by position (``agent_checkpoints``): they hold the
  subject's content; the one written with the erasure is after it. (A replay as of a
  moment never starts from a kept checkpoint of an agent with an erasure receipt, see
  :meth:`sinks.clickhouse.ClickHouseHistory.retained_checkpoint`.)

The subject's rows are those of its user, or without a user when the subject is the
agent itself; otherwise a row without a user is the agent's own, one of the others'
(its persona versions and fact changes are re-derived like another user's). Deletes
are lightweight ``DELETE``s (ReplacingMergeTree accepts them, chdb included), one per
table (per wave of erasures: at most one per agent). A rewritten row is inserted
first, with the same key and version and its new body, then the old one is deleted with
the subject's rows (by key and body): a crash in between leaves both, and the redo
deletes the old one.
Every step is idempotent: run again, it finds nothing more to do.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas import FactSetBody, PersonaVersionBody, SubjectErased

INSERT_SETTINGS = {"max_partitions_per_insert_block": 0}
"""A batch of events may span any number of months (the tables of a history made before
they lost their partition key are partitioned by the month of ``occurred_at``): a
backfill or an import of years of history must not fail the write for ever (ClickHouse
refuses more than 100 partitions per insert by default)."""
DELETE_SYNC = {"lightweight_deletes_sync": 2}
"""A lightweight DELETE returns once the rows are gone (on every replica, on a server)."""


def insert_rows(
    client: Client,
    table: str,
    rows: Sequence[Sequence[Any]],
    columns: Sequence[str],
    types: Sequence[str] | None = None,
) -> None:
    """``client.insert`` of ``rows`` into ``columns`` of ``table`` (of type names
    ``types`` when known, else asked of the server), with :data:`INSERT_SETTINGS`, and
    nothing of it left behind: clickhouse-connect's insert context refers to itself (a
    bound method in its own attributes) and would hold ``rows`` until the garbage
    collector's next pass over cycles, which the worker makes rare
    (:func:`ops.worker.tune_gc`); the context is emptied once the insert ends."""
    context = client.create_insert_context(
        table,
        list(columns),
        column_type_names=None if types is None else list(types),
        settings=INSERT_SETTINGS,
    )
    try:
        context.data = rows
        client.data_insert(context)
    finally:
        vars(context).clear()  # used once: its cycle and the rows go now


def without_pandas() -> bool:
    """Keep clickhouse-connect from importing pandas in this process, unless something
    has already: every insert asks whether its rows are a pandas DataFrame
    (``options.pd``, resolved on first use by importing pandas: ~0.3 s of CPU and
    30-50 MiB). Only for a process whose inserts are all plain rows, as the stack's (its
    history writes through :func:`insert_rows`): clickhouse-connect then treats
    everything as it does where pandas is not installed. Returns whether it now does."""
    if "pandas" in sys.modules:
        return False
    from clickhouse_connect.driver import options

    # what clickhouse-connect sets itself when it finds no pandas
    options.pd = options.pd_time_test = None
    return True


CHECKPOINT_TABLES = ("agent_states", "agent_checkpoints")
"""The tables of the agents' fold states: the latest one, and those kept by position."""
_ROW = "cityHash64(agent_id, seq, idx, body)"
"""Names one physical row of a memory-changes table: its key and its body."""


def purge(
    client: Client,
    erasures: Sequence[SubjectErased],
    change_tables: Sequence[str],
    columns: Sequence[str],
    purged: Callable[[str], None] | None = None,
) -> list[dict[str, int]]:
    """Purge every erasure of ``erasures`` (agents of one flush, as a broadcast request
    makes them) with one DELETE per table for all; return, per erasure, the rows
    deleted (or rewritten: ``"<table> rewritten"``) per table. ``purged`` is called
    with each table's name once it is purged (the crash tests stop the worker there)."""
    plans = [Purge(client, e, i, columns) for i, e in enumerate(erasures)]
    counts: list[dict[str, int]] = [{} for _ in plans]
    done = purged or _nothing
    _delete_all(client, "events", [(p, p.events()) for p in plans], counts)
    done("events")
    for table in change_tables:
        _delete_all(client, table, [(p, p.changes(table)) for p in plans], counts)
        for plan, count in zip(plans, counts, strict=True):
            if plan.rewritten.get(table):
                count[f"{table} rewritten"] = plan.rewritten[table]
        done(table)
    for table in CHECKPOINT_TABLES:
        _delete_all(client, table, [(p, p.checkpoints()) for p in plans], counts)
        done(table)
    return counts


def _nothing(table: str) -> None:
    """No hook."""


def _delete_all(
    client: Client,
    table: str,
    wheres: Sequence[tuple[Purge, tuple[str, str]]],
    counts: list[dict[str, int]],
) -> None:
    """Count each plan's rows of ``table`` (what it deletes for the subject, the
    first condition), then delete every plan's rows (the second) in one statement."""
    doomed: list[str] = []
    params: dict[str, Any] = {}
    for i, (plan, (subject, everything)) in enumerate(wheres):
        counts[i][table] = plan.count(table, subject)
        if counts[i][table] or plan.stale.get(table):
            doomed.append(f"({everything})")
            params |= plan.params
    if doomed:
        sql = f"DELETE FROM {table} WHERE {' OR '.join(doomed)}"
        client.command(sql, parameters=params, settings=DELETE_SYNC)


class Purge:
    """The plan of one erasure of one agent: which rows go, which are rewritten. Its
    query parameters are named after ``tag`` (``a{tag}``, ``u{tag}``, ...), so the
    plans of many agents share one statement."""

    def __init__(
        self, client: Client, erased: SubjectErased, tag: int, columns: Sequence[str]
    ) -> None:
        self.client = client
        self.tag = tag
        subject = erased.body.subject
        # ifNull: a row without a user is the agent's, so another subject's it is not
        # (`user_id = {u}` alone is NULL there, and so is its negation: such rows would be
        # neither the subject's nor the others', and kept what the subject had shaped)
        tail = " OR user_id IS NULL)" if subject == erased.agent_id else ")"
        self.owner = self.named("(ifNull(user_id = {u:String}, 0)") + tail
        self.before = self.named("agent_id = {a:String} AND seq < {s:UInt64}")
        self.params: dict[str, Any] = {
            f"a{tag}": erased.agent_id,
            f"u{tag}": subject,
            f"s{tag}": erased.seq,
            f"r{tag}": erased.body.request_id,
        }
        self.columns = tuple(columns)
        self.rewritten: dict[str, int] = {}
        self.stale: dict[str, list[int]] = {}

    def named(self, sql: str) -> str:
        """``sql`` with its parameters ``{x:T}`` renamed ``{x<tag>:T}``."""
        for name in ("a", "u", "s", "m", "old", "ns", "k", "r"):
            sql = sql.replace("{" + name + ":", "{" + f"{name}{self.tag}:")
        return sql

    def events(self) -> tuple[str, str]:
        """The subject's raw events but the erasure requests (no content)."""
        where = f"{self.before} AND {self.owner} AND type != 'subject.erasure_requested'"
        return where, where

    def checkpoints(self) -> tuple[str, str]:
        where = self.named("agent_id = {a:String} AND seq < {s:Int64}")
        return where, where

    # -- memory changes ---------------------------------------------------------

    def changes(self, table: str) -> tuple[str, str]:
        """The subject's changes of ``table`` (first) and, with them, the rows of the
        shared documents re-derived without the subject (second), whose new bodies
        are inserted here, before the DELETE: a crash in between leaves both, and the
        redo deletes the old ones."""
        mine = f"{self.before} AND {self.owner}"
        persona = self.count(table, f"{mine} AND type = 'persona.versioned'")
        keys = self.fact_keys(table, mine)
        memory_ids = self.values(table, "memory_id", f"{mine} AND memory_id != ''")
        self.params[f"m{self.tag}"] = memory_ids
        subject = (
            f"{self.before} AND ({self.owner} OR memory_id IN "
            + self.named("{m:Array(String)})")
            + " AND type != 'subject.erased'"
        )
        others = f"NOT ({subject})"
        # a redo after the subject's rows went (a rebuild from the log, where they are
        # shredded) still finds what they shaped: the receipt says persona versions
        # were rewritten, and a fact's chain is broken where the subject's changes were
        persona = persona or self.receipted()
        keys = sorted(set(keys) | set(self.broken_fact_keys(table, others)))
        changed, stale = self.persona_rewrites(table, others) if persona else ([], [])
        for namespace, key in keys:
            more, old = self.fact_rewrites(table, others, namespace, key)
            changed, stale = changed + more, stale + old
        if changed:
            insert_rows(self.client, table, changed, self.columns)
        self.rewritten[table] = len(stale)
        self.stale[table] = stale
        self.params[f"old{self.tag}"] = stale
        rows = self.named("{a:String} AND " + _ROW + " IN {old:Array(UInt64)}")
        return subject, f"({subject}) OR (agent_id = {rows})"

    def receipted(self) -> bool:
        """Whether this erasure of this agent has a receipt already (a redo)."""
        found = self.query(
            self.named(
                "SELECT count() FROM erasures WHERE agent_id = {a:String} AND request_id = {r:UUID}"
            ),
        )
        return bool(found and found[0][0])

    def broken_fact_keys(self, table: str, others: str) -> list[tuple[str, str]]:
        """The fact keys among ``others``' changes whose ``previous_value`` is not the
        value of the change before it (the first: not None)."""
        rows = self.query(
            "SELECT DISTINCT ns, k FROM ("
            " SELECT JSONExtractString(body, 'namespace') AS ns,"
            " JSONExtractString(body, 'key') AS k,"
            " JSONExtract(body, 'previous_value', 'Nullable(String)') AS prev,"
            " lagInFrame(JSONExtract(body, 'value', 'Nullable(String)')) OVER w AS prior,"
            " row_number() OVER w AS n"
            f" FROM {table} WHERE {self.before} AND type = 'fact.set' AND {others}"
            " WINDOW w AS (PARTITION BY ns, k ORDER BY seq, idx"
            " ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))"
            " WHERE if(n = 1, prev IS NOT NULL, NOT (prev <=> prior))"
        )
        return [(str(ns), str(key)) for ns, key in rows]

    def fact_keys(self, table: str, where: str) -> list[tuple[str, str]]:
        rows = self.query(
            f"SELECT DISTINCT JSONExtractString(body, 'namespace'), JSONExtractString(body, 'key')"
            f" FROM {table} WHERE {where} AND type = 'fact.set'"
        )
        return [(str(ns), str(key)) for ns, key in rows]

    def persona_rewrites(self, table: str, others: str) -> tuple[list[list[Any]], list[int]]:
        """The others' persona versions with the fold's re-merged bodies, to insert, and
        the :data:`_ROW` of the rows they replace or that the fold no longer has."""
        where = f"{self.before} AND type = 'persona.versioned' AND {others}"
        return remerge(self.rows(table, where), self.merged_persona(), self.columns)

    def merged_persona(self) -> dict[str, str]:
        """Source event id -> body of each persona version in the agent's latest
        checkpoint (a ``StoredState`` of the worker, or an ``AgentState``)."""
        found = self.query(
            self.named("SELECT state FROM agent_states FINAL WHERE agent_id = {a:String}"),
            formats={"state": "bytes"},
        )
        return merged_persona(found[0][0]) if found else {}

    def fact_rewrites(
        self, table: str, others: str, namespace: str, key: str
    ) -> tuple[list[list[Any]], list[int]]:
        """The others' changes of one fact key whose ``previous_value`` the chain of the
        remaining changes no longer gives, with the value it gives (to insert), and the
        :data:`_ROW` of the rows they replace."""
        where = f"{self.before} AND type = 'fact.set' AND {others}" + self.named(
            " AND JSONExtractString(body, 'namespace') = {ns:String}"
            " AND JSONExtractString(body, 'key') = {k:String}"
        )
        named = {f"ns{self.tag}": namespace, f"k{self.tag}": key}
        return rechain(self.rows(table, where, **named))

    # -- helpers ------------------------------------------------------------------

    def rows(self, table: str, where: str, **extra: Any) -> list[tuple[list[Any], int]]:
        """Every physical row (``columns``, body last; duplicates of a key included) of
        ``table`` matching ``where``, in (seq, idx) order, with its :data:`_ROW`."""
        names = ", ".join(self.columns)
        sql = f"SELECT {names}, {_ROW} FROM {table} WHERE {where} ORDER BY seq, idx"
        return [(list(r[:-1]), int(r[-1])) for r in self.query(sql, **extra)]

    def values(self, table: str, column: str, where: str) -> list[str]:
        rows = self.query(f"SELECT DISTINCT {column} FROM {table} WHERE {where}")
        return [str(r[0]) for r in rows]

    def count(self, table: str, where: str, **extra: Any) -> int:
        return int(self.query(f"SELECT count() FROM {table} WHERE {where}", **extra)[0][0])

    def query(
        self, sql: str, formats: dict[str, str | dict[str, str]] | None = None, **extra: Any
    ) -> Sequence[Sequence[Any]]:
        params = {**self.params, **extra}
        result = self.client.query(sql, parameters=params, column_formats=formats or {})
        return result.result_rows


# -- shared by the live purge and the rebuild's ----------------------------------------


def merged_persona(state: bytes) -> dict[str, str]:
    """Source event id -> body of each persona version in one serialised checkpoint
    (a ``StoredState`` of the worker, or an ``AgentState``)."""
    doc = json.loads(state)
    versions = doc.get("memory", doc).get("persona", {}).get("versions", [])
    fields = PersonaVersionBody.model_fields
    return {
        str(v["source_event_id"]): PersonaVersionBody.model_validate(
            {k: v[k] for k in fields if k in v}
        ).model_dump_json()
        for v in versions
    }


def remerge(
    rows: Sequence[tuple[list[Any], int]], merged: dict[str, str], columns: Sequence[str]
) -> tuple[list[list[Any]], list[int]]:
    """The persona rows (``columns``, body last, with their :data:`_ROW`) whose body
    is not the fold's re-merged one (``merged``, by source event id): those it has,
    with its body, to insert; and the :data:`_ROW` of every row they replace or that
    the fold no longer has."""
    source = list(columns).index("source_event_id")
    changed: list[list[Any]] = []
    stale: list[int] = []
    for row, ident in rows:
        body = merged.get(str(row[source]))
        if body == row[-1]:
            continue
        stale.append(ident)
        if body is not None:
            changed.append([*row[:-1], body])
    return changed, stale


def rechain(rows: Sequence[tuple[list[Any], int]]) -> tuple[list[list[Any]], list[int]]:
    """One fact key's remaining ``fact.set`` rows (``seq`` and ``idx`` second and
    third, body last, with their :data:`_ROW`) in (seq, idx) order: those whose
    ``previous_value`` the chain of these rows no longer gives, with the value it
    gives (to insert), and the :data:`_ROW` of the rows they replace. Copies of one
    change (a redelivery) chain once. A chain already whole gives nothing."""
    changed: list[list[Any]] = []
    stale: list[int] = []
    previous: str | None = None
    want: str | None = None
    last: tuple[int, int] | None = None
    for row, ident in rows:
        if (row[1], row[2]) != last:
            last, want = (row[1], row[2]), previous
        fact = FactSetBody.model_validate_json(row[-1])
        if fact.previous_value != want:
            body = fact.model_copy(update={"previous_value": want}).model_dump_json()
            changed.append([*row[:-1], body])
            stale.append(ident)
        previous = fact.value
    return changed, stale


# -- the rebuild's purge ---------------------------------------------------------------


def purge_rebuilt(
    client: Client,
    erasures: Sequence[SubjectErased],
    table: str,
    columns: Sequence[str],
    excluded: str | None = None,
) -> int:
    """Rebuild-only: purge ``erasures`` from ``table`` alone (a version of the memory
    changes being rebuilt from the log), set-based; return how many waves it took.

    The live purge (:func:`purge`) ran when each erasure was first folded: it purged
    the archive, the checkpoints and every table of memory changes then on disk, and
    wrote the receipts. A rebuild writes the log's rows again into a new table, so that
    table alone needs purging, and no counts are kept. What goes and what is rewritten
    is what :func:`purge` decides for ``table`` (the subject's changes and its
    memories', persona versions re-merged, fact chains mended), all bounded by the
    erasure's position: ``agent_id = A AND seq < E``. So an erasure may be purged any
    time after the rows of its agent before it are written (read in log order, they
    are when it is read), and rows written later change nothing it decides.

    Erasures go in :func:`waves` of at most one per agent, each agent's in log order,
    so a second erasure of an agent sees the table as the first one left it, as the
    live purge did; a wave costs a few queries, one insert of the rewritten rows and
    one DELETE (none when nothing matches). Idempotent: run again, it finds nothing.

    With ``excluded`` (a table of one ``h UInt64`` column, see :func:`exclusion_ddl`),
    nothing is deleted: the rows a wave would delete are named there by their
    :data:`_ROW`, and every wave reads ``table`` without the rows named so far, so it
    decides as after the DELETEs. :func:`kept_rows` then copies what is left in one
    pass. A lightweight DELETE is a mutation, which chdb ran for 1-34 s per wave on a
    million rows whatever it matched (its ``count()`` took 0.5 s): a table nobody
    reads yet is cheaper to copy once than to mutate wave after wave."""
    done = 0
    for wave in waves(erasures):
        Wave(client, wave, table, columns, excluded).run()
        done += 1
    return done


def exclusion_ddl(excluded: str) -> str:
    """The table of the rows a rebuild's purge excludes (:func:`purge_rebuilt`)."""
    return f"CREATE TABLE IF NOT EXISTS {excluded} (h UInt64) ENGINE = MergeTree ORDER BY h"


def kept_rows(table: str, excluded: str) -> str:
    """SQL: the rows of ``table`` that ``excluded`` does not name, to insert into a
    copy of ``table``."""
    return f"SELECT * FROM {table} WHERE {_ROW} NOT IN (SELECT h FROM {excluded})"


def agent_waves(erasures: Sequence[SubjectErased]) -> list[list[int]]:
    """The positions of ``erasures`` in waves of at most one per agent: the n-th wave
    holds each agent's n-th erasure, in log order (``seq``, then position)."""
    per_agent: dict[str, list[int]] = {}
    for at, erased in enumerate(erasures):
        per_agent.setdefault(erased.agent_id, []).append(at)
    ordered = [sorted(ats, key=lambda at: (erasures[at].seq, at)) for ats in per_agent.values()]
    depth = max((len(ats) for ats in ordered), default=0)
    return [[ats[n] for ats in ordered if n < len(ats)] for n in range(depth)]


def waves(erasures: Sequence[SubjectErased]) -> list[list[SubjectErased]]:
    """``erasures`` in waves: the n-th holds each agent's n-th erasure in log order
    (``seq``); copies of one erasure (a redelivery: same agent, seq and subject) once."""
    per_agent: dict[str, dict[tuple[int, str], SubjectErased]] = {}
    for erased in erasures:
        per_agent.setdefault(erased.agent_id, {}).setdefault(
            (erased.seq, erased.body.subject), erased
        )
    ordered = [[found[key] for key in sorted(found)] for found in per_agent.values()]
    depth = max((len(agent) for agent in ordered), default=0)
    return [[agent[n] for agent in ordered if n < len(agent)] for n in range(depth)]


class Wave:
    """At most one erasure per agent, purged from one table together. Its SQL names
    each row's erasure through the agent: ``{ag}`` the agents, ``{ae}`` and ``{au}``
    their erasures' sequences and subjects, in the same order."""

    def __init__(
        self,
        client: Client,
        erasures: Sequence[SubjectErased],
        table: str,
        columns: Sequence[str],
        excluded: str | None = None,
    ) -> None:
        self.client = client
        self.table = table
        self.excluded = excluded
        self.visible = f" AND {_ROW} NOT IN (SELECT h FROM {excluded})" if excluded else ""
        """What the wave's reads add to see ``table`` without the rows excluded so far."""
        self.columns = tuple(columns)
        self.erasures = {e.agent_id: e for e in erasures}
        agents = list(self.erasures)
        self.params: dict[str, Any] = {
            "ag": agents,
            "ae": [self.erasures[a].seq for a in agents],
            "au": [self.erasures[a].body.subject for a in agents],
        }
        # transform() looks the agent up in a hash table built once per query; a map
        # (mapFromArrays) was built per row: the DELETE took about 3x as long on chdb
        self.before = (
            "agent_id IN {ag:Array(String)}"
            " AND seq < transform(agent_id, {ag:Array(String)}, {ae:Array(UInt64)}, 0)"
        )
        self.owner = (
            "coalesce(user_id, agent_id)"
            " = transform(agent_id, {ag:Array(String)}, {au:Array(String)}, '')"
        )
        self.user = self.columns.index("user_id")

    def run(self) -> None:
        """Insert the rewritten rows, then delete the subject's and the replaced ones."""
        documents = self.documents()
        changed, stale = self.rewrites(documents)
        if changed:
            insert_rows(self.client, self.table, changed, self.columns)
        self.delete(self.memory_ids(), stale)

    def owns(self, row: Sequence[Any], agent: str) -> bool:
        """Whether ``row`` of ``agent`` is its erasure's subject's (True) or another's
        (False), as :class:`Purge`'s SQL decides it: a row without a user is the
        agent's, so the subject's when the agent is the subject, else another's."""
        user, subject = row[self.user], self.erasures[agent].body.subject
        if user is None:
            return subject == agent
        return bool(user == subject)

    def memory_ids(self) -> list[tuple[str, str]]:
        """(agent, memory id) of every memory the subject's changes before the erasure name."""
        rows = self.query(
            f"SELECT DISTINCT agent_id, memory_id FROM {self.table}"
            f" WHERE {self.before} AND {self.owner} AND memory_id != ''{self.visible}"
        )
        return [(str(agent), str(memory)) for agent, memory in rows]

    def documents(self) -> dict[str, list[tuple[list[Any], int]]]:
        """Per agent, its ``fact.set`` and ``persona.versioned`` rows before its erasure
        (``columns``, body last; copies included) in (seq, idx) order, with their
        :data:`_ROW`."""
        names = ", ".join(self.columns)
        rows = self.query(
            f"SELECT {names}, {_ROW} FROM {self.table} WHERE {self.before}"
            f" AND type IN ('fact.set', 'persona.versioned'){self.visible}"
            " ORDER BY agent_id, seq, idx"
        )
        found: dict[str, list[tuple[list[Any], int]]] = {}
        for row in rows:
            found.setdefault(str(row[0]), []).append((list(row[:-1]), int(row[-1])))
        return found

    def rewrites(
        self, documents: dict[str, list[tuple[list[Any], int]]]
    ) -> tuple[list[list[Any]], list[int]]:
        """The others' rows re-derived without the subject (to insert) and the
        :data:`_ROW` of those they replace: every fact key's chain mended
        (:func:`rechain`; a whole chain gives nothing, so every key may be looked at),
        and the persona versions re-merged (:func:`remerge`) where the subject made
        some or the erasure has a receipt (a redo, where the subject's are shredded)."""
        type_at = self.columns.index("type")
        receipted = self.receipted()
        personas: dict[str, list[tuple[list[Any], int]]] = {}
        changed: list[list[Any]] = []
        stale: list[int] = []
        for agent, rows in documents.items():
            others = [(r, i) for r, i in rows if self.owns(r, agent) is False]
            facts = [(r, i) for r, i in others if r[type_at] == "fact.set"]
            for chain in _by_fact_key(facts):
                more, old = rechain(chain)
                changed, stale = changed + more, stale + old
            mine = any(r[type_at] == "persona.versioned" and self.owns(r, agent) for r, _ in rows)
            if mine or agent in receipted:
                personas[agent] = [(r, i) for r, i in others if r[type_at] == "persona.versioned"]
        merged = self.merged({a for a, rows in personas.items() if rows})
        for agent, rows in personas.items():
            more, old = remerge(rows, merged.get(agent, {}), self.columns)
            changed, stale = changed + more, stale + old
        return changed, stale

    def receipted(self) -> set[str]:
        """The agents whose erasure of this wave has a receipt already."""
        rows = self.query(
            "SELECT agent_id, request_id FROM erasures WHERE agent_id IN {ag:Array(String)}"
        )
        return {
            str(agent)
            for agent, request in rows
            if str(request) == str(self.erasures[str(agent)].body.request_id)
        }

    def merged(self, agents: set[str]) -> dict[str, dict[str, str]]:
        """Per agent, :func:`merged_persona` of its latest checkpoint (none: empty)."""
        if not agents:
            return {}
        rows = self.client.query(
            "SELECT agent_id, state FROM agent_states FINAL WHERE agent_id IN {pa:Array(String)}",
            parameters={"pa": sorted(agents)},
            column_formats={"state": "bytes"},
        ).result_rows
        return {str(agent): merged_persona(state) for agent, state in rows}

    def delete(self, memory_ids: list[tuple[str, str]], stale: list[int]) -> None:
        """One DELETE of the subjects' changes (and their memories') before each
        erasure, but the erasures themselves, and of the ``stale`` rows; none when
        nothing matches. With an ``excluded`` table, their :data:`_ROW` go there
        instead (one ``INSERT … SELECT``)."""
        mine = self.owner
        if memory_ids:
            # a set from a subquery: IN over the array parameter itself took 13 s to count
            # 20 000 pairs against a million rows on chdb (0.4 s this way)
            memories = "SELECT arrayJoin({mi:Array(Tuple(String, String))})"
            mine = f"({mine} OR (agent_id, memory_id) IN ({memories}))"
        where = f"({self.before} AND type != 'subject.erased' AND {mine})"
        if stale:
            where += " OR (agent_id IN {ag:Array(String)} AND " + _ROW + " IN {old:Array(UInt64)})"
        extra = {"mi": memory_ids, "old": stale}
        if self.excluded is not None:
            self.client.command(
                f"INSERT INTO {self.excluded} SELECT {_ROW} FROM {self.table}"
                f" WHERE ({where}){self.visible}",
                parameters={**self.params, **extra},
            )
            return
        if int(self.query(f"SELECT count() FROM {self.table} WHERE {where}", **extra)[0][0]):
            self.client.command(
                f"DELETE FROM {self.table} WHERE {where}",
                parameters={**self.params, **extra},
                settings=DELETE_SYNC,
            )

    def query(self, sql: str, **extra: Any) -> Sequence[Sequence[Any]]:
        return self.client.query(sql, parameters={**self.params, **extra}).result_rows


def _by_fact_key(rows: list[tuple[list[Any], int]]) -> list[list[tuple[list[Any], int]]]:
    """``fact.set`` rows grouped by (namespace, key), each group in the rows' order."""
    keys: dict[tuple[str, str], list[tuple[list[Any], int]]] = {}
    for row, ident in rows:
        body = json.loads(row[-1])
        keys.setdefault((str(body["namespace"]), str(body["key"])), []).append((row, ident))
    return list(keys.values())

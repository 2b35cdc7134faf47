"""The ``engram`` command line."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from engram.errors import EngramError
from engram.settings import Settings, SettingsError
from schemas import BadEvent

if TYPE_CHECKING:
    from engram.transfer import ImportPlan

app = typer.Typer(
    name="engram",
    help="Event-sourced memory for AI agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
errors = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def warn(message: str) -> None:
    errors.print(f"[bold yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def load_settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as error:
        raise fail(str(error), 2) from None


@app.command()
def up() -> None:
    """Start the embedded stack (broker, worker, ClickHouse, HTTP API) until Ctrl-C.

    Example: ENGRAM_HOME=./.engram engram up
    """
    from ops.stack import run_up

    settings = load_settings()
    try:
        code = run_up(settings, say=lambda line: console.print(f"[dim]engram[/] {line}"))
    except (OSError, RuntimeError, EngramError) as error:
        raise fail(str(error)) from None
    raise typer.Exit(code)


@app.command()
def demo(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the history.")] = 120.0,
) -> None:
    """Run the demo: start the stack, publish three agents' sessions, show the history.

    Example: engram demo
    """
    from engram.rundemo import run_demo

    try:
        run_demo(load_settings(), console, timeout=timeout)
    except (EngramError, RuntimeError, OSError, TimeoutError) as error:
        raise fail(str(error)) from None


@app.command()
def publish(
    file: Annotated[Path, typer.Argument(help="JSON lines, one event per line; - for stdin.")],
    http: Annotated[bool, typer.Option(help="Publish through the HTTP API.")] = False,
    batch: Annotated[int, typer.Option(min=1, help="Events per batch.")] = 1000,
    skip: Annotated[
        int,
        typer.Option(
            min=0,
            help="Send only the events after the file's first SKIP (to go on after a failure).",
        ),
    ] = 0,
) -> None:
    """Publish events from a JSON-lines file. Every line is validated before any is sent.
    When a batch fails, the error says how many events were acknowledged and how to
    go on with --skip.

    Example: engram publish events.jsonl
    """
    from engram.errors import PartlyPublished
    from engram.publishing import publish_file

    try:
        count = publish_file(
            load_settings(), file, console, prefer_http=http, batch=batch, skip=skip
        )
    except BadEvent as bad:
        raise fail(f"nothing was published: {bad.reason}", 2) from None
    except PartlyPublished as partly:
        from processors import MemoryConfig

        window = MemoryConfig().dedupe_window
        raise fail(
            f"published the file's first {partly.done} events (up to line {partly.line});"
            f" then a batch of {partly.pending} failed: {partly.cause}. That batch may have"
            f" reached the log in part. To go on from it: engram publish {file}"
            f" --skip {partly.done} (the fold drops an agent's repeats among its latest"
            f" {window} events by default, so sending the batch again is safe when no agent"
            f" has more events than that in it: --batch {window} or less makes sure)"
        ) from None
    except (EngramError, OSError) as error:
        raise fail(str(error)) from None
    console.print(f"published {count} events")


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A read-only query (SELECT, SHOW, DESCRIBE…).")],
    format: Annotated[str, typer.Option("--format", "-f", help="table, csv or json")] = "table",
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="NAME=VALUE for a {NAME:Type} placeholder; repeatable"),
    ] = None,
) -> None:
    """Query the history in ClickHouse; ``@FILE`` reads the query from a file.

    Example: engram sql @ops/sql/promotions_per_day.sql -p since=2026-01-01
    -p until=2027-01-01 -p agent_id=
    """
    from engram.history import run_sql

    if format not in ("table", "csv", "json"):
        raise fail(f"--format must be table, csv or json, not {format!r}", 2)
    parameters = {}
    for item in param or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise fail(f"--param takes NAME=VALUE, not {item!r}", 2)
        parameters[name] = value
    if query.startswith("@"):
        try:
            query = Path(query[1:]).read_text(encoding="utf-8")
        except OSError as error:
            raise fail(f"cannot read the query file: {error}", 2) from None
        except UnicodeDecodeError as error:
            raise fail(
                f"the query file is not UTF-8 text ({error.reason} at byte {error.start})", 2
            ) from None
    try:
        columns, rows = run_sql(load_settings(), query, parameters)
    except EngramError as error:
        raise fail(str(error)) from None
    render(columns, rows, format)


def render(columns: list[str], rows: list[tuple[Any, ...]], fmt: str) -> None:
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows(rows)
        sys.stdout.write(out.getvalue())
    elif fmt == "json":
        records = [dict(zip(columns, map(_finite, row), strict=True)) for row in rows]
        text = json.dumps(records, default=str, ensure_ascii=False, indent=2, allow_nan=False)
        sys.stdout.write(text + "\n")
    else:
        table = Table(*columns)
        for row in rows:
            table.add_row(*(str(v) for v in row))
        console.print(table)


def _finite(value: Any) -> Any:
    """``value`` with every infinite or NaN float, at any depth, as None: JSON has no
    such numbers (ClickHouse's own JSON output writes them as null too)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


@app.command()
def schema(
    type: Annotated[str | None, typer.Argument(help="One event type, e.g. tool.result")] = None,
) -> None:
    """Print the JSON Schema of every event type (or of one).

    Example: engram schema interaction.recorded
    """
    from schemas import TYPES_BY_NAME

    if type is not None and type not in TYPES_BY_NAME:
        raise fail(f"unknown event type {type!r}; known: {', '.join(sorted(TYPES_BY_NAME))}", 2)
    chosen = {type: TYPES_BY_NAME[type]} if type else TYPES_BY_NAME
    schemas = {name: model.model_json_schema() for name, model in sorted(chosen.items())}
    sys.stdout.write(json.dumps(schemas, indent=2, ensure_ascii=False) + "\n")


@app.command()
def recall(
    query: Annotated[str, typer.Argument(help="What to remember, in any language.")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="The agent whose memory to search.")],
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's.")] = None,
    k: Annotated[int, typer.Option("-k", min=1, max=1000, help="How many memories.")] = 10,
    layer: Annotated[
        list[str] | None, typer.Option("--layer", "-l", help="L2 or L3; repeatable.")
    ] = None,
    min_importance: Annotated[float | None, typer.Option(min=1, max=10)] = None,
    forgotten: Annotated[bool, typer.Option(help="Include forgotten memories.")] = False,
    record: Annotated[
        bool, typer.Option(help="Record the recall (memory.recalled), which reinforces.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Recall an agent's memories (hybrid, retention weighted); the recall reinforces them.

    Example: engram recall "where does the user want to travel?" --agent travel-bot
    """
    from engram.client import Memory

    try:
        with Memory.connect(load_settings(), prefer_http=True) as memory:
            result = memory.recall(
                query,
                agent_id=agent,
                user_id=user,
                k=k,
                layers=layer,
                min_importance=min_importance,
                include_forgotten=forgotten,
                record=record,
            )
    except EngramError as error:
        raise fail(str(error)) from None
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return
    table = Table("#", "score", "R", "layer", "memory", title=f"{agent}: {query}")
    for rank, m in enumerate(result.memories, 1):
        table.add_row(str(rank), f"{m.score:.3f}", f"{m.retention:.2f}", m.layer, m.text)
    console.print(table)


@app.command()
def snapshot(
    agent: Annotated[str, typer.Argument(help="The agent.")],
    user: Annotated[str | None, typer.Option("--user", "-u")] = None,
    session: Annotated[str | None, typer.Option("--session", "-s")] = None,
    as_of: Annotated[
        str | None,
        typer.Option("--as-of", help="ISO-8601 moment with offset, e.g. 2026-01-31T12:00Z"),
    ] = None,
    episodes: Annotated[int, typer.Option(min=0, max=1000)] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show an agent's memory snapshot: working memory, episodes, facts, persona, skills.

    Example: engram snapshot travel-bot --user u-1 --json
    """
    from engram.client import Memory
    from engram.views import print_snapshot

    moment = parse_moment(as_of) if as_of is not None else None
    if moment is not None and moment > datetime.now(moment.tzinfo):
        raise fail(f"{as_of} is in the future", 2)
    try:
        with Memory.connect(load_settings(), prefer_http=True) as memory:
            snap = memory.snapshot(
                agent, user_id=user, session_id=session, as_of=moment, episodes=episodes
            )
    except EngramError as error:
        raise fail(str(error)) from None
    if as_json:
        sys.stdout.write(snap.model_dump_json(indent=2) + "\n")
        return
    print_snapshot(console, snap)


def parse_moment(text: str) -> datetime:
    """An aware datetime from ISO-8601 (``Z`` or ``z`` allowed, as RFC 3339 does); exits
    2 when it is not one."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise fail(f"not an ISO-8601 moment: {text!r}", 2) from None
    if moment.tzinfo is None:
        raise fail(f"{text!r} has no UTC offset; add Z or +HH:MM", 2)
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise fail(f"{text!r} is outside the years 1 to 9999 in UTC", 2) from None
    return moment


@app.command()
def mcp() -> None:
    """Serve engram to agent frameworks over MCP (stdio): memory_recall, memory_publish,
    memory_snapshot. Needs a running `engram up`.

    Example (in an MCP client's config): {"command": "engram", "args": ["mcp"]}
    """
    from engram.mcp import serve

    try:
        serve(load_settings())
    except EngramError as error:
        raise fail(str(error)) from None


class RebuildTarget(StrEnum):
    clickhouse = "clickhouse"
    vectors = "vectors"


@app.command()
def rebuild(
    target: Annotated[
        RebuildTarget, typer.Argument(help="clickhouse (memory_changes) or vectors.")
    ],
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the previous version instead of dropping it.")
    ] = False,
    max_rate: Annotated[
        float | None,
        typer.Option("--max-rate", min=1, help="Read at most this many events per second."),
    ] = None,
) -> None:
    """Rebuild a projection from engram.memory, blue/green: a new version is filled from
    the beginning of the log while reads go on, then swapped in atomically. Needs a
    running `engram up`. Ctrl-C cancels before the swap; the live version stays.

    Example: engram rebuild clickhouse --keep
    """
    from engram.client import read_up_file
    from ops.rebuild import RebuildFailed, run_rebuild

    settings = load_settings()
    up = read_up_file(settings.up_file)
    if up is None:
        raise fail(f"engram is not running (no {settings.up_file}); start `engram up` first", 2)
    try:
        status = run_rebuild(
            str(up["http"]), target.value, keep=keep, max_rate=max_rate, console=console
        )
    except (RebuildFailed, httpx.HTTPError) as error:
        raise fail(f"rebuild of {target.value}: {error}") from None
    if status.state == "cancelled":
        raise fail(f"rebuild of {target.value} cancelled; the live version is unchanged", 130)
    if status.state != "done":
        raise fail(f"rebuild of {target.value} failed ({status.error}); the live version stays")
    kept = f", v{status.previous} kept" if status.keep else f", v{status.previous} dropped"
    console.print(
        f"rebuilt {target.value}: {status.applied} changes applied, v{status.live} is live{kept}"
    )
    if status.error:
        errors.print(f"[yellow]warning:[/] {status.error}", highlight=False)


@app.command()
def reprocess(
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            "-c",
            help="JSON or TOML file of the new processor parameters (engram config shows them).",
        ),
    ] = None,
    keep: Annotated[
        bool,
        typer.Option("--keep", help="Keep the previous projection versions instead of dropping."),
    ] = False,
    max_rate: Annotated[
        float | None,
        typer.Option("--max-rate", min=1, help="Read at most this many raw events per second."),
    ] = None,
    show: Annotated[
        bool, typer.Option("--show", help="Print the derivations recorded (the last is live).")
    ] = False,
) -> None:
    """Derive the memory again from engram.events with new processor parameters (a
    forgetting threshold, FSRS instead of the exponential curve, a new episode gap):
    into a new derived topic, a new memory_changes version and a new vector collection,
    while the live derivation keeps serving; then a swap, and the worker folds on with
    the new parameters. Needs a running `engram up`. Ctrl-C cancels before the swap.

    Example: engram reprocess --config fsrs.toml   (fsrs.toml: [forgetting] curve = "fsrs")
    """
    from engram.client import read_up_file
    from ops.reprocess import ReprocessFailed, load_config, member_patience, run_reprocess

    settings = load_settings()
    if not show and config is None:
        raise fail("give --config FILE (the new parameters) or --show", 2)
    parsed = None
    if config is not None:
        try:
            parsed = load_config(config)
        except ValueError as error:
            raise fail(str(error), 2) from None
    up = read_up_file(settings.up_file)
    if up is None:
        raise fail(f"engram is not running (no {settings.up_file}); start `engram up` first", 2)
    if show:
        try:
            answer = httpx.get(f"{up['http']}/v1/admin/derivations", timeout=30)
            answer.raise_for_status()
        except httpx.HTTPError as error:
            raise fail(f"the stack did not answer: {error}") from None
        for d in answer.json():
            console.print(
                f"generation {d['generation']} {d['step']}: {d['version']} on {d['memory_topic']}"
            )
        return
    assert parsed is not None
    try:
        status = run_reprocess(
            str(up["http"]),
            parsed,
            keep=keep,
            max_rate=max_rate,
            console=console,
            patience_s=max(member_patience(settings.group_timeouts()[0]), member_patience(None)),
        )
    except (ReprocessFailed, httpx.HTTPError) as error:
        raise fail(f"reprocess: {error}") from None
    if status.state == "cancelled":
        raise fail("reprocess cancelled; the live derivation is unchanged", 130)
    if status.state != "done":
        raise fail(f"reprocess failed ({status.error}); the live derivation stays")
    kept = "kept" if status.keep else "dropped"
    console.print(
        f"reprocessed: generation {status.generation} ({status.version}) is live on"
        f" {status.memory_topic}: {status.done} raw events, {status.derived} derived,"
        f" {status.embedded} embedded ({status.reused} vectors reused); memory_changes"
        f" v{status.clickhouse} and vectors"
        f" v{status.vectors} live, previous {kept}"
    )


@app.command("config")
def config_cmd(
    live: Annotated[
        bool, typer.Option("--live", help="The running stack's parameters, not the defaults.")
    ] = False,
) -> None:
    """Print the processor parameters as JSON (the defaults, or with --live those of the
    running stack's live derivation): a starting point for `engram reprocess --config`.

    Example: engram config --live > params.json
    """
    from engram.client import read_up_file
    from processors import MemoryConfig

    if not live:
        print(MemoryConfig().model_dump_json(indent=2))
        return
    settings = load_settings()
    up = read_up_file(settings.up_file)
    if up is None:
        raise fail(f"engram is not running (no {settings.up_file}); start `engram up` first", 2)
    try:
        found = httpx.get(f"{up['http']}/v1/admin/derivations", timeout=30)
        found.raise_for_status()
    except httpx.HTTPError as error:
        raise fail(f"the stack did not answer: {error}") from None
    config = MemoryConfig.model_validate(found.json()[-1]["config"])
    print(config.model_dump_json(indent=2))


_AGENT = typer.Option("--agent", "-a", help="The agent whose memory to reconstruct.")
_USER = typer.Option("--user", "-u", help="Only this user's episodes and memories.")
_SESSION = typer.Option("--session", "-s", help="Only this session's working memory.")
_FORMAT = typer.Option("--format", "-f", help="table or json")
_EPISODES = typer.Option(min=0, max=1000, help="How many of the latest episodes.")


@app.command("history")
def history_cmd(
    agent: Annotated[str, _AGENT],
    as_of: Annotated[str, typer.Option("--as-of", help="ISO-8601 moment with offset.")],
    user: Annotated[str | None, _USER] = None,
    session: Annotated[str | None, _SESSION] = None,
    episodes: Annotated[int, _EPISODES] = 10,
    format: Annotated[str, _FORMAT] = "table",
) -> None:
    """An agent's memory as of a moment, by SQL over the ClickHouse history alone:
    working memory, episodes, memories with their retention, facts, persona, skills.

    Example: engram history --agent travel-bot --as-of 2026-01-31T12:00Z --format json
    """
    time_travel_cmd("history", agent, as_of, user, session, episodes, format)


@app.command("replay")
def replay_cmd(
    agent: Annotated[str, _AGENT],
    until: Annotated[str, typer.Option("--until", help="ISO-8601 moment with offset.")],
    user: Annotated[str | None, _USER] = None,
    session: Annotated[str | None, _SESSION] = None,
    episodes: Annotated[int, _EPISODES] = 10,
    format: Annotated[str, _FORMAT] = "table",
) -> None:
    """An agent's memory as of a moment, by replaying its archived log up to it
    through the processors (the same answer as `engram history`, the other road).

    Example: engram replay --agent travel-bot --user u-1 --until 2026-01-31T12:00Z
    """
    time_travel_cmd("replay", agent, until, user, session, episodes, format)


def time_travel_cmd(
    road: str,
    agent: str,
    moment_text: str,
    user: str | None,
    session: str | None,
    episodes: int,
    fmt: str,
) -> None:
    from engram.history import print_time_travel, time_travel
    from engram.snapshot import UnknownAgent

    if fmt not in ("table", "json"):
        raise fail(f"--format must be table or json, not {fmt!r}", 2)
    moment = parse_moment(moment_text)
    now = datetime.now(moment.tzinfo)
    if moment > now:
        raise fail(f"{moment_text} is in the future (now is {now.isoformat()})", 2)
    try:
        snap = time_travel(
            load_settings(),
            road,
            agent,
            moment,
            user_id=user,
            session_id=session,
            episodes=episodes,
        )
    except (UnknownAgent, EngramError) as error:
        raise fail(str(error).strip("'\"")) from None
    if fmt == "json":
        sys.stdout.write(snap.model_dump_json(indent=2) + "\n")
    else:
        print_time_travel(console, snap)


@app.command("status")
def status_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Lag of the worker per partition and consumer group, dead letters, projection versions.

    Example: engram status
    """
    from engram.client import read_up_file, reason_of
    from engram.status import render, status_of

    settings = load_settings()
    up = read_up_file(settings.up_file)
    if up is None:
        raise fail(f"engram is not running (no {settings.up_file}); start it with `engram up`")
    try:
        response = httpx.get(f"{up['http']}/v1/status", timeout=30)
    except httpx.HTTPError as error:
        raise fail(f"engram at {up['http']} did not answer: {error}") from None
    if response.status_code != 200:
        raise fail(f"engram at {up['http']}: {reason_of(response)}")
    if as_json:
        sys.stdout.write(json.dumps(response.json(), indent=2) + "\n")
    else:
        render(console, status_of(response.json()))


@app.command("dead-letters")
def dead_letters_cmd(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many of the newest.")] = 20,
    content: Annotated[
        bool, typer.Option("--content", help="Show what each one held (opened with the keys).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """The newest dead letters: why each was refused, where from, whose key seals it and
    whether it still opens (a letter of an erased subject is gone for good).

    Example: engram dead-letters --limit 5 --content
    """
    from engram.client import read_up_file
    from engram.letters import DeadLetterView, dumps

    settings = load_settings()
    up = read_up_file(settings.up_file)
    if up is None:
        raise fail(f"engram is not running (no {settings.up_file}); start it with `engram up`")
    try:
        response = httpx.get(
            f"{up['http']}/v1/admin/dead-letters",
            params={"limit": limit, "content": content},
            timeout=60,
        )
        response.raise_for_status()
    except httpx.HTTPError as error:
        raise fail(f"engram at {up['http']} did not answer: {error}") from None
    views = [DeadLetterView.model_validate(v) for v in response.json()]
    if as_json:
        sys.stdout.write(dumps(views) + "\n")
        return
    if not views:
        console.print(f"no dead letters on {settings.dlq_topic}")
        return
    table = Table("at", "where", "reason", "subject", "state", "bytes")
    for v in views:
        table.add_row(
            v.at.strftime("%Y-%m-%d %H:%M:%S"),
            f"{v.partition}:{v.offset}",
            (v.reason or "") + (f"\n[dim]{v.source}[/dim]" if v.source else ""),
            v.subject or "",
            v.state,
            str(v.size),
        )
        if v.content is not None:
            table.add_row("", "", Text(v.content, style="dim"), "", "", "")
    console.print(table)


@app.command("erase")
def erase_cmd(
    user: Annotated[str | None, typer.Option("--user", "-u", help="The user to forget.")] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", "-a", help="An agent to forget (its user-less memory).")
    ] = None,
    reason: Annotated[str | None, typer.Option(help="Why (kept in the log).")] = None,
) -> None:
    """Forget a subject everywhere: its keys are destroyed, every agent, the history and
    the vectors purge it, each leaving a receipt without content (see engram status).

    Example: engram erase --user u-7 --reason "GDPR request 2026-11-02"
    """
    from engram.client import Memory

    if (user is None) == (agent is None):
        raise fail("name exactly one subject: --user U or --agent A", 2)
    subject = user or agent or ""
    try:
        with Memory.connect(load_settings(), prefer_http=True) as memory:
            request_id = memory.erase(subject, reason=reason)
    except (EngramError, ValueError) as error:
        raise fail(str(error)) from None
    console.print(f"erasure of {subject!r} requested: {request_id} (follow it with engram status)")


_WAIT = typer.Option(min=1, help="Seconds to wait for the worker to apply it.")


@app.command("rollback")
def rollback_cmd(
    agent: Annotated[str, typer.Argument(help="The agent to roll back.")],
    to: Annotated[str, typer.Option("--to", help="ISO-8601 moment with offset.")],
    reason: Annotated[str | None, typer.Option(help="Why (kept in the log).")] = None,
    timeout: Annotated[float, _WAIT] = 120.0,
) -> None:
    """Roll an agent's memory back to a past moment. A memory.rolled_back event is
    appended; the agent's memory then continues from its state at that moment. History
    is never edited: everything stays in it, the rollback too.

    Example: engram rollback travel-bot --to 2026-01-31T12:00Z --reason "bad import"
    """
    from engram.client import Memory

    moment = parse_moment(to)
    settings = load_settings()
    try:
        with Memory.connect(settings, prefer_http=True) as memory:
            event = memory.rollback(agent, to=moment, reason=reason)
    except EngramError as error:
        raise fail(str(error), 2) from None
    except BadEvent as bad:
        raise fail(f"refused: {bad.reason}", 2) from None
    change = wait_applied(settings, event.event_id, timeout)
    console.print(
        f"rolled {agent} back to {moment.isoformat()} (seq {change['to_seq']}): " + _counted(change)
    )


@app.command("fork")
def fork_cmd(
    source: Annotated[str, typer.Argument(help="The agent to copy.")],
    into: Annotated[str, typer.Option("--as", help="The new agent's id.")],
    at: Annotated[
        str | None, typer.Option("--at", help="ISO-8601 moment with offset; now if omitted.")
    ] = None,
    timeout: Annotated[float, _WAIT] = 120.0,
) -> None:
    """Create a new agent whose memory begins as another's was at a moment. A
    memory.forked event on the new agent names the source and the position; the
    source is untouched.

    Example: engram fork travel-bot --as travel-bot-b --at 2026-01-31T12:00Z
    """
    from engram.client import Memory

    moment = parse_moment(at) if at else None
    settings = load_settings()
    try:
        with Memory.connect(settings, prefer_http=True) as memory:
            event = memory.fork(source, into=into, at=moment)
    except EngramError as error:
        raise fail(str(error), 2) from None
    except BadEvent as bad:
        raise fail(f"refused: {bad.reason}", 2) from None
    change = wait_applied(settings, event.event_id, timeout)
    console.print(f"forked {source} at seq {change['source_seq']} as {into}: " + _counted(change))


def wait_applied(settings: Settings, request_id: Any, timeout: float) -> dict[str, Any]:
    """Wait (with a spinner) until the worker applied the request; exit 1 on timeout."""
    import time

    from engram.rebase import applied

    deadline = time.monotonic() + timeout
    with console.status("waiting for the worker to apply it…"):
        while time.monotonic() < deadline:
            try:
                change = applied(settings, request_id)
            except EngramError:
                change = None  # the history may lag behind a restart: ask again
            if change is not None:
                return change
            time.sleep(0.5)
    raise fail(
        f"published {request_id}, but the worker has not applied it after {timeout:.0f}s;"
        " see engram status (a refused request is a dead letter, with its reason)"
    )


def wait_archived(client: Any, plan: ImportPlan, timeout: float) -> None:
    """Wait (with a progress bar) until the history ``client`` reads holds every event
    of ``plan``; exit 1 on timeout, saying how far it got."""
    import time

    from engram.transfer import archived_counts, expected_counts

    expected = expected_counts(plan)
    total = sum(expected.values())
    deadline = time.monotonic() + timeout
    held = 0
    with Progress(console=console) as progress:
        task = progress.add_task("folding", total=total)
        while time.monotonic() < deadline:
            counts = archived_counts(client, plan)
            held = sum(min(counts[agent], want) for agent, want in expected.items())
            progress.update(task, completed=held)
            if held == total:
                return
            time.sleep(0.5)
    raise fail(
        f"published, but the history holds {held} of the {total} events after {timeout:.0f}s;"
        " see engram status (a refused event is a dead letter, with its reason) and import"
        " again once it caught up (what is there already is not sent twice)"
    )


def _counted(change: dict[str, Any]) -> str:
    parts = [
        f"{change.get(key, 0)} {label}"
        for key, label in (
            ("forgotten", "memories left"),
            ("restored", "memories restored"),
            ("facts", "facts set"),
            ("persona", "persona versions"),
            ("sessions", "working sessions replaced"),
        )
    ]
    return ", ".join(parts)


class ExportFormat(StrEnum):
    jsonl = "jsonl"
    avro = "avro"


@app.command("export")
def export_cmd(
    agent: Annotated[str, typer.Argument(help="The agent whose log to export.")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="File to write; <agent>.<format> if omitted."),
    ] = None,
    format: Annotated[
        ExportFormat, typer.Option("--format", "-f", help="jsonl (readable) or avro (exact bytes).")
    ] = ExportFormat.jsonl,
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
) -> None:
    """Write an agent's whole raw log (in log order) to a file another deployment imports.

    Example: engram export travel-bot -o travel-bot.avro --format avro
    """
    from engram.transfer import export_with_keys

    path = output or Path(f"{agent}.{format.value}")
    if path.exists() and not force:
        raise fail(f"{path} exists; pass --force to overwrite it", 2)
    partial = path.with_name(path.name + ".partial")
    try:
        done = export_with_keys(load_settings(), agent, partial, format.value)
    except (EngramError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise fail(str(error)) from None
    partial.replace(path)
    span = f"seq {done.first_seq}..{done.last_seq}"
    console.print(f"exported {done.events} events of {agent} ({span}) to {path}")


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="A file written by engram export (either format).")],
    http: Annotated[bool, typer.Option(help="Publish through the HTTP API.")] = False,
    batch: Annotated[int, typer.Option(min=1, help="Events per batch.")] = 1000,
    timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait until the history holds them; 0: no wait.")
    ] = 600.0,
) -> None:
    """Publish an exported log to this deployment, in its order, and wait until its fold
    archived them (it derives the same memory). Every record is checked before any is
    sent, and the history here first: events of the agent already here must be the
    file's first ones (importing again sends only the rest), and a fork's source must
    be imported before the fork (the source itself: the fork names its event there).

    Example: engram import travel-bot.avro
    """
    from contextlib import nullcontext

    from engram.clock import hold_clock
    from engram.history import history_client
    from engram.publishing import publish_events
    from engram.transfer import import_plan, read_export

    if file.is_dir():
        raise fail(f"{file} is a directory: give the file engram export wrote", 2)
    if not file.is_file():
        raise fail(f"{file}: no such file", 2)
    settings = load_settings()
    try:
        events = read_export(file)
        agents = sorted({e.agent_id for e in events})
        history = history_client(settings)
        plan = import_plan(history, events)
        # no tick of this deployment's clock among the events until they are folded
        held = hold_clock(settings, f"import of {', '.join(agents)}", warn) if plan.events else None
        with held or nullcontext():
            count = publish_events(settings, plan.events, console, prefer_http=http, batch=batch)
            if timeout:
                wait_archived(history, plan, timeout)
    except BadEvent as bad:
        raise fail(f"nothing was imported: {bad.reason}", 2) from None
    except (EngramError, OSError) as error:
        raise fail(str(error)) from None
    console.print(f"imported {count} events of {', '.join(agents)}")
    for agent_id, present in plan.present.items():
        console.print(f"{agent_id}: the first {present} events of the file were here already")
    if plan.copies:
        console.print(
            f"left out {plan.copies} erasure copies (what they erased is not in the file)"
        )


def main() -> None:
    app()

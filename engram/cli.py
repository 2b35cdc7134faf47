"""The ``engram`` command line."""

from __future__ import annotations

import csv
import io
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from engram.errors import EngramError
from engram.settings import Settings, SettingsError
from schemas import BadEvent

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
) -> None:
    """Publish events from a JSON-lines file. Every line is validated before any is sent.

    Example: engram publish events.jsonl
    """
    from engram.publishing import publish_file

    try:
        count = publish_file(load_settings(), file, console, prefer_http=http, batch=batch)
    except BadEvent as bad:
        raise fail(f"nothing was published: {bad.reason}", 2) from None
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
        records = [dict(zip(columns, row, strict=True)) for row in rows]
        sys.stdout.write(json.dumps(records, default=str, ensure_ascii=False, indent=2) + "\n")
    else:
        table = Table(*columns)
        for row in rows:
            table.add_row(*(str(v) for v in row))
        console.print(table)


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

    moment = parse_moment(as_of) if as_of else None
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
    """An aware datetime from ISO-8601 (``Z`` allowed); exits 2 when it is not one."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise fail(f"not an ISO-8601 moment: {text!r}", 2) from None
    if moment.tzinfo is None:
        raise fail(f"{text!r} has no UTC offset; add Z or +HH:MM", 2)
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


def main() -> None:
    app()

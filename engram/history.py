"""Read the ClickHouse history from the CLI: through the running ``engram up``
(its read-only ClickHouse-compatible endpoint, since chdb allows one process per
data directory), a ClickHouse server, or the embedded data directory itself."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from engram.client import read_up_file
from engram.errors import EngramError, NotRunning
from engram.settings import Settings
from engram.sqlgate import ReadOnlyViolation, check_read_only


def http_client(url: str) -> Client:
    """A clickhouse-connect HTTP client for ``http://host:port``."""
    parsed = urlparse(url)
    return clickhouse_connect.get_client(
        host=parsed.hostname or "127.0.0.1",
        port=parsed.port or 8123,
        interface=parsed.scheme or "http",
        username=parsed.username or "default",
        password=parsed.password or "",
    )


def history_client(settings: Settings) -> Client:
    """The best way to the history from here; raises NotRunning when there is none."""
    up = read_up_file(settings.up_file)
    if up is not None:
        return http_client(up["http"])
    if settings.clickhouse_url:
        if settings.clickhouse_url.startswith("chdb:"):
            return clickhouse_connect.get_client(dsn=settings.clickhouse_url)
        return http_client(settings.clickhouse_url)
    if (settings.home / "clickhouse").is_dir():
        return clickhouse_connect.get_client(dsn=settings.clickhouse_dsn)
    raise NotRunning(
        f"no history found: engram is not running and {settings.home / 'clickhouse'} does not "
        "exist. Run `engram demo` or `engram up` first, or set ENGRAM_CLICKHOUSE_URL."
    )


def run_sql(
    settings: Settings, query: str, parameters: dict[str, str] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only query (``{name:Type}`` placeholders bound from ``parameters``);
    returns column names and rows."""
    try:
        check_read_only(query)
    except ReadOnlyViolation as error:
        raise EngramError(str(error)) from None
    client = history_client(settings)
    try:
        result = client.query(query, parameters=parameters or None)
    except ClickHouseError as error:
        raise EngramError(f"query failed: {error}") from None
    finally:
        client.close()
    return list(result.column_names), [tuple(r) for r in result.result_rows]

"""The HTTP API of ``engram up`` on a real port, over real chdb: events in, SQL out.

chdb hosts one engine per process: while any client is open on one path, a
client on another path fails ("EmbeddedServer already initialized with path").
This module opens one path for its whole run and closes every client at the end,
so modules that run after it may open their own.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clickhouse_connect
import httpx
import pytest
import uvicorn
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError
from fastapi import FastAPI

from engram.api import (
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_OTHER_BODY_BYTES,
    MAX_QUERY_BYTES,
    create_api,
)
from engram.sqlgate import QueryFailed, QueryGate, QueryLimits, ReadOnlyViolation
from schemas import RAW_TYPE_NAMES, Codec, Event

pytestmark = pytest.mark.integration

ROWS = [
    (1, "agent-1", "hello"),
    (2, "agent-2", "tab\there, 'quoted' and \\ backslash"),
    (3, "agent-1", "用户说：我喜欢绿茶"),
]
MAX_EVENT_BYTES = 4096


@dataclass
class Api:
    """The running API: its URL, the engine behind it and what it published."""

    url: str
    port: int
    writer: Client
    gate: QueryGate
    published: list[Event]
    data_dir: Path


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path]]:
    """A chdb engine in a temp dir with a small ``history`` table; closed at the end."""
    data_dir = tmp_path_factory.mktemp("chdb")
    writer = clickhouse_connect.get_client(dsn=f"chdb://{data_dir}/ch")
    writer.command(
        "CREATE TABLE history (id UInt32, agent String, note String) ENGINE = MergeTree ORDER BY id"
    )
    writer.command("CREATE TABLE scratch (id UInt32) ENGINE = MergeTree ORDER BY id")
    writer.insert("history", ROWS, column_names=["id", "agent", "note"])
    yield writer, data_dir
    writer.close()


def serve(app: FastAPI) -> tuple[uvicorn.Server, threading.Thread, int]:
    """uvicorn on a socket already bound to a free 127.0.0.1 port, in its own thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until_it_answers(f"http://127.0.0.1:{port}/ping")
    return server, thread, port


def wait_until_it_answers(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=1.0).text == "Ok.\n":
                return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


@pytest.fixture(scope="module")
def api(engine: tuple[Client, Path]) -> Iterator[Api]:
    """``create_api`` served by uvicorn; the gate shares the writer's client, as
    ``engram up`` does."""
    writer, data_dir = engine
    gate = QueryGate(writer)
    published: list[Event] = []

    async def publish(events: Sequence[Event]) -> None:
        published.extend(events)

    app = create_api(
        codec=Codec(max_bytes=MAX_EVENT_BYTES, accept=RAW_TYPE_NAMES),
        publish=publish,
        gate=gate,
        info=lambda: {"clickhouse": "chdb", "pid": 1234},
    )
    server, thread, port = serve(app)
    yield Api(f"http://127.0.0.1:{port}", port, writer, gate, published, data_dir)
    server.should_exit = True
    thread.join(timeout=20)
    gate.close()


@pytest.fixture
def published(api: Api) -> list[Event]:
    """What the API published during one test."""
    api.published.clear()
    return api.published


@pytest.fixture
def http(api: Api) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=30.0) as client:
        yield client


@pytest.fixture
def clickhouse(api: Api) -> Iterator[Client]:
    """clickhouse-connect's HTTP client, pointed at the API."""
    client = clickhouse_connect.get_client(
        host="127.0.0.1", port=api.port, interface="http", username="default", password=""
    )
    yield client
    client.close()


def history_count(api: Api) -> int:
    return int(str(api.writer.command("SELECT count() FROM history")))


# -- SQL, curl style ------------------------------------------------------


def test_a_get_with_a_query_answers_tab_separated(http: httpx.Client, api: Api) -> None:
    response = http.get("/", params={"query": "SELECT id, agent FROM history ORDER BY id"})
    assert response.status_code == 200
    assert response.text == "1\tagent-1\n2\tagent-2\n3\tagent-1\n"
    assert response.headers["content-type"] == "text/tab-separated-values; charset=UTF-8"
    assert response.headers["x-clickhouse-format"] == "TabSeparated"
    assert response.headers["x-clickhouse-server-display-name"] == "engram"
    assert response.headers["x-clickhouse-timezone"] == api.writer.command("SELECT timezone()")
    assert response.headers["x-clickhouse-query-id"]


def test_a_format_clause_picks_the_output_format(http: httpx.Client) -> None:
    query = "SELECT id, note FROM history ORDER BY id FORMAT JSONEachRow"
    response = http.get("/", params={"query": query})
    assert response.status_code == 200
    assert response.headers["x-clickhouse-format"] == "JSONEachRow"
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert lines == [{"id": row[0], "note": row[2]} for row in ROWS]


def test_default_format_and_a_post_body_that_continues_the_query(http: httpx.Client) -> None:
    response = http.post(
        "/",
        params={"query": "SELECT id, agent FROM history", "default_format": "CSVWithNames"},
        content=b"WHERE id = 3",
    )
    assert response.status_code == 200
    assert response.text == '"id","agent"\n3,"agent-1"\n'
    assert response.headers["content-type"].startswith("text/csv")


def test_param_values_bind_placeholders(http: httpx.Client) -> None:
    query = "SELECT count() FROM history WHERE agent = {agent:String} AND id > {min:UInt32}"
    response = http.get("/", params={"query": query, "param_agent": "agent-1", "param_min": "1"})
    assert response.text == "1\n"


def test_ping_and_a_bare_get_answer_ok(http: httpx.Client) -> None:
    assert http.get("/ping").text == "Ok.\n"
    assert http.get("/").text == "Ok.\n"


def test_a_write_is_refused_with_403_readonly(http: httpx.Client, api: Api) -> None:
    response = http.post("/", content=b"DROP TABLE history")
    assert response.status_code == 403
    assert response.headers["x-clickhouse-exception-code"] == "164"
    assert response.text.startswith("Code: 164. DB::Exception: read-only gate refused the query")
    assert "DROP is not a read statement" in response.text
    assert response.text.rstrip().endswith("(READONLY)")
    assert history_count(api) == len(ROWS)


def test_into_outfile_is_refused_and_writes_nothing(http: httpx.Client, api: Api) -> None:
    target = api.data_dir / "leak.tsv"
    response = http.get("/", params={"query": f"SELECT * FROM history INTO OUTFILE '{target}'"})
    assert response.status_code == 403
    assert "INTO OUTFILE would write a file" in response.text
    assert not target.exists()


def test_no_spelling_of_file_reads_a_file_through_the_endpoint(
    http: httpx.Client, api: Api
) -> None:
    """The engine's read-only session lets the ordinary function ``file(path)`` read
    any file under chdb (a master key, part files of erased rows): the gate's check is
    what stops it, however the name is spelt or bound."""
    secret = api.data_dir / "secret.key"
    secret.write_text("the master key")
    quoted = f"SELECT `file`('{secret}')"
    assert api.gate.reader.command(quoted) == "the master key"  # what a bypass would give
    for params in (
        {"query": f"SELECT file('{secret}')"},
        {"query": quoted},
        {"query": f"SELECT \"file\"('{secret}')"},
        {"query": f"SELECT `\\x66ile`('{secret}')"},
        {"query": f"SELECT {{f:Identifier}}('{secret}')", "param_f": "file"},
    ):
        response = http.get("/", params=params)
        assert response.status_code == 403, params
        assert "the master key" not in response.text
        assert "read-only gate refused the query" in response.text


async def test_a_query_past_the_gates_time_limit_fails_and_cannot_lift_it(api: Api) -> None:
    """Analysts' reads share the history's thread: each is bounded, and read-only
    forbids a query to change the bound."""
    gate = QueryGate(api.writer, QueryLimits(timeout_s=0.5))
    try:
        heavy = "SELECT count() FROM numbers(100000000000) WHERE cityHash64(number) % 7 = 9"
        started = time.monotonic()
        with pytest.raises(QueryFailed, match=r"TIMEOUT_EXCEEDED|Timeout exceeded") as failed:
            await gate.raw(heavy)
        assert failed.value.code == 159
        assert time.monotonic() - started < 30
        with pytest.raises(QueryFailed, match="max_execution_time") as lifted:
            await gate.raw(heavy + " SETTINGS max_execution_time = 0")
        assert lifted.value.code == 164
        assert await gate.raw("SELECT 1") == b"1\n"
    finally:
        gate.close()


def test_an_engine_error_is_answered_clickhouse_style(http: httpx.Client) -> None:
    response = http.get("/", params={"query": "SELECT no_such_column FROM history"})
    assert response.status_code == 404
    assert response.headers["x-clickhouse-exception-code"] == "47"
    assert response.text.startswith("Code: 47. DB::Exception: ")
    assert "(UNKNOWN_IDENTIFIER)" in response.text


def test_an_empty_post_is_a_syntax_error(http: httpx.Client) -> None:
    response = http.post("/")
    assert response.status_code == 400
    assert response.text == "Code: 62. DB::Exception: Empty query. (SYNTAX_ERROR)\n"


def test_a_query_that_is_not_utf8_is_refused(http: httpx.Client) -> None:
    response = http.post("/", content=b"SELECT '\xff\xfe'")
    assert response.status_code == 400
    assert response.headers["x-clickhouse-exception-code"] == "36"
    assert response.text == (
        "Code: 36. DB::Exception: the query is not UTF-8 text. (BAD_ARGUMENTS)\n"
    )


def test_a_malformed_bind_value_is_bad_arguments(http: httpx.Client) -> None:
    query = "SELECT {v:String}"
    response = http.get("/", params={"query": query, "param_v": "\\xff"})
    assert response.status_code == 400
    assert "bind parameter's \\xHH bytes are not UTF-8 text. (BAD_ARGUMENTS)" in response.text


def test_compress_1_is_not_implemented(http: httpx.Client) -> None:
    response = http.get("/", params={"query": "SELECT 1", "compress": "1"})
    assert response.status_code == 501
    assert response.text == (
        "Code: 48. DB::Exception: compress=1 (ClickHouse-compressed responses) "
        "is not supported. (NOT_IMPLEMENTED)\n"
    )


# -- SQL through clickhouse-connect's HTTP client -------------------------


def test_clickhouse_connect_connects_and_reads_rows(clickhouse: Client) -> None:
    result = clickhouse.query("SELECT id, agent, note FROM history ORDER BY id")
    assert result.result_rows == ROWS
    assert result.column_names == ("id", "agent", "note")
    assert clickhouse.command("SELECT 1") == 1


def test_clickhouse_connect_binds_server_side_parameters(clickhouse: Client) -> None:
    result = clickhouse.query(
        "SELECT id FROM history WHERE note = {note:String}", parameters={"note": ROWS[1][2]}
    )
    assert result.result_rows == [(2,)]


def test_clickhouse_connect_binds_client_side_parameters(clickhouse: Client) -> None:
    result = clickhouse.query(
        "SELECT id FROM history WHERE agent = %(agent)s ORDER BY id",
        parameters={"agent": "agent-1"},
    )
    assert result.result_rows == [(1,), (3,)]


def test_clickhouse_connect_form_encoded_parameters(api: Api) -> None:
    client = clickhouse_connect.get_client(
        host="127.0.0.1", port=api.port, interface="http", form_encode_query_params=True
    )
    try:
        result = client.query(
            "SELECT id FROM history WHERE note = {note:String}", parameters={"note": ROWS[2][2]}
        )
    finally:
        client.close()
    assert result.result_rows == [(3,)]


def test_an_insert_through_clickhouse_connect_fails_read_only(clickhouse: Client, api: Api) -> None:
    with pytest.raises(DatabaseError, match="read-only") as compressed:
        clickhouse.insert("history", [(9, "agent-9", "nope")], column_names=["id", "agent", "note"])
    assert compressed.value.code == 164
    with pytest.raises(DatabaseError, match="INSERT is not a read statement") as plain:
        clickhouse.command("INSERT INTO history VALUES (9, 'agent-9', 'nope')")
    assert plain.value.code == 164
    assert history_count(api) == len(ROWS)


def test_an_uncompressed_insert_fails_read_only(api: Api) -> None:
    client = clickhouse_connect.get_client(
        host="127.0.0.1", port=api.port, interface="http", compress=False
    )
    try:
        with pytest.raises(DatabaseError, match="INSERT is not a read statement"):
            client.insert("history", [(9, "agent-9", "x'")], column_names=["id", "agent", "note"])
    finally:
        client.close()
    assert history_count(api) == len(ROWS)


def test_the_gate_reads_through_a_session_the_engine_keeps_read_only(api: Api) -> None:
    """Past the keyword check, the engine still refuses: the gate's own handle is readonly=1."""
    with pytest.raises(DatabaseError, match="READONLY"):
        api.gate.reader.command("INSERT INTO scratch VALUES (1)")
    api.writer.command("INSERT INTO scratch VALUES (2)")  # the shared client still writes
    assert api.writer.command("SELECT groupArray(id) FROM scratch") == "[2]"


async def test_the_gate_returns_rows_with_bound_parameters(api: Api) -> None:
    by_agent = "SELECT id FROM history WHERE agent = %(agent)s ORDER BY id"
    assert await api.gate.rows(by_agent, {"agent": "agent-1"}) == [(1,), (3,)]
    by_id = "SELECT id, note FROM history WHERE id = {id:UInt32}"
    assert await api.gate.rows(by_id, {"id": 3}) == [(3, ROWS[2][2])]


async def test_the_gate_refuses_writes_and_the_engine_refuses_setting_changes(api: Api) -> None:
    with pytest.raises(ReadOnlyViolation, match="DROP is not a read statement"):
        await api.gate.rows("DROP TABLE history")
    with pytest.raises(QueryFailed, match="Cannot modify 'max_threads' setting") as failed:
        await api.gate.raw("SELECT 1", settings={"max_threads": "1"})
    assert failed.value.code == 164
    assert await api.gate.raw("SELECT 41 + 1", "JSONEachRow") == b'{"plus(41, 1)":42}\n'


# -- events ---------------------------------------------------------------


def event(**changes: Any) -> dict[str, Any]:
    """A valid ``interaction.recorded`` in the JSON wire format."""
    base: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "type": "interaction.recorded",
        "agent_id": "agent-1",
        "session_id": "s-1",
        "occurred_at": "2025-01-31T10:30:00.123+01:00",
        "schema_version": 1,
        "body": {"role": "user", "content": "I prefer green tea."},
    }
    base.update(changes)
    return base


def test_one_event_is_accepted_and_published(http: httpx.Client, published: list[Event]) -> None:
    sent = event()
    response = http.post("/v1/events", json=sent)
    assert response.status_code == 202
    assert response.json() == {"accepted": 1, "event_ids": [sent["event_id"]]}
    assert [str(e.event_id) for e in published] == [sent["event_id"]]
    assert published[0].occurred_at.isoformat() == "2025-01-31T09:30:00.123000+00:00"


def test_a_batch_is_published_in_order(http: httpx.Client, published: list[Event]) -> None:
    batch = [event(), event(type="session.started", body={"task": "triage"}), event()]
    response = http.post("/v1/events", json=batch)
    assert response.status_code == 202
    assert response.json()["event_ids"] == [e["event_id"] for e in batch]
    assert [str(e.event_id) for e in published] == [e["event_id"] for e in batch]


BAD_ELEMENTS = [
    ({"body": None}, "invalid interaction.recorded: body: "),
    ({"body": {"role": "user"}}, "body.content: Field required"),
    ({"type": "no.such.type"}, "unknown event type 'no.such.type'"),
    ({"body": {"role": "user", "content": "x" * MAX_EVENT_BYTES}}, "over the limit of 4096"),
    ({"type": "memory.created"}, "'memory.created' is a derived event type"),
    ({"occurred_at": "2025-01-31T10:30:00"}, "occurred_at: Input should have timezone info"),
]


@pytest.mark.parametrize(("change", "reason"), BAD_ELEMENTS)
def test_one_bad_element_refuses_the_whole_batch(
    http: httpx.Client, published: list[Event], change: dict[str, Any], reason: str
) -> None:
    bad = event(**change)
    if change.get("body") is None and "body" in change:
        del bad["body"]
    response = http.post("/v1/events", json=[event(), bad, event()])
    assert response.status_code == 422
    problem = response.json()
    assert problem["error"] == "invalid event"
    assert problem["index"] == 1
    assert reason in problem["reason"]
    assert published == []


def test_a_single_bad_object_is_index_0(http: httpx.Client, published: list[Event]) -> None:
    response = http.post("/v1/events", json={"type": "interaction.recorded"})
    assert response.status_code == 422
    assert response.json()["index"] == 0
    assert published == []


def test_malformed_json_is_400(http: httpx.Client, published: list[Event]) -> None:
    response = http.post("/v1/events", content=b'{"event_id": ')
    assert response.status_code == 400
    assert response.json() == {
        "error": "malformed JSON",
        "reason": "Expecting value: line 1 column 14 (char 13)",
    }
    assert published == []


def test_an_empty_array_is_422_and_an_oversized_batch_413(
    http: httpx.Client, published: list[Event]
) -> None:
    empty = http.post("/v1/events", json=[])
    assert (empty.status_code, empty.json()["error"]) == (422, "empty batch")
    one = event()
    too_many = http.post("/v1/events", json=[one] * (MAX_BATCH + 1))
    assert too_many.status_code == 413
    assert too_many.json()["reason"] == "10001 events, over the limit of 10000 per request"
    assert published == []


def streamed_past(limit: int, head: bytes, filler: bytes, tail: bytes) -> Iterator[bytes]:
    """A body sent without a length: ``head``, more than ``limit`` bytes of ``filler``
    in pieces of 64 KiB, then ``tail``."""
    yield head
    for _ in range(limit // 65536 + 1):
        yield filler * 65536
    yield tail


def test_a_body_over_the_limit_is_413_without_being_read(
    http: httpx.Client, published: list[Event]
) -> None:
    """Declared too large (``Content-Length``), or found so while it streams in (chunked,
    no length): refused as soon as the limit is passed, nothing published."""
    over = b"[" + b" " * MAX_BODY_BYTES + b"]"
    declared = http.post("/v1/events", content=over, headers={"content-type": "application/json"})
    assert declared.status_code == 413
    assert declared.json() == {
        "error": "request too large",
        "reason": f"the request body holds {len(over)} bytes, over the limit of"
        f" {MAX_BODY_BYTES} bytes: send fewer events at once",
    }

    streamed = http.post(
        "/v1/events",
        content=streamed_past(MAX_BODY_BYTES, b"[", b" ", b"]"),
        headers={"content-type": "application/json"},
    )
    assert streamed.status_code == 413
    assert "more bytes, over the limit of" in streamed.json()["reason"]
    assert published == []
    one = event()
    assert http.post("/v1/events", json=one).status_code == 202  # the server still serves
    assert [str(e.event_id) for e in published] == [one["event_id"]]


def test_a_query_body_over_the_limit_is_query_is_too_large(http: httpx.Client) -> None:
    response = http.post("/", content=b"SELECT 1 " + b" " * MAX_QUERY_BYTES)
    assert response.status_code == 413
    assert response.headers["X-ClickHouse-Exception-Code"] == "229"
    assert response.text.startswith("Code: 229. DB::Exception: the request body holds")
    assert response.text.rstrip().endswith("(QUERY_IS_TOO_LARGE)")


def test_any_other_body_over_a_mebibyte_is_413_before_its_endpoint_reads_it(api: Api) -> None:
    """An erasure (or a recall) is a small JSON object: a body over
    ``MAX_OTHER_BODY_BYTES``, declared or streamed, is refused before the endpoint
    parses it; a request within the limit is served as before."""
    erased: list[str] = []

    async def erase(subject: str, reason: str | None) -> uuid.UUID:
        erased.append(subject)
        return uuid.uuid4()

    app = create_api(
        codec=Codec(max_bytes=MAX_EVENT_BYTES, accept=RAW_TYPE_NAMES),
        publish=lambda events: asyncio.sleep(0),
        gate=api.gate,
        info=lambda: {},
        erase=erase,
    )
    server, thread, port = serve(app)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as http:
            padded = {"subject": "mei", "reason": "x" * MAX_OTHER_BODY_BYTES}
            declared = http.post("/v1/erasures", json=padded)
            assert declared.status_code == 413
            assert declared.json() == {
                "error": "request too large",
                "reason": f"the request body holds {len(declared.request.content)} bytes,"
                f" over the limit of {MAX_OTHER_BODY_BYTES} bytes",
            }

            streamed = http.post(
                "/v1/erasures",
                content=streamed_past(
                    MAX_OTHER_BODY_BYTES, b'{"subject": "mei", "reason": "', b"x", b'"}'
                ),
                headers={"content-type": "application/json"},
            )
            assert streamed.status_code == 413
            assert "more bytes, over the limit of" in streamed.json()["reason"]
            assert erased == []
            fine = http.post("/v1/erasures", json={"subject": "mei", "reason": "asked"})
            assert fine.status_code == 202, fine.text
            assert erased == ["mei"]
            assert http.get("/ping").text == "Ok.\n"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


async def test_a_failing_publish_is_503(api: Api) -> None:
    async def broken(events: Sequence[Event]) -> None:
        raise ConnectionError("broker unreachable")

    app = create_api(codec=Codec(), publish=broken, gate=api.gate, info=dict)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://engram") as client:
        response = await client.post("/v1/events", json=event())
    assert response.status_code == 503
    assert response.json() == {"error": "publish failed", "reason": "broker unreachable"}


def test_health_reports_the_stack(http: httpx.Client) -> None:
    assert http.get("/v1/health").json() == {"status": "ok", "clickhouse": "chdb", "pid": 1234}


def test_openapi_documents_the_events_endpoint(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    post = spec["paths"]["/v1/events"]["post"]
    assert set(post["responses"]) == {"202", "400", "413", "422", "503"}
    body = post["requestBody"]["content"]["application/json"]
    assert body["example"]["type"] == "interaction.recorded"
    assert {"/", "/ping", "/v1/health"} <= set(spec["paths"])

"""The HTTP API of ``engram up``: publish events, check health, query history.

- ``POST /v1/events``: one JSON event or an array of them; all are validated
  before any is published, so a batch is accepted whole or not at all.
- ``POST /v1/erasures``: forget a subject everywhere (a broadcast
  ``subject.erasure_requested``); answers the request id.
- ``GET /v1/health``: liveness plus what the stack reports about itself.
- ``/`` and ``/ping``: the subset of ClickHouse's HTTP interface that ``curl``
  and clickhouse-connect's HTTP client use, read-only, over :class:`QueryGate`.

Bodies are bounded before they are held whole (the worker shares the process): 64 MiB
for events, 16 MiB for a query, 1 MiB for anything else; past that, 413.

Everything the API touches comes through :func:`create_api`; it holds no
global state.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email import policy
from email.message import Message
from email.parser import BytesParser
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from engram.erasure import BROADCAST_ONLY
from engram.sqlgate import (
    QueryFailed,
    QueryGate,
    ReadOnlyViolation,
    UncheckableQuery,
    check_read_only,
)
from schemas import RAW_TYPE_NAMES, TYPES_BY_NAME, BadEvent, Codec, Event

log = logging.getLogger("engram.api")

MAX_BATCH = 10_000
"""Most events one ``POST /v1/events`` may carry."""

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Most bytes a ``POST /v1/events`` body may hold (raised to eight times the size limit
of one event when that is larger, so one event of the largest size always fits): the
stack's worker shares the process, and a body is held whole while it is validated."""

MAX_QUERY_BYTES = 16 * 1024 * 1024
"""Most bytes of a query's ``POST /`` body (the text of one read-only query)."""

MAX_OTHER_BODY_BYTES = 1024 * 1024
"""Most bytes of any other request's body (a recall, an erasure: small JSON objects),
checked by :class:`BodyLimit` before the endpoint reads it."""

OWN_LIMITS = frozenset({"/v1/events", "/"})
"""The paths whose endpoints bound their bodies themselves (and answer in their own
format): :class:`BodyLimit` lets them through."""


class TooLarge(Exception):
    """A request body over its limit; the rest of it was not read."""

    def __init__(self, limit: int, size: int | None = None) -> None:
        said = f"{size} bytes" if size is not None else "more bytes"
        super().__init__(f"the request body holds {said}, over the limit of {limit} bytes")
        self.limit = limit


async def bounded_body(request: Request, limit: int) -> bytes:
    """The request's body, or TooLarge as soon as its ``Content-Length`` or the bytes
    read so far pass ``limit`` (the rest is never read into memory)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(limit, int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


Publish = Callable[[Sequence[Event]], Awaitable[None]]

EXAMPLE_EVENT: dict[str, Any] = {
    "event_id": "0b7e5f0e-8c1a-4c5e-9a53-2f0d6c1e4a10",
    "type": "interaction.recorded",
    "agent_id": "support-bot",
    "session_id": "s-42",
    "user_id": "u-7",
    "occurred_at": "2025-01-31T09:30:00.000+00:00",
    "schema_version": 1,
    "body": {"role": "user", "content": "My order 1234 has not arrived.", "entities": ["1234"]},
}


class BodyLimit:
    """ASGI middleware: a request with a body, on a path not in ``exempt``, is read
    (at most ``limit`` bytes) before the endpoint sees it, and answered 413 with a
    :class:`Problem` when it holds more, without reading the rest. Anything else
    passes untouched."""

    def __init__(
        self, app: Any, limit: int = MAX_OTHER_BODY_BYTES, exempt: frozenset[str] = OWN_LIMITS
    ) -> None:
        self.app = app
        self.limit = limit
        self.exempt = exempt

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in ("GET", "HEAD", "OPTIONS")
            or scope["path"] in self.exempt
        ):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send, TooLarge(self.limit, int(declared)))
            return
        messages: list[Any] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._refuse(send, TooLarge(self.limit))
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, error: TooLarge) -> None:
        problem = Problem(error="request too large", reason=str(error))
        body = problem.model_dump_json(exclude_none=True).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def create_api(
    *,
    codec: Codec,
    publish: Publish,
    gate: QueryGate,
    info: Callable[[], dict[str, Any]],
    memory: APIRouter | None = None,
    erase: Erase | None = None,
) -> FastAPI:
    """The FastAPI app: events go to ``publish``, SQL to ``gate``, health asks ``info``;
    ``memory`` adds recall and snapshots (:func:`engram.service.memory_router`)."""
    app = FastAPI(
        title="engram",
        summary="Event-sourced memory for AI agents",
        description=__doc__,
        version="0.1.0",
    )
    app.include_router(events_router(codec, publish))
    app.include_router(health_router(info))
    if memory is not None:
        app.include_router(memory)
    if erase is not None:
        app.include_router(erasures_router(erase))
    app.include_router(clickhouse_router(gate))
    app.add_middleware(BodyLimit)
    app.add_exception_handler(RequestValidationError, invalid_request)
    return app


async def invalid_request(request: Request, error: Exception) -> Response:
    """422 with what was wrong, as FastAPI's own handler says it, without echoing the
    refused input back: a lone surrogate or a NaN in it made that handler fail (500)."""
    assert isinstance(error, RequestValidationError)
    details = [
        {key: value for key, value in item.items() if key not in ("input", "ctx", "url")}
        for item in error.errors()
    ]
    body = json.dumps({"detail": details}, ensure_ascii=True, default=repr)
    return Response(body, status_code=422, media_type="application/json")


# -- POST /v1/events ------------------------------------------------------


class Accepted(BaseModel):
    """Every event of the request was validated and handed to the log."""

    accepted: int
    event_ids: list[uuid.UUID]


class Problem(BaseModel):
    """Why a request was refused; ``index`` is the offending event's position."""

    error: str
    reason: str
    index: int | None = None


class Health(BaseModel):
    """``status`` plus whatever the running stack reports about itself."""

    model_config = ConfigDict(extra="allow")
    status: str


class Refused(Exception):
    """A request the API answers with ``status`` and ``problem``; nothing was published."""

    def __init__(self, status: int, problem: Problem) -> None:
        super().__init__(problem.reason)
        self.status = status
        self.problem = problem


def parse_batch(body: bytes) -> list[Any]:
    """The JSON items of a request body: an object is a batch of one."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Refused(400, Problem(error="malformed JSON", reason=str(error))) from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise Refused(422, Problem(error="empty batch", reason="the array holds no events"))
    if len(items) > MAX_BATCH:
        reason = f"{len(items)} events, over the limit of {MAX_BATCH} per request"
        raise Refused(413, Problem(error="batch too large", reason=reason))
    return items


def validate_event(codec: Codec, item: Any) -> Event:
    """One raw event from its JSON object, or BadEvent (derived types and oversize included)."""
    type_name = item.get("type") if isinstance(item, dict) else None
    if isinstance(type_name, str) and type_name in TYPES_BY_NAME:
        _require_raw(type_name)
    event = codec.from_json_object(item)
    _require_raw(event.type)
    codec.encode(event)
    return event


def _require_raw(type_name: str) -> None:
    if type_name == BROADCAST_ONLY:
        raise BadEvent(
            f"{BROADCAST_ONLY!r} must reach every partition of the log, not one agent's: "
            "use POST /v1/erasures (or engram erase, Memory.erase)"
        )
    if type_name not in RAW_TYPE_NAMES:
        raw = ", ".join(sorted(RAW_TYPE_NAMES))
        raise BadEvent(
            f"{type_name!r} is a derived event type, written by engram's processors; "
            f"only raw event types may be published ({raw})"
        )


def validate_batch(codec: Codec, items: Sequence[Any]) -> list[Event]:
    """Every item as an event, or Refused(422) naming the first bad one."""
    events = []
    for index, item in enumerate(items):
        try:
            events.append(validate_event(codec, item))
        except BadEvent as bad:
            problem = Problem(error="invalid event", reason=bad.reason, index=index)
            raise Refused(422, problem) from None
    return events


def _problem_response(refused: Refused) -> JSONResponse:
    return JSONResponse(refused.problem.model_dump(exclude_none=True), status_code=refused.status)


def events_router(codec: Codec, publish: Publish) -> APIRouter:
    """``POST /v1/events``: validate all, then publish all, or publish nothing."""
    router = APIRouter(tags=["events"])
    limit = max(MAX_BODY_BYTES, 8 * codec.max_bytes)
    body_schema = {
        "oneOf": [
            {"type": "object", "description": "one event"},
            {"type": "array", "items": {"type": "object"}, "maxItems": MAX_BATCH},
        ]
    }

    @router.post(
        "/v1/events",
        status_code=202,
        response_model=Accepted,
        summary="Publish raw events",
        description=(
            "Body: one event (JSON object) or an array of up to 10 000, at most 64 MiB."
            " Every event is validated (schema, raw type, encoded size) before any is"
            " published."
        ),
        responses={
            400: {"model": Problem, "description": "malformed JSON"},
            413: {
                "model": Problem,
                "description": "more than 10 000 events, or a body over 64 MiB",
            },
            422: {"model": Problem, "description": "an invalid event, or an empty array"},
            503: {"model": Problem, "description": "the log did not take the events"},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": body_schema, "example": EXAMPLE_EVENT}},
            }
        },
    )
    async def publish_events(request: Request) -> Accepted | JSONResponse:
        try:
            events = validate_batch(codec, parse_batch(await events_body(request, limit)))
        except Refused as refused:
            return _problem_response(refused)
        try:
            await publish(events)
        except Exception as error:  # any publish failure is the client's 503, and logged
            log.exception("publishing %d events failed", len(events))
            return _problem_response(
                Refused(503, Problem(error="publish failed", reason=str(error)))
            )
        return Accepted(accepted=len(events), event_ids=[e.event_id for e in events])

    return router


async def events_body(request: Request, limit: int) -> bytes:
    """The body of ``POST /v1/events``, or Refused(413) past ``limit`` bytes."""
    try:
        return await bounded_body(request, limit)
    except TooLarge as error:
        problem = Problem(error="request too large", reason=f"{error}: send fewer events at once")
        raise Refused(413, problem) from None


# -- POST /v1/erasures ----------------------------------------------------

Erase = Callable[[str, str | None], Awaitable[uuid.UUID]]
"""Publishes an erasure request for (subject, reason); returns the request id."""


class ErasureRequest(BaseModel):
    """Forget ``subject`` (a user, or an agent without users) everywhere."""

    model_config = ConfigDict(extra="forbid")
    subject: Annotated[str, Field(min_length=1, max_length=256)]
    reason: Annotated[str, Field(max_length=1000)] | None = None


class ErasureAccepted(BaseModel):
    """The request is in the log; follow it by ``request_id`` (``GET /v1/status``)."""

    request_id: uuid.UUID
    subject: str


def erasures_router(erase: Erase) -> APIRouter:
    """``POST /v1/erasures``: publish a broadcast ``subject.erasure_requested``."""
    router = APIRouter(tags=["erasure"])

    @router.post(
        "/v1/erasures",
        status_code=202,
        response_model=ErasureAccepted,
        summary="Erase a subject everywhere",
        description=(
            "Publishes `subject.erasure_requested` to every partition of the log: the "
            "worker destroys the subject's data keys, every agent purges the subject, "
            "the history and the vectors follow, and each agent leaves a receipt "
            "(`erasures`, counts only). Erasing again is harmless."
        ),
        responses={
            422: {"model": Problem, "description": "the subject is not an identifier"},
            503: {"model": Problem, "description": "the log did not take the request"},
        },
    )
    async def request_erasure(request: ErasureRequest) -> ErasureAccepted | JSONResponse:
        try:
            request_id = await erase(request.subject, request.reason)
        except ValueError as bad:
            return _problem_response(
                Refused(422, Problem(error="invalid erasure", reason=str(bad)))
            )
        except Exception as error:  # the log refused: the client's 503, and logged
            log.exception("publishing an erasure request failed")
            return _problem_response(
                Refused(503, Problem(error="publish failed", reason=str(error)))
            )
        return ErasureAccepted(request_id=request_id, subject=request.subject)

    return router


def health_router(info: Callable[[], dict[str, Any]]) -> APIRouter:
    """``GET /v1/health``."""
    router = APIRouter(tags=["health"])

    @router.get("/v1/health", response_model=Health, summary="Liveness and stack details")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **info()}

    return router


# -- the ClickHouse HTTP interface ----------------------------------------

READONLY = 164
SYNTAX_ERROR = 62
BAD_ARGUMENTS = 36
NOT_IMPLEMENTED = 48
QUERY_IS_TOO_LARGE = 229
_NAMES = {
    READONLY: "READONLY",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    BAD_ARGUMENTS: "BAD_ARGUMENTS",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    QUERY_IS_TOO_LARGE: "QUERY_IS_TOO_LARGE",
}

_STATUS_BY_CODE = {
    **dict.fromkeys((READONLY, 497), 403),  # READONLY (our choice), ACCESS_DENIED
    **dict.fromkeys((6, 8, 25, 26, 27, 36, 38, 41, 44, 53, 62, 72, 117, 376), 400),
    **dict.fromkeys((46, 47, 50, 60, 63, 73, 81, 115), 404),  # UNKNOWN_*
    QUERY_IS_TOO_LARGE: 413,
    159: 408,  # TIMEOUT_EXCEEDED
    NOT_IMPLEMENTED: 501,
}
"""HTTP status per ClickHouse error code, as ClickHouse's own HTTP handler maps them."""

_CONTENT_TYPES = (
    ("TabSeparated", "text/tab-separated-values; charset=UTF-8"),
    ("TSV", "text/tab-separated-values; charset=UTF-8"),
    ("CSVWithNames", "text/csv; charset=UTF-8; header=present"),
    ("CSV", "text/csv; charset=UTF-8; header=absent"),
    ("JSONEachRow", "application/x-ndjson; charset=UTF-8"),
    ("JSONLines", "application/x-ndjson; charset=UTF-8"),
    ("NDJSON", "application/x-ndjson; charset=UTF-8"),
    ("JSON", "application/json; charset=UTF-8"),
    ("XML", "application/xml; charset=UTF-8"),
    ("Markdown", "text/markdown; charset=UTF-8"),
)
_TEXT_FORMATS = ("Pretty", "Vertical", "Values", "TSKV", "Template", "Raw", "LineAsString")


def content_type(fmt: str) -> str:
    """The Content-Type ClickHouse sends for output format ``fmt``."""
    for prefix, media in _CONTENT_TYPES:
        if fmt.startswith(prefix):
            return media
    if fmt.startswith(_TEXT_FORMATS):
        return "text/plain; charset=UTF-8"
    return "application/octet-stream"


class ClickHouseError(Exception):
    """An error answered ClickHouse-style: text ``Code: N. DB::Exception: … (NAME)``
    and the ``X-ClickHouse-Exception-Code`` header; ``message`` is kept as is when
    it already is such a text (the engine's own)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def body(self) -> str:
        if self.message.lstrip().startswith("Code:"):
            return self.message.strip() + "\n"
        name = _NAMES.get(self.code)
        suffix = f". ({name})" if name else ""
        return f"Code: {self.code}. DB::Exception: {self.message}{suffix}\n"


@dataclass(frozen=True)
class HttpQuery:
    """What one request to ``/`` asks: the SQL, the default format, bind values."""

    sql: str | None
    default_format: str = "TabSeparated"
    params: dict[str, str] = field(default_factory=dict)
    query_id: str = ""


_COMPRESSED_BODY = (
    "a {encoding}-compressed request body carries insert data, and this server is "
    "read-only (send queries uncompressed)"
)
_REFUSED_FLAGS = {
    "compress": "compress=1 (ClickHouse-compressed responses) is not supported",
    "decompress": "decompress=1 (ClickHouse-compressed request bodies) is not supported",
}


def read_http_query(
    method: str, url_params: Mapping[str, str], headers: Mapping[str, str], body: bytes
) -> HttpQuery:
    """The query a ClickHouse HTTP request carries.

    SQL is the ``query`` URL parameter followed by the POST body (as in ClickHouse),
    or the ``query`` field of a multipart form; ``param_<name>`` entries are bind
    values; every other parameter (``query_id``, ``session_id``, ``database``,
    ``wait_end_of_query``, settings …) is ignored, since the session is read-only
    and accepts no setting changes. A compressed body is refused as a write:
    clickhouse-connect compresses only insert data. Raises ClickHouseError for
    what cannot be served. ``headers`` are looked up by lower-case name.
    """
    fields = dict(url_params)
    for flag, reason in _REFUSED_FLAGS.items():
        if fields.get(flag, "0") not in ("0", "false", ""):
            raise ClickHouseError(NOT_IMPLEMENTED, reason)
    encoding = headers.get("content-encoding", "identity")
    if body and encoding != "identity":
        raise ClickHouseError(READONLY, _COMPRESSED_BODY.format(encoding=encoding))
    kind = headers.get("content-type", "")
    if kind.startswith("multipart/form-data"):
        fields.update(_form_fields(kind, body))
        body = b""
    parts = [fields["query"]] if "query" in fields else []
    if method == "POST" and body:
        parts.append(_utf8(body))
    return HttpQuery(
        sql="\n".join(parts) if parts else None,
        default_format=fields.get("default_format") or "TabSeparated",
        params={k.removeprefix("param_"): v for k, v in fields.items() if k.startswith("param_")},
        query_id=fields.get("query_id") or str(uuid.uuid4()),
    )


def _utf8(body: bytes) -> str:
    """The body as text; undecodable bytes (an INSERT's data) become lone surrogates,
    which the read-only check passes over and :func:`_require_utf8` refuses."""
    return body.decode("utf-8", errors="surrogateescape")


def _require_utf8(sql: str) -> None:
    try:
        sql.encode()
    except UnicodeEncodeError:
        raise ClickHouseError(BAD_ARGUMENTS, "the query is not UTF-8 text") from None


def _form_fields(content_type_header: str, body: bytes) -> dict[str, str]:
    """Text fields of a multipart/form-data body; file parts (external tables) are refused."""
    head = f"Content-Type: {content_type_header}\r\n\r\n".encode()
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise ClickHouseError(BAD_ARGUMENTS, "malformed multipart/form-data body")
    return dict(_form_field(part) for part in message.iter_parts())


def _form_field(part: Message) -> tuple[str, str]:
    if part.get_filename() is not None:
        raise ClickHouseError(NOT_IMPLEMENTED, "external data (form file parts) is not supported")
    name = part.get_param("name", header="content-disposition")
    payload = part.get_payload(decode=True)
    if not isinstance(name, str) or not isinstance(payload, bytes):
        raise ClickHouseError(BAD_ARGUMENTS, "a form field without a name or a value")
    return name, _utf8(payload)


def _answer(data: bytes, fmt: str, query_id: str, timezone: str) -> Response:
    headers = {
        "X-ClickHouse-Format": fmt,
        "X-ClickHouse-Timezone": timezone,
        "X-ClickHouse-Server-Display-Name": "engram",
        "X-ClickHouse-Query-Id": query_id,
    }
    return Response(content=data, headers=headers, media_type=content_type(fmt))


def _error_answer(error: ClickHouseError, query_id: str) -> Response:
    headers = {
        "X-ClickHouse-Exception-Code": str(error.code),
        "X-ClickHouse-Server-Display-Name": "engram",
        "X-ClickHouse-Query-Id": query_id,
    }
    status = _STATUS_BY_CODE.get(error.code, 500)
    return Response(error.body(), status, headers, media_type="text/plain; charset=UTF-8")


async def run_http_query(gate: QueryGate, request: HttpQuery) -> Response:
    """Run one read query through the gate; every refusal is a ClickHouse-style error."""
    try:
        if not request.sql or not request.sql.strip():
            raise ClickHouseError(SYNTAX_ERROR, "Empty query")
        fmt = _output_format(request)
        _require_utf8(request.sql)
        data = await gate.raw(request.sql, fmt, params=request.params)
    except ClickHouseError as error:
        return _error_answer(error, request.query_id)
    except UncheckableQuery as error:
        return _error_answer(ClickHouseError(SYNTAX_ERROR, str(error)), request.query_id)
    except ReadOnlyViolation as error:
        return _error_answer(ClickHouseError(READONLY, str(error)), request.query_id)
    except QueryFailed as failure:
        return _error_answer(ClickHouseError(failure.code, failure.message), request.query_id)
    except ValueError as error:  # a malformed bind parameter
        return _error_answer(ClickHouseError(BAD_ARGUMENTS, str(error)), request.query_id)
    return _answer(data, fmt, request.query_id, gate.timezone)


def _output_format(request: HttpQuery) -> str:
    """The query's own FORMAT clause, else ``default_format``."""
    return check_read_only(request.sql or "").fmt or request.default_format


def clickhouse_router(gate: QueryGate) -> APIRouter:
    """``/`` (GET, POST) and ``/ping``: ClickHouse's HTTP interface, read-only."""
    router = APIRouter(tags=["sql"])

    @router.get("/ping", response_class=Response, summary="ClickHouse-style ping")
    async def ping() -> Response:
        return Response("Ok.\n", media_type="text/plain; charset=UTF-8")

    description = (
        "Query text from `?query=` and/or the POST body; output format from a "
        "trailing `FORMAT X` or `default_format`, TabSeparated by default; "
        "`param_<name>` binds `{name:Type}` placeholders. Only one SELECT, WITH, "
        "SHOW, DESCRIBE, EXISTS or EXPLAIN statement runs; anything else is "
        "refused with `Code: 164` (READONLY), HTTP 403. Without a query, GET answers `Ok.`"
    )
    summary = "Read-only SQL, ClickHouse HTTP interface"

    @router.get("/", response_class=Response, summary=summary, description=description)
    @router.post(
        "/",
        response_class=Response,
        summary=summary,
        description=description,
        operation_id="query_post",
    )
    async def query(request: Request) -> Response:
        try:
            body = await bounded_body(request, MAX_QUERY_BYTES)
        except TooLarge as error:
            return _error_answer(ClickHouseError(QUERY_IS_TOO_LARGE, str(error)), "")
        try:
            http_query = read_http_query(
                request.method, request.query_params, request.headers, body
            )
        except ClickHouseError as error:
            return _error_answer(error, "")
        if http_query.sql is None and request.method == "GET":
            return Response("Ok.\n", media_type="text/plain; charset=UTF-8")
        return await run_http_query(gate, http_query)

    return router

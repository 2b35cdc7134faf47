"""A read-only SQL gate over a clickhouse-connect client.

Two locks keep a query from writing:

1. :func:`check_read_only`, a pure check over the query's tokens (lexed the way
   ClickHouse lexes them: quotes with backslash escapes, nested ``/* */`` and
   ``--`` / ``//`` / ``#`` comments, ``$tag$`` heredocs): one statement, starting
   with SELECT, WITH … SELECT, SHOW, DESCRIBE, DESC, EXISTS or EXPLAIN; no
   ``INTO OUTFILE`` (chdb writes that file even in read-only mode); no
   ``SETTINGS`` that touch ``readonly``, ``allow_ddl`` or introspection.
2. The engine: :class:`QueryGate` reads through a ``readonly=1`` session, so
   ClickHouse itself refuses writes, DDL and setting changes (chdb honours this,
   per connection handle).

Every call into the client runs on the gate's single worker thread
(:attr:`QueryGate.executor`): chdb is synchronous and hosts one engine per
process, so the ClickHouse sink may share that thread by submitting to it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import Error as ClickHouseClientError

T = TypeVar("T")

READ_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})
"""Keywords a read statement may start with."""

WRITE_KEYWORDS = frozenset(
    {
        "INSERT", "ALTER", "DROP", "CREATE", "TRUNCATE", "OPTIMIZE", "SYSTEM", "SET", "KILL",
        "GRANT", "REVOKE", "RENAME", "DELETE", "UPDATE", "ATTACH", "DETACH", "EXCHANGE",
        "UNDROP", "BACKUP", "RESTORE", "USE", "MOVE", "REPLACE", "CHECK", "BEGIN", "COMMIT",
        "ROLLBACK",
    }
)  # fmt: skip
"""Statement keywords that the main statement of a ``WITH`` query must not be."""

PROTECTED_SETTINGS = frozenset({"readonly", "allow_ddl", "allow_introspection_functions"})
"""Settings a query may not change: they would lift the read-only lock."""

_FORMAT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEREDOC_TAG = re.compile(r"\$[A-Za-z0-9_]*\$", re.ASCII)
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$")
_SPACE = frozenset(" \t\n\r\f\v")


class ReadOnlyViolation(ValueError):
    """The gate refused a query because it could write, or could not be checked.

    ``keyword`` names what was refused (``INSERT``, ``;``, ``INTO OUTFILE``,
    ``SETTINGS readonly`` …); the message says why.
    """

    def __init__(self, keyword: str, reason: str) -> None:
        super().__init__(f"read-only gate refused the query: {reason}")
        self.keyword = keyword
        self.reason = reason


class UncheckableQuery(ReadOnlyViolation):
    """The query could not be read (empty, an unclosed quote or comment), so it is refused."""


class QueryFailed(Exception):
    """The engine (or the client talking to it) rejected a query that passed the gate.

    ``code`` is the ClickHouse error code (0 when unknown, e.g. a lost connection),
    ``message`` the engine's text, usually ``Code: N. DB::Exception: … (NAME)``.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- lexing ---------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    """One significant token: ``kind`` is word, quoted, string, number or punct."""

    kind: str
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


def tokenize(sql: str) -> list[Token]:
    """The significant tokens of ``sql`` (comments and whitespace dropped); see iter_tokens."""
    return list(iter_tokens(sql))


def iter_tokens(sql: str) -> Iterator[Token]:
    """The significant tokens of ``sql``, lexed lazily.

    Raises UncheckableQuery on an unclosed quote or comment, when it gets there.
    Where ClickHouse's lexer is uncertain to us (heredoc tags), this lexer sees
    *more* tokens, never fewer, so a check over them is stricter, never laxer.
    """
    pos = 0
    while pos < len(sql):
        end, kind = _scan(sql, pos)
        if kind:
            yield Token(kind, sql[pos:end], pos)
        pos = end


def _scan(sql: str, pos: int) -> tuple[int, str]:
    """End of the token starting at ``pos`` and its kind ('' for comments and spaces)."""
    char, pair = sql[pos], sql[pos : pos + 2]
    if char in _SPACE:
        return _skip_spaces(sql, pos), ""
    if pair in ("--", "//", "# ", "#!"):
        end = sql.find("\n", pos)
        return (len(sql) if end < 0 else end), ""
    if pair == "/*":
        return _skip_block_comment(sql, pos), ""
    if char in "'\"`":
        return _skip_quoted(sql, pos), "string" if char == "'" else "quoted"
    if char == "$":
        heredoc_end = _heredoc_end(sql, pos)
        if heredoc_end:
            return heredoc_end, "string"
    if char in _WORD_CHARS:
        end = pos
        while end < len(sql) and sql[end] in _WORD_CHARS:
            end += 1
        return end, "number" if char.isdigit() else "word"
    return pos + 1, "punct"


def _skip_spaces(sql: str, pos: int) -> int:
    while pos < len(sql) and sql[pos] in _SPACE:
        pos += 1
    return pos


def _skip_block_comment(sql: str, pos: int) -> int:
    """End of a ``/* */`` comment; ClickHouse nests them."""
    depth, index = 1, pos + 2
    while index < len(sql) - 1:
        pair = sql[index : index + 2]
        if pair in ("/*", "*/"):
            depth += 1 if pair == "/*" else -1
            index += 2
            if depth == 0:
                return index
        else:
            index += 1
    raise UncheckableQuery("/*", f"the comment opened at position {pos} is not closed")


def _skip_quoted(sql: str, pos: int) -> int:
    """End of a quoted string or identifier: backslash escapes, a doubled quote is one quote."""
    quote, index = sql[pos], pos + 1
    while index < len(sql):
        char = sql[index]
        if char == "\\" or (char == quote and sql[index + 1 : index + 2] == quote):
            index += 2
        elif char == quote:
            return index + 1
        else:
            index += 1
    raise UncheckableQuery(quote, f"the quote {quote} opened at position {pos} is not closed")


def _heredoc_end(sql: str, pos: int) -> int:
    """End of a ``$tag$ … $tag$`` heredoc starting at ``pos``, or 0 if there is none."""
    tag = _HEREDOC_TAG.match(sql, pos)
    if tag is None:
        return 0
    close = sql.find(tag.group(), tag.end())
    return 0 if close < 0 else close + len(tag.group())


# -- the read-only rule ---------------------------------------------------


@dataclass(frozen=True)
class ReadQuery:
    """A query that passed :func:`check_read_only`.

    ``text`` is its one statement without the trailing ``;``, surrounding comments
    or ``FORMAT`` clause; ``fmt`` is that clause's format name, if it had one.
    """

    text: str
    fmt: str | None


MEMO_CHARS = 65_536
"""Texts up to this many characters have their check and their placeholders
remembered (the last :data:`MEMO_ENTRIES`): a client sends the same query again with
other bind values, and lexing a 4 KiB query costs about 1.5 ms each time."""
MEMO_ENTRIES = 256


def check_read_only(sql: str) -> ReadQuery:
    """Accept exactly one read statement, or raise ReadOnlyViolation naming the offender.

    Allowed: one statement (one trailing ``;`` at most) starting with SELECT,
    WITH (whose main statement is a SELECT), SHOW, DESCRIBE, DESC, EXISTS or
    EXPLAIN, optionally behind opening parentheses. Refused: anything else, a
    second statement, ``INTO OUTFILE``, ``SETTINGS`` naming a PROTECTED_SETTINGS
    entry. The first keyword is checked before the rest is lexed, so an INSERT
    with binary data is refused as an INSERT. Pure: no I/O; the answer for a text
    of up to :data:`MEMO_CHARS` characters is remembered (a refusal is not).
    """
    return _remembered_check(sql) if len(sql) <= MEMO_CHARS else _check_read_only(sql)


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def _remembered_check(sql: str) -> ReadQuery:
    return _check_read_only(sql)


def _check_read_only(sql: str) -> ReadQuery:
    tokens = iter_tokens(sql)
    lead = _lead(tokens)
    statement = _one_statement([*lead, *tokens])
    if lead[-1].upper == "WITH":
        _check_with(statement[len(lead) :])
    _check_no_outfile(statement)
    _check_table_functions(statement)
    _check_settings(statement)
    return _split_format(sql, statement)


def _lead(tokens: Iterator[Token]) -> list[Token]:
    """Opening parentheses and the first keyword, refused unless a read keyword."""
    lead: list[Token] = []
    for token in tokens:
        lead.append(token)
        if token.text != "(":
            break
    if not lead:
        raise UncheckableQuery("", "the query is empty")
    if lead[-1].text == "(":
        raise UncheckableQuery("(", "the query holds nothing after '('")
    first = lead[-1]
    if first.upper not in READ_KEYWORDS:
        raise _refuse(first.upper or first.text)
    return lead


def _one_statement(tokens: list[Token]) -> list[Token]:
    if tokens[-1].text == ";" and tokens[-1].kind == "punct":
        tokens = tokens[:-1]
    for index, token in enumerate(tokens):
        if token.kind == "punct" and token.text == ";":
            after = tokens[index + 1].text if index + 1 < len(tokens) else ";"
            raise ReadOnlyViolation(
                ";", f"only one statement may run per query, found {after!r} after ';'"
            )
    return tokens


def _refuse(keyword: str) -> ReadOnlyViolation:
    allowed = ", ".join(sorted(READ_KEYWORDS))
    return ReadOnlyViolation(
        keyword, f"{keyword} is not a read statement; only {allowed} statements may run here"
    )


def _check_with(tokens: Sequence[Token]) -> None:
    main = _main_keyword_after_with(tokens)
    if main != "SELECT":
        raise _refuse(f"WITH … {main}" if main else "WITH without SELECT")


def _main_keyword_after_with(tokens: Sequence[Token]) -> str:
    """The first statement keyword outside brackets after WITH ('' if none)."""
    depth = 0
    for token in tokens:
        if token.text in ("(", "["):
            depth += 1
        elif token.text in (")", "]"):
            depth -= 1
        elif depth == 0 and token.upper in READ_KEYWORDS | WRITE_KEYWORDS:
            return token.upper
    return ""


def _check_no_outfile(statement: list[Token]) -> None:
    if any(token.upper == "OUTFILE" for token in statement):
        raise ReadOnlyViolation(
            "INTO OUTFILE", "INTO OUTFILE would write a file on the server running the engine"
        )


OUTSIDE_FUNCTIONS = frozenset(
    {
        "file", "url", "urlcluster", "s3", "s3cluster", "gcs", "azureblobstorage", "hdfs",
        "hdfscluster", "remote", "remotesecure", "cluster", "clusterallreplicas", "mysql",
        "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc", "executable", "input",
        "deltalake", "hudi", "iceberg", "filesystem", "fuzzjson", "fuzzquery", "loop",
        "python",
    }
)  # fmt: skip
"""Functions that reach outside the history (files, URLs, other servers, programs).
``file`` is also an ordinary function, ``file(path)``: the engine's read-only mode does
not stop it, and chdb does not confine it to ``user_files_path``. This check is all
that keeps it from the master key, the data keys and the part files of erased rows."""

OUTSIDE_PREFIXES = ("iceberg", "deltalake", "hudi", "s3", "azure", "hdfs", "gcs")
"""Families of table functions that read lakes and object stores (``icebergLocal``,
``deltaLakeS3``, ...); no ordinary function's name starts so."""


def _check_table_functions(statement: list[Token]) -> None:
    """Refuse calls of functions that read outside engram's own tables, and calls of
    a quoted name: the engine unescapes `` `file` ``, ``"file"`` and `` `\x66ile` ``
    alike into ``file``, so a quoted name is refused whatever it spells."""
    for token, following in itertools.pairwise(statement):
        if following.text != "(" or following.kind != "punct":
            continue
        if token.kind == "quoted":
            raise ReadOnlyViolation(
                f"{token.text}()",
                "a function may not be called by a quoted name here: spell its name plainly",
            )
        name = token.text.lower()
        if token.kind == "word" and (
            name in OUTSIDE_FUNCTIONS or name.startswith(OUTSIDE_PREFIXES)
        ):
            raise ReadOnlyViolation(
                f"{token.text}()",
                f"the table function {token.text}() reads outside the history; only engram's "
                "tables and views can be queried here",
            )


def _check_settings(statement: list[Token]) -> None:
    for index, token in enumerate(statement):
        if token.upper == "SETTINGS":
            for name in _setting_names(statement, index + 1):
                if name.lower() in PROTECTED_SETTINGS:
                    raise ReadOnlyViolation(
                        f"SETTINGS {name}", f"a query may not change the setting {name}"
                    )


def _setting_names(tokens: list[Token], index: int) -> list[str]:
    """Names of a ``SETTINGS a = 1, b = 'x'`` clause starting at ``index``."""
    names = []
    while index + 2 < len(tokens) and tokens[index + 1].text == "=":
        names.append(tokens[index].text.strip('`"'))
        index += 2
        if tokens[index].text in ("-", "+") and index + 1 < len(tokens):
            index += 1
        index += 1
        if index >= len(tokens) or tokens[index].text != ",":
            break
        index += 1
    return names


def _split_format(sql: str, statement: list[Token]) -> ReadQuery:
    """Cut a ``FORMAT name`` clause (at the end, or before a final SETTINGS) out of the text."""
    start, end = statement[0].start, statement[-1].end
    depth = 0
    for index, token in enumerate(statement[:-1]):
        depth += (token.text in ("(", "[")) - (token.text in (")", "]"))
        name = statement[index + 1]
        after = statement[index + 2] if index + 2 < len(statement) else None
        closes = after is None or after.upper == "SETTINGS"
        if depth == 0 and token.upper == "FORMAT" and name.kind == "word" and closes:
            text = f"{sql[start : token.start].rstrip()} {sql[name.end : end].lstrip()}"
            return ReadQuery(text.rstrip(), name.text)
    return ReadQuery(sql[start:end], None)


def check_format(fmt: str) -> str:
    """``fmt`` if it is a plain format name (it is spliced into SQL), else UncheckableQuery."""
    if not _FORMAT_NAME.fullmatch(fmt):
        raise UncheckableQuery("FORMAT", f"{fmt!r} is not a format name")
    return fmt


def check_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """Per-query settings, refused if a name is malformed or in PROTECTED_SETTINGS."""
    for name in settings:
        if not _SETTING_NAME.fullmatch(name) or name.lower() in PROTECTED_SETTINGS:
            raise ReadOnlyViolation(f"SETTINGS {name}", f"a query may not set {name!r}")
    return dict(settings)


# -- bind parameters ------------------------------------------------------

_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "0": "\0", "a": "\a", "v": "\v"}


def unescape_param(value: str) -> str | None:
    """A ``param_<name>`` value in ClickHouse's escaped text form, as a Python string.

    ``\\N`` alone is NULL (None); ``\\xHH`` is a byte; ``\\n``, ``\\t`` … the usual
    controls; any other escaped character stands for itself. Raises ValueError if
    the ``\\xHH`` bytes are not UTF-8.
    """
    if value == "\\N":
        return None
    out = bytearray()
    index = 0
    while index < len(value):
        char = value[index]
        if char != "\\" or index + 1 == len(value):
            out += char.encode()
            index += 1
            continue
        nxt = value[index + 1]
        hex_digits = value[index + 2 : index + 4]
        if nxt == "x" and re.fullmatch(r"[0-9A-Fa-f]{2}", hex_digits):
            out.append(int(hex_digits, 16))
            index += 4
        else:
            out += _ESCAPES.get(nxt, nxt).encode()
            index += 2
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise ValueError("a bind parameter's \\xHH bytes are not UTF-8 text") from None


# -- the gate -------------------------------------------------------------


class QueryGate:
    """Runs read-only queries against the engine behind a clickhouse-connect client.

    The gate never changes the client it is given (a sink may write with it):
    it reads through a connection whose session is ``readonly=1``. For chdb,
    whose session settings stick to a connection handle, that is a second
    handle on the same engine, opened and closed by the gate; for a server, the
    given client with ``readonly=1`` sent on each query (unless the server user
    is read-only already). Every call into either runs on :attr:`executor`, one
    thread, in submission order; a sink that shares it must be done before
    :meth:`close`.

    Each read is bounded by ``limits`` (:class:`QueryLimits`), set before the lock so
    that no query can lift them: a sink sharing the thread waits at most that long
    behind an analyst's query. A server user that is read-only already has its
    profile's limits instead.
    """

    def __init__(self, client: Client, limits: QueryLimits | None = None) -> None:
        self.client = client
        self.limits = limits or QueryLimits()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engram-sql")
        reader = self.executor.submit(_open_reader, client, self.limits).result()
        self._reader, self._query_settings, self._owns_reader = reader
        self.timezone: str = self.executor.submit(self._engine_timezone).result()

    @property
    def reader(self) -> Client:
        """The client the gate reads through: for chdb its own handle, locked with
        ``readonly=1`` at the engine; for a server, the given client (the lock rides
        on each query). Calls on it bypass the keyword check: for diagnostics and tests."""
        return self._reader

    def _engine_timezone(self) -> str:
        tz = self._reader.command(
            "SELECT timezone()", settings=self._query_settings, use_database=False
        )
        return str(tz)

    async def _run(self, call: Callable[[], T]) -> T:
        """``call()`` on the worker thread; client errors become QueryFailed."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, call)
        except ClickHouseClientError as error:
            raise QueryFailed(error.code or 0, str(error)) from error

    async def raw(
        self,
        sql: str,
        fmt: str = "TabSeparated",
        *,
        settings: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> bytes:
        """The result of one read query as bytes in ClickHouse output format ``fmt``.

        A FORMAT clause in ``sql`` wins over ``fmt`` (as in ClickHouse). ``params``
        are server-side bind values for ``{name:Type}`` placeholders, in the escaped
        text form of ClickHouse's ``param_<name>`` URL parameters. ``settings`` ride
        with the query, but a read-only chdb session refuses any change. Raises
        ReadOnlyViolation before running anything that could write, QueryFailed
        when the engine rejects the query, ValueError for a malformed parameter.
        """
        query = check_read_only(sql)
        out_fmt = check_format(query.fmt or fmt)
        merged = {**check_settings(settings or {}), **self._query_settings}
        text = query.text
        if params:  # an Identifier's value lands in the text: check what will run
            text = check_read_only(bind_placeholders(text, params)).text
        return await self._run(
            lambda: self._reader.raw_query(text, settings=merged or None, fmt=out_fmt)
        )

    async def rows(
        self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Rows of one read query; ``parameters`` bind as in ``client.query``.

        Raises ReadOnlyViolation for anything but one read statement, ValueError
        if it has a FORMAT clause, QueryFailed when the engine rejects it.
        """
        query = check_read_only(sql)
        if query.fmt:
            raise ValueError("rows() decodes the result itself: drop the FORMAT clause")
        bound = dict(parameters) if isinstance(parameters, Mapping) else parameters
        settings = self._query_settings or None
        result = await self._run(
            lambda: self._reader.query(query.text, parameters=bound, settings=settings)
        )
        return [tuple(row) for row in result.result_rows]

    def close(self) -> None:
        """Close the gate's own chdb handle (never the given client), then stop the thread."""
        if self._owns_reader:
            self.executor.submit(self._reader.close).result()
        self.executor.shutdown(wait=True)


@dataclass(frozen=True)
class QueryLimits:
    """What one read through the gate may take: ``timeout_s`` seconds of execution
    (then ClickHouse's ``TIMEOUT_EXCEEDED``, code 159) and ``max_memory_bytes`` of
    memory (then ``MEMORY_LIMIT_EXCEEDED``, code 241). ValueError unless positive."""

    timeout_s: float = 60.0
    max_memory_bytes: int = 4 << 30

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or self.max_memory_bytes <= 0:
            raise ValueError(f"query limits must be positive, got {self}")

    def settings(self) -> dict[str, str]:
        """The engine settings that enforce them."""
        return {
            "max_execution_time": f"{self.timeout_s:g}",
            "max_memory_usage": str(self.max_memory_bytes),
        }


def _open_reader(client: Client, limits: QueryLimits) -> tuple[Client, dict[str, str], bool]:
    """(client to read through, settings for each query, whether the gate owns it).
    The limits come before ``readonly``: once it is set, no query can change them."""
    path = getattr(client, "path", None)
    if client.uri.startswith("chdb:") and isinstance(path, str):
        reader = clickhouse_connect.get_client(
            interface="chdb", path=path, database=client.database
        )
        for name, value in limits.settings().items():
            reader.set_client_setting(name, value)
        reader.set_client_setting("readonly", "1")
        return reader, {}, True
    current = client.server_settings.get("readonly")
    already = current is not None and current.value != "0"
    return client, ({} if already else {**limits.settings(), "readonly": "1"}), False


def bind_placeholders(sql: str, params: Mapping[str, str]) -> str:
    """``sql`` with each ``{name:Type}`` placeholder replaced by its value.

    ``params`` hold the values in the escaped text form of ClickHouse's
    ``param_<name>`` URL parameters; each becomes ``CAST('<text>' AS Type)``, so
    the engine parses the text as the server would (arrays, maps, UUIDs, dates),
    or a quoted identifier for ``Identifier``. Placeholders inside string literals
    are left alone. Raises ValueError for a placeholder without a value.
    """
    out: list[str] = []
    done = 0
    for start, name, type_text, end in placeholders(sql):
        if name not in params:
            raise ValueError(f"query parameter {name!r} has no value (send param_{name})")
        out += [sql[done:start], _literal(unescape_param(params[name]), type_text)]
        done = end
    return "".join(out) + sql[done:]


Placeholder = tuple[int, str, str, int]
"""Where a ``{name:Type}`` placeholder starts, its name, its type's text, where it ends."""


def placeholders(sql: str) -> tuple[Placeholder, ...]:
    """The ``{name:Type}`` placeholders of ``sql`` outside string literals, in order;
    remembered for a text of up to :data:`MEMO_CHARS` characters. Pure."""
    return _remembered_placeholders(sql) if len(sql) <= MEMO_CHARS else _placeholders(sql)


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def _remembered_placeholders(sql: str) -> tuple[Placeholder, ...]:
    return _placeholders(sql)


def _placeholders(sql: str) -> tuple[Placeholder, ...]:
    tokens = tokenize(sql)
    found: list[Placeholder] = []
    index = 0
    while index < len(tokens):
        at = _placeholder_at(tokens, index)
        if at is None:
            index += 1
            continue
        name, type_start, close = at
        type_text = sql[type_start : tokens[close].start].strip()
        found.append((tokens[index].start, name, type_text, tokens[close].end))
        index = close + 1
    return tuple(found)


def _placeholder_at(tokens: list[Token], index: int) -> tuple[str, int, int] | None:
    """(name, start of the type text, index of the closing brace) of a placeholder."""
    if index + 3 >= len(tokens) or tokens[index].text != "{" or tokens[index].kind != "punct":
        return None
    name, colon = tokens[index + 1], tokens[index + 2]
    if name.kind != "word" or colon.text != ":":
        return None
    depth = 0
    for close in range(index + 3, len(tokens)):
        text = tokens[close].text if tokens[close].kind == "punct" else ""
        if text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
        elif text == "}" and depth == 0:
            return name.text, colon.end, close
    return None


def _literal(value: str | None, type_text: str) -> str:
    if value is None:
        return f"CAST(NULL AS {type_text})"
    if type_text == "Identifier":
        return "`" + value.replace("\\", "\\\\").replace("`", "\\`") + "`"
    quoted = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return f"CAST({quoted} AS {type_text})"

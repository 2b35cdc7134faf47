"""The read-only rule of the SQL gate: one read statement passes, anything that
could write (or that cannot be read) is refused, naming the offender."""

from __future__ import annotations

import pytest

from engram.sqlgate import (
    MEMO_CHARS,
    QueryLimits,
    ReadOnlyViolation,
    ReadQuery,
    UncheckableQuery,
    bind_placeholders,
    check_format,
    check_read_only,
    check_settings,
    tokenize,
    unescape_param,
)

ACCEPTED = [
    # (query, the statement the gate runs, its FORMAT clause)
    ("SELECT 1", "SELECT 1", None),
    ("  select 1 ;", "select 1", None),
    ("SELECT 1;\n-- trailing comment", "SELECT 1", None),
    ("-- a comment\nSELECT 1", "SELECT 1", None),
    ("/* a /* nested; DROP */ comment */ SELECT 1", "SELECT 1", None),
    ("# mysql-style comment\nSELECT 1", "SELECT 1", None),
    ("#!/usr/bin/clickhouse-local\nSELECT 1", "SELECT 1", None),
    ("SELECT 1 // to the end of the line; DROP TABLE t", "SELECT 1", None),
    ("WITH x AS (SELECT 1) SELECT * FROM x", "WITH x AS (SELECT 1) SELECT * FROM x", None),
    ("with (select max(id) from t) as m select m", None, None),
    ("SHOW TABLES", "SHOW TABLES", None),
    ("DESCRIBE TABLE t", "DESCRIBE TABLE t", None),
    ("desc t", "desc t", None),
    ("EXISTS TABLE t", "EXISTS TABLE t", None),
    ("EXPLAIN SELECT 1", "EXPLAIN SELECT 1", None),
    ("(SELECT 1) UNION ALL (SELECT 2)", "(SELECT 1) UNION ALL (SELECT 2)", None),
    ("SELECT ';' AS semicolon", "SELECT ';' AS semicolon", None),
    ("SELECT 'it''s; DROP', \"a;b\", `c;d`", "SELECT 'it''s; DROP', \"a;b\", `c;d`", None),
    ("SELECT 'a\\'; DROP TABLE t --'", "SELECT 'a\\'; DROP TABLE t --'", None),
    ("SELECT $$; DROP TABLE t$$", "SELECT $$; DROP TABLE t$$", None),
    ("SELECT $tag$; INSERT$tag$ AS x", "SELECT $tag$; INSERT$tag$ AS x", None),
    ("SELECT * FROM t WHERE drop = 'INSERT'", "SELECT * FROM t WHERE drop = 'INSERT'", None),
    ("SELECT name, value, readonly FROM system.settings LIMIT 10000", None, None),
    ("SELECT 1 FORMAT JSONEachRow", "SELECT 1", "JSONEachRow"),
    ("SELECT 1\n FORMAT Native;", "SELECT 1", "Native"),
    ("SELECT 1 format CSV -- comment", "SELECT 1", "CSV"),
    ("SELECT 1 SETTINGS max_threads = 1 FORMAT CSV", "SELECT 1 SETTINGS max_threads = 1", "CSV"),
    ("SELECT 1 FORMAT CSV SETTINGS max_threads = 1", "SELECT 1 SETTINGS max_threads = 1", "CSV"),
    ("SELECT format FROM t", "SELECT format FROM t", None),
    ("SELECT * FROM t AS format FORMAT TSV", "SELECT * FROM t AS format", "TSV"),
    ("SELECT {agent:String} AS a", "SELECT {agent:String} AS a", None),
]


@pytest.mark.parametrize(("sql", "text", "fmt"), ACCEPTED)
def test_a_read_statement_passes(sql: str, text: str | None, fmt: str | None) -> None:
    assert check_read_only(sql) == ReadQuery(text if text is not None else sql, fmt)


REFUSED = [
    # (query, the keyword named, a fragment of the message)
    ("INSERT INTO t VALUES (1)", "INSERT", "INSERT is not a read statement"),
    ("insert into t values (1)", "INSERT", "only DESC, DESCRIBE, EXISTS, EXPLAIN, SELECT"),
    ("INSERT INTO t FORMAT Native\n\x00\x01'binary", "INSERT", "INSERT is not a read"),
    ("ALTER TABLE t DELETE WHERE 1", "ALTER", "ALTER is not a read statement"),
    ("DROP TABLE t", "DROP", "DROP is not a read statement"),
    ("CREATE TABLE u (a Int8) ENGINE = Memory", "CREATE", "CREATE is not"),
    ("TRUNCATE TABLE t", "TRUNCATE", "TRUNCATE is not"),
    ("OPTIMIZE TABLE t FINAL", "OPTIMIZE", "OPTIMIZE is not"),
    ("SYSTEM FLUSH LOGS", "SYSTEM", "SYSTEM is not"),
    ("SET readonly = 0", "SET", "SET is not"),
    ("KILL QUERY WHERE 1", "KILL", "KILL is not"),
    ("GRANT ALL ON *.* TO someone", "GRANT", "GRANT is not"),
    ("DELETE FROM t WHERE 1", "DELETE", "DELETE is not"),
    ("/* SELECT */ DROP TABLE t", "DROP", "DROP is not"),
    ("-- SELECT\nDROP TABLE t", "DROP", "DROP is not"),
    ("FROM t SELECT *", "FROM", "FROM is not"),
    ("; SELECT 1", ";", "; is not"),
    ("SELECT 1; DROP TABLE t", ";", "found 'DROP' after ';'"),
    ("SELECT 1; SELECT 2", ";", "only one statement may run per query"),
    ("SELECT 1;;", ";", "found ';' after ';'"),
    ("SELECT $a b$ ; DROP TABLE t $a b$", ";", "found 'DROP' after ';'"),
    ("WITH 1 AS x INSERT INTO t SELECT x", "WITH … INSERT", "WITH … INSERT is not"),
    ("WITH 1 AS x", "WITH without SELECT", "WITH without SELECT is not"),
    ("SELECT 1 INTO OUTFILE '/tmp/leak.tsv'", "INTO OUTFILE", "would write a file"),
    ("SELECT 1 into /* c */ outfile 'x' FORMAT CSV", "INTO OUTFILE", "would write a file"),
    ("SELECT 1 SETTINGS readonly = 0", "SETTINGS readonly", "may not change the setting"),
    ("SELECT 1 SETTINGS max_threads = 2, allow_ddl = 1", "SETTINGS allow_ddl", "allow_ddl"),
    ("SELECT (SELECT 1 SETTINGS readonly=0)", "SETTINGS readonly", "readonly"),
    ("SELECT 1 SETTINGS `readonly` = -1", "SETTINGS readonly", "readonly"),
]


@pytest.mark.parametrize(("sql", "keyword", "message"), REFUSED)
def test_anything_else_is_refused_naming_the_keyword(sql: str, keyword: str, message: str) -> None:
    with pytest.raises(ReadOnlyViolation) as refused:
        check_read_only(sql)
    assert refused.value.keyword == keyword
    assert message in str(refused.value)
    assert str(refused.value).startswith("read-only gate refused the query: ")
    assert not isinstance(refused.value, UncheckableQuery)


UNREADABLE = [
    ("", "the query is empty"),
    ("  -- only a comment\n", "the query is empty"),
    ("((", "the query holds nothing after '\\('"),
    ("SELECT 'open", "the quote ' opened at position 7 is not closed"),
    ('SELECT "open', 'the quote " opened at position 7 is not closed'),
    ("SELECT 'a\\' ; DROP TABLE t", "the quote ' opened at position 7 is not closed"),
    ("SELECT 1 /* open /* nested */", "the comment opened at position 9 is not closed"),
]


@pytest.mark.parametrize(("sql", "message"), UNREADABLE)
def test_a_query_that_cannot_be_read_is_refused(sql: str, message: str) -> None:
    with pytest.raises(UncheckableQuery, match=message):
        check_read_only(sql)


def test_tokens_keep_strings_and_drop_comments() -> None:
    tokens = tokenize("SELECT 'a;b' /* c */ AS x -- d\n, `q` ;")
    assert [(t.kind, t.text) for t in tokens] == [
        ("word", "SELECT"),
        ("string", "'a;b'"),
        ("word", "AS"),
        ("word", "x"),
        ("punct", ","),
        ("quoted", "`q`"),
        ("punct", ";"),
    ]


@pytest.mark.parametrize("fmt", ["CSV;DROP", "JSON Each", "", "1CSV", "Native\n"])
def test_a_format_name_is_a_plain_word(fmt: str) -> None:
    with pytest.raises(UncheckableQuery, match="is not a format name"):
        check_format(fmt)
    assert check_format("TabSeparatedWithNamesAndTypes") == "TabSeparatedWithNamesAndTypes"


@pytest.mark.parametrize("name", ["readonly", "READONLY", "allow_ddl", "max threads", "a;b"])
def test_per_query_settings_may_not_lift_the_lock(name: str) -> None:
    with pytest.raises(ReadOnlyViolation, match="may not set"):
        check_settings({name: "0"})
    assert check_settings({"max_threads": "1"}) == {"max_threads": "1"}


@pytest.mark.parametrize(
    ("wire", "value"),
    [
        ("abc", "abc"),
        ("a\\tb\\nc", "a\tb\nc"),
        ("a\\\tb", "a\tb"),  # clickhouse-connect escapes a tab as backslash + tab
        ("it\\'s", "it's"),
        ("back\\\\slash", "back\\slash"),
        ("\\x41\\xc3\\xa9", "Aé"),
        ("用户", "用户"),
        ("\\N", None),
        ("trailing\\", "trailing\\"),
    ],
)
def test_bind_values_are_unescaped_like_clickhouse_does(wire: str, value: str | None) -> None:
    assert unescape_param(wire) == value


def test_bind_bytes_must_be_utf8() -> None:
    with pytest.raises(ValueError, match="not UTF-8"):
        unescape_param("\\xff")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "SELECT * FROM url('http://127.0.0.1:1/x', CSV)",
        "select count() from s3('http://x/y.csv')",
        "SELECT * FROM events WHERE agent_id IN (SELECT * FROM remote('h', system.one))",
        "WITH f AS (SELECT * FROM File('/etc/hosts', 'LineAsString')) SELECT * FROM f",
        "SELECT * FROM executable('ls', 'TSV', 'x String')",
    ],
)
def test_table_functions_that_reach_outside_are_refused(sql: str) -> None:
    with pytest.raises(ReadOnlyViolation, match="reads outside the history"):
        check_read_only(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM icebergLocal('/data/lake')",
        "SELECT * FROM deltaLakeLocal('/data/lake')",
        "SELECT * FROM hudiS3('http://x/y')",
        "SELECT * FROM python('frame')",
    ],
)
def test_families_of_table_functions_that_reach_outside_are_refused(sql: str) -> None:
    with pytest.raises(ReadOnlyViolation, match="reads outside the history"):
        check_read_only(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT `file`('/etc/hostname')",
        "SELECT \"file\"('/etc/hostname')",
        "SELECT `\\x66ile`('/etc/hostname')",  # the engine unescapes it to file
        "SELECT * FROM `url`('http://127.0.0.1:1/x', CSV)",
        "SELECT `count`(*) FROM events",  # harmless, but the gate cannot tell
    ],
)
def test_a_function_called_by_a_quoted_name_is_refused(sql: str) -> None:
    with pytest.raises(ReadOnlyViolation, match="may not be called by a quoted name"):
        check_read_only(sql)


def test_quoted_names_that_are_not_called_pass() -> None:
    check_read_only('SELECT `file`, "url" FROM `events` AS "e" WHERE (`file` = 1)')


def test_query_limits_are_engine_settings_and_must_be_positive() -> None:
    assert QueryLimits(2.5, 1 << 20).settings() == {
        "max_execution_time": "2.5",
        "max_memory_usage": "1048576",
    }
    for timeout_s, max_memory_bytes in ((0.0, 1), (1.0, 0), (float("nan"), 1)):
        with pytest.raises(ValueError, match="query limits must be positive"):
            QueryLimits(timeout_s, max_memory_bytes)


def test_columns_and_ordinary_functions_named_like_them_pass() -> None:
    check_read_only("SELECT url, file FROM events WHERE path(url) != '' AND lower(file) = 'x'")


@pytest.mark.parametrize("pad", [0, MEMO_CHARS])
def test_a_text_checked_again_gets_the_same_answer_and_binds_other_values(pad: int) -> None:
    """Checks and placeholders of short texts are remembered, of long ones not: the
    answers are the same either way, and each call binds its own values."""
    sql = "SELECT {a:String}, '{b:String}'" + " " * pad + " -- {c:UInt8}"
    assert (
        check_read_only(sql)
        == check_read_only(sql)
        == ReadQuery(sql.split(" --")[0].rstrip(), None)
    )
    one = bind_placeholders(sql, {"a": "x"})
    two = bind_placeholders(sql, {"a": "y"})
    assert one.startswith("SELECT CAST('x' AS String), '{b:String}'")
    assert two.startswith("SELECT CAST('y' AS String), '{b:String}'")
    for _ in range(2):  # a refusal is not remembered as a pass
        with pytest.raises(ReadOnlyViolation):
            check_read_only("SELECT 1; DROP TABLE t" + " " * pad)

"""``Settings.from_env`` for the worker's process and batch-window settings."""

from __future__ import annotations

import pytest

from engram.settings import Settings, SettingsError

HOME = {"ENGRAM_HOME": "/tmp/engram-settings-test"}


def test_memories_are_embedded_in_a_child_process_unless_turned_off() -> None:
    assert Settings.from_env(HOME).embed_process is True
    assert Settings.from_env({**HOME, "ENGRAM_EMBED_PROCESS": "ON "}).embed_process is True
    assert Settings.from_env({**HOME, "ENGRAM_EMBED_PROCESS": "off"}).embed_process is False
    with pytest.raises(SettingsError, match="ENGRAM_EMBED_PROCESS"):
        Settings.from_env({**HOME, "ENGRAM_EMBED_PROCESS": "yes"})


def test_memories_wait_for_a_fold_behind_by_4096_events_for_30_s_unless_set() -> None:
    default = Settings.from_env(HOME)
    assert (default.embed_yield_backlog, default.embed_yield_max_s) == (4096, 30.0)
    off = Settings.from_env({**HOME, "ENGRAM_EMBED_YIELD_BACKLOG": "0"})
    assert off.embed_yield_backlog == 0
    set_ = Settings.from_env(
        {**HOME, "ENGRAM_EMBED_YIELD_BACKLOG": "100", "ENGRAM_EMBED_YIELD_MAX_S": "2.5"}
    )
    assert (set_.embed_yield_backlog, set_.embed_yield_max_s) == (100, 2.5)
    with pytest.raises(SettingsError, match="ENGRAM_EMBED_YIELD_BACKLOG=-1 is below"):
        Settings.from_env({**HOME, "ENGRAM_EMBED_YIELD_BACKLOG": "-1"})
    with pytest.raises(SettingsError, match=r"ENGRAM_EMBED_YIELD_MAX_S=0\.0 must be a positive"):
        Settings.from_env({**HOME, "ENGRAM_EMBED_YIELD_MAX_S": "0"})


def test_the_ingest_hop_runs_in_a_child_process_unless_turned_off() -> None:
    assert Settings.from_env(HOME).ingest_process is True
    assert Settings.from_env({**HOME, "ENGRAM_INGEST_PROCESS": " OFF "}).ingest_process is False
    with pytest.raises(SettingsError, match="ENGRAM_INGEST_PROCESS='no' must be on or off"):
        Settings.from_env({**HOME, "ENGRAM_INGEST_PROCESS": "no"})


def test_the_fold_is_fed_directly_unless_turned_off() -> None:
    assert Settings.from_env(HOME).direct_feed is True
    assert Settings.from_env({**HOME, "ENGRAM_DIRECT_FEED": " Off"}).direct_feed is False
    with pytest.raises(SettingsError, match="ENGRAM_DIRECT_FEED"):
        Settings.from_env({**HOME, "ENGRAM_DIRECT_FEED": "1"})


def test_the_relay_window_is_its_own_setting() -> None:
    assert Settings.from_env(HOME).relay_interval_s == 0.1
    flush = {**HOME, "ENGRAM_FLUSH_INTERVAL_S": "0.5"}
    assert Settings.from_env(flush).relay_interval_s == 0.1
    assert Settings.from_env({**flush, "ENGRAM_RELAY_INTERVAL_S": "0.05"}).relay_interval_s == 0.05
    with pytest.raises(SettingsError, match="ENGRAM_RELAY_INTERVAL_S"):
        Settings.from_env({**HOME, "ENGRAM_RELAY_INTERVAL_S": "soon"})


def test_states_are_saved_at_one_flush_in_ten_unless_set() -> None:
    assert Settings.from_env(HOME).state_save_every == 10
    assert Settings.from_env({**HOME, "ENGRAM_STATE_SAVE_EVERY": "1"}).state_save_every == 1
    with pytest.raises(SettingsError, match="ENGRAM_STATE_SAVE_EVERY"):
        Settings.from_env({**HOME, "ENGRAM_STATE_SAVE_EVERY": "0"})


def test_reads_through_the_sql_endpoint_are_bounded_unless_set() -> None:
    settings = Settings.from_env(HOME)
    assert (settings.query_timeout_s, settings.query_max_memory_mb) == (60.0, 4096)
    bounded = {**HOME, "ENGRAM_QUERY_TIMEOUT_S": "5", "ENGRAM_QUERY_MAX_MEMORY_MB": "512"}
    assert Settings.from_env(bounded).query_timeout_s == 5.0
    assert Settings.from_env(bounded).query_max_memory_mb == 512
    for value in ("0", "-1", "nan", "inf"):
        with pytest.raises(SettingsError, match=r"ENGRAM_QUERY_TIMEOUT_S=.* must be a positive"):
            Settings.from_env({**HOME, "ENGRAM_QUERY_TIMEOUT_S": value})
    with pytest.raises(SettingsError, match="ENGRAM_QUERY_MAX_MEMORY_MB"):
        Settings.from_env({**HOME, "ENGRAM_QUERY_MAX_MEMORY_MB": "0"})

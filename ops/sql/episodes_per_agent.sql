-- Episodes per agent over a period: how many, from how many sessions, how they were
-- cut, how important and how felt they were.
--
-- Parameters (ClickHouse query parameters, bound server-side: param_<name>):
--   since     DateTime64(3, 'UTC')   episodes that ended at or after this moment
--   until     DateTime64(3, 'UTC')   and before this one
--   agent_id  String                 one agent, or '' for every agent
--
-- Columns: agent_id, episodes, sessions (distinct sessions the episodes came from),
-- turns, avg_importance (1..10), avg_sentiment (-1..1), cut_session_ended,
-- cut_idle_gap, cut_turn_count (episodes by what closed them), first_started_at,
-- last_ended_at; most episodes first.
-- An episode closed by a clock.tick carries no session on its change, so its
-- session is that of its first turn, found in the raw-event archive (events).
WITH
    closed AS (
        SELECT
            agent_id,
            JSONExtractString(body, 'episode_id') AS episode_id,
            JSONExtract(body, 'sources', 'Array(String)')[1] AS first_turn
        FROM memory_changes FINAL
        WHERE type = 'episode.closed'
          AND ({agent_id:String} = '' OR agent_id = {agent_id:String})
    ),
    turns AS (
        SELECT agent_id, toString(event_id) AS first_turn, session_id AS turn_session
        FROM events FINAL
        WHERE type = 'interaction.recorded'
          AND ({agent_id:String} = '' OR agent_id = {agent_id:String})
    )
SELECT
    ep.agent_id AS agent_id,
    count() AS episodes,
    uniqExact(coalesce(t.turn_session, ep.session_id)) AS sessions,
    sum(ep.turn_count) AS turns,
    round(avg(ep.importance), 2) AS avg_importance,
    round(avg(ep.sentiment), 3) AS avg_sentiment,
    countIf(ep.cut = 'session_ended') AS cut_session_ended,
    countIf(ep.cut = 'idle_gap') AS cut_idle_gap,
    countIf(ep.cut = 'turn_count') AS cut_turn_count,
    min(ep.started_at) AS first_started_at,
    max(ep.ended_at) AS last_ended_at
FROM episodes AS ep
LEFT JOIN closed AS c ON c.agent_id = ep.agent_id AND c.episode_id = ep.episode_id
LEFT JOIN turns AS t ON t.agent_id = c.agent_id AND t.first_turn = c.first_turn
WHERE ep.ended_at >= {since:DateTime64(3, 'UTC')}
  AND ep.ended_at < {until:DateTime64(3, 'UTC')}
  AND ({agent_id:String} = '' OR ep.agent_id = {agent_id:String})
GROUP BY ep.agent_id
ORDER BY episodes DESC, agent_id

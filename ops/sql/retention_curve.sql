-- Retention curve of one memory: every change of its strength, and its retention
-- R = exp(-Δt / S) at daily points from its creation on.
--
-- Parameters (ClickHouse query parameters, bound server-side: param_<name>):
--   agent_id   String   the agent that owns the memory
--   memory_id  String   the memory (memories.memory_id)
--   days       UInt32   the last daily point, in days after the creation (points 0..days)
--
-- One row per change of the memory in memory_changes (row = 'change': created,
-- reinforced, weakened, promoted, forgotten) and per daily point (row = 'point'),
-- ordered by time, a change before a point at the same instant:
--   at         DateTime64(3, 'UTC'), event time
--   type       the change's type; '' for a point
--   strength   S in days: after the change (NULL for promoted and forgotten), or in
--              force at the point (that of the last created/reinforced/weakened before it)
--   retention  at a point, R = exp(-Δt / S) with Δt in days since the creation or the
--              last reinforcement (a weakening changes S, not Δt); at a forgotten
--              change, the R the fold saw at the tick that forgot it; else NULL
--   forgotten  1 from the moment the memory was forgotten (it left recall) on
-- Δt is counted from the change's event time, the source event's occurred_at (for an
-- episode: the event that closed it), so R may differ a little from the fold's, which
-- starts at the episode's last turn. The curve is the exponential one (the default
-- config); under the fsrs curve S is the card's stability and R follows a power law.
WITH
    changes AS (
        SELECT occurred_at AS at, seq, idx, type, body
        FROM memory_changes FINAL
        WHERE agent_id = {agent_id:String}
          AND memory_id = {memory_id:String}
          AND type IN ('memory.created', 'memory.reinforced', 'memory.weakened',
                       'memory.promoted', 'memory.forgotten')
    ),
    curve AS (
        SELECT
            minIf(at, type = 'memory.created') AS created_at,
            minIf(at, type = 'memory.forgotten') AS forgotten_at,
            countIf(type = 'memory.forgotten') > 0 AS was_forgotten,
            arraySort(groupArrayIf(at, type IN ('memory.created', 'memory.reinforced')))
                AS reinforced,
            arraySort(groupArrayIf(
                (seq, idx, at, JSONExtractFloat(body, 'strength')),
                type IN ('memory.created', 'memory.reinforced', 'memory.weakened')
            )) AS strengths
        FROM changes
    ),
    points AS (
        SELECT
            arrayJoin(range(toUInt64({days:UInt32}) + 1)) AS day,
            created_at + toIntervalDay(day) AS at,
            arrayFilter(x -> x <= at, reinforced)[-1] AS since,
            arrayFilter(x -> x.3 <= at, strengths)[-1].4 AS strength,
            round(exp(-greatest(dateDiff('millisecond', since, at), 0) / 86400000 / strength), 6)
                AS retention,
            was_forgotten AND forgotten_at <= at AS forgotten
        FROM curve
        WHERE notEmpty(reinforced)
    )
SELECT row, at, type, strength, retention, forgotten
FROM (
    SELECT
        'change' AS row,
        c.at AS at,
        c.type AS type,
        if(c.type IN ('memory.promoted', 'memory.forgotten'), NULL,
           toNullable(JSONExtractFloat(c.body, 'strength'))) AS strength,
        if(c.type = 'memory.forgotten', toNullable(JSONExtractFloat(c.body, 'retention')), NULL)
            AS retention,
        curve.was_forgotten AND curve.forgotten_at <= c.at AS forgotten,
        c.seq AS seq,
        c.idx AS idx
    FROM changes AS c CROSS JOIN curve
    UNION ALL
    SELECT 'point', at, '', toNullable(strength), toNullable(retention), forgotten, 0, 0
    FROM points
)
ORDER BY at, row, seq, idx

-- What an agent knew at a moment T: the facts valid at T, and the memories it had
-- made by T and not forgotten by T, with their layer, strength and retention at T.
-- The same answer as replaying the agent's log up to T (time travel's second road).
--
-- Parameters (ClickHouse query parameters, bound server-side: param_<name>):
--   agent_id  String                  the agent
--   at        DateTime64(3, 'UTC')    the moment T (event time)
--
-- Columns:
--   kind       'fact' or 'memory'
--   id         'namespace/key' of a fact, memory_id of a memory
--   detail     a fact's namespace; a memory's kind (turn, episode, semantic, core)
--   layer      L3 for facts; a memory's layer at T (L3 once promoted by T)
--   content    a fact's value, a memory's text
--   since      a fact version's valid_from; when a memory was made (its source's time)
--   strength   a memory's S in days at T (NULL for facts)
--   retention  a memory's R = exp(-Δt / S) at T, Δt in days since its creation or
--              last reinforcement by T (the exponential curve); NULL for facts
-- A fact is valid at T when valid_from <= T < valid_to; a memory is known at T when
-- its memory.created occurred at or before T and no memory.forgotten did.
SELECT kind, id, detail, layer, content, since, strength, retention
FROM (
    SELECT
        'fact' AS kind,
        concat(namespace, '/', key) AS id,
        namespace AS detail,
        'L3' AS layer,
        assumeNotNull(value) AS content,
        valid_from AS since,
        CAST(NULL AS Nullable(Float64)) AS strength,
        CAST(NULL AS Nullable(Float64)) AS retention
    FROM facts
    WHERE agent_id = {agent_id:String}
      AND valid_from <= {at:DateTime64(3, 'UTC')}
      AND (valid_to IS NULL OR valid_to > {at:DateTime64(3, 'UTC')})
    UNION ALL
    SELECT
        'memory',
        memory_id,
        memory_kind,
        layer,
        text,
        made_at,
        toNullable(strength),
        toNullable(round(exp(-greatest(
            dateDiff('millisecond', reinforced_at, {at:DateTime64(3, 'UTC')}), 0
        ) / 86400000 / strength), 6))
    FROM (
        SELECT
            memory_id,
            argMaxIf(JSONExtractString(body, 'kind'), (seq, idx), type = 'memory.created')
                AS memory_kind,
            if(countIf(type = 'memory.promoted') > 0, 'L3',
               argMaxIf(JSONExtractString(body, 'layer'), (seq, idx), type = 'memory.created'))
                AS layer,
            argMaxIf(JSONExtractString(body, 'text'), (seq, idx), type = 'memory.created') AS text,
            minIf(occurred_at, type = 'memory.created') AS made_at,
            maxIf(occurred_at, type IN ('memory.created', 'memory.reinforced')) AS reinforced_at,
            argMaxIf(JSONExtractFloat(body, 'strength'), (seq, idx),
                     type IN ('memory.created', 'memory.reinforced', 'memory.weakened'))
                AS strength,
            countIf(type = 'memory.created') AS made,
            countIf(type = 'memory.forgotten') AS forgotten
        FROM memory_changes FINAL
        WHERE agent_id = {agent_id:String}
          AND memory_id != ''
          AND occurred_at <= {at:DateTime64(3, 'UTC')}
        GROUP BY memory_id
        HAVING made > 0 AND forgotten = 0
    )
)
ORDER BY kind, since, id

-- Memories that reached L3 (long-term), per day and reason.
--
-- Parameters (ClickHouse query parameters, bound server-side: param_<name>):
--   since     DateTime64(3, 'UTC')   first moment counted (inclusive)
--   until     DateTime64(3, 'UTC')   end of the period (exclusive)
--   agent_id  String                 one agent, or '' for every agent
--
-- Columns:
--   day         Date (UTC) of the event that promoted the memory
--   reason      a memory.promoted's reason ('flashbulb': importance and sentiment over
--               the bar, kept verbatim; 'abstraction'), or 'abstraction' for a memory
--               created in L3 directly (a semantic memory consolidated from episodes)
--   promotions  distinct memories that reached L3 that day for that reason
--   agents      distinct agents they belong to
SELECT
    day,
    reason,
    uniqExact(agent_id, memory_id) AS promotions,
    uniqExact(agent_id) AS agents
FROM (
    SELECT
        agent_id,
        memory_id,
        toDate(occurred_at, 'UTC') AS day,
        if(type = 'memory.promoted', JSONExtractString(body, 'reason'), 'abstraction') AS reason
    FROM memory_changes FINAL
    WHERE (type = 'memory.promoted'
           OR (type = 'memory.created' AND JSONExtractString(body, 'layer') = 'L3'))
      AND occurred_at >= {since:DateTime64(3, 'UTC')}
      AND occurred_at < {until:DateTime64(3, 'UTC')}
      AND ({agent_id:String} = '' OR agent_id = {agent_id:String})
)
GROUP BY day, reason
ORDER BY day, reason

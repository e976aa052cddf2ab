-- How much memory each conversation of a tenant holds, and how fresh it is.
-- epistream sql --tenant demo -f sql/examples/03_conversation_stats.sql
SELECT conversation_id, turns, segments, segments_enriched, segments_failed, gists, facts,
       first_turn_at, last_turn_at, now() - last_stored_at AS since_last_stored
FROM memory.conversation_stats
WHERE tenant = :'tenant'
ORDER BY last_turn_at DESC;

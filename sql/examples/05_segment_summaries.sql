-- The segments of a conversation with their summaries and enrichment state.
-- epistream sql --tenant demo -v conversation=demo-alice-bob -f sql/examples/05_segment_summaries.sql
SELECT seq, start_ts, end_ts, turns, close_reason, status, left(summary, 120) AS summary
FROM memory.segment_summaries
WHERE tenant = :'tenant' AND conversation_id = :'conversation'
ORDER BY seq;

-- What happened in a conversation, in the order it happened.
-- epistream sql --tenant demo -v conversation=demo-alice-bob -f sql/examples/01_gist_timeline.sql
SELECT event_date, date_precision, text, turn_ids
FROM memory.gist_timeline
WHERE tenant = :'tenant' AND conversation_id = :'conversation'
ORDER BY event_date, said_at, gist_id;

-- Full-text search over raw turns (the fast path: searchable milliseconds after produce).
-- epistream sql --tenant demo -v query='cat adopted' -f sql/examples/04_search_turns.sql
SELECT conversation_id, turn_id, ts, speaker, text,
       ts_rank_cd(tsv, websearch_to_tsquery('english', :'query')) AS rank
FROM memory.turns
WHERE tenant = :'tenant' AND tsv @@ websearch_to_tsquery('english', :'query')
ORDER BY rank DESC, ts
LIMIT 10;

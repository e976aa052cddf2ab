-- Everything said about a subject, oldest first, with what is still current:
-- "where did she live last year" reads the history, "where does she live" the current rows.
-- epistream sql --tenant demo -v subject=Alice -f sql/examples/02_fact_history.sql
SELECT predicate, object, point_in_time, start_time, end_time, said_at, is_current
FROM memory.fact_history
WHERE tenant = :'tenant' AND subject = :'subject'
ORDER BY predicate, coalesce(start_time, point_in_time, said_at::date), said_at;

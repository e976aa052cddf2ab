-- Cypher through Apache AGE: the predicate edges leaving an entity, with their qualifiers.
-- Values go in AGE's parameter map (a prepared statement's $1), never into the Cypher text.
-- epistream sql --tenant demo -v params='{"tenant": "demo", "name": "Alice"}' -f sql/examples/06_cypher_facts_about.sql
SET search_path = ag_catalog, memory, public;
PREPARE facts_about(agtype) AS
SELECT * FROM cypher('memory_graph', $$
    MATCH (s:Entity {tenant: $tenant, name: $name})-[f:FACT]->(o:Entity)
    RETURN f.predicate, o.name, f.point_in_time, f.start_time, f.end_time, f.said_at
    ORDER BY f.said_at
$$, $1) AS (predicate agtype, object agtype, point_in_time agtype, start_time agtype, end_time agtype,
            said_at agtype);
EXECUTE facts_about(:'params');

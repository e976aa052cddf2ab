-- Cypher through Apache AGE, two hops: gists that mention an entity, and the
-- gists SIMILAR to them (cosine > 0.8), e.g. other tellings of the same event.
-- epistream sql --tenant demo -v params='{"tenant": "demo", "name": "Bob"}' -f sql/examples/07_cypher_related_gists.sql
SET search_path = ag_catalog, memory, public;
PREPARE related_gists(agtype) AS
SELECT * FROM cypher('memory_graph', $$
    MATCH (e:Entity {tenant: $tenant, name: $name})<-[:MENTIONS]-(g:Gist)
    OPTIONAL MATCH (g)-[s:SIMILAR]-(other:Gist)
    RETURN g.text, other.text, s.similarity
    ORDER BY g.text
$$, $1) AS (gist agtype, similar_gist agtype, similarity agtype);
EXECUTE related_gists(:'params');

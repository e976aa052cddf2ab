"""`epistream mcp`: memory for agents over the Model Context Protocol (docs/mcp.md).

A thin server on epistream.client.api (Kafka in and out, no database login): `remember` produces turns,
`recall` is the `context` read, `ask` an answer, `forget` an erasure, all for the one tenant the
server is started for. Only `server` imports the `mcp` SDK (the `mcp` extra); `arguments` and
`memory` are plain Python, so the base install imports this package without it."""

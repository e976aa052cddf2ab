"""`epistream mcp`: the one tenant it serves, how it signs for it, how long each call may take.

Listed in GROUPS, so its variables are documented like every other group's; only the MCP server loads
it (`McpServerSettings`, with a client's settings), so it is not part of the workers' `Settings`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr
from pydantic_settings import BaseSettings

from .base import SETTINGS_CONFIG


def _hex_key(value: SecretStr | None) -> SecretStr | None:
    if value is not None:
        bytes.fromhex(value.get_secret_value())  # its ValueError names the variable at start-up
    return value


def _bearer_token(value: SecretStr | None) -> SecretStr | None:
    if value is not None:
        token = value.get_secret_value()
        if len(token) < 16 or not token.isascii() or not token.isprintable() or " " in token:
            raise ValueError("needs at least 16 printable ASCII characters and no spaces (it travels in a header)")
    return value


class McpSettings(BaseSettings):
    """`epistream mcp`: the one tenant it serves, how it signs for it, how long each call may take."""

    model_config = SETTINGS_CONFIG

    mcp_tenant: str = Field("demo", min_length=1, max_length=200,
                            description="The one tenant `epistream mcp` serves (its --tenant overrides).")
    mcp_tenant_key: Annotated[SecretStr | None, AfterValidator(_hex_key)] = Field(
        None, description="That tenant's signing key in hex (`epistream tenant-key T`): with tenant claims on, the "
        "MCP server signs as the tenant and reads the tenant's own reply topic. Unset: the operator's secret, if set.")
    mcp_token: Annotated[SecretStr | None, AfterValidator(_bearer_token)] = Field(
        None, description="The bearer token every request to `epistream mcp --transport http` must carry "
        "(`Authorization: Bearer ...`); required to listen on an address other than loopback. Unset: no login, "
        "loopback only.")
    mcp_timeout_s: float = Field(30.0, gt=0, le=3600,
                                 description="Longest an MCP remember, recall or forget call may take.")
    mcp_ask_timeout_s: float = Field(300.0, gt=0, le=3600,
                                     description="Longest an MCP ask call may take (a model answers it).")
    mcp_log_level: Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"] = Field(
        "warning", description="The least severe MCP log notification `epistream mcp` sends a client that has not "
        "set a level (logging/setLevel): what the server itself does, never memory's text.")
    mcp_list_page: int = Field(50, ge=1, le=100, description="Conversations one MCP resources/list page names "
                               "(two resources each); the next page is behind its cursor.")
    mcp_events_retry_s: float = Field(5.0, gt=0, le=600, description="How long the MCP server waits before reading "
                                      "memory events again (for its resource notifications) after a failed read.")

    @property
    def mcp_key(self) -> bytes | None:
        """The tenant's signing key as bytes, or None."""
        return None if self.mcp_tenant_key is None else bytes.fromhex(self.mcp_tenant_key.get_secret_value())

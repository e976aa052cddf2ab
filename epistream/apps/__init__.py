"""The applications, on the top floor: the CLI (`epistream ...`) and the MCP server. Nothing below
imports them (pyproject.toml's import contracts)."""

"""The Node tools of the MCP interop tests (the official conformance suite, the MCP Inspector): installed
by `make node-tools` (pinned, on the `node` npm package's Node 22) into .epistream/node; installed here
when missing, and the test skipped with the reason where they cannot be had (no make or npm, the
registry refused)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT

BIN = ROOT / ".epistream" / "node" / "node_modules" / ".bin"


def node_tool(name: str) -> Path:
    """The path of the Node tool `name` (its `node` the pinned Node 22: run it with node_env()), or a skip."""
    if not (BIN / name).exists():
        if shutil.which("make") is None or shutil.which("npm") is None:
            pytest.skip(f"{name} is not installed and there is no make or npm to install it (make node-tools)")
        done = subprocess.run(["make", "-s", "node-tools"], cwd=ROOT, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not (BIN / name).exists():
            pytest.skip(f"make node-tools could not install {name}: {(done.stdout + done.stderr)[-1000:]}")
    return BIN / name


def node_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (else this process's) with the pinned Node first on PATH (the tools' `#!/usr/bin/env node`)."""
    env = dict(os.environ if env is None else env)
    return env | {"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}

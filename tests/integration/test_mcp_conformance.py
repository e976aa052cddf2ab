"""The official MCP conformance suite (@modelcontextprotocol/conformance, pinned in the Makefile) against
`epistream mcp --transport http` on the real stack: every server scenario of its active suite passes but
those listed in mcp_conformance_expected_failures.txt, each of which needs a fixture tool, resource or
prompt (test_*, test://...) that a memory server has no reason to expose (docs/mcp.md, "Conformance")."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from .mcp_servers import http_server
from .node_tools import node_env, node_tool

pytestmark = [pytest.mark.integration]

EXPECTED_FAILURES = Path(__file__).with_name("mcp_conformance_expected_failures.txt")
#: Its result directories: server-<scenario>-<ISO time>.
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT[\d-]+Z$")


def expected_failures() -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in EXPECTED_FAILURES.read_text().splitlines())
    return {line for line in lines if line}


def scenario_results(out: Path) -> dict[str, list[dict[str, object]]]:
    """Each scenario's checks, from the suite's output directory."""
    results: dict[str, list[dict[str, object]]] = {}
    for directory in out.iterdir():
        if match := RESULT_DIR.match(directory.name):
            results[match["scenario"]] = json.loads((directory / "checks.json").read_text())
    return results


async def test_the_official_conformance_suite_passes_but_for_fixture_scenarios(stack, unique, tmp_path):
    conformance = node_tool("conformance")
    async with http_server(unique("mcp-conformance"), dict(os.environ)) as url:
        done = await asyncio.to_thread(subprocess.run, [str(conformance), "server", "--url", url, "-o", str(tmp_path)],
                                       env=node_env(), capture_output=True, text=True, timeout=150)
    results = scenario_results(tmp_path)
    assert results, f"the suite produced no results: {(done.stdout + done.stderr)[-3000:]}"
    failed = {name: [str(check.get("errorMessage")) for check in checks if check.get("status") == "FAILURE"]
              for name, checks in results.items()}
    failed = {name: reasons for name, reasons in failed.items() if reasons}
    expected = expected_failures()
    unexpected = {name: reasons for name, reasons in failed.items() if name not in expected}
    assert not unexpected, f"conformance scenarios failed: {unexpected}"
    assert expected <= results.keys(), f"listed but not run: {expected - results.keys()}"
    assert not expected - failed.keys(), f"listed as failing but passed (remove them): {expected - failed.keys()}"
    passed = results.keys() - failed.keys()
    assert {"server-initialize", "ping", "tools-list", "tools-call-error", "resources-list", "completion-complete",
            "logging-set-level", "dns-rebinding-protection"} <= passed, sorted(passed)

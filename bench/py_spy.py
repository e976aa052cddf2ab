"""Where a process spends its time: py-spy samples its Python stacks (all threads, busy ones only) for
a few seconds, and the samples are summed by what their innermost known frame belongs to (Kafka client,
database driver, embedding model, the read's own code...). A profile to read, not a figure to gate on."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

#: Where a frame's file lives -> what it is counted as (the first match, innermost frame first).
BUCKETS = (
    ("aiokafka", "Kafka client (aiokafka)"),
    ("psycopg", "PostgreSQL driver (psycopg)"),
    ("onnxruntime", "embedding model (onnxruntime)"),
    ("tokenizers", "embedding model (tokenizer)"),
    ("models/embeddings", "embedding model (epistream)"),
    ("pydantic", "contracts (pydantic)"),
    ("json", "JSON"),
    ("mcp/", "MCP SDK"),
    ("starlette", "HTTP server (starlette/uvicorn)"),
    ("uvicorn", "HTTP server (starlette/uvicorn)"),
    ("httpx", "HTTP client (httpx)"),
    ("opentelemetry", "tracing"),
    ("consumers/", "the read (consumers/)"),
    ("epistream/", "epistream, other"),
    ("asyncio", "event loop (asyncio)"),
    ("selectors", "event loop (asyncio)"),
)


def bucket(stack: str) -> str:
    """What one collapsed stack (frames outermost first, `;`-separated) is counted as."""
    for frame in reversed(stack.split(";")):
        for needle, name in BUCKETS:
            if needle in frame:
                return name
    return "other"


def shares(collapsed: str) -> dict[str, float]:
    """Each bucket's share of the samples in py-spy's raw (collapsed) output, largest first."""
    counts: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[bucket(stack)] += int(count)
    total = sum(counts.values()) or 1
    return {name: round(n / total, 3) for name, n in counts.most_common()}


def profile(pid: int, seconds: float) -> dict[str, float] | None:
    """`pid`'s busy samples over `seconds`, by bucket; None where py-spy is missing or may not attach."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stacks.txt"
        done = subprocess.run([spy, "record", "--nonblocking", "--format", "raw", "--rate", "200",
                               "--duration", str(max(1, round(seconds))), "--pid", str(pid), "--output", str(out)],
                              capture_output=True, check=False)
        if done.returncode != 0 or not out.exists():
            return None
        return shares(out.read_text())

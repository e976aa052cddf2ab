"""Which code the running ingest worker executes: up() leaves a running worker alone."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from epistream.settings import Settings
from infra.process import ManagedProcess


def process_started_at(pid: int) -> datetime | None:
    """Start time from /proc (Linux): boot time + field 22 of /proc/<pid>/stat, in clock ticks."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
    except (OSError, StopIteration, ValueError):
        return None
    ticks = int(stat.rsplit(") ", 1)[1].split()[19])  # after the command name, which may hold spaces
    return datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"), tz=UTC)


def worker_pid(settings: Settings) -> int | None:
    return ManagedProcess("worker-ingest", settings.state_dir).pid()


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process, all threads (fields 14-15 of /proc/<pid>/stat)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stale_worker_sources(settings: Settings, root: Path) -> tuple[datetime | None, list[str]]:
    """The ingest worker's start time, and the code files changed since (it runs the older version of those)."""
    pid = worker_pid(settings)
    started = process_started_at(pid) if pid else None
    if started is None:
        return None, []
    changed = [
        str(path.relative_to(root))
        for folder in ("pipeline", "epistream")
        for path in sorted((root / folder).rglob("*.py"))
        if datetime.fromtimestamp(path.stat().st_mtime, tz=UTC) > started
    ]
    return started, changed

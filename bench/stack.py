"""What the running stack is: which code and settings its processes run, and where the CPU time goes.

up() leaves running processes alone, so a worker may be older than the code
or started with other settings than the benchmark asks for: both come from
the supervisor's state (run/supervisor.json: each child's start time, the
settings the children run with) and are recorded next to the figures. CPU
time, which the product does not track, is read from /proc.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from epistream.infra import services, supervisor
from epistream.settings.processes import Settings

# The processes the supervisor runs, by the names the reports use.
OWN_PROCESSES = ("worker-ingest", "worker-answer", "model-server", "kafka")


def up(settings: Settings, *, only: set[str] | None = None) -> None:
    """Start the embedded stack (idempotent; with `only`, those services and no workers), a line per service."""
    print(f"starting {'the stack' if only is None else ', '.join(sorted(only))} under {settings.state_dir} "
          "(idempotent)", flush=True)
    for row in services.up(settings, workers=only is None, only=only):
        print(f"  {row.state:<8} {row.name:<15} {row.detail}", flush=True)


def managed_pid(settings: Settings, name: str) -> int | None:
    return services.service_pid(settings, name)


def worker_pid(settings: Settings) -> int | None:
    return managed_pid(settings, "worker-ingest")


def restart_ingest_worker(settings: Settings) -> int | None:
    """Have the supervisor restart the ingest worker; its new pid.

    The only way to discard segments it has already fetched from Kafka: those stay in its memory even
    after they are deleted from the topic, and it calls the model for each before finding it forgotten.
    """
    return services.restart_service(settings, "worker-ingest")


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process, all threads (fields 14-15 of /proc/<pid>/stat)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_setting(settings: Settings, field: str) -> str | None:
    """The workers' value of a setting, as the supervisor that runs them records it; else the default."""
    recorded = supervisor.read_state(settings.state_dir).get("settings", {}) if managed_pid(
        settings, "worker-ingest") else {}
    if field in recorded:
        value = recorded[field]
        return None if value is None else str(value)
    default = Settings.model_fields[field].default
    return None if default is None else str(default)


def service_started_at(settings: Settings, name: str) -> datetime | None:
    """When the supervisor last started a service (to the second), None when it does not run."""
    if managed_pid(settings, name) is None:
        return None
    started = supervisor.read_state(settings.state_dir).get("services", {}).get(name, {}).get("started_at")
    return datetime.fromisoformat(started) if started else None


def stale_worker_sources(
    settings: Settings, root: Path, *, worker: str = "ingest", folders: tuple[str, ...] = ("pipeline", "epistream")
) -> tuple[datetime | None, list[str]]:
    """A worker's start time, and the code files changed since (it runs the older version of those)."""
    started = service_started_at(settings, f"worker-{worker}")
    if started is None:
        return None, []
    changed = [
        str(path.relative_to(root))
        for folder in folders
        for path in sorted((root / folder).rglob("*.py"))
        if datetime.fromtimestamp(path.stat().st_mtime, tz=UTC) > started
    ]
    return started, changed


def wait_until_idle(pid: int | None, *, quiet_s: float = 3.0, max_cpu_share: float = 0.05, timeout_s: float = 600.0) -> float:
    """Block until process `pid` has used under `max_cpu_share` of a core for `quiet_s`; return the seconds waited.

    The model server has no queue metric; its CPU use is the one sign that it
    is still working on a request (even one whose client gave up).
    """
    started = time.monotonic()
    last = process_cpu_seconds(pid)
    if last is None:
        return 0.0
    quiet_since = time.monotonic()
    while time.monotonic() - started < timeout_s:
        time.sleep(0.5)
        now_cpu = process_cpu_seconds(pid)
        if now_cpu is None:
            break
        if now_cpu - last > max_cpu_share * 0.5:
            quiet_since = time.monotonic()
        last = now_cpu
        if time.monotonic() - quiet_since >= quiet_s:
            break
    return time.monotonic() - started


# --- where the machine's CPU time went ---------------------------------------


def _machine_busy_seconds() -> float:
    """CPU-seconds all cores spent on anything but idle and iowait, since boot (first line of /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _all_process_cpu() -> dict[int, tuple[float, int]]:
    """CPU-seconds and parent pid of every process."""
    found: dict[int, tuple[float, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        found[int(entry.name)] = ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[1]))
    return found


def _own_processes(settings: Settings, parents: dict[int, int]) -> dict[int, str]:
    """This stack's pids by service name; PostgreSQL's backends count as its postmaster's."""
    own = {pid: name for name in OWN_PROCESSES if (pid := managed_pid(settings, name)) is not None}
    try:
        postmaster = int((settings.state_dir / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return own
    own[postmaster] = "postgres"
    own.update({pid: "postgres" for pid, parent in parents.items() if parent == postmaster})
    return own


def _describe(pid: int, own: dict[int, str]) -> str:
    if pid in own:
        return f"this stack: {own[pid]}"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "exited processes"
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return "kernel threads"
    # Enough of the command line to tell one embedded stack's model server from another's.
    port = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--port"), None)
    head = " ".join([Path(words[0]).name, *words[1:3]])[:60]
    return head + (f" --port {port}" if port else "")


@dataclass(frozen=True)
class CpuSnapshot:
    at: float
    machine_busy_s: float
    per_pid: dict[int, tuple[float, int]]

    @classmethod
    def take(cls) -> CpuSnapshot:
        return cls(time.monotonic(), _machine_busy_seconds(), _all_process_cpu())


def cpu_report(settings: Settings, before: CpuSnapshot, after: CpuSnapshot, top: int = 8) -> dict[str, object]:
    """CPU-seconds used between two snapshots: the whole machine, and the biggest consumers (this stack's by name).

    Processes that ended in between are missing, so the rows may sum to less than the machine's busy time.
    """
    own = _own_processes(settings, {pid: parent for pid, (_, parent) in after.per_pid.items()})
    used: dict[str, float] = {}
    for pid, (cpu, _) in after.per_pid.items():
        delta = cpu - before.per_pid.get(pid, (0.0, 0))[0]
        if delta > 0:
            label = _describe(pid, own)
            used[label] = used.get(label, 0.0) + delta
    busy = after.machine_busy_s - before.machine_busy_s
    return {
        "wall_s": round(after.at - before.at, 1),
        "cores": len(os.sched_getaffinity(0)),
        "machine_busy_cpu_s": round(busy, 1),
        # Busy time no live process accounts for: processes that ran and exited in between (a test
        # suite's services, short-lived commands), plus the kernel's own work.
        "exited_or_unattributed_cpu_s": round(max(0.0, busy - sum(used.values())), 1),
        "top_processes": [
            {"process": label, "cpu_s": round(cpu, 1)} for label, cpu in sorted(used.items(), key=lambda kv: -kv[1])[:top]
        ],
    }

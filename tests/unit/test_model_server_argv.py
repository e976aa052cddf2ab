"""The embedded model server starts niced, so the fast path goes first on shared cores."""

from __future__ import annotations

from pathlib import Path

from epistream.infra.model_server import model_server_argv
from epistream.settings.processes import Settings


def test_the_model_server_runs_niced_by_default_and_at_equal_priority_when_asked(tmp_path):
    model = tmp_path / "m.gguf"
    default = model_server_argv(Settings(model_path=model))
    assert default[:3] == ["nice", "-n", "19"]
    assert default[4:7] == ["-P", "-m", "llama_cpp.server"]  # -P: never the working directory's modules
    equal = model_server_argv(Settings(model_path=model, model_nice=0))
    assert equal[1:4] == ["-P", "-m", "llama_cpp.server"] and "nice" not in equal
    assert Path(equal[equal.index("--model") + 1]) == model

"""The pure logic of bench/model_build.py and bench/setup_cost.py: no build, no model, no subprocess."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from bench.model_build import (
    alternate,
    cpu_flags,
    makefile_var,
    outcome,
    prompt_text,
    summarize,
)
from bench.setup_cost import STEPS, run_steps, total_seconds

ROOT = Path(__file__).resolve().parents[2]

CPUINFO = """processor\t: 0
model name\t: Some Xeon
flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512bw amx_bf16 amx_tile
processor\t: 1
flags\t\t: fpu sse2
"""


def test_cpu_flags_read_the_first_processor_and_match_whole_words():
    assert cpu_flags(CPUINFO) == {"avx2": True, "avx512f": True, "amx_tile": True}
    assert cpu_flags("flags : fpu avx avx512fx amx_tiles\n") == {"avx2": False, "avx512f": False, "amx_tile": False}
    assert cpu_flags("no flags line here") == {"avx2": False, "avx512f": False, "amx_tile": False}


def test_makefile_var_reads_each_assignment_form():
    text = "WHEEL_DIR ?= .epistream/wheels\nLLAMA_CPP_VERSION  = 0.3.36\nX := a b  \nLLAMA_CPP_VERSION_OLD = 1\n"
    assert makefile_var(text, "LLAMA_CPP_VERSION") == "0.3.36"
    assert makefile_var(text, "WHEEL_DIR") == ".epistream/wheels"
    assert makefile_var(text, "X") == "a b"
    with pytest.raises(KeyError):
        makefile_var(text, "GGML_PORTABLE_FLAGS")


def test_the_real_makefile_pins_one_version_and_builds_portably():
    text = (ROOT / "Makefile").read_text()
    assert makefile_var(text, "LLAMA_CPP_VERSION").count(".") == 2
    flags = makefile_var(text, "GGML_PORTABLE_FLAGS").split()
    assert "-DGGML_NATIVE=OFF" in flags
    assert not any("AVX512" in f or "AMX" in f for f in flags if f.endswith("=ON"))


def test_alternate_interleaves_the_builds_round_by_round():
    assert alternate(["portable", "native"], 3) == ["portable", "native"] * 3
    assert alternate(["portable"], 2) == ["portable", "portable"]
    assert alternate(["a", "b"], 0) == []


def test_a_signal_death_is_a_crash_named_by_its_signal():
    assert outcome(-signal.SIGSEGV, "", "") == {"status": "crashed", "signal": "SIGSEGV"}
    assert outcome(-signal.SIGILL, "partial output\n", "") == {"status": "crashed", "signal": "SIGILL"}
    assert outcome(-200, "", "") == {"status": "crashed", "signal": "signal 200"}


def test_an_exit_status_is_a_failure_with_the_last_stderr_line():
    result = outcome(1, "", "Traceback ...\nModuleNotFoundError: No module named 'llama_cpp'\n")
    assert result == {"status": "failed", "detail": "ModuleNotFoundError: No module named 'llama_cpp'"}
    assert outcome(0, "", "") == {"status": "failed", "detail": "exit 0"}


def test_success_takes_the_last_stdout_line_as_the_figures():
    figures = {"prompt_tokens": 400, "prompt_s": 2.0, "generated_tokens": 64, "generation_s": 4.0, "module": "m"}
    result = outcome(0, "noise from the library\n" + json.dumps(figures) + "\n", "warning\n")
    assert result == {"status": "ok", **figures}


def run(prompt_s: float, generation_s: float) -> dict:
    return {"status": "ok", "prompt_tokens": 400, "prompt_s": prompt_s, "generated_tokens": 64,
            "generation_s": generation_s}


def test_summarize_takes_medians_of_tokens_per_second_not_of_seconds():
    # 400/2=200, 400/4=100, 400/8=50 -> 100; 64/1=64, 64/2=32, 64/16=4 -> 32
    summary = summarize([run(2, 1), run(8, 16), run(4, 2)])
    assert (summary["prompt_tokens_per_s"], summary["generation_tokens_per_s"]) == (100.0, 32.0)
    assert summary["runs"] == 3 and summary["status"] == "ok"
    assert [s["prompt_tokens_per_s"] for s in summary["samples"]] == [200.0, 50.0, 100.0]  # in run order
    # an even count: the mean of the middle two rates (200 and 100), not 400 over the middle seconds
    assert summarize([run(2, 1), run(4, 2)])["prompt_tokens_per_s"] == 150.0


def test_summarize_ignores_failed_runs_and_reports_a_crash():
    assert summarize([run(4, 2), {"status": "failed", "detail": "x"}])["runs"] == 1
    assert summarize([{**run(4, 2), "load_1min": 1.5}])["samples"][0]["load_1min"] == 1.5
    crashed = summarize([{"status": "crashed", "signal": "SIGSEGV"}])
    assert crashed["status"] == "crashed" and crashed["signal"] == "SIGSEGV"
    assert crashed["prompt_tokens_per_s"] is None and crashed["generation_tokens_per_s"] is None
    assert summarize([])["status"] == "not run"


def test_prompt_text_is_the_sample_as_a_transcript_and_long_enough():
    assert prompt_text('{"speaker": "A", "text": "hi"}\n\n{"speaker": "B", "text": "yo"}\n') == "A: hi\nB: yo\n"
    sample = prompt_text((ROOT / "epistream" / "data" / "sample_conversation.jsonl").read_text())
    assert len(sample.split()) > 400  # at least PROMPT_TOKENS tokens: a word is one token or more


def test_setup_steps_are_named_once_in_make_order():
    names = [s.name for s in STEPS]
    assert names[:4] == ["venv", "model-wheel", "python-deps", "model-files"]
    assert len(set(names)) == len(names)


def test_run_steps_skips_a_missing_step_and_stops_after_a_failure(tmp_path):
    from bench.setup_cost import Step

    steps = (
        Step("missing", ("true",), ("false",)),
        Step("no program", ("true",), ("./no-such-program",)),
        Step("works", ("true",), ("true",)),
        Step("breaks", ("sh", "-c", "echo boom >&2; exit 3"), ("true",)),
        Step("after", ("true",), ("true",)),
    )
    results = run_steps(steps, tmp_path, {"PATH": "/usr/bin:/bin"})
    assert [r["ok"] for r in results] == [None, None, True, False, None]
    assert results[0]["note"].startswith("skipped")
    assert results[1]["note"] == "skipped: ./no-such-program: not found"
    assert results[3]["note"] == "exit 3: boom"
    assert results[4]["note"] == "not run: breaks failed"
    assert total_seconds(results) == pytest.approx(results[2]["seconds"] + results[3]["seconds"])

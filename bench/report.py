"""The one writer of every benchmark's results: the JSON, its PNG chart beside it and the markdown table
printed for the docs, with the helpers the charts and tables share (bars, grouped bars, a table)."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def git_commit(root: Path) -> str | None:
    """HEAD's short hash, read from .git directly: no git process, so nothing can touch the work tree."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:7]
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()[:7]
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:7]
    except OSError:
        pass
    return None


def machine_info(root: Path) -> dict[str, Any]:
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],  # other tenants of the cores show here
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_commit": git_commit(root),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def run_args(prog: str, doc: str | None, argv: list[str] | None, *, turns: int, reads: int, rounds: int,
             port: int, results: Path, help_: dict[str, str], more: Callable[[Any], None] | None = None) -> Any:
    """The arguments of a benchmark that stores `--turns`, reads `--reads` over `--rounds` on workers of its
    own (metrics from `--port`): each at least 1. `help_` words --turns, --reads, --rounds, --results;
    `more` adds the benchmark's own arguments to the parser."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=(doc or "").splitlines()[0])
    p.add_argument("--turns", type=int, default=turns, help=f"{help_['turns']} (default {turns})")
    p.add_argument("--reads", type=int, default=reads, help=f"{help_['reads']} (default {reads})")
    p.add_argument("--rounds", type=int, default=rounds, help=f"{help_['rounds']} (default {rounds})")
    p.add_argument("--port", type=int, default=port, help=f"first of the two workers' metrics ports (default {port})")
    p.add_argument("--results", type=Path, default=results, help=help_["results"])
    if more is not None:
        more(p)
    args = p.parse_args(argv)
    if min(args.turns, args.reads, args.rounds) < 1:
        p.error("--turns, --reads and --rounds must be at least 1")
    return args


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def write_results(path: Path, result: dict[str, Any], plot: Callable[[dict, Path], None] | None = None,
                  markdown: Callable[[dict], str] | None = None) -> None:
    """A benchmark's JSON at `path`, given a plot its PNG beside it, and given a markdown writer its tables
    printed after the paths. Every result records its machine (cores, load average, commit, time) unless
    it recorded its own: a figure on shared cores means little without them."""
    if "machine" not in result:  # machine_info asks git: only when the result has none
        result["machine"] = machine_info(Path(__file__).resolve().parents[1])
    write_json(path, result)
    if plot is not None:
        plot(result, path.with_suffix(".png"))
    print(f"wrote {path}" + (f" and {path.with_suffix('.png')}" if plot is not None else ""))
    if markdown is not None:
        print("\n" + markdown(result))


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A markdown table; `align` has an l or r per column (default: the first left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "".join("---|" if a == "l" else "---:|" for a in align)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def subplots(*args: Any, **kwargs: Any) -> Any:
    """``plt.subplots`` on the headless backend (no display on CI or servers); matplotlib loads only to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save(fig: Any, path: Path, *, dpi: int = 110) -> None:
    """Lay the figure out, write it as a PNG and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def bars(ax: Any, labels: Sequence[str], values: Sequence[float], colors: Sequence[str] | None = None, *,
         label: str | None = None, horizontal: bool = False) -> None:
    """One bar per value, each annotated with ``label.format(value)`` at its end when a label is given."""
    drawn = (ax.barh if horizontal else ax.bar)(labels, values, color=colors)
    if label is None:
        return
    for bar, value in zip(drawn, values, strict=True):
        if horizontal:
            ax.text(value, bar.get_y() + bar.get_height() / 2, " " + label.format(value), va="center")
        else:
            ax.annotate(label.format(value), (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom")


def grouped_bars(ax: Any, groups: int, series: Sequence[tuple[str, Sequence[float], str | None]]) -> None:
    """Side by side at each of `groups` positions, a bar of each series (label, values, colour)."""
    width = 0.8 / len(series)
    for i, (name, values, color) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(groups)]
        ax.bar(xs, values, width, label=name, color=color)

"""``make bench``: every benchmark, one after another, then one table of
every ratio line they printed, its goal, and whether it holds.

Each benchmark runs as its own process (``python -m bench.NAME``), its output
passed through as it comes; a line ``NAME: ratio R (goal G)`` (the one format,
``bench.harness.ratio_line``) becomes a row. A benchmark that exits non-zero
is a row of its own that does not hold, the run goes on, and it ends with
exit 1 (a goal missed is a row, not a failure). ``--profile``
is passed to each (``bench.profiling``); ``--only`` runs some of them.

    python -m bench.all [--only ingest_throughput serving] [--profile]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.harness import ITSELF, ROOT

BENCHMARKS = (
    "bus_throughput",
    "ingest_throughput",
    "transform_latency",
    "tuner_overhead",
    "study_speedup",
    "tuning_gain",
    "trainer_overhead",
    "serving",
    "batch_scoring",
    "user_code",
    "object_store",
    "broker_start",
)

_RATIO = re.compile(
    r"^(?P<name>\S.*?): ratio (?P<ratio>[-+]?(?:\d+(?:\.\d*)?|inf|nan)) "
    r"\(goal (?P<goal>[-+]?\d+(?:\.\d*)?)\)(?P<itself> " + re.escape(ITSELF) + r")?\s*$"
)


@dataclass(frozen=True)
class Figure:
    bench: str
    name: str
    ratio: float
    goal: float
    itself: bool = False
    failure: str = ""

    @property
    def holds(self) -> bool:
        return not self.failure and self.ratio >= self.goal


def parse_line(bench: str, line: str) -> Figure | None:
    """The figure a ratio line states, or None for any other line."""
    matched = _RATIO.match(line.strip())
    if matched is None:
        return None
    return Figure(
        bench,
        matched["name"],
        float(matched["ratio"]),
        float(matched["goal"]),
        itself=matched["itself"] is not None,
    )


def run_one(bench: str, command: Sequence[str]) -> list[Figure]:
    """Runs ``command``, passing its output through; its figures, and a
    failed row when it exits non-zero."""
    figures: list[Figure] = []
    with subprocess.Popen(
        list(command),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            figure = parse_line(bench, line)
            if figure is not None:
                figures.append(figure)
    if process.returncode != 0:
        figures.append(
            Figure(bench, "(the benchmark)", 0.0, 0.0, failure=f"exited {process.returncode}")
        )
    return figures


def table(figures: Iterable[Figure]) -> str:
    rows = [("benchmark", "figure", "ratio", "goal", "holds")]
    for f in figures:
        name = f"{f.name} {ITSELF}" if f.itself else f.name
        if f.failure:
            rows.append((f.bench, name, f.failure, "", "NO"))
        else:
            rows.append(
                (f.bench, name, f"{f.ratio:.2f}", f"{f.goal:g}", "yes" if f.holds else "NO")
            )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, help="these benchmarks only")
    parser.add_argument("--profile", action="store_true", help="pass --profile to each")
    args = parser.parse_args(argv)
    figures: list[Figure] = []
    for bench in args.only or BENCHMARKS:
        command = [sys.executable, "-m", f"bench.{bench}"]
        if args.profile:
            command.append("--profile")
        print(f"==== bench.{bench}", flush=True)
        figures += run_one(bench, command)
    held = sum(f.holds for f in figures)
    print(f"\n==== every figure: {held} of {len(figures)} hold their goal")
    print(table(figures), flush=True)
    return 1 if any(f.failure for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())

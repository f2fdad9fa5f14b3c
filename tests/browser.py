"""Pages in a real browser: Debian's chromium, headless (``make setup``
installs it where it can). A test that needs it skips, saying why, where it
is missing."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Simulated time the page's scripts get before the DOM is read: charts are
#: drawn by then, with no waiting in real time.
SCRIPT_TIME_MS = 20_000


def chromium() -> str:
    """The browser's executable; skips the test when there is none."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium on this machine: make setup installs Debian's where it can")


def _run(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium(),
            "--headless=new",
            "--no-sandbox",  # as root, in a container
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--virtual-time-budget={SCRIPT_TIME_MS}",
            *flags,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def rendered(url: str) -> str:
    """The page's DOM after its scripts ran."""
    return _run(url, "--dump-dom").stdout


def screenshot(url: str, path: Path, width: int = 1400, height: int = 1000) -> Path:
    _run(url, f"--window-size={width},{height}", f"--screenshot={path}")
    return path


@dataclass(frozen=True)
class Plot:
    """A plotly chart in a rendered DOM: its traces and the points they drew
    (markers, bars), and the lines."""

    traces: int
    points: int
    lines: int


def plotly_plots(dom: str) -> list[Plot]:
    """Every plotly chart the page drew, in order."""
    starts = [m.start() for m in re.finditer(r'<div[^>]*class="[^"]*\bjs-plotly-plot\b', dom)]
    plots = []
    for start, end in zip(starts, [*starts[1:], len(dom)], strict=True):
        chunk = dom[start:end]
        plots.append(
            Plot(
                traces=len(re.findall(r'class="trace\b', chunk)),
                points=len(re.findall(r'class="point\b', chunk)),
                lines=len(re.findall(r'class="js-line"', chunk)),
            )
        )
    return plots

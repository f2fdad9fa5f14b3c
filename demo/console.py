"""What ``aistack demo`` prints: step headers, progress redrawn in place on a
terminal (one line per state in a log file), and the closing summary table."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TextIO

from shared.errors import AistackError

#: The demo's numbered steps.
STEPS = 8


class ServiceDied(AistackError):
    """A service of the demo's stack stopped, or never did what was awaited."""

    reason = "service_died"


class Console:
    """Step headers and progress lines, redrawn in place on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._live = out.isatty()
        self._started = time.monotonic()
        self._open = False
        self._last = ""

    def step(self, number: int, text: str) -> None:
        self._close()
        elapsed = time.monotonic() - self._started
        self._out.write(f"\n[{number}/{STEPS}] {text}   (t+{elapsed:.0f}s)\n")
        self._out.flush()

    def line(self, text: str) -> None:
        self._close()
        self._out.write(text + "\n")
        self._out.flush()

    def progress(self, text: str) -> None:
        if text == self._last:
            return  # a log file gets each state once, a terminal is redrawn
        self._last = text
        if self._live:
            self._out.write("\r\033[K  " + text)
            self._open = True
        else:
            self._out.write("  " + text + "\n")
        self._out.flush()

    def _close(self) -> None:
        if self._open:
            self._out.write("\n")
            self._open = False

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started


@dataclass
class Summary:
    rows: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, value: object) -> None:
        self.rows.append((name, str(value)))

    def table(self) -> str:
        width = max((len(n) for n, _ in self.rows), default=10)
        rule = "-" * (width + 50)
        lines = ["", "aistack demo: summary", rule]
        lines += [f"{name:<{width}}  {value}" for name, value in self.rows]
        lines.append(rule)
        return "\n".join(lines)


class ProgressOut:
    """A text stream for aistack.cli.study.watch that draws through the console."""

    def __init__(self, console: Console) -> None:
        self._console = console

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self._console.progress(line.strip())
        return len(text)

    def flush(self) -> None:
        return None


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]

"""What ``aistack demo`` prints: step headers, progress, and the closing
summary table. On a terminal Rich draws them (a rule per step, a spinner or
a study's progress bar redrawn in place, a table); in a log file each is
plain text, one line per state."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from shared.errors import AistackError

if TYPE_CHECKING:
    from rich.console import Console as RichConsole
    from rich.progress import Progress
    from rich.status import Status

    from aistack.studies import StudyProgress

#: The demo's numbered steps.
STEPS = 8


class ServiceDied(AistackError):
    """A service of the demo's stack stopped, or never did what was awaited."""

    reason = "service_died"


class Console:
    """Step headers and progress: Rich on a terminal, plain lines otherwise."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._rich = _rich_console(out) if out.isatty() else None
        self._started = time.monotonic()
        self._last = ""
        # What Rich redraws in place on a terminal: a spinner with a line of
        # text, or a study's progress bar; one at a time.
        self._status: Status | None = None
        self._bar: Progress | None = None

    def step(self, number: int, text: str) -> None:
        self._close()
        elapsed = time.monotonic() - self._started
        header = f"[{number}/{STEPS}] {text}   (t+{elapsed:.0f}s)"
        if self._rich is not None:
            from rich.text import Text

            self._rich.rule(Text(header, style="bold"), align="left")
            return
        self._out.write(f"\n{header}\n")
        self._out.flush()

    def line(self, text: str) -> None:
        self._close()
        if self._rich is not None:
            from rich.text import Text

            self._rich.print(Text(text))
            return
        self._out.write(text + "\n")
        self._out.flush()

    def progress(self, text: str) -> None:
        if text == self._last:
            return  # a log file gets each state once, a terminal is redrawn
        self._last = text
        if self._rich is None:
            self._out.write("  " + text + "\n")
            self._out.flush()
            return
        from rich.text import Text

        if self._status is None:
            self._close()
            self._status = self._rich.status(Text(text))
            self._status.start()
        else:
            self._status.update(Text(text))

    def study(self, progress: StudyProgress) -> None:
        """A watched study's progress: a Rich bar on a terminal, its line otherwise."""
        if self._rich is None:
            self.progress(progress.line())
            return
        from aistack.cli import terminal

        if self._bar is None:
            self._close()
            self._bar = terminal.progress_bar(self._rich)
            self._bar.start()
        terminal.show_study(self._bar, progress)

    def summary(self, summary: Summary) -> None:
        """The closing summary: a Rich table on a terminal, ``Summary.table`` otherwise."""
        if self._rich is None:
            self.line(summary.table())
            return
        from rich.table import Table

        self._close()
        table = Table(title="aistack demo: summary", title_justify="left", show_header=False)
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for name, value in summary.rows:
            table.add_row(name, value)
        self._rich.print(table)

    def _close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self._last = ""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started


def _rich_console(out: TextIO) -> RichConsole:
    from rich.console import Console as RichConsole

    return RichConsole(file=out, highlight=False)


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


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]

"""The ``aistack`` command's output: Rich on a terminal, plain lines off one.

Scripts and tests read the plain lines (one record per line, columns padded),
so they stay as they are whatever a terminal shows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from aistack.lineage import Node
    from aistack.studies import StudyProgress


def on_terminal() -> bool:
    return sys.stdout.isatty()


def _console() -> Console:
    from rich.console import Console

    return Console()


def table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], plain: list[str]
) -> None:
    """``rows`` under ``headers`` as a Rich table on a terminal; ``plain``
    (the same rows, one line each) otherwise."""
    if not on_terminal():
        for line in plain:
            print(line)
        return
    from rich.table import Table

    shown = Table(title=title, title_justify="left", show_edge=False)
    for header in headers:
        shown.add_column(header, overflow="fold")
    for row in rows:
        shown.add_row(*row)
    _console().print(shown)


def tree(root: Node) -> None:
    """A lineage tree: Rich's tree on a terminal, the same text drawn by hand otherwise."""
    if not on_terminal():
        print("\n".join(root.lines()))
        return
    from rich.markup import escape
    from rich.tree import Tree

    def grow(branch: Tree, node: Node) -> None:
        for child in node.children:
            grow(branch.add(escape(child.title)), child)

    shown = Tree(f"[bold]{escape(root.title)}[/]")
    grow(shown, root)
    _console().print(shown)


def progress_bar(console: Console) -> Progress:
    """A Rich bar for a watched study on ``console``: the bar, trials
    finished of the budget, then the counts per state (cut to the width)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Column

    return Progress(
        BarColumn(bar_width=24, table_column=Column(min_width=24)),
        MofNCompleteColumn(table_column=Column(min_width=7)),
        TextColumn(
            "{task.description}",
            table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1),
        ),
        console=console,
        expand=True,
    )


def show_study(bar: Progress, progress: StudyProgress) -> None:
    """Draw ``progress`` on ``bar``'s one task (added on the first call)."""
    if not bar.task_ids:
        bar.add_task("", total=progress.total)
    bar.update(
        bar.task_ids[0],
        total=progress.total,
        completed=progress.finished,
        description=progress.text(),
    )


@contextmanager
def study_bar(out: TextIO) -> Iterator[Callable[[StudyProgress], None]]:
    """A study's progress bar on ``out`` (a terminal) while the block runs;
    yields what to call with each change of the study's progress."""
    from rich.console import Console

    bar = progress_bar(Console(file=out))
    with bar:
        yield lambda progress: show_study(bar, progress)

"""The ``aistack`` command's output: Rich on a terminal, plain lines off one.

Scripts and tests read the plain lines (one record per line, columns padded),
so they stay as they are whatever a terminal shows.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from aistack.lineage import Node


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

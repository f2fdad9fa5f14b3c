"""The ``aistack`` command, on Typer: ``--help`` on every command, shell
completion (``--install-completion``), Rich on a terminal and plain lines off
one (``aistack.cli.terminal``).

Each command returns its exit status; ``main`` turns an ``AistackError`` into
one line on standard error and exit status 1; a usage error is the usage and
one line naming the argument, and ``SystemExit(2)``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer
from typer.core import TyperGroup

from aistack.cli import demo, lineage, models, predict, produce, report, score, stack, study
from shared.errors import AistackError

app = typer.Typer(
    name="aistack",
    help="aistack: the event-driven ML platform",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(stack.infra, name="infra")
app.command()(stack.up)
app.command()(stack.down)
app.command()(stack.status)
app.command()(stack.env)
app.command()(stack.dashboard)
app.command()(stack.logs)
app.command()(produce.produce)
app.command()(score.score)
app.command()(lineage.lineage)
app.add_typer(study.app, name="study")
app.add_typer(models.app, name="models")
app.command()(predict.predict)
app.command()(demo.demo)
app.command()(report.report)


def command() -> TyperGroup:
    """The command as Typer builds it: every subcommand (``.commands``) and its parameters."""
    group = typer.main.get_command(app)
    if not isinstance(group, TyperGroup):
        raise TypeError(f"aistack's command is a group of commands, not {type(group).__name__}")
    return group


def main(argv: Sequence[str] | None = None) -> int:
    try:
        status = command().main(
            args=list(sys.argv[1:] if argv is None else argv),
            prog_name="aistack",
            standalone_mode=False,
        )
    except AistackError as exc:
        print(f"aistack: {exc}", file=sys.stderr)
        return 1
    except typer.TyperException as exc:  # a usage error, as Typer raises it
        _show(exc)
        # Exit status 2, raised as argparse did: the caller learns it either way.
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        print("aistack: aborted", file=sys.stderr)
        return 1
    return int(status or 0)


def _show(exc: typer.TyperException) -> None:
    """Typer's panel on a terminal; off one, the usage line and then the error
    in one line, as ``COMMAND: error: MESSAGE``."""
    context: typer.Context | None = getattr(exc, "ctx", None)
    # Typer's own test for the help it prints when a group is given no command.
    if exc.__class__.__name__ == "NoArgsIsHelpError" or context is None:
        exc.show()  # type: ignore[attr-defined]
    elif sys.stderr.isatty():
        from typer import rich_utils

        rich_utils.rich_format_error(exc)  # type: ignore[arg-type]
    else:
        print(context.get_usage(), file=sys.stderr)
        print(f"{context.command_path}: error: {exc.format_message()}", file=sys.stderr)


__all__ = ["app", "command", "main"]

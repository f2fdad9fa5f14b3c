"""The ``aistack`` command on Typer: every command listed with its help, exit
statuses as documented (usage error 2, an aistack error 1 in one line), and
the terminal's output through Rich while scripts get plain lines."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from aistack import cli
from aistack.cli import terminal
from aistack.lineage import Node
from shared.contracts.aistack.v1 import monitoring_pb2

COMMANDS = {
    "infra", "up", "down", "status", "env", "dashboard", "logs", "produce", "score", "lineage",
    "study", "models", "predict", "demo", "report",
}  # fmt: skip


def test_help_lists_every_command_and_offers_completion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(cli.command().commands) == COMMANDS
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)
    assert "--install-completion" in out


@pytest.mark.parametrize(
    ("group", "subcommands"),
    [
        ("infra", {"up", "down", "status", "fetch"}),
        ("study", {"create", "watch", "best", "stop", "show", "replay"}),
        ("models", {"list", "fetch", "register", "challenge"}),
    ],
)
def test_each_group_holds_its_subcommands(group: str, subcommands: set[str]) -> None:
    assert set(getattr(cli.command().commands[group], "commands", {})) == subcommands


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["nosuch"], "aistack: error: No such command 'nosuch'."),
        (
            ["infra", "up", "--brokers", "12"],
            "aistack infra up: error: Invalid value for '--brokers'",
        ),
        (["logs", "-n", "-1"], "aistack logs: error: Invalid value for '-n' / '--lines'"),
        (["predict", "m"], "aistack predict: error: Invalid value for --input: give exactly one"),
        (
            ["study", "create", "--file=b.yaml", "a.yaml"],
            "aistack study create: error: argument SPEC: not allowed with argument -f/--file",
        ),
    ],
)
def test_a_usage_error_is_the_usage_and_one_line_with_exit_status_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("Usage: aistack")
    assert err[-1].startswith(error)
    assert len(err) == 2


def test_an_aistack_error_is_one_line_and_exit_status_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["models", "register", "m", "--artifact", "/nonexistent", "--metric", "bad"]
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", "aistack: --metric 'bad': expected KEY=VALUE\n")


ROWS = [("kafka", "running"), ("redis", "stopped")]
PLAIN = ["kafka   running", "redis   stopped"]


def test_off_a_terminal_a_table_is_its_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    terminal.table("servers", ("server", "state"), ROWS, PLAIN)
    assert capsys.readouterr().out == "kafka   running\nredis   stopped\n"


def rich_output(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What Rich draws, as on a terminal 100 columns wide."""
    drawn = io.StringIO()
    monkeypatch.setattr(terminal, "on_terminal", lambda: True)
    monkeypatch.setattr(terminal, "_console", lambda: Console(file=drawn, width=100))
    return drawn


def test_on_a_terminal_a_table_is_drawn_by_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = rich_output(monkeypatch)
    terminal.table("servers", ("server", "state"), ROWS, PLAIN)
    text = drawn.getvalue()
    assert text.splitlines()[0].strip() == "servers"
    assert "server" in text and "state" in text and "━" in text  # the header's rule
    assert [line.split() for line in text.splitlines()[-2:]] == [
        ["kafka", "│", "running"],
        ["redis", "│", "stopped"],
    ]


def test_a_lineage_tree_is_the_same_tree_on_and_off_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Node("prediction r-1", children=[Node("model m@2", children=[Node("[raw] x")])])
    terminal.tree(root)
    assert capsys.readouterr().out.splitlines() == [
        "prediction r-1",
        "└─ model m@2",
        "   └─ [raw] x",
    ]
    drawn = rich_output(monkeypatch)
    terminal.tree(root)
    lines = drawn.getvalue().splitlines()
    # Rich's guides; a title's brackets are text, not markup.
    assert lines == ["prediction r-1", "└── model m@2", "    └── [raw] x"]


def test_models_list_shows_which_version_serves_and_which_challenge_it() -> None:
    from aistack.cli.models import version_rows
    from shared import model_registry
    from shared.settings import ServingSettings
    from tests.model_events import ready, retuned

    marked = ready(4, 0.3)
    marked.labels[model_registry.CHALLENGER_LABEL] = "true"
    registry = model_registry.Registry.of(
        [ready(1, 0.2), ready(2, 0.1), retuned(3, 0.4, baseline=2, baseline_value=0.1), marked]
    )
    live = {
        ("m", "2"): monitoring_pb2.LivePerformance(
            model_name="m", model_version="2", metric="mae", mae=0.42, pairs=120
        )
    }
    rows = version_rows(registry, ["m"], ServingSettings(challengers=2), live)
    assert [(version, role, error) for _, version, role, _, error, _ in rows] == [
        ("1", "-", "-"),
        ("2", "serving", "mae=0.42 (n=120)"),
        ("3", "challenger", "-"),
        ("4", "challenger", "-"),
    ]
    assert rows[1][3] == "val_error=0.1"
    only_one = version_rows(registry, ["m"], ServingSettings(challengers=1))
    assert [row[2] for row in only_one] == ["-", "serving", "-", "challenger"]


def test_the_latest_live_error_of_each_version_wins() -> None:
    from shared import live_performance

    def summary(version: str, pairs: int) -> monitoring_pb2.LivePerformance:
        return monitoring_pb2.LivePerformance(model_name="m", model_version=version, pairs=pairs)

    found = live_performance.latest([summary("1", 5), summary("2", 3), summary("1", 9)])
    assert {key: s.pairs for key, s in found.items()} == {("m", "1"): 9, ("m", "2"): 3}


def test_models_list_ends_with_each_models_last_decision_and_why() -> None:
    from aistack.cli.models import decision_lines

    decision = monitoring_pb2.ChampionDecision(
        model_name="m",
        kind=monitoring_pb2.DECISION_KIND_PROMOTE,
        chosen_version="3",
        reason="the challenger beat the champion on 200 requests both served: 0.1 against 0.3",
    )
    decision.decided_time.FromSeconds(1_800_000_000)
    assert decision_lines(["m", "other"], {"m": decision}) == [
        "m: last decision promote (serving 3, 2027-01-15T08:00:00Z): the challenger beat the "
        "champion on 200 requests both served: 0.1 against 0.3"
    ]

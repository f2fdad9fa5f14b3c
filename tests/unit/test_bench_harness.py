"""The benchmarks' harness: the one output format and the plumbing every
benchmark shares, without a broker."""

from __future__ import annotations

import operator
import subprocess
import sys

import pytest

from bench import harness
from shared.settings import KafkaSettings, RedisSettings


def test_ratio_line_is_name_ratio_goal() -> None:
    assert (
        harness.ratio_line("shared_vs_bare", 0.934, 0.9) == "shared_vs_bare: ratio 0.93 (goal 0.9)"
    )


def test_ratio_line_digits_and_goal_as_written() -> None:
    assert harness.ratio_line("trial_vs_overhead", 28.66, 20, digits=1) == (
        "trial_vs_overhead: ratio 28.7 (goal 20)"
    )
    assert harness.ratio_line("x", 1.0, 1.0) == "x: ratio 1.00 (goal 1.0)"


def test_ratio_line_rounds_a_computed_goal() -> None:
    assert harness.ratio_line("tuned_vs_default_error", 1.83, 1 / (1 - 0.34)) == (
        "tuned_vs_default_error: ratio 1.83 (goal 1.52)"
    )


def test_ratio_of_aistack_against_itself_is_labelled() -> None:
    line = harness.ratio_line("two_vs_one_consumer", 1.87, 1.8, itself=True)
    assert line == "two_vs_one_consumer: ratio 1.87 (goal 1.8) [aistack against itself]"
    assert harness.ITSELF not in harness.ratio_line("two_vs_one_consumer", 1.87, 1.8)


def test_print_ratio_prints_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    harness.print_ratio("a_vs_b", 2.0, 1.5, itself=True)
    assert capsys.readouterr().out == f"{harness.ratio_line('a_vs_b', 2.0, 1.5, itself=True)}\n"


def test_round_order_alternates() -> None:
    assert harness.round_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert harness.round_order(["a", "b", "c"], 1) == ["c", "b", "a"]
    assert harness.round_order(range(2), 2) == [0, 1]


def test_sum_series_adds_the_exact_series_only() -> None:
    text = "\n".join(
        [
            "# HELP aistack_ingest_records_in_total records",
            'aistack_ingest_records_in_total{partition="0"} 5.0',
            "aistack_ingest_records_in_total 7.0",
            "aistack_ingest_records_in_total 3.0",
            "aistack_ingest_records_in_total_created 1.7e9",
        ]
    )
    assert harness.sum_series(text, "aistack_ingest_records_in_total") == 10.0
    assert harness.sum_series(text, 'aistack_ingest_records_in_total{partition="0"}') == 5.0
    assert harness.sum_series(text, "aistack_missing_total") == 0.0


def test_a_counter_is_scraped_more_often_only_as_its_end_nears() -> None:
    every, floor = harness.SCRAPE_EVERY_S, harness.SCRAPE_FLOOR_S
    assert harness.next_scrape_in(0, 100_000, None) == every  # not rising yet
    assert harness.next_scrape_in(10_000, 100_000, 40_000.0) == every  # 2.25 s to go
    # 0.1 s to go: half of it, then down to the floor, never past the end.
    assert harness.next_scrape_in(96_000, 100_000, 40_000.0) == pytest.approx(0.05)
    assert harness.next_scrape_in(99_990, 100_000, 40_000.0) == floor
    assert harness.next_scrape_in(100_000, 100_000, 40_000.0) == floor


def test_read_metric_is_zero_before_the_process_answers() -> None:
    from shared.ports import free_port

    assert harness.read_metric(free_port(), "aistack_ingest_records_in_total") == 0.0


def test_child_env_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("AISTACK_STATE_DIR", "/from/caller")
    monkeypatch.delenv("AISTACK_TRACE", raising=False)
    env = harness.child_env(
        {"AISTACK_STATE_DIR": "/from/bench"},
        kafka=KafkaSettings(bootstrap="broker:19092"),
        redis=RedisSettings(url="redis://cache:16379/0"),
        defaults={"AISTACK_LOG_LEVEL": "WARNING", "AISTACK_TRACE": "off"},
    )
    assert env["AISTACK_LOG_LEVEL"] == "DEBUG"  # the caller's wins over a default
    assert env["AISTACK_TRACE"] == "off"
    assert env["AISTACK_STATE_DIR"] == "/from/bench"  # an override wins over the caller
    assert env["AISTACK_KAFKA_BOOTSTRAP"] == "broker:19092"
    assert env["AISTACK_REDIS_URL"] == "redis://cache:16379/0"


def test_child_env_without_infra_names_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AISTACK_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("AISTACK_REDIS_URL", raising=False)
    env = harness.child_env({})
    assert "AISTACK_KAFKA_BOOTSTRAP" not in env
    assert "AISTACK_REDIS_URL" not in env


def test_python_module_runs_this_interpreter() -> None:
    assert harness.python_module("bench.serving_kserve", "--name", "digits") == [
        sys.executable,
        "-m",
        "bench.serving_kserve",
        "--name",
        "digits",
    ]


def test_in_fresh_process_returns_the_result() -> None:
    assert harness.in_fresh_process(operator.add, 2, 3, timeout=120) == 5


def test_serving_leaves_the_inference_package_to_its_clients() -> None:
    """bench.serving's client processes are spawned and import it again: it
    must not load aistack's contracts, which register the protobuf package
    ``inference`` that tritonclient registers too."""
    code = (
        "import sys, bench.serving; "
        "owners = ('shared.contracts', 'kserve', 'tritonclient'); "
        "loaded = [m for m in sys.modules if m.startswith(owners)]; "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    pytest.importorskip("numpy")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=harness.ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr

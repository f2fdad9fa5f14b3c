"""bench.serving's pure parts: which configurations a ratio line starts and
measures, and how each line is computed from the results."""

from __future__ import annotations

import pytest

from bench import serving
from bench.harness import ITSELF
from bench.serving_servers import (
    AISTACK_BATCHED,
    AISTACK_LOG_OFF,
    AISTACK_SHADOWED,
    AISTACK_UNBATCHED,
    AISTACK_UNBATCHED_LOG_OFF,
    AISTACK_UNBATCHED_UNTRACED,
    KSERVE,
)


def result(throughput: float, p99_ms: float = 10.0) -> serving.Result:
    return serving.Result(throughput=throughput, p50_ms=1.0, p99_ms=p99_ms)


def test_unbatched_vs_kserve_measures_only_its_two_configurations() -> None:
    # Like for like: KServe logs no predictions, so neither does svc_model here.
    assert serving.configs_for(["unbatched_vs_kserve_c16"]) == [
        (AISTACK_UNBATCHED_LOG_OFF, 16),
        (KSERVE, 16),
    ]
    assert serving.configs_for(["unbatched_logged_vs_kserve_c16"]) == [
        (AISTACK_UNBATCHED, 16),
        (KSERVE, 16),
    ]


def test_the_headline_and_the_like_for_like_line_share_kserve() -> None:
    assert serving.configs_for(["aistack_vs_kserve_c16", "unbatched_vs_kserve_c16"]) == [
        (AISTACK_BATCHED, 16),
        (AISTACK_UNBATCHED_LOG_OFF, 16),
        (KSERVE, 16),
    ]


def test_every_line_measures_in_the_usual_order_once() -> None:
    configs = serving.configs_for(list(serving.RATIOS))
    assert len(configs) == len(set(configs))
    assert configs == [
        (AISTACK_BATCHED, 1),
        (serving.IN_PROCESS, 1),
        (AISTACK_BATCHED, 16),
        (AISTACK_LOG_OFF, 16),
        (AISTACK_SHADOWED, 16),
        (AISTACK_UNBATCHED, 16),
        (AISTACK_UNBATCHED_LOG_OFF, 16),
        (AISTACK_UNBATCHED_UNTRACED, 16),
        (KSERVE, 16),
    ]


def test_the_shadow_cost_compares_one_challenger_with_none_both_logging(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert serving.configs_for(["shadow_cost"]) == [(AISTACK_BATCHED, 16), (AISTACK_SHADOWED, 16)]
    best = {(AISTACK_BATCHED, 16): result(1000.0), (AISTACK_SHADOWED, 16): result(960.0)}
    serving.print_figure("shadow_cost", best)
    assert capsys.readouterr().out.startswith("shadow_cost: ratio 0.96 (goal 0.95)")


def test_unbatched_vs_kserve_is_unbatched_throughput_over_kserves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    best = {
        (AISTACK_UNBATCHED_LOG_OFF, 16): result(1200.0),
        (AISTACK_UNBATCHED, 16): result(1100.0),
        (AISTACK_UNBATCHED_UNTRACED, 16): result(900.0),
        (KSERVE, 16): result(1000.0),
    }
    serving.print_figure("unbatched_vs_kserve_c16", best)
    serving.print_figure("unbatched_logged_vs_kserve_c16", best)
    serving.print_figure("unbatched_untraced_vs_kserve_c16", best)
    # Against a peer, so not labelled as aistack against itself.
    assert capsys.readouterr().out.splitlines() == [
        "unbatched_vs_kserve_c16: ratio 1.20 (goal 1.2)",
        "unbatched_logged_vs_kserve_c16: ratio 1.10 (goal 1.2)",
        "unbatched_untraced_vs_kserve_c16: ratio 0.90 (goal 1.2)",
    ]


def test_headline_stays_batched_over_kserve(capsys: pytest.CaptureFixture[str]) -> None:
    best = {
        (AISTACK_BATCHED, 16): result(1500.0),
        (AISTACK_UNBATCHED_LOG_OFF, 16): result(900.0),
        (KSERVE, 16): result(1000.0),
    }
    serving.print_figure("aistack_vs_kserve_c16", best)
    serving.print_figure("unbatched_vs_kserve_c16", best)
    assert capsys.readouterr().out.splitlines() == [
        "aistack_vs_kserve_c16: ratio 1.50 (goal 1.5)",
        "unbatched_vs_kserve_c16: ratio 0.90 (goal 1.2)",
    ]


def test_batched_vs_unbatched_is_labelled_as_against_itself(
    capsys: pytest.CaptureFixture[str],
) -> None:
    best = {(AISTACK_BATCHED, 16): result(1500.0), (AISTACK_UNBATCHED, 16): result(750.0)}
    serving.print_figure("batched_vs_unbatched_c16", best)
    assert capsys.readouterr().out == f"batched_vs_unbatched_c16: ratio 2.00 (goal 2.0) {ITSELF}\n"


def test_a_configuration_counts_its_median_round_whole() -> None:
    runs = [
        serving.Result(throughput=900.0, p50_ms=3.0, p99_ms=30.0),
        serving.Result(throughput=1_100.0, p50_ms=1.0, p99_ms=10.0),
        serving.Result(throughput=1_000.0, p50_ms=2.0, p99_ms=20.0),
    ]
    assert serving.median_run(runs) is runs[2]  # its own latencies, not the best's
    assert serving.median_run(runs[:2]) is runs[0]  # an even count: the lower middle


def test_every_round_measures_every_configuration_on_servers_of_its_own() -> None:
    configs = [(AISTACK_BATCHED, 16), (KSERVE, 16)]
    throughputs = {
        AISTACK_BATCHED: iter([2_000.0, 1_800.0, 1_900.0]),
        KSERVE: iter([1_000.0, 1_200.0, 1_100.0]),
    }
    measured: list[tuple[int, str, int]] = []
    started: list[dict[str, RoundServer]] = []

    class Measured:
        def __init__(self) -> None:
            self.servers: dict[str, RoundServer] = {}

        def measure(self, target: str, concurrency: int) -> serving.Result:
            assert not self.servers[target].stopped  # the round's own, still up
            measured.append((len(started) - 1, target, concurrency))
            return result(next(throughputs[target]))

    def start_round(round_number: int) -> dict[str, RoundServer]:
        assert round_number == len(started)
        assert all(server.stopped for servers in started for server in servers.values())
        started.append({AISTACK_BATCHED: RoundServer(logged=10.0), KSERVE: RoundServer()})
        return started[-1]

    counted, log = serving.median_of(Measured(), 3, configs, start_round)  # type: ignore[arg-type]
    assert sorted(measured) == sorted((r, *config) for r in range(3) for config in configs)
    assert all(server.stopped for servers in started for server in servers.values())
    assert list(counted) == configs
    assert (counted[configs[0]].throughput, counted[configs[1]].throughput) == (1_900.0, 1_100.0)
    assert log == (30.0, 3.0)  # the logged servers' counts, summed over the rounds


class RoundServer:
    """What median_of asks of a round's server: its log's counts, and to stop."""

    def __init__(self, logged: float = 0.0) -> None:
        self.stopped = False
        self._logged = logged

    def logged(self) -> tuple[float, float]:
        return self._logged, 1.0

    def ask_to_stop(self) -> None:
        self.stopped = True

    def wait(self, timeout: float) -> None:
        pass

    def kill(self) -> None:
        self.stopped = True


def test_each_target_is_started_once() -> None:
    assert len(serving.AISTACK_TARGETS) == len(set(serving.AISTACK_TARGETS))
    assert len(serving.TARGETS) == len(set(serving.TARGETS))
    assert set(serving.AISTACK_TARGETS) <= set(serving.TARGETS)

"""svc_model against KServe's Python model server and against the model called
in-process, same model and same client, measured in the same run.

The model is the digits CNN with the default hyperparameters, exported by
svc_trainer's own code (``torch.export``, dynamic batch; untrained: the
weights do not change the work). It is served these ways, all up at once
and measured one at a time:

* aistack batched: ``python -m svc_model`` as deployed, dynamic batching on
  (the default: up to 64 rows, no queue delay), the model from a ModelReady
  event on a topic of this run's own, and the prediction log on for every
  request (``AISTACK_MODEL_PREDICTION_LOG_TENSOR_FRACTION=1``: its cost at
  its worst; the default logs a tenth) to a topic of this run's own.
* aistack batched log-off: the same with the prediction log off (at C=16 only).
* aistack unbatched: aistack batched with ``AISTACK_MODEL_BATCHING=false``.
* aistack unbatched log-off: the same with the prediction log off (at C=16
  only): KServe logs nothing, so this is the like-for-like comparison.
  As deployed, svc_model runs the exported program as TorchScript traced
  from it and checked against it at load (``AISTACK_MODEL_TRACE_EXPORTED``;
  Triton, too, runs PyTorch models as TorchScript): fewer Python steps per
  call, the server's own doing.
* aistack unbatched log-off untraced: the same running the exported program
  itself, as KServe's ``predict`` below does (at C=16 only).
* kserve: KServe's ``ModelServer`` (bench.serving_kserve: a ``kserve.Model``
  with a synchronous ``predict``, one worker) on its v2 gRPC endpoint.
* in-process: the exported module called directly on the numpy image, in one
  process: the latency floor. At C=16 it still runs each call alone, so a
  server that batches may pass its throughput.

Every server and the floor run torch with the same intra-op thread count,
``--threads``: by default svc_model's own default
(``AISTACK_MODEL_INTRA_OP_THREADS``, one per execution), given to KServe and
the floor too; ``--threads 0`` gives them all torch's own default (one per
core). With one thread svc_model's unbatched version runs on the event loop
(``AISTACK_MODEL_INLINE_MAX_MS``), as KServe's ``predict`` does, and its
batched version runs there a request alone in the server (at C=1, every
request; at C=16, none once requests overlap). Every server
is checked first: its probabilities for a few images must match the
in-process module's. Each server line gives the server process's CPU per
request and cores over the counted window.

The client is tritonclient's gRPC client, one request one image ([1, 8, 8]
FP32), closed loop: each caller sends its next request when the last one
returns. Concurrency C is C callers: C=1 is one thread in one process; C=16 is
4 processes of 4 threads, each thread with its own client, since one Python
process's GIL would cap the client, not the server (the in-process floor runs
its 16 callers as 16 threads of one process). Each measurement warms up for
``--warmup`` s, then counts for ``--duration`` s: throughput is the requests
completed in the window over its length, p50 and p99 are of their latencies;
a failed call counts for neither and is reported on its configuration's line.
Every configuration runs ``--rounds`` times (3), the order reversed each
round, and every round on server processes started for it (and stopped
after it): one process of a configuration kept what it drew at its start
for its life, and two processes of the same configuration measured side by
side, seven rounds each, differed by up to 14%, more than the prediction log
costs. The run with the median throughput counts, its latencies with it.

Clients and servers share the machine's cores, as they would a node; the
client's cost is the same for every server. On a machine with few cores that
also runs other work the figures move from run to run, KServe's at C=16 most:
its ``predict`` blocks its event loop, and torch's thread team then competes
with the clients for the cores (``--threads 0`` puts that back, for both).

Prints a line per configuration (for svc_model also the mean rows per model
execution over the run, off its own batch-size histogram), then, higher
always better:

    aistack_vs_kserve_c16: ratio R (goal 1.5)
        aistack batched over kserve, throughput at C=16: svc_model as
        deployed against KServe's server as deployed, which does not batch.
    unbatched_vs_kserve_c16: ratio R (goal 1.2)
        aistack unbatched log-off over kserve, throughput at C=16: like for
        like, one request one model call and no prediction log on both sides.
    unbatched_logged_vs_kserve_c16: ratio R (goal 1.2)
        the same with svc_model logging every prediction, which KServe does not.
    unbatched_untraced_vs_kserve_c16: ratio R (goal 1.2)
        unbatched_vs_kserve_c16 with svc_model running the exported program
        itself (``AISTACK_MODEL_TRACE_EXPORTED=false``), as KServe's
        ``predict`` does: the two servers' own costs alone.
    p50_overhead_c1: ratio R (goal 1.0)
        1 ms over (aistack batched p50 - in-process p50) at C=1, the
        difference floored at 0.01 ms (so R <= 100); R >= 1 means the server
        adds at most 1 ms.
    batched_vs_unbatched_c16: ratio R (goal 2.0)
        aistack batched over aistack unbatched, throughput at C=16.
    batched_p99_vs_unbatched_c16: ratio R (goal 0.67)
        unbatched p99 over batched p99 at C=16; R >= 0.67 means batching
        costs the tail at most 1.5x.
    prediction_log_cost: ratio R (goal 0.95)
        aistack batched (log on, every request) over aistack batched
        log-off, throughput at C=16; with the records logged and dropped.
    shadow_cost: ratio R (goal 0.95)
        aistack batched with one challenger in the champion's shadow (the
        default share of its requests, AISTACK_MODEL_SHADOW_FRACTION) over
        aistack batched with none, throughput at C=16; both log every
        request.

``--ratios`` picks some of these lines: only the configurations they need
are started and measured.

Needs a broker: ``aistack infra up`` (Kafka, and Redis for svc_model's online
features).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import profiling
from bench.harness import cpu_seconds, print_ratio, round_order
from bench.serving_callers import Worker, client_main, floor_main
from bench.serving_servers import (
    AISTACK_BATCHED,
    AISTACK_LOG_OFF,
    AISTACK_SHADOWED,
    AISTACK_UNBATCHED,
    AISTACK_UNBATCHED_LOG_OFF,
    AISTACK_UNBATCHED_UNTRACED,
    KSERVE,
    Exported,
    Server,
    export_model,
    publish_model,
    start_aistack,
    start_kserve,
)

# Only the standard library and numpy at module level, here and in the bench
# modules imported above: the client processes are spawned, so they import
# this module again, and there tritonclient must be the one owner of the
# protobuf package ``inference`` (kserve and aistack's own contracts register
# it too). Everything else is imported where used.

GOAL_VS_KSERVE = 1.5
GOAL_UNBATCHED_VS_KSERVE = 1.2
GOAL_P50_OVERHEAD = 1.0
GOAL_BATCHED = 2.0
GOAL_BATCHED_P99 = 0.67
GOAL_PREDICTION_LOG = 0.95
GOAL_SHADOW = 0.95
OVERHEAD_BUDGET_MS = 1.0
OVERHEAD_FLOOR_MS = 0.01
CONCURRENCY = (1, 16)
CLIENT_PROCESSES = 4
START_TIMEOUT = 180.0

IN_PROCESS = "in-process"
TARGETS = (
    AISTACK_BATCHED,
    AISTACK_LOG_OFF,
    AISTACK_SHADOWED,
    AISTACK_UNBATCHED,
    AISTACK_UNBATCHED_LOG_OFF,
    AISTACK_UNBATCHED_UNTRACED,
    KSERVE,
    IN_PROCESS,
)
AISTACK_TARGETS = (
    AISTACK_BATCHED,
    AISTACK_LOG_OFF,
    AISTACK_SHADOWED,
    AISTACK_UNBATCHED,
    AISTACK_UNBATCHED_LOG_OFF,
    AISTACK_UNBATCHED_UNTRACED,
)

Config = tuple[str, int]
#: The configurations each ratio line compares.
RATIOS: dict[str, tuple[Config, Config]] = {
    "aistack_vs_kserve_c16": ((AISTACK_BATCHED, 16), (KSERVE, 16)),
    "unbatched_vs_kserve_c16": ((AISTACK_UNBATCHED_LOG_OFF, 16), (KSERVE, 16)),
    "unbatched_logged_vs_kserve_c16": ((AISTACK_UNBATCHED, 16), (KSERVE, 16)),
    "unbatched_untraced_vs_kserve_c16": ((AISTACK_UNBATCHED_UNTRACED, 16), (KSERVE, 16)),
    "p50_overhead_c1": ((AISTACK_BATCHED, 1), (IN_PROCESS, 1)),
    "batched_vs_unbatched_c16": ((AISTACK_BATCHED, 16), (AISTACK_UNBATCHED, 16)),
    "batched_p99_vs_unbatched_c16": ((AISTACK_BATCHED, 16), (AISTACK_UNBATCHED, 16)),
    "prediction_log_cost": ((AISTACK_BATCHED, 16), (AISTACK_LOG_OFF, 16)),
    "shadow_cost": ((AISTACK_SHADOWED, 16), (AISTACK_BATCHED, 16)),
}


def configs_for(ratios: list[str]) -> list[Config]:
    """What the ``ratios`` lines need measured, in the bench's usual order."""
    wanted = {config for name in ratios for config in RATIOS[name]}
    return [(target, c) for c in CONCURRENCY for target in TARGETS if (target, c) in wanted]


def stop_all(processes: list[Worker | Server], grace: float = 15.0) -> None:
    """Ask every process to stop at once, wait up to ``grace`` s for them all,
    then terminate and kill whatever is left."""
    for process in processes:
        process.ask_to_stop()
    deadline = time.monotonic() + grace
    for process in processes:
        process.wait(max(0.0, deadline - time.monotonic()))
    for process in processes:
        process.kill()


# ---- measuring ----


@dataclass(frozen=True)
class Result:
    throughput: float
    p50_ms: float
    p99_ms: float
    failures: int = 0
    first_failure: str = ""
    mean_batch: float = 0.0
    server_cpu_ms: float = 0.0  # the server process's CPU per counted request
    server_cores: float = 0.0  # the server process's CPU over the counted window's length


def summarise(
    parts: list[tuple[list[float], int, str]],
    duration: float,
    mean_batch: float = 0.0,
    server_cpu_s: float = 0.0,
) -> Result:
    latencies = np.array([value for part in parts for value in part[0]])
    failures = sum(part[1] for part in parts)
    first = next((part[2] for part in parts if part[2]), "")
    if latencies.size == 0:
        return Result(0.0, float("nan"), float("nan"), failures, first)
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    return Result(
        latencies.size / duration,
        float(p50),
        float(p99),
        failures,
        first,
        mean_batch,
        server_cpu_s / latencies.size * 1000,
        server_cpu_s / duration,
    )


class Bench:
    def __init__(
        self,
        clients: list[Worker],
        floor: Worker | None,
        servers: dict[str, Server],
        images: np.ndarray,
        warmup: float,
        duration: float,
    ) -> None:
        self.clients, self.floor, self.servers = clients, floor, servers
        self.images, self.warmup, self.duration = images, warmup, duration

    def measure(self, target: str, concurrency: int) -> Result:
        # The callers start a moment from now, set up their clients in the warm-up.
        warm_at = time.monotonic() + 0.2 + self.warmup
        end_at = warm_at + self.duration
        timeout = self.warmup + self.duration + 60
        if target == IN_PROCESS:
            assert self.floor is not None
            self.floor.send("run", "", concurrency, warm_at, end_at, self.images)
            return summarise([self.floor.answer(timeout)], self.duration)
        server = self.servers[target]
        per_process = _split(concurrency, len(self.clients))
        used = [(client, n) for client, n in zip(self.clients, per_process, strict=True) if n]
        before = server.mean_batch() if server.metrics_port else (0.0, 0.0)
        for client, threads in used:
            client.send("run", server.address, threads, warm_at, end_at, self.images)
        # The server's CPU over the counted window: where it goes beside the
        # cores the clients take (a spinning thread team shows as cores).
        time.sleep(max(0.0, warm_at - time.monotonic()))
        cpu_before = cpu_seconds(server.process.pid)
        time.sleep(max(0.0, end_at - time.monotonic()))
        cpu = cpu_seconds(server.process.pid) - cpu_before
        parts = [client.answer(timeout) for client, _ in used]
        mean = 0.0
        if server.metrics_port:
            after = server.mean_batch()
            runs = after[1] - before[1]
            mean = (after[0] - before[0]) / runs if runs else 0.0
        return summarise(parts, self.duration, mean, cpu)


def _split(total: int, processes: int) -> list[int]:
    """``total`` callers over at most ``processes`` processes, as evenly as they go."""
    used = min(total, processes)
    return [total // used + (1 if i < total % used else 0) for i in range(used)] + [0] * (
        processes - used
    )


def median_of(
    bench: Bench,
    rounds: int,
    configs: list[Config],
    start_round: Callable[[int], dict[str, Server]],
) -> tuple[dict[Config, Result], tuple[float, float]]:
    """Each configuration's median round (``median_run``), in ``configs``'
    order, and the records the rounds' logged batched servers logged and
    dropped. Every round runs on servers of its own (``start_round``),
    stopped when it ends: a process keeps what it drew at its start (where
    its threads, arenas and model landed) for its life, and two processes
    of one configuration differed by as much as the prediction log costs."""
    runs: dict[Config, list[Result]] = {config: [] for config in configs}
    logged = dropped = 0.0
    for round_number in range(rounds):
        servers = start_round(round_number)
        bench.servers = servers
        try:
            for config in round_order(configs, round_number):
                runs[config].append(bench.measure(*config))
            if AISTACK_BATCHED in servers:
                round_logged, round_dropped = servers[AISTACK_BATCHED].logged()
                logged, dropped = logged + round_logged, dropped + round_dropped
        finally:
            stop_all(list(servers.values()))
    return {config: median_run(results) for config, results in runs.items()}, (logged, dropped)


def median_run(results: list[Result]) -> Result:
    """The run of median throughput (the lower middle one of an even count),
    its latencies with it: one measured run, not a blend of several."""
    ranked = sorted(results, key=lambda result: result.throughput)
    return ranked[(len(ranked) - 1) // 2]


def line(target: str, concurrency: int, result: Result) -> str:
    text = (
        f"{target} c{concurrency}: {result.throughput:,.0f} req/s  "
        f"p50 {result.p50_ms:.2f} ms  p99 {result.p99_ms:.2f} ms"
    )
    if result.mean_batch:
        text += f"  (mean batch {result.mean_batch:.1f} rows)"
    if result.server_cpu_ms:
        text += (
            f"  server CPU {result.server_cpu_ms:.2f} ms/request, {result.server_cores:.2f} cores"
        )
    if result.failures:
        text += f"  [{result.failures} failed calls, first: {result.first_failure}]"
    return text


def report(counted: dict[Config, Result], ratios: list[str], log: tuple[float, float]) -> None:
    """A line per configuration measured, then the ``ratios`` lines."""
    for config in counted:
        print(line(*config, counted[config]))
    if "p50_overhead_c1" in ratios:
        overhead = counted[(AISTACK_BATCHED, 1)].p50_ms - counted[(IN_PROCESS, 1)].p50_ms
        print(f"p50 overhead over in-process at c1: {overhead:.2f} ms")
    if "prediction_log_cost" in ratios:
        logged, dropped = log
        print(f"prediction log ({AISTACK_BATCHED}): {logged:,.0f} logged, {dropped:,.0f} dropped")
    for name in ratios:
        print_figure(name, counted)


def print_figure(name: str, counted: dict[Config, Result]) -> None:
    batched = counted[(AISTACK_BATCHED, 16)] if (AISTACK_BATCHED, 16) in counted else None
    if name == "aistack_vs_kserve_c16":
        assert batched is not None
        print_ratio(name, batched.throughput / counted[(KSERVE, 16)].throughput, GOAL_VS_KSERVE)
    elif name in (
        "unbatched_vs_kserve_c16",
        "unbatched_logged_vs_kserve_c16",
        "unbatched_untraced_vs_kserve_c16",
    ):
        unbatched = counted[RATIOS[name][0]]
        kserve = counted[(KSERVE, 16)].throughput
        print_ratio(name, unbatched.throughput / kserve, GOAL_UNBATCHED_VS_KSERVE)
    elif name == "p50_overhead_c1":
        overhead = counted[(AISTACK_BATCHED, 1)].p50_ms - counted[(IN_PROCESS, 1)].p50_ms
        print_ratio(name, OVERHEAD_BUDGET_MS / max(overhead, OVERHEAD_FLOOR_MS), GOAL_P50_OVERHEAD)
    elif name == "batched_vs_unbatched_c16":
        # Batching on against off: both are svc_model.
        assert batched is not None
        unbatched = counted[(AISTACK_UNBATCHED, 16)]
        print_ratio(name, batched.throughput / unbatched.throughput, GOAL_BATCHED, itself=True)
    elif name == "batched_p99_vs_unbatched_c16":
        assert batched is not None
        unbatched = counted[(AISTACK_UNBATCHED, 16)]
        print_ratio(name, unbatched.p99_ms / batched.p99_ms, GOAL_BATCHED_P99, itself=True)
    elif name == "prediction_log_cost":
        assert batched is not None
        off = counted[(AISTACK_LOG_OFF, 16)]
        print_ratio(name, batched.throughput / off.throughput, GOAL_PREDICTION_LOG, itself=True)
    elif name == "shadow_cost":
        assert batched is not None
        shadowed = counted[(AISTACK_SHADOWED, 16)]
        print_ratio(name, shadowed.throughput / batched.throughput, GOAL_SHADOW, itself=True)


def check(clients: list[Worker], servers: dict[str, Server], exported: Exported) -> None:
    """Every server answers, and with the in-process module's probabilities."""
    for server in servers.values():
        clients[0].send("ready", server.address, START_TIMEOUT)
        clients[0].answer(START_TIMEOUT + 30)
        clients[0].send("check", server.address, exported.images)
        got = clients[0].answer(60)
        if not np.allclose(got, exported.expected, atol=1e-5):
            worst = float(np.abs(got - exported.expected).max())
            raise RuntimeError(f"{server.name} answers differ from in-process by up to {worst}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds counted per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before counting")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads in every server and the floor (default: svc_model's "
        "AISTACK_MODEL_INTRA_OP_THREADS default; 0: torch's own, one per core)",
    )
    parser.add_argument(
        "--ratios",
        default=",".join(RATIOS),
        help=f"comma-separated lines to measure for (default all: {', '.join(RATIOS)})",
    )
    profiling.add_flag(parser, "serving")
    args = parser.parse_args()
    ratios = [name.strip() for name in args.ratios.split(",") if name.strip()]
    unknown = sorted(set(ratios) - set(RATIOS))
    if unknown or not ratios:
        parser.error(f"--ratios: unknown {unknown}; expected some of {', '.join(RATIOS)}")
    configs = configs_for(ratios)
    targets = {target for target, _ in configs}
    from shared.errors import AistackError
    from svc_model.settings import ModelSettings

    if args.threads is None:
        args.threads = ModelSettings.model_fields["intra_op_threads"].default

    suffix = uuid.uuid4().hex[:8]
    topics = (f"bench-models-{suffix}", f"bench-dlq-{suffix}", f"bench-predictions-{suffix}")
    workers: list[Worker] = []
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        state = Path(tmp)
        try:
            # What needs no model starts first: its imports overlap with the export.
            first_kserve = start_kserve(state, args.threads) if KSERVE in targets else None
            if first_kserve is not None:
                servers[KSERVE] = first_kserve
            clients = [Worker(client_main) for _ in range(CLIENT_PROCESSES)]
            workers.extend(clients)
            floor = Worker(floor_main, args.threads) if IN_PROCESS in targets else None
            if floor is not None:
                workers.append(floor)
            exported = export_model(state / "export")
            if floor is not None:
                floor.send("load", str(exported.path))
            # svc_model finds the model on start-up, replaying the topic.
            publish_model(topics, exported)
            for worker in workers:
                if worker is not floor:
                    worker.send("ping", "")
                worker.answer(START_TIMEOUT)

            def start_round(round_number: int) -> dict[str, Server]:
                """Every server this run measures, started afresh for the round
                (KServe's first at once, above), answering as in-process."""
                directory = state / f"round-{round_number}"
                directory.mkdir()
                servers.clear()
                if KSERVE in targets:
                    kserve = first_kserve if round_number == 0 else None
                    servers[KSERVE] = kserve or start_kserve(directory, args.threads)
                    servers[KSERVE].give_model(exported.path)
                for name in AISTACK_TARGETS:
                    if name in targets:
                        servers[name] = start_aistack(name, topics, directory, args.threads)
                for server in servers.values():
                    server.wait_for_port(START_TIMEOUT)
                check(clients, servers, exported)
                return dict(servers)

            bench = Bench(clients, floor, {}, exported.images, args.warmup, args.duration)
            print(
                f"digits CNN (default hyperparameters), {os.cpu_count()} cores, torch threads "
                f"{args.threads or 'default'}, {args.rounds} rounds of {args.warmup:g} s "
                f"warm-up + {args.duration:g} s, each on servers of its own, median round:"
            )
            counted, log = median_of(bench, args.rounds, configs, start_round)
        except (RuntimeError, AistackError) as exc:  # AistackError: no broker, mostly
            print(f"serving: {exc}", file=sys.stderr)
            for server in servers.values():
                print(f"--- {server.name} log:\n{server.log_tail()}", file=sys.stderr)
            return 1
        finally:
            stop_all([*workers, *servers.values()])
    report(counted, ratios, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""svc_model against KServe's Python model server and against the model called
in-process, same model and same client, measured in the same run.

The model is the digits CNN with the default hyperparameters, exported by
svc_trainer's own code (``torch.export``, dynamic batch; untrained: the
weights do not change the work). It is served four ways, all up at once and
measured one at a time:

* aistack batched: ``python -m svc_model`` as deployed, dynamic batching on
  (the default: up to 64 rows, no queue delay), the model from a ModelReady
  event on a topic of this run's own.
* aistack unbatched: the same with ``AISTACK_MODEL_BATCHING=false``.
* kserve: KServe's ``ModelServer`` (bench/serving_kserve.py: a ``kserve.Model``
  with a synchronous ``predict``, one worker) on its v2 gRPC endpoint.
* in-process: the exported module called directly on the numpy image, in one
  process: the latency floor. At C=16 it still runs each call alone, so a
  server that batches may pass its throughput.

Every server and the floor run torch with the same intra-op thread count:
``--threads``, by default 0, torch's own default (one per core), which is
what both servers deploy with. Every server is checked first: its
probabilities for a few images must match the in-process module's.

The client is tritonclient's gRPC client, one request one image ([1, 8, 8]
FP32), closed loop: each caller sends its next request when the last one
returns. Concurrency C is C callers: C=1 is one thread in one process; C=16 is
4 processes of 4 threads, each thread with its own client, since one Python
process's GIL would cap the client, not the server (the in-process floor runs
its 16 callers as 16 threads of one process). Each measurement warms up for
``--warmup`` s, then counts for ``--duration`` s: throughput is the requests
completed in the window over its length, p50 and p99 are of their latencies;
a failed call counts for neither and is reported on its configuration's line.
Every configuration runs ``--rounds`` times, the order reversed each round;
the run with the higher throughput counts, its latencies with it.

Clients and servers share the machine's cores, as they would a node; the
client's cost is the same for every server. On a machine with few cores that
also runs other work the figures move from run to run, KServe's at C=16 most:
its ``predict`` blocks its event loop, and torch's thread team then competes
with the clients for the cores (``--threads 1`` takes that out).

Prints a line per configuration (for svc_model also the mean rows per model
execution over the run, off its own batch-size histogram), then, higher
always better:

    aistack_vs_kserve_c16: ratio R (goal 1.5)
        aistack batched over kserve, throughput at C=16.
    p50_overhead_c1: ratio R (goal 1.0)
        1 ms over (aistack batched p50 - in-process p50) at C=1, the
        difference floored at 0.01 ms (so R <= 100); R >= 1 means the server
        adds at most 1 ms.
    batched_vs_unbatched_c16: ratio R (goal 2.0)
        aistack batched over aistack unbatched, throughput at C=16.
    batched_p99_vs_unbatched_c16: ratio R (goal 0.67)
        unbatched p99 over batched p99 at C=16; R >= 0.67 means batching
        costs the tail at most 1.5x.

Needs a broker: ``aistack infra up`` (Kafka, and Redis for svc_model's online
features).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.ports import free_port  # noqa: E402  (the standard library only)

# Only the standard library and numpy at module level: the client processes are
# spawned, so they import this module again, and there tritonclient must be
# the one owner of the protobuf package ``inference`` (kserve and aistack's
# own contracts register it too). Everything else is imported where used.

MODEL = "digits"
GOAL_VS_KSERVE = 1.5
GOAL_P50_OVERHEAD = 1.0
GOAL_BATCHED = 2.0
GOAL_BATCHED_P99 = 0.67
OVERHEAD_BUDGET_MS = 1.0
OVERHEAD_FLOOR_MS = 0.01
CONCURRENCY = (1, 16)
CLIENT_PROCESSES = 4
CHECK_IMAGES = 8
START_TIMEOUT = 180.0

AISTACK_BATCHED = "aistack batched"
AISTACK_UNBATCHED = "aistack unbatched"
KSERVE = "kserve"
IN_PROCESS = "in-process"
TARGETS = (AISTACK_BATCHED, AISTACK_UNBATCHED, KSERVE, IN_PROCESS)


# ---- the callers (spawned processes) ----


def _window(
    call: Callable[[int], object], warm_at: float, end_at: float
) -> tuple[list[float], int, str]:
    """Call in a closed loop until ``end_at``: the latencies of the calls that
    succeeded and ended inside [warm_at, end_at], the failures and the first
    one's text."""
    latencies: list[float] = []
    failures, first = 0, ""
    index = 0
    while True:
        started = time.monotonic()
        if started >= end_at:
            break
        index += 1
        try:
            call(index)
        except Exception as exc:  # counted, never retried: a failure is a result
            failures += 1
            first = first or f"{type(exc).__name__}: {exc}"
            continue
        ended = time.monotonic()
        if warm_at <= ended <= end_at:
            latencies.append(ended - started)
    return latencies, failures, first


def _in_threads(
    count: int, make_call: Callable[[], Callable[[int], object]], warm_at: float, end_at: float
) -> tuple[list[float], int, str]:
    results: list[tuple[list[float], int, str]] = []
    lock = threading.Lock()

    def caller() -> None:
        try:
            result = _window(make_call(), warm_at, end_at)
        except Exception as exc:  # the caller could not even be set up
            result = ([], 1, f"{type(exc).__name__}: {exc}")
        with lock:
            results.append(result)

    threads = [threading.Thread(target=caller) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies = [value for result in results for value in result[0]]
    failures = sum(result[1] for result in results)
    first = next((result[2] for result in results if result[2]), "")
    return latencies, failures, first


def _client_main(commands: Any, results: Any) -> None:
    """A client process: tritonclient only, commands from the orchestrator."""
    import tritonclient.grpc as triton_grpc

    def make_call(address: str, images: np.ndarray) -> Callable[[int], object]:
        client = triton_grpc.InferenceServerClient(address)
        inputs = []
        for image in images:
            tensor = triton_grpc.InferInput("input", [1, 8, 8], "FP32")
            tensor.set_data_from_numpy(image[None])
            inputs.append(tensor)
        wanted = [triton_grpc.InferRequestedOutput("probabilities")]

        def call(index: int) -> object:
            return client.infer(MODEL, [inputs[index % len(inputs)]], outputs=wanted)

        return call

    while (command := commands.get()) is not None:
        kind, address, *rest = command
        try:
            if kind == "ping":
                results.put(("ok", None))
            elif kind == "ready":
                (timeout,) = rest
                client = triton_grpc.InferenceServerClient(address)
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        if client.is_model_ready(MODEL):
                            break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{MODEL} not ready at {address} after {timeout} s")
                    time.sleep(0.2)
                results.put(("ok", None))
            elif kind == "check":
                (images,) = rest
                call = make_call(address, images)
                rows = [call(i).as_numpy("probabilities") for i in range(CHECK_IMAGES)]  # type: ignore[attr-defined]
                results.put(("ok", np.concatenate(rows)))
            else:
                threads, warm_at, end_at, images = rest
                per_thread = functools.partial(make_call, address, images)
                results.put(("ok", _in_threads(threads, per_thread, warm_at, end_at)))
        except Exception as exc:
            results.put(("error", f"{type(exc).__name__}: {exc}"))


def _floor_main(threads: int, commands: Any, results: Any) -> None:
    """The in-process floor: the exported module (``load`` names it), called
    from threads of this process."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    module: Any = None

    def make_call(images: np.ndarray) -> Callable[[int], object]:
        def call(index: int) -> object:
            with torch.inference_mode():
                return module(torch.from_numpy(images[index % len(images)][None])).numpy()

        return call

    while (command := commands.get()) is not None:
        kind, path, *rest = command
        try:
            if kind == "ping":
                results.put(("ok", None))
            elif kind == "load":
                module = torch.export.load(path).module()
                results.put(("ok", None))
            else:
                callers, warm_at, end_at, images = rest
                per_thread = functools.partial(make_call, images)
                results.put(("ok", _in_threads(callers, per_thread, warm_at, end_at)))
        except Exception as exc:
            results.put(("error", f"{type(exc).__name__}: {exc}"))


class Worker:
    """A spawned process that takes commands from a queue and answers on another."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        context = mp.get_context("spawn")
        self.commands: Any = context.Queue()
        self.results: Any = context.Queue()
        self.process = context.Process(
            target=target, args=(*args, self.commands, self.results), daemon=True
        )
        self.process.start()

    def send(self, *command: Any) -> None:
        self.commands.put(command)

    def answer(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, value = self.results.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(
                        f"a worker exited ({self.process.exitcode}) without answering"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer from a worker in {timeout} s") from None
        if status != "ok":
            raise RuntimeError(value)
        return value

    def ask_to_stop(self) -> None:
        if self.process.is_alive():
            self.commands.put(None)

    def wait(self, timeout: float) -> None:
        self.process.join(timeout)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


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


# ---- the model and the servers ----


@dataclass(frozen=True)
class Exported:
    directory: Path
    path: Path
    sha256: str
    size: int
    images: np.ndarray
    expected: np.ndarray  # the in-process probabilities of the first CHECK_IMAGES images


def export_model(directory: Path) -> Exported:
    import torch

    from shared.artifacts import digest
    from svc_trainer import data as datasets
    from svc_trainer import torch_models, torch_runner
    from svc_trainer.plan import Hyperparams

    data = datasets.load("digits", {})
    torch.manual_seed(0)
    model = torch_models.build("cnn", Hyperparams(), data)
    path = torch_runner.export(model, data, directory)
    sha, size = digest(directory)
    images = np.ascontiguousarray(data.x_test[:64], dtype=np.float32)
    module = torch.export.load(str(path)).module()
    with torch.inference_mode():
        expected = np.concatenate(
            [module(torch.from_numpy(images[i][None])).numpy() for i in range(CHECK_IMAGES)]
        )
    return Exported(directory, path, sha, size, images, expected)


def publish_model(topics: tuple[str, str], exported: Exported) -> None:
    """The ModelReady event svc_trainer would publish, on this run's own topic."""
    from shared.bus.producer import BusProducer
    from shared.bus.topics import EVENTS_DLQ, MODELS_READY, TOPICS_BY_NAME, ensure_topics
    from shared.contracts.aistack.v1 import common_pb2, models_pb2
    from shared.settings import KafkaSettings, load_settings

    kafka = load_settings(KafkaSettings)
    models_topic, dlq_topic = topics
    ensure_topics(
        kafka,
        [
            TOPICS_BY_NAME[MODELS_READY].named(models_topic),
            TOPICS_BY_NAME[EVENTS_DLQ].named(dlq_topic),
        ],
    )
    ready = models_pb2.ModelReady(
        model_name=MODEL,
        version="1",
        framework=common_pb2.FRAMEWORK_TORCH,
        format=models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT,
        artifact_uri=exported.directory.as_uri(),
        sha256=exported.sha256,
        size_bytes=exported.size,
        inputs=[models_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1, 8, 8])],
        outputs=[models_pb2.TensorSpec(name="probabilities", datatype="FP32", shape=[-1, 10])],
        objective=common_pb2.Objective(metric="val_error", direction=common_pb2.DIRECTION_MINIMIZE),
    )
    ready.metrics["val_error"] = 0.1
    with BusProducer(kafka, source="bench") as producer:
        producer.publish(models_topic, ready, key=f"{ready.model_name}/{ready.version}")
        producer.flush()


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int = 0
    _handle: IO[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def wait_for_port(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: nothing listens on {self.port} after {timeout} s")

    def mean_batch(self) -> tuple[float, float]:
        """(rows, executions) so far, off svc_model's batch-size histogram."""
        rows = _metric(self.metrics_port, f'aistack_model_batch_size_sum{{model="{MODEL}"}}')
        runs = _metric(self.metrics_port, f'aistack_model_batch_size_count{{model="{MODEL}"}}')
        return rows, runs

    def give_model(self, path: Path) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(f"{path}\n".encode())
            self.process.stdin.close()
        except BrokenPipeError as exc:
            raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}") from exc

    def ask_to_stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: both servers drain and exit

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self._handle is not None:
            self._handle.close()


def _metric(port: int, series: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series))


def _spawn(
    name: str, command: list[str], env: dict[str, str], state: Path, port: int, stdin: bool = False
) -> Server:
    log = state / f"{name.replace(' ', '-')}.log"
    handle = log.open("wb")
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    return Server(name, port, process, log, _handle=handle)


def start_aistack(batching: bool, topics: tuple[str, str], state: Path, threads: int) -> Server:
    from shared.settings import KafkaSettings, RedisSettings, load_settings

    port, metrics_port = free_port(), free_port()
    name = AISTACK_BATCHED if batching else AISTACK_UNBATCHED
    directory = state / name.replace(" ", "-")
    directory.mkdir()
    env = {
        **os.environ,
        "AISTACK_KAFKA_BOOTSTRAP": load_settings(KafkaSettings).bootstrap,
        "AISTACK_REDIS_URL": load_settings(RedisSettings).url,
        "AISTACK_STATE_DIR": str(directory),
        "AISTACK_LOG_LEVEL": "WARNING",
        "AISTACK_MODEL_GRPC_ADDRESS": f"127.0.0.1:{port}",
        "AISTACK_MODEL_MODELS_TOPIC": topics[0],
        "AISTACK_MODEL_DLQ_TOPIC": topics[1],
        "AISTACK_MODEL_METRICS_PORT": str(metrics_port),
        "AISTACK_MODEL_BATCHING": "true" if batching else "false",
        "AISTACK_MODEL_INTRA_OP_THREADS": str(threads),
    }
    server = _spawn(name, [sys.executable, "-m", "svc_model"], env, state, port)
    server.metrics_port = metrics_port
    return server


def start_kserve(state: Path, threads: int) -> Server:
    """KServe's server, importing; ``Server.give_model`` tells it what to load."""
    port = free_port()
    command = [
        sys.executable,
        str(ROOT / "bench" / "serving_kserve.py"),
        "--model_path",
        "-",
        "--name",
        MODEL,
        "--grpc_port",
        str(port),
        "--http_port",
        str(free_port()),
        "--threads",
        str(threads),
    ]
    return _spawn(KSERVE, command, dict(os.environ), state, port, stdin=True)


# ---- measuring ----


@dataclass(frozen=True)
class Result:
    throughput: float
    p50_ms: float
    p99_ms: float
    failures: int = 0
    first_failure: str = ""
    mean_batch: float = 0.0


def summarise(
    parts: list[tuple[list[float], int, str]], duration: float, mean_batch: float = 0.0
) -> Result:
    latencies = np.array([value for part in parts for value in part[0]])
    failures = sum(part[1] for part in parts)
    first = next((part[2] for part in parts if part[2]), "")
    if latencies.size == 0:
        return Result(0.0, float("nan"), float("nan"), failures, first)
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    return Result(latencies.size / duration, float(p50), float(p99), failures, first, mean_batch)


class Bench:
    def __init__(
        self,
        clients: list[Worker],
        floor: Worker,
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
            self.floor.send("run", "", concurrency, warm_at, end_at, self.images)
            return summarise([self.floor.answer(timeout)], self.duration)
        server = self.servers[target]
        per_process = _split(concurrency, len(self.clients))
        used = [(client, n) for client, n in zip(self.clients, per_process, strict=True) if n]
        before = server.mean_batch() if server.metrics_port else (0.0, 0.0)
        for client, threads in used:
            client.send("run", server.address, threads, warm_at, end_at, self.images)
        parts = [client.answer(timeout) for client, _ in used]
        mean = 0.0
        if server.metrics_port:
            after = server.mean_batch()
            runs = after[1] - before[1]
            mean = (after[0] - before[0]) / runs if runs else 0.0
        return summarise(parts, self.duration, mean)


def _split(total: int, processes: int) -> list[int]:
    """``total`` callers over at most ``processes`` processes, as evenly as they go."""
    used = min(total, processes)
    return [total // used + (1 if i < total % used else 0) for i in range(used)] + [0] * (
        processes - used
    )


def best_of(bench: Bench, rounds: int) -> dict[tuple[str, int], Result]:
    configs = [(target, c) for c in CONCURRENCY for target in TARGETS]
    best: dict[tuple[str, int], Result] = {}
    for round_number in range(rounds):
        order = configs if round_number % 2 == 0 else configs[::-1]
        for config in order:
            result = bench.measure(*config)
            if config not in best or result.throughput > best[config].throughput:
                best[config] = result
    return best


def line(target: str, concurrency: int, result: Result) -> str:
    text = (
        f"{target} c{concurrency}: {result.throughput:,.0f} req/s  "
        f"p50 {result.p50_ms:.2f} ms  p99 {result.p99_ms:.2f} ms"
    )
    if result.mean_batch:
        text += f"  (mean batch {result.mean_batch:.1f} rows)"
    if result.failures:
        text += f"  [{result.failures} failed calls, first: {result.first_failure}]"
    return text


def report(best: dict[tuple[str, int], Result]) -> None:
    for concurrency in CONCURRENCY:
        for target in TARGETS:
            print(line(target, concurrency, best[(target, concurrency)]))
    batched, unbatched = best[(AISTACK_BATCHED, 16)], best[(AISTACK_UNBATCHED, 16)]
    kserve = best[(KSERVE, 16)]
    overhead = best[(AISTACK_BATCHED, 1)].p50_ms - best[(IN_PROCESS, 1)].p50_ms
    print(f"p50 overhead over in-process at c1: {overhead:.2f} ms")
    ratios = (
        ("aistack_vs_kserve_c16", batched.throughput / kserve.throughput, GOAL_VS_KSERVE),
        (
            "p50_overhead_c1",
            OVERHEAD_BUDGET_MS / max(overhead, OVERHEAD_FLOOR_MS),
            GOAL_P50_OVERHEAD,
        ),
        ("batched_vs_unbatched_c16", batched.throughput / unbatched.throughput, GOAL_BATCHED),
        ("batched_p99_vs_unbatched_c16", unbatched.p99_ms / batched.p99_ms, GOAL_BATCHED_P99),
    )
    for name, ratio, goal in ratios:
        print(f"{name}: ratio {ratio:.2f} (goal {goal})")


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
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads in every server (0: its default)"
    )
    args = parser.parse_args()
    from shared.errors import AistackError

    suffix = uuid.uuid4().hex[:8]
    topics = (f"bench-models-{suffix}", f"bench-dlq-{suffix}")
    workers: list[Worker] = []
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="aistack-bench-") as tmp:
        state = Path(tmp)
        try:
            # What needs no model starts first: its imports overlap with the export.
            servers[KSERVE] = start_kserve(state, args.threads)
            clients = [Worker(_client_main) for _ in range(CLIENT_PROCESSES)]
            workers.extend(clients)
            floor = Worker(_floor_main, args.threads)
            workers.append(floor)
            exported = export_model(state / "export")
            servers[KSERVE].give_model(exported.path)
            floor.send("load", str(exported.path))
            # svc_model finds the model on start-up, replaying the topic.
            publish_model(topics, exported)
            servers[AISTACK_BATCHED] = start_aistack(True, topics, state, args.threads)
            servers[AISTACK_UNBATCHED] = start_aistack(False, topics, state, args.threads)
            for worker in workers:
                if worker is not floor:
                    worker.send("ping", "")
                worker.answer(START_TIMEOUT)
            for server in servers.values():
                server.wait_for_port(START_TIMEOUT)
            check(clients, servers, exported)
            bench = Bench(clients, floor, servers, exported.images, args.warmup, args.duration)
            print(
                f"digits CNN (default hyperparameters), {os.cpu_count()} cores, torch threads "
                f"{args.threads or 'default'}, {args.rounds} rounds of {args.warmup:g} s "
                f"warm-up + {args.duration:g} s, best round:"
            )
            best = best_of(bench, args.rounds)
        except (RuntimeError, AistackError) as exc:  # AistackError: no broker, mostly
            print(f"serving: {exc}", file=sys.stderr)
            for server in servers.values():
                print(f"--- {server.name} log:\n{server.log_tail()}", file=sys.stderr)
            return 1
        finally:
            stop_all([*workers, *servers.values()])
    report(best)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

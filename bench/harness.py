"""What every benchmark shares: the one output format, the infra it runs
against, the processes it starts and the order of its rounds.

Only the standard library at module level: ``bench.serving``'s client
processes are spawned and import it again, and there tritonclient must be the
one owner of the protobuf package ``inference`` (aistack's contracts register
it too). aistack's settings are imported where used.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from bench import profiling

if TYPE_CHECKING:
    from shared.settings import KafkaSettings, RedisSettings

ROOT = Path(__file__).resolve().parent.parent
"""The repository: every service a benchmark starts runs from here."""

ITSELF = "[aistack against itself]"

T = TypeVar("T")


# ---- the one output format ----


def ratio_line(
    name: str, ratio: float, goal: float, *, digits: int = 2, itself: bool = False
) -> str:
    """``NAME: ratio R (goal G)``, the line each figure of a benchmark ends in.

    Higher is always better: a benchmark states every figure as a ratio that
    meets its goal when ``ratio >= goal``. ``itself`` marks a ratio of aistack
    against itself (two of its own stages or configurations: two consumers
    over one, batched over unbatched), not against a peer, so that nobody
    reads it as one.
    The goal is shown to two decimals at most."""
    text = f"{name}: ratio {ratio:.{digits}f} (goal {round(goal, 2)})"
    return f"{text} {ITSELF}" if itself else text


def print_ratio(
    name: str, ratio: float, goal: float, *, digits: int = 2, itself: bool = False
) -> None:
    print(ratio_line(name, ratio, goal, digits=digits, itself=itself), flush=True)


# ---- the infra: Kafka and Redis as `aistack infra up` (or the environment) names them ----


def kafka_settings() -> KafkaSettings:
    """The broker every benchmark uses: ``aistack infra up``'s, or the one
    ``AISTACK_KAFKA_BOOTSTRAP`` names."""
    from shared.settings import KafkaSettings, load_settings

    return load_settings(KafkaSettings)


def redis_settings() -> RedisSettings:
    from shared.settings import RedisSettings, load_settings

    return load_settings(RedisSettings)


def child_env(
    overrides: Mapping[str, str],
    *,
    kafka: KafkaSettings | None = None,
    redis: RedisSettings | None = None,
    defaults: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a service a benchmark starts: this process's, then
    ``defaults`` where it sets nothing, the infra's addresses and ``overrides``.

    The benchmarks configure the services they start as a deployment does,
    through their settings' environment variables; this is the one place a
    benchmark reads its own environment."""
    env = dict(os.environ)
    for name, value in (defaults or {}).items():
        env.setdefault(name, value)
    if kafka is not None:
        env["AISTACK_KAFKA_BOOTSTRAP"] = kafka.bootstrap
    if redis is not None:
        env["AISTACK_REDIS_URL"] = redis.url
    env.update(overrides)
    return env


# ---- processes ----


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def spawn(
    command: Sequence[str],
    env: Mapping[str, str],
    log: IO[bytes],
    *,
    stdin: bool = False,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """``command`` from the repository root, its output into ``log``; with
    ``stdin`` a pipe the caller writes to, else nothing to read. Under
    ``--profile`` py-spy samples it and its Spark driver records itself
    (``bench.profiling``)."""
    profiler = profiling.active()
    label = ""
    if profiler is not None:
        label = profiler.unique_label(profiling.label_of(command))
        env = profiler.jvm_env(env, label)
    process = subprocess.Popen(
        list(command),
        cwd=ROOT,
        env=dict(env),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=new_session,
    )
    if profiler is not None:
        profiler.attach(process.pid, label, unique=True)
    return process


def read_metric(port: int, series: str) -> float:
    """``series`` (name and labels) from a process's /metrics; 0 before it answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum_series(text, series)


#: The longest pause between two scrapes of a counter a run is timed by.
SCRAPE_EVERY_S = 0.2
#: The shortest, as its count nears the end.
SCRAPE_FLOOR_S = 0.005


def next_scrape_in(seen: float, count: float, rate: float | None) -> float:
    """Seconds to wait before scraping a counter again that should reach
    ``count`` (at ``seen``, rising at ``rate`` a second, None before it rose).

    Scraping is not free, so a counter is read every ``SCRAPE_EVERY_S``;
    but a run timed to the first scrape that sees its end is timed up to
    that pause late (a tenth of a run of 2 s). Near the end, then, it waits
    half the time the rest should take, and no less than ``SCRAPE_FLOOR_S``:
    a few scrapes more, the end seen within milliseconds."""
    if not rate or rate <= 0:
        return SCRAPE_EVERY_S
    left_s = max(count - seen, 0.0) / rate
    return min(SCRAPE_EVERY_S, max(SCRAPE_FLOOR_S, left_s / 2))


def sum_series(text: str, series: str) -> float:
    """The sum of ``series``' samples in a Prometheus text exposition."""
    wanted = f"{series} "
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process ``pid`` has used so far (Linux);
    0 once it is gone."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _TICKS if fields else 0.0


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and every process below it: the
    live ones' own, and those of the children each has reaped (a trainer's
    recycled executors). A child that has exited but is not reaped yet is
    missed until its parent waits for it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        if fields := _stat_fields(current):
            total += sum(int(f) for f in fields[11:15]) / _TICKS
        stack.extend(children.get(current, ()))
    return total


def infra_pids() -> dict[str, int]:
    """The broker's and Redis's pids where ``aistack infra up`` runs them
    (none for servers it did not start)."""
    from compose.local import LocalStack
    from compose.settings import InfraSettings

    stack = LocalStack(InfraSettings())
    found = {"broker": stack.kafka.pid(), "Redis": stack.redis.pid()}
    return {name: pid for name, pid in found.items() if pid is not None}


_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    # /proc/PID/stat after the command name (which may hold spaces): field
    # 1 is the parent's pid, 11-14 utime, stime, cutime, cstime in ticks.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _put_result(queue: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    queue.put(fn(*args))


def in_fresh_process(fn: Callable[..., T], *args: Any, timeout: float = 1800) -> T:
    """``fn(*args)`` in a fresh spawned process (thread settings and devices
    are per process); not a daemon, so that it may start processes itself
    (DDP ranks). ``fn`` must be importable by name."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_put_result, args=(queue, fn, args))
    profiler = profiling.active()
    if profiler is None:
        process.start()
    else:
        label = profiler.unique_label(fn.__name__.strip("_"))
        with profiler.jvm_environ(label):
            process.start()
        assert process.pid is not None
        profiler.attach(process.pid, label, unique=True)
    result: T = queue.get(timeout=timeout)
    process.join()
    return result


# ---- rounds ----


def round_order(items: Sequence[T], round_number: int) -> list[T]:
    """``items`` in the order they run in round ``round_number``: as given in
    even rounds, reversed in odd ones, so that warm caches and a machine's
    drift favour none of them."""
    return list(items) if round_number % 2 == 0 else list(reversed(items))


# ---- Ray Tune, the peer of the study benchmarks ----


def ray_tune_one_at_a_time(
    trainable: Callable[[dict[str, Any]], None],
    define_space: Callable[[Any], dict[str, Any]],
    sampler: Any,
    *,
    metric: str,
    trials: int,
    pythonpath: Sequence[Path] = (ROOT,),
) -> tuple[float, float, int]:
    """``trials`` trials of Ray Tune's function ``trainable``, one at a time on
    a reused actor, sampled by OptunaSearch (``define_space``, ``sampler``):
    (wall seconds of ``Tuner.fit``, the best ``metric``, the trials run).
    Ray's start-up stays outside the wall time, as the aistack side's does."""
    import tempfile
    import time

    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    ray.init(
        num_cpus=os.cpu_count() or 1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(map(str, pythonpath))}},
    )
    try:
        search = OptunaSearch(space=define_space, metric=metric, mode="min", sampler=sampler)
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            tune_config=tune.TuneConfig(
                search_alg=search, num_samples=trials, max_concurrent_trials=1, reuse_actors=True
            ),
            run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="ray-tune-"), verbose=0),
        )
        started = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - started
        best = results.get_best_result(metric=metric, mode="min")
        assert best.metrics is not None
        return wall, float(best.metrics[metric]), len(results)
    finally:
        ray.shutdown()

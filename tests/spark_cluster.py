"""A Spark standalone cluster for the tests: one master and one worker,
started from pyspark's own jars with ``spark-class``, as an operator starts
them with ``sbin/start-master.sh`` / ``start-worker.sh`` (which only wrap
these classes).

Everything binds to 127.0.0.1 on free ports; the worker's executors run this
venv's Python, so the jobs' Python functions find aistack and its packages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pyspark

from shared.ports import free_ports
from shared.settings import SparkSettings

SPARK_HOME = Path(pyspark.__file__).resolve().parent
_START_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class StandaloneCluster:
    master: str  # spark://127.0.0.1:PORT
    web_ui: str  # the master's web UI, whose /json lists the workers
    cores: int

    def settings(self, **conf: str) -> SparkSettings:
        """Settings for a driver in this process: the driver on 127.0.0.1
        (the executors call it back), executors on this venv's Python, and
        ``conf`` on top."""
        base = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.pyspark.python": sys.executable,
            "spark.executor.memory": "1g",
        }
        return SparkSettings(master=self.master, conf={**base, **conf})

    def applications(self) -> list[dict[str, object]]:
        """The applications the master has run and is running."""
        state = _master_state(self.web_ui)
        apps: list[dict[str, object]] = []
        for field in ("activeapps", "completedapps"):
            listed = state.get(field, [])
            if isinstance(listed, list):
                apps.extend(app for app in listed if isinstance(app, dict))
        return apps

    def alive_workers(self) -> int:
        alive = _master_state(self.web_ui).get("aliveworkers", 0)
        return alive if isinstance(alive, int) else 0


@contextmanager
def standalone_cluster(
    work_dir: Path, *, cores: int = 2, memory: str = "2g", workers: int = 1
) -> Iterator[StandaloneCluster]:
    """Start a master and ``workers`` workers with ``cores`` and ``memory``
    each; yield once every worker has registered; stop them all (and the
    executors under the workers) on exit. Logs go to ``work_dir``/logs; the
    message of a start that fails ends with their tail."""
    port, ui_port, *worker_ui_ports = free_ports(2 + workers)
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(logs),
        "PYSPARK_PYTHON": sys.executable,
    }
    master = f"spark://127.0.0.1:{port}"
    cluster = StandaloneCluster(master, f"http://127.0.0.1:{ui_port}", cores * workers)
    with ExitStack() as stack:
        stack.enter_context(
            _spark_class(
                [
                    "org.apache.spark.deploy.master.Master",
                    *("--host", "127.0.0.1", "--port", str(port)),
                    *("--webui-port", str(ui_port)),
                ],
                env,
                logs / "master.log",
            )
        )
        for index, worker_ui_port in enumerate(worker_ui_ports):
            name = "worker" if index == 0 else f"worker-{index}"
            stack.enter_context(
                _spark_class(
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        *("--host", "127.0.0.1", "--cores", str(cores), "--memory", memory),
                        *("--work-dir", str(work_dir / name)),
                        *("--webui-port", str(worker_ui_port)),
                        master,
                    ],
                    env,
                    logs / f"{name}.log",
                )
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while _alive(cluster) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no worker registered with {master} in {_START_TIMEOUT_S} s\n" + _tails(logs)
                )
            time.sleep(0.5)
        yield cluster


def _alive(cluster: StandaloneCluster) -> int:
    try:
        return cluster.alive_workers()
    except (OSError, ValueError):  # the master's web UI not up yet, or answering an empty page
        return 0


def _master_state(web_ui: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{web_ui}/json", timeout=2) as response:
        state: dict[str, object] = json.load(response)
    return state


@contextmanager
def _spark_class(args: list[str], env: dict[str, str], log: Path) -> Iterator[None]:
    out: IO[bytes] = log.open("wb")
    process = subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-class"), *args],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        # A group of its own: the JVM and, under the worker, its executors.
        start_new_session=True,
    )
    try:
        yield
    finally:
        _stop_group(process)
        out.close()


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    for signum, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tails(logs: Path, lines: int = 20) -> str:
    parts = []
    for path in sorted(logs.glob("*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path.name}\n" + "\n".join(tail))
    return "\n".join(parts)

"""The whole stack for real, once: Kafka, Redis and every service as a process,
on free ports and a throw-away state directory beside the developer's stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from compose.processes import group_members
from compose.settings import StackSettings
from compose.stack import ServiceStack, ServiceStatus
from shared.errors import Unavailable
from tests.infra import wait_until

pytestmark = pytest.mark.integration

SERVICES = [
    "svc_ingest",
    "svc_transform",
    "svc_tuner",
    "svc_trainer-1",
    "svc_trainer-2",
    "svc_model",
    "svc_monitor",
]


def settings_on_free_ports(state_dir: Path) -> StackSettings:
    return StackSettings.on_free_ports(state_dir)


def cli_env(settings: StackSettings) -> dict[str, str]:
    """The same stack, as ``aistack`` reads it from the environment."""
    infra = settings.infra
    return {
        **os.environ,
        "AISTACK_STATE_DIR": str(infra.common.state_dir),
        "AISTACK_INFRA_KAFKA_PORT": str(infra.kafka_port),
        "AISTACK_INFRA_KAFKA_CONTROLLER_PORT": str(infra.kafka_controller_port),
        "AISTACK_INFRA_REDIS_PORT": str(infra.redis_port),
        "AISTACK_STACK_TUNER_PORT": str(settings.tuner_port),
        "AISTACK_STACK_MODEL_PORT": str(settings.model_port),
        "AISTACK_STACK_INGEST_METRICS_PORT": str(settings.ingest_metrics_port),
        "AISTACK_STACK_TRANSFORM_METRICS_PORT": str(settings.transform_metrics_port),
        "AISTACK_STACK_TUNER_METRICS_PORT": str(settings.tuner_metrics_port),
        "AISTACK_STACK_TRAINER_METRICS_PORT": str(settings.trainer_metrics_port),
        "AISTACK_STACK_MODEL_METRICS_PORT": str(settings.model_metrics_port),
        "AISTACK_STACK_MONITOR_METRICS_PORT": str(settings.monitor_metrics_port),
        "AISTACK_STACK_TRAINERS": str(settings.trainers),
        "AISTACK_STACK_OPTUNA_DASHBOARD_PORT": str(settings.optuna_dashboard_port),
        "AISTACK_STACK_TENSORBOARD_PORT": str(settings.tensorboard_port),
    }


def serving(target: str, service: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def metrics_answer(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return bool(response.status == 200)


def json_from(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if " Z " in (entry / "stat").read_text().rpartition(")")[2][:3]:
                continue
            if any(text.encode() in (entry / part).read_bytes() for part in ("cmdline", "environ")):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_up_status_restart_and_down(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    settings = settings_on_free_ports(state_dir)
    stack = ServiceStack(settings)
    started_at = time.monotonic()
    ready_after: dict[str, float] = {}
    pids: list[int] = []
    try:
        statuses = stack.up(
            progress=lambda s: ready_after.setdefault(s.name, time.monotonic() - started_at)
        )
        print("ready after (s):", {k: round(v, 1) for k, v in ready_after.items()})
        by_name = {s.name: s for s in statuses}
        assert list(by_name) == ["kafka", "redis", *SERVICES]
        assert all(s.state == "running" and s.pid for s in statuses), statuses
        pids = [s.pid for s in statuses if s.pid is not None]
        assert by_name["svc_tuner"].addresses == (
            f"grpc {stack.tuner_target}",
            f"metrics :{settings.tuner_metrics_port}",
        )
        assert by_name["svc_trainer-2"].addresses == (
            f"metrics :{settings.trainer_metrics_port + 10}",
        )
        assert by_name["kafka"].addresses == (stack.kafka_bootstrap,)
        # Ready means what it says: gRPC serving, metrics answering.
        wait_until(
            lambda: serving(stack.tuner_target, "aistack.v1.TunerService"), 10, "tuner health"
        )
        wait_until(
            lambda: serving(stack.model_target, "inference.GRPCInferenceService"),
            10,
            "model health",
        )
        for use in settings.ports():
            if use.role == "metrics":
                assert metrics_answer(use.port), use

        # Idempotent: nothing running is started again.
        assert [s.pid for s in stack.up()] == [s.pid for s in statuses]

        victim = by_name["svc_trainer-2"]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        wait_until(
            lambda: stack.status()[6].state == "exited", 10, "the killed trainer reads exited"
        )
        exited = stack.status()[6]
        assert (exited.name, exited.pid) == ("svc_trainer-2", None)
        assert "trainer.started" in exited.last_lines
        assert {s.state for s in stack.status() if s.name != "svc_trainer-2"} == {"running"}

        cli = subprocess.run(
            [sys.executable, "-m", "aistack.cli", "status"],
            env=cli_env(settings),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert cli.returncode == 3, cli.stderr
        lines = cli.stdout.splitlines()
        assert sum(line.split()[:2] == ["svc_trainer-2", "exited"] for line in lines) == 1
        assert [line.split()[1] for line in lines if not line.startswith(" ")].count("running") == 8
        shown = [line.strip() for line in lines if line.startswith("    ")]
        assert shown == exited.last_lines.splitlines()

        restarted_at = time.monotonic()
        again = {s.name: s for s in stack.up()}
        print(f"trainer restarted in {time.monotonic() - restarted_at:.1f}s")
        assert again["svc_trainer-2"].state == "running"
        assert again["svc_trainer-2"].pid not in (None, victim.pid)
        assert all(
            again[name].pid == by_name[name].pid for name in by_name if name != "svc_trainer-2"
        )
        assert again["svc_trainer-2"].pid is not None
        pids.append(again["svc_trainer-2"].pid)

        # The dashboards, beside the stack, until `down`.
        shown = subprocess.run(
            [sys.executable, "-m", "aistack.cli", "dashboard"],
            env=cli_env(settings),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr
        optuna_url = f"http://127.0.0.1:{settings.optuna_dashboard_port}"
        tensorboard_url = f"http://127.0.0.1:{settings.tensorboard_port}"
        assert f"optuna-dashboard: {optuna_url}" in shown.stdout
        assert f"tensorboard: {tensorboard_url}" in shown.stdout
        # optuna-dashboard reads the tuner's journal (no study yet); TensorBoard the runs' dir.
        assert json_from(f"{optuna_url}/api/studies")["study_summaries"] == []
        logdir = json_from(f"{tensorboard_url}/data/environment")["data_location"]
        assert logdir == str(state_dir / "tensorboard")
        dashboards = {s.name: s for s in stack.status()[-2:]}
        assert {n: s.state for n, s in dashboards.items()} == {
            "optuna-dashboard": "running",
            "tensorboard": "running",
        }
        pids += [s.pid for s in dashboards.values() if s.pid is not None]
    finally:
        stopping_at = time.monotonic()
        final = stack.down()
        print(f"down in {time.monotonic() - stopping_at:.1f}s")
    assert [(s.name, s.state) for s in final] == [(s.name, "stopped") for s in final]
    assert all(s == ServiceStatus(s.name, "stopped", None, s.addresses, s.log_file) for s in final)
    assert not any(group_members(pid) for pid in pids)
    assert processes_mentioning(str(state_dir)) == []


def test_a_service_that_dies_at_start_fails_up_and_undoes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The one way to break a single service: its own setting, from the
    # environment every service inherits.
    monkeypatch.setenv("AISTACK_TRANSFORM_WATERMARK_SECONDS", "-1")
    state_dir = tmp_path / "state"
    stack = ServiceStack(settings_on_free_ports(state_dir))
    started_at = time.monotonic()
    with pytest.raises(Unavailable) as raised:
        stack.up()
    message = str(raised.value)
    assert message.startswith("svc_transform exited during start-up (exit status 2)")
    assert "AISTACK_TRANSFORM_WATERMARK_SECONDS" in message.splitlines()[-1]
    # At once, not at the start timeout.
    assert time.monotonic() - started_at < stack.settings.start_timeout / 2
    assert {s.state for s in stack.status()} == {"stopped"}
    assert processes_mentioning(str(state_dir)) == []

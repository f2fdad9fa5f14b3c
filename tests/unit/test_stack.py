"""The whole stack's launcher without a broker: environments, ports, pid files, logs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from aistack import cli
from compose.local import PortTaken
from compose.logs import follow, last_lines
from compose.processes import group_members, port_taken
from compose.settings import InfraSettings, StackSettings
from compose.stack import ServiceStack
from shared.errors import ConfigError, NotFound, Unavailable
from shared.ports import free_ports
from shared.settings import CommonSettings, load_settings

SERVICES = [
    "svc_ingest",
    "svc_transform",
    "svc_tuner",
    "svc_trainer-1",
    "svc_trainer-2",
    "svc_model",
    "svc_monitor",
]


def free_trainer_base(avoid: set[int] | None = None) -> int:
    """A free port whose +10 (the second replica's) is free as well, neither
    among the ports ``avoid`` (those the stack already uses)."""
    avoid = avoid or set()
    while True:
        (port,) = free_ports(1)
        if port in avoid or port + 10 in avoid:
            continue
        if port + 10 < 65536 and not port_taken("0.0.0.0", port + 10):
            return port


def stack_settings(state_dir: Path, **overrides: Any) -> StackSettings:
    # The ports a test gives (and the second trainer's, 10 above its base) are
    # never handed to another service: a random pick once matched one (CI).
    given = {value for name, value in overrides.items() if name.endswith("_port")}
    if "trainer_metrics_port" in overrides:
        given.add(overrides["trainer_metrics_port"] + 10)
    ports = [port for port in free_ports(11 + len(given)) if port not in given][:11]
    infra = InfraSettings(
        kafka_port=overrides.pop("kafka_port", ports[0]),
        kafka_controller_port=ports[1],
        redis_port=ports[2],
        common=CommonSettings(state_dir=state_dir),
    )
    values: dict[str, Any] = {
        "tuner_port": ports[3],
        "model_port": ports[4],
        "ingest_metrics_port": ports[5],
        "transform_metrics_port": ports[6],
        "tuner_metrics_port": ports[7],
        "trainer_metrics_port": free_trainer_base(avoid=set(ports) | given),
        "model_metrics_port": ports[9],
        "monitor_metrics_port": ports[10],
        "trainers": 2,
        "infra": infra,
    }
    values.update(overrides)
    return StackSettings(**values)


@pytest.fixture
def stack(tmp_path: Path) -> ServiceStack:
    return ServiceStack(stack_settings(tmp_path))


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# ---- settings ----


def test_default_ports_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("AISTACK_STACK_", "AISTACK_INFRA_")):
            monkeypatch.delenv(name)
    ports = {(use.service, use.role): use.port for use in StackSettings().ports()}
    assert ports == {
        ("kafka", ""): 9092,
        ("kafka", "controller"): 9093,
        ("redis", ""): 6379,
        ("svc_tuner", "gRPC"): 50051,
        ("svc_tuner", "metrics"): 9104,
        ("svc_model", "gRPC"): 8001,
        ("svc_model", "metrics"): 9106,
        ("svc_ingest", "metrics"): 9102,
        ("svc_transform", "metrics"): 9103,
        ("svc_monitor", "metrics"): 9107,
        ("svc_trainer-1", "metrics"): 9105,
        ("svc_trainer-2", "metrics"): 9115,
        ("optuna-dashboard", "http"): 8080,
        ("tensorboard", "http"): 6006,
    }


def test_trainer_replicas_get_ports_ten_apart(tmp_path: Path) -> None:
    settings = stack_settings(tmp_path, trainers=3, trainer_metrics_port=20005)
    trainers = [use for use in settings.ports() if use.service.startswith("svc_trainer")]
    assert [(u.service, u.port) for u in trainers] == [
        ("svc_trainer-1", 20005),
        ("svc_trainer-2", 20015),
        ("svc_trainer-3", 20025),
    ]


def test_a_port_given_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="port 20015 is given twice"):
        stack_settings(tmp_path, trainer_metrics_port=20005, model_port=20015)


def test_a_replica_beyond_the_last_port_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="beyond 65535"):
        stack_settings(tmp_path, trainers=3, trainer_metrics_port=65520)


def test_bad_settings_name_their_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_STACK_TRAINERS", "0")
    with pytest.raises(ConfigError, match="AISTACK_STACK_TRAINERS"):
        load_settings(StackSettings)
    monkeypatch.setenv("AISTACK_STACK_TRAINERS", "2")
    monkeypatch.setenv("AISTACK_INFRA_REDIS_PORT", "http")
    with pytest.raises(ConfigError, match="AISTACK_INFRA_REDIS_PORT"):
        load_settings(StackSettings)


# ---- environments ----


def test_every_service_is_pointed_at_the_stacks_servers(
    stack: ServiceStack, tmp_path: Path
) -> None:
    for name in SERVICES:
        env = stack.service_env(name)
        assert env["AISTACK_KAFKA_BOOTSTRAP"] == stack.kafka_bootstrap
        assert env["AISTACK_REDIS_URL"] == stack.redis_url
        assert env["AISTACK_STATE_DIR"] == str(tmp_path)
        assert env["PATH"] == os.environ["PATH"]  # the rest passes through


def test_each_service_gets_its_own_ports(stack: ServiceStack) -> None:
    s = stack.settings
    assert stack.service_env("svc_tuner")["AISTACK_TUNER_GRPC_ADDRESS"] == stack.tuner_target
    assert stack.tuner_target == f"127.0.0.1:{s.tuner_port}"
    assert stack.service_env("svc_model")["AISTACK_MODEL_GRPC_ADDRESS"] == stack.model_target
    assert stack.model_target == f"127.0.0.1:{s.model_port}"
    assert stack.service_env("svc_ingest")["AISTACK_INGEST_METRICS_PORT"] == str(
        s.ingest_metrics_port
    )
    assert stack.service_env("svc_transform")["AISTACK_TRANSFORM_METRICS_PORT"] == str(
        s.transform_metrics_port
    )
    assert stack.service_env("svc_tuner")["AISTACK_TUNER_METRICS_PORT"] == str(s.tuner_metrics_port)
    assert stack.service_env("svc_model")["AISTACK_MODEL_METRICS_PORT"] == str(s.model_metrics_port)
    assert stack.service_env("svc_monitor")["AISTACK_MONITOR_METRICS_PORT"] == str(
        s.monitor_metrics_port
    )


def test_trainer_replicas_differ_in_id_and_metrics_port(stack: ServiceStack) -> None:
    first, second = (stack.service_env(f"svc_trainer-{i}") for i in (1, 2))
    assert (first["AISTACK_TRAINER_TRAINER_ID"], second["AISTACK_TRAINER_TRAINER_ID"]) == (
        "trainer-1",
        "trainer-2",
    )
    base = stack.settings.trainer_metrics_port
    assert first["AISTACK_TRAINER_METRICS_PORT"] == str(base)
    assert second["AISTACK_TRAINER_METRICS_PORT"] == str(base + 10)


def test_defaults_yield_to_what_the_user_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AISTACK_LOG_FORMAT", raising=False)
    monkeypatch.delenv("AISTACK_SPARK_MASTER", raising=False)
    env = ServiceStack(stack_settings(tmp_path)).service_env("svc_transform")
    assert (env["AISTACK_LOG_FORMAT"], env["AISTACK_SPARK_MASTER"]) == ("json", "local[2]")
    monkeypatch.setenv("AISTACK_LOG_FORMAT", "console")
    monkeypatch.setenv("AISTACK_SPARK_MASTER", "local[1]")
    env = ServiceStack(stack_settings(tmp_path)).service_env("svc_transform")
    assert (env["AISTACK_LOG_FORMAT"], env["AISTACK_SPARK_MASTER"]) == ("console", "local[1]")


def test_where_things_are_is_the_stacks_to_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AISTACK_KAFKA_BOOTSTRAP", "elsewhere:1")
    monkeypatch.setenv("AISTACK_STATE_DIR", "/elsewhere")
    stack = ServiceStack(stack_settings(tmp_path / "mine"))
    env = stack.service_env("svc_ingest")
    assert env["AISTACK_KAFKA_BOOTSTRAP"] == stack.kafka_bootstrap
    assert env["AISTACK_STATE_DIR"] == str(tmp_path / "mine")


def test_with_an_object_store_every_service_keeps_its_files_on_the_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``aistack up --object-store``: each service reaches the store with the
    infra's key and finds its paths on the bucket, unless the user set one;
    TensorBoard reads the runs there with its own S3 reader."""
    from compose.object_store import BUCKET

    for name in ("AISTACK_TRAINER_ARTIFACT_ROOT", "AISTACK_TRAINER_TENSORBOARD_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AISTACK_TRANSFORM_OFFLINE_DIR", "s3a://mine/windows")
    settings = stack_settings(tmp_path)
    (store_port,) = free_ports(1)
    infra = settings.infra.model_copy(
        update={"object_store": True, "object_store_port": store_port}
    )
    stack = ServiceStack(settings.model_copy(update={"infra": infra}))
    trainer = stack.service_env("svc_trainer-1")
    transform = stack.service_env("svc_transform")
    for env in (trainer, transform, stack.service_env("svc_model"), stack.client_env()):
        assert env["AISTACK_OBJECT_STORE_ENDPOINT"] == f"http://127.0.0.1:{store_port}"
        assert env["AISTACK_OBJECT_STORE_PATH_STYLE"] == "true"
        assert env["AISTACK_OBJECT_STORE_SECRET_ACCESS_KEY"]
    assert trainer["AISTACK_TRAINER_ARTIFACT_ROOT"] == f"s3://{BUCKET}/artifacts"
    assert transform["AISTACK_TRANSFORM_CHECKPOINT_DIR"].startswith(f"s3a://{BUCKET}/")
    assert transform["AISTACK_TRANSFORM_OFFLINE_DIR"] == "s3a://mine/windows"  # the user's
    assert stack.offline_store() == "s3://mine/windows"
    assert "object-store" in [use.service for use in stack.settings.ports()]

    board = stack._service("tensorboard")
    command = stack._command(board)
    assert command[1:3] == ["-m", "svc_trainer.tensorboard"]
    assert f"--logdir=s3://{BUCKET}/tensorboard" in command and "--load_fast=false" in command
    env = stack.service_env("tensorboard")
    assert env["S3_ENDPOINT"] == f"http://127.0.0.1:{store_port}"
    assert env["AWS_SECRET_ACCESS_KEY"] == trainer["AISTACK_OBJECT_STORE_SECRET_ACCESS_KEY"]


# ---- names ----


def test_unknown_names_are_refused_with_the_known_ones(stack: ServiceStack) -> None:
    with pytest.raises(NotFound, match="svc_trainer-2, svc_model"):
        stack.log_file("svc_trainer-3")
    with pytest.raises(NotFound, match="'kafka'"):
        stack.service_env("kafka")  # a server, not a service process


def test_log_files_live_in_the_state_dir(stack: ServiceStack, tmp_path: Path) -> None:
    assert stack.log_file("svc_trainer-2") == tmp_path / "stack" / "svc_trainer-2.log"
    assert stack.log_file("kafka") == tmp_path / "infra" / "kafka.log"


# ---- ports ----


def test_a_taken_grpc_port_stops_up_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        stack = ServiceStack(stack_settings(tmp_path, model_port=port))
        with pytest.raises(PortTaken) as raised:
            stack.up()
    assert str(raised.value) == (
        f"port {port} (svc_model gRPC) is taken by another process: "
        "stop it or set AISTACK_STACK_MODEL_PORT"
    )
    assert {s.state for s in stack.status()} == {"stopped"}
    assert not (tmp_path / "stack").exists()


def test_a_bound_but_silent_port_is_taken_too(tmp_path: Path) -> None:
    # Bound, not listening: nothing answers a connection, but a server's bind fails.
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        port = squatter.getsockname()[1]
        stack = ServiceStack(stack_settings(tmp_path, ingest_metrics_port=port))
        with pytest.raises(PortTaken, match=f"port {port} \\(svc_ingest metrics\\).*INGEST"):
            stack.up()


def test_the_second_trainers_port_names_how_it_is_derived(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        stack = ServiceStack(stack_settings(tmp_path, trainer_metrics_port=port - 10))
        with pytest.raises(PortTaken) as raised:
            stack.up()
    assert str(raised.value) == (
        f"port {port} (svc_trainer-2 metrics) is taken by another process: stop it or set "
        "AISTACK_STACK_TRAINER_METRICS_PORT (replica 2 uses it + 10)"
    )


# ---- status ----


def test_a_dead_pid_file_reads_exited_with_the_last_log_lines(
    stack: ServiceStack, tmp_path: Path
) -> None:
    (tmp_path / "stack").mkdir()
    (tmp_path / "stack" / "svc_trainer-2.pid").write_text(f"{dead_pid()}\n")
    (tmp_path / "stack" / "svc_trainer-2.log").write_text("".join(f"line {i}\n" for i in range(30)))
    status = {s.name: s for s in stack.status()}
    exited = status["svc_trainer-2"]
    assert (exited.state, exited.pid) == ("exited", None)
    assert exited.last_lines == "\n".join(f"line {i}" for i in range(20, 30))
    assert (tmp_path / "stack" / "svc_trainer-2.pid").exists()  # status changes nothing
    assert status["svc_trainer-1"].state == "stopped"
    assert status["svc_trainer-1"].last_lines == ""


def test_a_reused_pid_is_not_ours(stack: ServiceStack, tmp_path: Path) -> None:
    (tmp_path / "stack").mkdir()
    (tmp_path / "stack" / "svc_model.pid").write_text(f"{os.getpid()}\n")  # pytest, not svc_model
    assert {s.name: s.state for s in stack.status()}["svc_model"] == "exited"


def test_a_crashed_kafka_reads_exited(stack: ServiceStack, tmp_path: Path) -> None:
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "kafka.pid").write_text(f"{dead_pid()}\n")
    (tmp_path / "infra" / "kafka.log").write_text("ERROR out of disk\n")
    kafka = stack.status()[0]
    assert (kafka.name, kafka.state, kafka.last_lines) == ("kafka", "exited", "ERROR out of disk")


def test_down_stops_a_service_and_the_children_it_leaves(
    stack: ServiceStack, tmp_path: Path
) -> None:
    (tmp_path / "stack").mkdir()
    # Looks like svc_ingest to the "is it ours" check ("-m svc_ingest" in its
    # command line); dies on SIGTERM, but its child ignores SIGTERM.
    script = (
        "import signal, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "time.sleep(600)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", script, "-m", "svc_ingest"], start_new_session=True
    )
    (tmp_path / "stack" / "svc_ingest.pid").write_text(f"{leader.pid}\n")
    time.sleep(0.5)
    assert {s.name: s.state for s in stack.status()}["svc_ingest"] == "running"
    stack.down(timeout=2)
    assert leader.wait(5) == -signal.SIGTERM
    assert {s.state for s in stack.status()} == {"stopped"}
    # Zombies aside (init reaps the orphan when it gets to it): nobody is left.
    assert group_members(leader.pid) == []


def test_down_clears_exited_services(stack: ServiceStack, tmp_path: Path) -> None:
    (tmp_path / "stack").mkdir()
    (tmp_path / "stack" / "svc_tuner.pid").write_text(f"{dead_pid()}\n")
    assert {s.state for s in stack.down()} == {"stopped"}


# ---- logs ----


def test_last_lines_reads_from_the_end(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"{i:08d} {'x' * 200}\n" for i in range(2000)))
    assert [line[:8] for line in last_lines(log, 3).splitlines()] == [
        "00001997",
        "00001998",
        "00001999",
    ]
    assert last_lines(log, 0) == ""
    assert last_lines(tmp_path / "missing.log", 5) == ""
    (tmp_path / "short.log").write_text("only\n")
    assert last_lines(tmp_path / "short.log", 5) == "only"


def test_follow_yields_whole_lines_as_they_come(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("first\n")
    lines = follow({"svc": log}, interval=0.01, from_end=False)
    assert next(lines) == ("svc", "first")
    with log.open("a") as file:
        file.write("second\npart")
    assert next(lines) == ("svc", "second")
    with log.open("a") as file:
        file.write("ial\n")
    assert next(lines) == ("svc", "partial")
    log.write_text("again\n")  # truncated and rewritten: read from the start
    assert next(lines) == ("svc", "again")


# ---- the command line ----


def stack_env(monkeypatch: pytest.MonkeyPatch, settings: StackSettings) -> None:
    infra = settings.infra
    for name, value in {
        "AISTACK_STATE_DIR": infra.common.state_dir,
        "AISTACK_INFRA_KAFKA_PORT": infra.kafka_port,
        "AISTACK_INFRA_KAFKA_CONTROLLER_PORT": infra.kafka_controller_port,
        "AISTACK_INFRA_REDIS_PORT": infra.redis_port,
        "AISTACK_STACK_TRAINER_METRICS_PORT": settings.trainer_metrics_port,
    }.items():
        monkeypatch.setenv(name, str(value))


def test_cli_status_shows_exited_services_and_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack_env(monkeypatch, stack_settings(tmp_path))
    (tmp_path / "stack").mkdir()
    (tmp_path / "stack" / "svc_model.pid").write_text(f"{dead_pid()}\n")
    (tmp_path / "stack" / "svc_model.log").write_text("booting\nsvc_model: no broker\n")
    assert cli.main(["status"]) == 3
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out if not line.startswith(" ")] == [
        ["kafka", "stopped"],
        ["redis", "stopped"],
        *([name, "exited" if name == "svc_model" else "stopped"] for name in SERVICES),
    ]
    # The exited service's last log lines follow its own entry.
    shown = out.index("    booting")
    assert out[shown : shown + 2] == ["    booting", "    svc_model: no broker"]
    model, monitor = (
        next(i for i, line in enumerate(out) if line.startswith(name))
        for name in ("svc_model", "svc_monitor")
    )
    assert model < shown < monitor


def test_cli_logs_prefixes_each_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack_env(monkeypatch, stack_settings(tmp_path))
    (tmp_path / "stack").mkdir()
    (tmp_path / "stack" / "svc_tuner.log").write_text("a\nb\nc\n")
    (tmp_path / "stack" / "svc_model.log").write_text("m\n")
    assert cli.main(["logs", "-n", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "svc_tuner     | b",
        "svc_tuner     | c",
        "svc_model     | m",
    ]
    assert cli.main(["logs", "svc_tuner", "-n", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["c"]
    assert cli.main(["logs", "svc_nope"]) == 1
    assert "known: kafka, redis" in capsys.readouterr().err


# ---- all or nothing, with stand-ins for the services ----


def stand_ins(
    monkeypatch: pytest.MonkeyPatch, stack: ServiceStack, scripts: dict[str, str]
) -> None:
    """Each service runs ``scripts[name]`` (default: sleeps) instead of its
    module; "-m <module>" stays in the command line so that it reads as ours."""
    monkeypatch.setattr(stack.infra, "up", lambda: [])
    monkeypatch.setattr(stack, "_prepare_topics", lambda kafka: None)

    def command(svc: Any) -> list[str]:
        script = scripts.get(svc.name, "import time; time.sleep(600)")
        return [sys.executable, "-c", script, "-m", svc.module]

    monkeypatch.setattr(stack, "_command", command)


def test_a_service_that_exits_fails_up_at_once_and_stops_the_others(
    stack: ServiceStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_ins(
        monkeypatch,
        stack,
        {"svc_tuner": "import sys, time; time.sleep(0.5); print('tuner: no broker'); sys.exit(3)"},
    )
    started_at = time.monotonic()
    with pytest.raises(Unavailable) as raised:
        stack.up()
    assert time.monotonic() - started_at < 10
    assert str(raised.value).splitlines() == [
        f"svc_tuner exited during start-up (exit status 3); last lines of "
        f"{stack.log_file('svc_tuner')}:",
        "    tuner: no broker",
    ]
    assert {s.state for s in stack.status()} == {"stopped"}


def test_a_service_that_never_gets_ready_fails_up_at_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = ServiceStack(stack_settings(tmp_path, start_timeout=1))
    stand_ins(monkeypatch, stack, {})
    with pytest.raises(Unavailable, match=r"svc_ingest is not ready on port .* after 1s \(nor"):
        stack.up()
    assert {s.state for s in stack.status()} == {"stopped"}


# ---- a cluster of brokers ----


def test_on_three_brokers_services_get_every_broker_and_replication_three_two_in_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AISTACK_KAFKA_TOPIC_REPLICATION_FACTOR", raising=False)
    monkeypatch.delenv("AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS", raising=False)
    settings = stack_settings(tmp_path)
    infra = settings.infra.model_copy(update={"brokers": 3})
    stack = ServiceStack(settings.model_copy(update={"infra": infra}))
    port = infra.kafka_port

    assert stack.names[:4] == ["kafka", "kafka-2", "kafka-3", "redis"]
    env = stack.service_env("svc_ingest")
    assert env["AISTACK_KAFKA_BOOTSTRAP"] == (
        f"127.0.0.1:{port},127.0.0.1:{port + 100},127.0.0.1:{port + 200}"
    )
    assert env["AISTACK_KAFKA_TOPIC_REPLICATION_FACTOR"] == "3"
    assert env["AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS"] == "2"
    assert stack.log_file("kafka-3") == tmp_path / "infra" / "kafka-3.log"
    # What the user set stays.
    monkeypatch.setenv("AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS", "3")
    assert stack.service_env("svc_model")["AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS"] == "3"


def test_the_broker_count_follows_the_state_and_a_different_one_is_refused(
    tmp_path: Path,
) -> None:
    from compose.local import CLUSTER_FILE, LocalStack

    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / CLUSTER_FILE).write_text('{"brokers": 3, "secure": true}\n')
    infra = stack_settings(tmp_path).infra
    # The defaults (1, plaintext) follow the state.
    found = LocalStack(infra)
    assert (len(found.brokers), found.secure) == (3, True)
    assert found.redis_url.startswith("rediss://")
    with pytest.raises(ConfigError, match=r"AISTACK_INFRA_BROKERS=1, .* a 3-broker Kafka cluster"):
        LocalStack(infra.model_copy(update={"brokers": 1}))
    with pytest.raises(ConfigError, match=r"AISTACK_INFRA_SECURE=false, .* a secure Kafka cluster"):
        LocalStack(infra.model_copy(update={"secure": False}))


def test_a_state_from_before_the_shape_was_recorded_holds_one_plain_broker(
    tmp_path: Path,
) -> None:
    from compose.local import LocalStack

    (tmp_path / "infra" / "kafka" / "data").mkdir(parents=True)
    (tmp_path / "infra" / "kafka" / "data" / "meta.properties").write_text("cluster.id=x\n")
    infra = stack_settings(tmp_path).infra
    found = LocalStack(infra)
    assert (len(found.brokers), found.secure) == (1, False)
    with pytest.raises(ConfigError, match="a plaintext Kafka cluster"):
        LocalStack(infra.model_copy(update={"secure": True}))


def test_the_brokers_ports_are_checked_with_every_other_port(tmp_path: Path) -> None:
    infra = stack_settings(tmp_path).infra
    with pytest.raises(ValidationError, match="given twice: kafka-2 controller"):
        StackSettings(
            infra=InfraSettings(
                brokers=3,
                kafka_port=infra.kafka_port,
                kafka_controller_port=infra.kafka_controller_port,
                redis_port=infra.kafka_controller_port + 100,
                common=infra.common,
            )
        )


# ---- secure mode ----


def test_in_secure_mode_each_service_runs_as_its_own_principal(tmp_path: Path) -> None:
    from compose.secure import ensure_material

    settings = stack_settings(tmp_path)
    infra = settings.infra.model_copy(update={"secure": True})
    stack = ServiceStack(settings.model_copy(update={"infra": infra}))
    material = ensure_material(stack.infra.material.directory, ["127.0.0.1"])

    for name in SERVICES:
        env = stack.service_env(name)
        principal = name.split("-")[0]  # svc_trainer-2 is svc_trainer
        assert env["AISTACK_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert env["AISTACK_KAFKA_SASL_USERNAME"] == principal
        assert env["AISTACK_KAFKA_SASL_PASSWORD"] == material.password(principal).get_secret_value()
        assert env["AISTACK_KAFKA_SSL_CAFILE"] == str(material.ca_cert)
        assert env["AISTACK_REDIS_URL"].startswith("rediss://")
        assert env["AISTACK_REDIS_USERNAME"] == principal
    for server, prefix in (("svc_tuner", "AISTACK_TUNER_"), ("svc_model", "AISTACK_MODEL_")):
        env = stack.service_env(server)
        assert env[f"{prefix}TLS_CERT_FILE"] == str(material.server_cert)
        assert env[f"{prefix}AUTH_TOKEN"] == material.token(server).get_secret_value()
    # The user's side: the client principal, the CA and both tokens.
    client = stack.client_env()
    assert client["AISTACK_KAFKA_SASL_USERNAME"] == "client"
    assert client["AISTACK_TUNER_TLS_CA_FILE"] == str(material.ca_cert)
    assert client["AISTACK_MODEL_AUTH_TOKEN"] == material.token("svc_model").get_secret_value()
    assert stack.tuner().token == material.token("svc_tuner").get_secret_value()
    assert stack.client_kafka().sasl_username == "client"


def test_a_plain_stack_hands_out_no_credentials(stack: ServiceStack) -> None:
    env = stack.service_env("svc_tuner")
    assert "AISTACK_KAFKA_SASL_USERNAME" not in env or env["AISTACK_KAFKA_SASL_USERNAME"] == (
        os.environ.get("AISTACK_KAFKA_SASL_USERNAME")
    )
    assert "AISTACK_TUNER_AUTH_TOKEN" not in env or "AISTACK_TUNER_AUTH_TOKEN" in os.environ
    assert stack.tuner().tls_ca_file is None and stack.tuner().token is None


def test_cli_env_prints_what_the_users_side_needs_and_in_secure_mode_the_client_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex

    from compose.local import CLUSTER_FILE
    from compose.secure import ensure_material

    settings = stack_settings(tmp_path)
    stack_env(monkeypatch, settings)
    assert cli.main(["env"]) == 0
    plain = dict(
        line.removeprefix("export ").split("=", 1) for line in capsys.readouterr().out.splitlines()
    )
    assert plain["AISTACK_KAFKA_BOOTSTRAP"] == f"127.0.0.1:{settings.infra.kafka_port}"
    assert "AISTACK_KAFKA_SASL_PASSWORD" not in plain

    (tmp_path / "infra").mkdir(exist_ok=True)
    (tmp_path / "infra" / CLUSTER_FILE).write_text('{"brokers": 1, "secure": true}\n')
    assert cli.main(["env"]) == 1  # no credentials before the first `aistack up`
    assert "run `aistack up` first" in capsys.readouterr().err
    material = ensure_material(tmp_path / "infra" / "secure", ["127.0.0.1"])
    assert cli.main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    secure = {k: shlex.split(v)[0] for k, v in (line[7:].split("=", 1) for line in lines)}
    assert secure["AISTACK_KAFKA_SASL_USERNAME"] == "client"
    assert secure["AISTACK_KAFKA_SASL_PASSWORD"] == material.password("client").get_secret_value()
    assert secure["AISTACK_TUNER_AUTH_TOKEN"] == material.token("svc_tuner").get_secret_value()
